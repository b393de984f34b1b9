"""Testing support: an in-memory driver and fixtures for a real broker and real instances."""

from enhydra.testing.driver import Driver, Outcome

__all__ = ["Driver", "Outcome"]
