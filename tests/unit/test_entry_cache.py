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
