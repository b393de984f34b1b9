"""A store partition keeps data and checkpoints together across close and reopen."""

from __future__ import annotations

from pathlib import Path

from enhydra.stores.partition import PartitionStore


def test_data_and_checkpoints_survive_reopen(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p0")
    assert store.changelog_offset == -1 and store.input_offset == -1
    store.write([(b"a", b"1"), (b"b", b"2")], changelog_offset=10, input_offset=99)
    store.write([(b"a", None)], changelog_offset=11)
    store.close()
    again = PartitionStore(tmp_path / "p0")
    assert again.get(b"a") is None and again.get(b"b") == b"2"
    assert (again.changelog_offset, again.input_offset) == (11, 99)
    assert list(again.items()) == [(b"b", b"2")]
    again.close()


def test_items_are_in_key_order_from_a_start_key(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p1")
    store.write([(k.encode(), b"v") for k in ["c", "a", "d", "b"]])
    assert [k for k, _ in store.items(b"b")] == [b"b", b"c", b"d"]
    store.close()
