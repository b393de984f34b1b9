"""Fencing a cut-off owner under at-least-once: owner epochs on changelog records (pure).

Kafka has no conditional write, and at-least-once has no transactions to fence a previous
owner. An owner cut off from the brokers right after it handed a changelog batch to its
producer may see that batch land minutes later, after the next owner's newer entries: the
changelog's last record for a key would then be the older state. So every changelog record
carries the epoch of the owner that wrote it (contracts/headers.py), and:

- a new owner writes with `next_epoch`: above every epoch its restored copy applied and at
  least the group generation that gave it the task (two owners that cannot see each other's
  records still differ, as each rebalance raises the generation);
- restores and standbys `admit` a record only if its epoch is not below the highest epoch
  they already applied: a late write of an older owner is skipped;
- the current owner notices foreign records between its own (`gaps`: the offsets the broker
  gave its batches are not contiguous) and writes the current value again for each key an
  older owner wrote there (`stale_keys`), so the last record per key, the one compaction
  keeps, is the newest state again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from enhydra.contracts.headers import record_epoch

Range = tuple[int, int]  # [start, end) offsets of one partition


def next_epoch(highest_applied: int, generation: int) -> int:
    """The epoch of a new owner whose copy applied up to `highest_applied` (-1: none)."""
    return max(highest_applied + 1, generation, 1)


@dataclass(frozen=True, slots=True)
class Admitted:
    """What a reader applies of some changelog records."""

    puts: list[tuple[bytes, bytes | None]]
    last: int | None  # offset of the last record applied; None when every one was skipped
    epoch: int  # the highest epoch applied, these records included
    skipped: int  # records of an older owner that landed after a newer owner's


def admitted(records: Iterable[Any], highest: int = -1) -> Iterator[tuple[Any, int]]:
    """(record, the highest epoch so far) for each record (in offset order of one partition)
    that a copy which applied up to epoch `highest` applies; the others are skipped.

    A record without an epoch claims none (exactly-once, or written before epochs): applied.
    """
    for record in records:
        epoch = record_epoch(record.headers)
        if epoch is not None:
            if epoch < highest:
                continue
            highest = epoch
        yield record, highest


def admit(records: Iterable[Any], highest: int) -> Admitted:
    """What a copy that applied up to epoch `highest` applies of `records` (in offset order)."""
    records = list(records)
    puts: list[tuple[bytes, bytes | None]] = []
    last = None
    for record, running in admitted(records, highest):
        puts.append((record.key, record.value))
        last, highest = record.offset, running
    return Admitted(puts, last, highest, len(records) - len(puts))


def gaps(expected: int, batches: Sequence[Range]) -> tuple[list[Range], int]:
    """Offsets an owner did not write between its own batches, and the next offset it expects.

    `expected` is where its next record should land if nobody else writes; `batches` are the
    [start, end) ranges the broker gave its batches.
    """
    found: list[Range] = []
    for start, end in sorted(batches):
        if start > expected:
            found.append((expected, start))
        expected = max(expected, end)
    return found, expected


def stale_keys(records: Iterable[Any], epoch: int) -> list[bytes]:
    """Keys written by an owner older than `epoch`, each once, in the order they appear."""
    keys: dict[bytes, None] = {}
    for record in records:
        written = record_epoch(record.headers)
        if written is not None and written < epoch and record.key is not None:
            keys[record.key] = None
    return list(keys)
