"""The engine's cache of decoded entries stays bounded and keeps the most recently written."""

from __future__ import annotations

from enhydra.contracts.codec import Entry
from enhydra.processing.cache import EntryCache


def entries(*keys: str, offset: int = 0) -> dict[str, Entry]:
    return {key: Entry({"n": offset}, offset) for key in keys}


def test_keeps_at_most_capacity_evicting_the_least_recently_written() -> None:
    cache = EntryCache(3)
    cache.persisted(entries("a", "b", "c"))
    cache.persisted(entries("a", offset=1))  # a is now the most recent write
    cache.persisted(entries("d", "e"))
    assert len(cache) == 3
    assert cache.get("b") is None and cache.get("c") is None
    assert cache.get("a") == Entry({"n": 1}, 1)
    assert cache.get("d") is not None and cache.get("e") is not None


def test_clear_and_zero_capacity() -> None:
    cache = EntryCache(10)
    cache.persisted(entries("a"))
    cache.clear()
    assert cache.get("a") is None
    off = EntryCache(0)
    off.persisted(entries("a", "b"))
    assert len(off) == 0 and off.get("a") is None


def test_staged_entries_are_read_first_until_their_batch_is_persisted() -> None:
    cache = EntryCache(10)
    cache.persisted(entries("a", "b", offset=1))
    first = entries("a", offset=2)  # a batch in flight
    cache.stage(first)
    assert cache.get("a") == Entry({"n": 2}, 2) and cache.get("b") == Entry({"n": 1}, 1)
    second = entries("a", offset=3)  # the next batch, computed while the first flies
    cache.stage(second)
    cache.persisted(first)  # the first lands: the second's entry stays the one read
    assert cache.get("a") == Entry({"n": 3}, 3)
    cache.persisted(second)
    assert cache.get("a") == Entry({"n": 3}, 3)
    cache.clear()
    assert cache.get("a") is None


def test_staged_entries_are_read_with_the_cache_off() -> None:
    off = EntryCache(0)
    flying = entries("a", offset=5)
    off.stage(flying)
    assert off.get("a") == Entry({"n": 5}, 5)  # correctness does not depend on the capacity
    off.persisted(flying)
    assert off.get("a") is None and len(off) == 0
