"""Time windows by event time, as in Kafka Streams: hopping windows with a grace period.

A hopping window of `size` advancing by `advance` covers [start, start + size) for every start
that is a multiple of `advance`; a record belongs to every window containing its timestamp
(size / advance of them). Stream time is the largest timestamp seen so far. A window closes
once stream time reaches its end plus `grace`: a record arriving later for it is too late and
is dropped from it (out-of-order records within the grace period still count).

Pure helpers over plain data, so `apply` stays a pure fold and a backfill agrees with it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HoppingWindows:
    size_ms: int
    advance_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or not 0 < self.advance_ms <= self.size_ms or self.grace_ms < 0:
            raise ValueError(
                f"hopping windows need size > 0, 0 < advance <= size and grace >= 0; got "
                f"size={self.size_ms}, advance={self.advance_ms}, grace={self.grace_ms}"
            )

    def starts(self, timestamp_ms: int) -> list[int]:
        """Starts of the windows containing a timestamp, oldest first."""
        first = (timestamp_ms - self.size_ms) // self.advance_ms + 1
        last = timestamp_ms // self.advance_ms
        return [k * self.advance_ms for k in range(max(first, 0), last + 1)]

    def end(self, start_ms: int) -> int:
        return start_ms + self.size_ms

    def is_closed(self, start_ms: int, stream_time_ms: int) -> bool:
        """Whether a window accepts no more records at this stream time."""
        return stream_time_ms >= start_ms + self.size_ms + self.grace_ms

    def open_starts(self, timestamp_ms: int, stream_time_ms: int) -> list[int]:
        """The windows a record still counts in, given the stream time after seeing it."""
        return [s for s in self.starts(timestamp_ms) if not self.is_closed(s, stream_time_ms)]
