"""aiokafka's connection errors, rate-limited while a broker is down.

Every client retries on its own (the fetcher, the producer's sender, the coordinator, the
changelog reader), and each logs each failed attempt: one instance wrote 70,045 lines in 66 s
of broker outage. The filter lets the first line of a kind through for each broker, then one
line per interval saying how many were held back. While a client starts, its bootstrap errors
are dropped altogether: `clients.start` explains the failure in one line of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

INTERVAL_S = 60.0
_starting: contextvars.ContextVar[bool] = contextvars.ContextVar("kafka_starting", default=False)


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """While a client starts in this task, its bootstrap errors are ours to explain."""
    token = _starting.set(True)
    try:
        yield
    finally:
        _starting.reset(token)


@dataclass
class _Seen:
    last_shown: float
    held_back: int = 0


class ConnectionNoise(logging.Filter):
    """Passes each aiokafka warning once per (message, first argument) and interval.

    Every warning and error aiokafka logs repeats while a broker is away (a failed fetch, a
    metadata update, a coordinator lookup, a heartbeat), so every one is rate-limited.
    """

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._seen: dict[tuple[str, str], _Seen] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("aiokafka") or record.levelno < logging.WARNING:
            return True
        template = str(record.msg)
        if _starting.get() and template.startswith("Unable connect to"):
            return False
        first_arg = record.args[0] if isinstance(record.args, tuple) and record.args else ""
        key = (f"{record.name}:{template}", str(first_arg))
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = _Seen(now)
            return True
        if now - seen.last_shown < self.interval_s:
            seen.held_back += 1
            return False
        if seen.held_back:
            record.msg = f"{template} (and {seen.held_back} more like it since the last one)"
        seen.last_shown, seen.held_back = now, 0
        return True
