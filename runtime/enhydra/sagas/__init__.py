"""Sagas: process managers keyed by a correlation id, with durable deadlines."""

from enhydra.reactions.model import Emit, Upstream
from enhydra.sagas.model import Cancel, Deadline, Saga

__all__ = ["Cancel", "Deadline", "Emit", "Saga", "Upstream"]
