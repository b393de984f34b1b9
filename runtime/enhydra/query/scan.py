"""Prefix and key-range scans over store partitions, and the merge of their pages.

Every partition is sorted by key bytes (RocksDB), and UTF-8 byte order is code point order, so
pages from any number of partitions and instances merge into one key-ordered page by comparing
the keys as strings. A cursor is the last key of a page: the next page starts strictly after it,
which stays correct while keys are added or removed between pages.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from enhydra.contracts.codec import decode_entry
from enhydra.query.openapi import BadRequest
from enhydra.stores.partition import PartitionStore

Item = tuple[str, Any]  # key, state


@dataclass(frozen=True)
class KeyRange:
    """Keys with `prefix`, in [start, end), strictly after `after` (a cursor)."""

    prefix: bytes = b""
    start: bytes | None = None
    end: bytes | None = None
    after: bytes | None = None

    @classmethod
    def from_args(
        cls, prefix: str | None, start: str | None, end: str | None, cursor: str | None
    ) -> KeyRange:
        return cls(
            prefix=(prefix or "").encode("utf-8"),
            start=start.encode("utf-8") if start else None,
            end=end.encode("utf-8") if end else None,
            after=decode_cursor(cursor) if cursor else None,
        )

    def seek(self) -> bytes:
        """The first key that can be in the range."""
        candidates = [self.prefix]
        if self.start is not None:
            candidates.append(self.start)
        if self.after is not None:
            candidates.append(self.after + b"\x00")  # the smallest key greater than `after`
        return max(candidates)

    def past(self, key: bytes) -> bool:
        """True once `key` (reached in key order from seek()) is beyond the range."""
        if self.end is not None and key >= self.end:
            return True
        return not key.startswith(self.prefix)


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> bytes:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("cursor", "is not a cursor returned by a scan") from None


def _keys(store: PartitionStore, rng: KeyRange) -> Iterator[tuple[bytes, bytes]]:
    for key, value in store.items(rng.seek()):
        if rng.past(key):
            return
        yield key, value


def scan_stores(stores: Iterable[PartitionStore], rng: KeyRange, limit: int) -> tuple[list, bool]:
    """The first `limit` items over `stores` in key order, and whether more follow.

    Runs without awaiting: a store can only be closed by the event loop, so it stays open for
    the whole read.
    """
    per_store: list[list[tuple[bytes, bytes]]] = []
    for store in stores:
        page = []
        for pair in _keys(store, rng):
            page.append(pair)
            if len(page) > limit:
                break
        per_store.append(page)
    merged = list(heapq.merge(*per_store, key=lambda pair: pair[0]))
    items = [
        (key.decode("utf-8", "replace"), decode_entry(value).state) for key, value in merged[:limit]
    ]
    return items, len(merged) > limit


def count_stores(stores: Iterable[PartitionStore], rng: KeyRange) -> int:
    """Every key of `rng` in `stores`, in one go: for small stores and tests (see count_slices)."""
    return sum(1 for store in stores for _ in _keys(store, rng))


COUNT_SLICE_S = 0.02  # the longest a count holds the event loop at a time
_CHECK_EVERY = 1024  # keys between two looks at the clock


def count_slice(
    store: PartitionStore, rng: KeyRange, budget_s: float = COUNT_SLICE_S
) -> tuple[int, bytes | None]:
    """Count keys of `rng` for about `budget_s`: (how many, the last key counted, or None when
    the range is done). The iterator does not outlive the call."""
    deadline = time.perf_counter() + budget_s
    counted, last = 0, None
    for key, _ in _keys(store, rng):
        counted += 1
        last = key
        if counted % _CHECK_EVERY == 0 and time.perf_counter() >= deadline:
            return counted, last
    return counted, None


async def count_slices(
    stores: Callable[[], list[PartitionStore]],
    rng: KeyRange,
    *,
    budget_s: float = COUNT_SLICE_S,
) -> int:
    """Count keys of `rng` over the stores, yielding the event loop every `budget_s`.

    A store of millions of keys takes seconds to count; on the loop in one go it froze
    processing, heartbeats and the liveness stream long enough for peers to take the instance
    for dead. Not on a thread either: a rebalance closes a store from the loop, which must not
    happen under a running RocksDB iterator. So the loop counts in slices, each with its own
    iterator that resumes after the last key counted, and asks `stores()` again after every
    pause (which raises when a partition moved away meanwhile). A key added or removed during
    the count is counted or not, as with any read that is not a snapshot.
    """
    total = 0
    index, after = 0, rng.after
    while True:
        current = stores()
        if index >= len(current):
            return total
        counted, last = count_slice(current[index], replace(rng, after=after), budget_s)
        total += counted
        if last is None:
            index, after = index + 1, rng.after
        else:
            after = last
        await asyncio.sleep(0)


def merge_pages(pages: Iterable[tuple[list[Item], bool]], limit: int) -> tuple[list[Item], bool]:
    """Merge key-ordered pages from several sources into the first `limit` items overall."""
    pages = list(pages)
    merged = list(heapq.merge(*(items for items, _ in pages), key=lambda item: item[0]))
    more = len(merged) > limit or any(more for _, more in pages)
    return merged[:limit], more
