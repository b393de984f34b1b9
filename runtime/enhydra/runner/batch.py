"""What one batch is made of, as plain data: the pure step's output and the commit unit's input.

No I/O here: the aggregate's and the projection's steps build these, the checkpoint
(checkpoint.py) makes them durable, and neither side needs the other's modules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# (key, value, headers) of one output record; its topic and partition are where it is grouped.
Out = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]
Put = tuple[bytes, bytes | None]  # a changelog record: key, new value (None deletes)
# Where outputs go: a topic name (the input's partition number, co-partitioned outputs such as
# events), or (topic, partition) for records placed by their key (a reaction's commands).
Target = str | tuple[str, int]


def placed(target: Target, partition: int) -> tuple[str, int]:
    """The topic-partition of outputs grouped under `target` in `partition`'s batch."""
    return target if isinstance(target, tuple) else (target, partition)


@dataclass(slots=True)
class StepOutput:
    """What the pure step made of one partition's records."""

    outputs: dict[Target, list[Out]]  # records published before the changelog
    puts: list[Put]  # changelog records: the store's new values
    last_offset: int  # the last record handled (the next to read is last_offset + 1)
    counts: dict[str, int] = field(default_factory=dict)  # added to the runner's stats
    failed: list[str] = field(default_factory=list)  # "stage:ErrorClass" of records that failed
    # A transient error stopped the step at this record: (offset, error), retried after a backoff.
    interrupted: tuple[int, BaseException] | None = None
    persisted: Callable[[], None] | None = None  # called once the batch is durable
    # Span contexts of the sampled records (tracing on): the batch's span links to them.
    traced: Sequence[Any] = ()
    rows: Any = None  # what a commit unit of another kind writes (a SQL projection's rows)


@dataclass(frozen=True, slots=True)
class PartitionWrite:
    """What one partition's batch must make durable."""

    partition: int
    outputs: Mapping[Target, list[Out]]  # records, published before the changelog
    puts: list[Put]
    # The last input offset handled: the last record, or past it a transaction marker or an
    # aborted record the consumer went over (runner._process); -1 when none was.
    last_offset: int
    rows: Any = None  # StepOutput.rows, for a commit unit of another kind


class Step(Protocol):
    """The pure part of a batch: one partition's records -> what to make durable.

    A step whose reads see the entries of its own earlier outputs before they are durable
    (processing/cache.py keeps them staged) says so with `reads_unpersisted = True`, and may
    offer `slices(task, records, give_up, size)`: a generator that pauses after every `size`
    records and returns the StepOutput. The runner then lets the event loop run at each pause
    and computes a batch while the previous one flies. Without them, a batch is one call and
    is made durable before the next one is computed.
    """

    counters: tuple[str, ...]  # the stats this step counts, in display order

    def __call__(self, task: Any, records: list[Any], give_up: Mapping[int, int]) -> StepOutput: ...

    def new_cache(self) -> Any:
        """A per-task cache of decoded entries, or None."""
