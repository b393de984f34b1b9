"""A record that could not be processed: where it failed and why (the error policies' input)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Stage(StrEnum):
    """Where a record failed: reading it, running decide/apply, or serializing its outputs."""

    DESERIALIZE = "deserialize"
    PROCESS = "process"
    PRODUCE = "produce"


@dataclass(slots=True)
class Failure:
    """A record that could not be processed, and why; the error policies decide its fate."""

    record: Any  # the Kafka record (offset, key, value, timestamp, headers)
    stage: Stage
    error: BaseException
    key: str | None = None
    attempts: int = 1
