"""The part of a Kafka record the pure steps read: one shape for the aggregate's, the sagas'
and the tests' records, and for a record that never came from Kafka (a saga deadline's
dead letter)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class InputRecord:
    """The part of a Kafka record that processing needs."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()
