"""`python -m ledger` runs one worker (settings from ENHYDRA_* variables)."""

from ledger.service import service

if __name__ == "__main__":
    service.run()
