"""A test helper: how much of a store a piece of code reads."""

from __future__ import annotations

from typing import Any


class Seeks:
    """A real store that counts the entries its iterators hand out."""

    def __init__(self, store: Any) -> None:
        self.store, self.read = store, 0

    def items(self, start=None, **options):
        for item in self.store.items(start, **options):
            self.read += 1
            yield item

    def __getattr__(self, name):
        return getattr(self.store, name)
