"""A live export places its file only after leaving its report beside it, so a writer killed
between placing and reporting loses nothing: whoever finds the file sends that report."""

from __future__ import annotations

import pytest

from enhydra.contracts.codec import Entry, encode_entry
from enhydra.snapshots.format import PartitionTaken, file_digest
from enhydra.snapshots.live import _place_with_report, left_report


def rows(n: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{i:03}".encode(), encode_entry(Entry({"n": i}, offset=i))) for i in range(n)]


def test_the_first_placed_file_keeps_its_report_and_a_later_writer_finds_it(tmp_path):
    first = _place_with_report(tmp_path, "accounts", 2, rows(5), {"instance": "a", "cut": 40})
    assert left_report(tmp_path, "accounts", 1) is None  # nothing placed there
    with pytest.raises(PartitionTaken):
        _place_with_report(tmp_path, "accounts", 2, rows(7), {"instance": "b", "cut": 90})
    # a died before sending its report: b sends the one a left, which describes the file kept
    left = left_report(tmp_path, "accounts", 2)
    assert left is not None and left["instance"] == "a" and left["cut"] == 40
    assert left["file"]["sha256"] == first.sha256 == file_digest(tmp_path / first.file)[0]
    assert left["file"]["rows"] == 5
    assert not list(tmp_path.glob(".staging-*")), "nothing of either writer's staging stays"
