"""Ledger: the reference Enhydra service (accounts with deposits and withdrawals)."""
