"""Payments: one payment per order, asked for once stock has reserved its items."""
