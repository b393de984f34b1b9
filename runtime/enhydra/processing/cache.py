"""Decoded entries of recently changed keys, so a hot key is not read and decoded every batch.

RocksDB holds bytes; reading a key and decoding its entry costs more than deciding a command
on it. Like Kafka Streams' record cache, this keeps the most recently written entries of an
active task in memory. Only entries that are already persisted (published, written to the
store) enter, so a batch that fails never leaves its state here, and the store stays the one
source of truth: the cache is dropped whenever the store may change under it (restore,
standby, rebalance). Bounded by a number of entries; 0 turns it off.

Entries of batches still on their way to durable are `staged`: the next batch (or the next
slice of this one) must read them, not the older stored value. They leave the stage when their
batch is persisted, and are dropped with the cache; the stage is never bounded, it only ever
holds the batches in flight.
"""

from __future__ import annotations

from itertools import islice

from enhydra.contracts.codec import Entry


class EntryCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: dict[str, Entry] = {}
        self._staged: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Entry | None:
        """The newest entry known here: staged (in flight) first, then persisted."""
        entry = self._staged.get(key) if self._staged else None
        return entry if entry is not None else self._entries.get(key)

    def stage(self, changed: dict[str, Entry]) -> None:
        """A batch's entries, not yet durable: reads see them until `persisted` or `clear`."""
        self._staged.update(changed)

    def persisted(self, changed: dict[str, Entry]) -> None:
        """These entries are now in the store: keep them, evicting the least recently written."""
        staged = self._staged
        if staged:
            for key, entry in changed.items():
                if staged.get(key) is entry:  # not replaced by a later batch in flight
                    del staged[key]
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
        self._staged.clear()
