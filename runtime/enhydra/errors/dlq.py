"""The dead-letter queue: failed records with their origin, and the way back.

A dead letter keeps the original key, value and headers, and adds `enhydra.dlq.*` headers that
say where it came from and why it failed. Replaying one sends key, value and original headers
back to its source topic with `enhydra.dlq.replays` counting the trips, so a second failure is
recognisable in the DLQ.
"""

from __future__ import annotations

import datetime as dt
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from enhydra.contracts.sizes import record_size
from enhydra.errors.failure import Failure

PREFIX = "enhydra.dlq."
REPLAYS = PREFIX + "replays"
REPLAYED_FROM = PREFIX + "replayed_from"
TRUNCATED_FROM = PREFIX + "truncated_from"  # a cut dead letter: its value's original size
MAX_MESSAGE = 2_000
MAX_STACKTRACE = 8_000

Header = tuple[str, bytes]


def dlq_topic_name(app_id: str) -> str:
    return f"{app_id}-dlq"


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 20] + "\n...[truncated]"


def error_class(error: BaseException) -> str:
    kind = type(error)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def dead_letter_headers(
    failure: Failure,
    *,
    topic: str,
    partition: int,
    app_id: str,
    instance_id: str,
    now: dt.datetime | None = None,
) -> list[Header]:
    """The original headers (minus an earlier failure's) plus where and why this one failed."""
    record = failure.record
    now = now or dt.datetime.now(dt.UTC)
    stack = "".join(traceback.format_exception(failure.error))
    kept = [(k, v) for k, v in (record.headers or ()) if not k.startswith(PREFIX) or k == REPLAYS]
    added = {
        "topic": topic,
        "partition": str(partition),
        "offset": str(record.offset),
        "timestamp": str(record.timestamp),
        "error.class": error_class(failure.error),
        "error.message": _bounded(str(failure.error), MAX_MESSAGE),
        "error.stacktrace": _bounded(stack, MAX_STACKTRACE),
        "stage": str(failure.stage),
        "app": app_id,
        "instance": instance_id,
        "attempts": str(failure.attempts),
        "failed_at": now.isoformat(timespec="milliseconds"),
    }
    return kept + [(PREFIX + name, value.encode("utf-8")) for name, value in added.items()]


def within(
    key: bytes | None, value: bytes | None, headers: list[Header], limit: int
) -> tuple[bytes | None, bytes | None, list[Header]]:
    """A dead letter that fits the DLQ's `limit`: a value too large is cut to fit, and the
    `truncated_from` header keeps its original size. A cut copy cannot be replayed as it is,
    but the failure is not lost: its origin headers say where the whole record is."""
    size = record_size(key, value, headers)
    if size <= limit or not value:
        return key, value, headers
    headers = [*headers, (TRUNCATED_FROM, str(len(value)).encode())]
    excess = record_size(key, value, headers) - limit
    return key, value[: max(0, len(value) - excess)], headers


@dataclass(frozen=True)
class DeadLetter:
    """One record read back from the DLQ."""

    dlq_partition: int
    dlq_offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]

    def header(self, name: str, default: str = "") -> str:
        for key, value in self.headers:
            if key == PREFIX + name or key == name:
                return value.decode("utf-8", "replace")
        return default

    @property
    def origin_topic(self) -> str:
        return self.header("topic")

    @property
    def origin_partition(self) -> int:
        return int(self.header("partition", "-1"))

    @property
    def origin_offset(self) -> int:
        return int(self.header("offset", "-1"))

    @property
    def failed_at(self) -> dt.datetime | None:
        raw = self.header("failed_at")
        return dt.datetime.fromisoformat(raw) if raw else None

    @property
    def truncated_from(self) -> int | None:
        """The original value's size when this copy was cut to fit the DLQ, else None."""
        raw = self.header("truncated_from")
        return int(raw) if raw else None

    @property
    def replays(self) -> int:
        return int(self.header(REPLAYS, "0") or 0)

    def original_headers(self) -> list[Header]:
        return [(k, v) for k, v in self.headers if not k.startswith(PREFIX)]

    def replay_headers(self, dlq_topic: str) -> list[Header]:
        """Original headers plus the replay count and this dead letter's address."""
        return [
            *self.original_headers(),
            (REPLAYS, str(self.replays + 1).encode()),
            (REPLAYED_FROM, f"{dlq_topic}/{self.dlq_partition}/{self.dlq_offset}".encode()),
        ]

    def decoded_value(self) -> object:
        if self.value is None:
            return None
        try:
            return orjson.loads(self.value)
        except orjson.JSONDecodeError:
            return self.value.decode("utf-8", "replace")

    def summary(self, now: dt.datetime) -> dict[str, object]:
        failed = self.failed_at
        age = (now - failed).total_seconds() if failed else None
        return {
            "dlq": f"{self.dlq_partition}@{self.dlq_offset}",
            "origin": f"{self.origin_topic}[{self.origin_partition}]@{self.origin_offset}",
            "stage": self.header("stage"),
            "error": self.header("error.class"),
            "message": self.header("error.message"),
            "attempts": self.header("attempts"),
            "replays": self.replays,
            "age_s": round(age, 1) if age is not None else None,
        }


@dataclass(frozen=True)
class Selection:
    """Which dead letters a list or replay applies to; every given criterion must match."""

    error_class: str | None = None
    stage: str | None = None
    origin_partition: int | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    def matches(self, letter: DeadLetter) -> bool:
        if self.error_class and not (
            letter.header("error.class") == self.error_class
            or letter.header("error.class").endswith("." + self.error_class)
        ):
            return False
        if self.stage and letter.header("stage") != self.stage:
            return False
        if self.origin_partition is not None and letter.origin_partition != self.origin_partition:
            return False
        if self.min_offset is not None and letter.origin_offset < self.min_offset:
            return False
        if self.max_offset is not None and letter.origin_offset > self.max_offset:
            return False
        failed = letter.failed_at
        if self.since is not None and (failed is None or failed < self.since):
            return False
        return not (self.until is not None and (failed is None or failed > self.until))

    def select(self, letters: Iterable[DeadLetter]) -> list[DeadLetter]:
        return [letter for letter in letters if self.matches(letter)]


def format_table(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> str:
    """A plain aligned text table (no dependency, copy-paste friendly)."""
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    for row in rows:
        lines.append("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))
    return "\n".join(lines)
