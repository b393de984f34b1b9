"""Decoded entries of recently changed keys, so a hot key is not read and decoded every batch.

RocksDB holds bytes; reading a key and decoding its entry costs more than deciding a command
on it. Like Kafka Streams' record cache, this keeps the most recently written entries of an
active task in memory. Only entries that are already persisted (published, written to the
store) enter, so a batch that fails never leaves its state here, and the store stays the one
source of truth: the cache is dropped whenever the store may change under it (restore,
standby, rebalance). Bounded by a number of entries; 0 turns it off.
"""

from __future__ import annotations

from itertools import islice

from enhydra.contracts.codec import Entry


class EntryCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def persisted(self, changed: dict[str, Entry]) -> None:
        """These entries are now in the store: keep them, evicting the least recently written."""
        if not self.capacity:
            return
        entries = self._entries
        for key, entry in changed.items():
            entries.pop(key, None)  # re-inserted last: dict order is write order
            entries[key] = entry
        excess = len(entries) - self.capacity
        if excess > 0:
            for key in list(islice(entries, excess)):
                del entries[key]

    def clear(self) -> None:
        self._entries.clear()
