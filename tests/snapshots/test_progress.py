"""The state every instance keeps of a live snapshot (pure): what a late joiner learns, what is
exported by whom, and the one line a snapshot fails with."""

from __future__ import annotations

from enhydra.snapshots.progress import (
    FAIL_GRACE_S,
    ORPHAN_GRACE_S,
    SNAPSHOT_CLAIM,
    SNAPSHOT_CREATE,
    SNAPSHOT_DONE,
    SNAPSHOT_PART,
    SNAPSHOT_REQUEST,
    Progress,
)

SID = "ledger-20261127T050000000000Z"


def part(partition: int, instance: str = "a", cut: int = 10) -> dict:
    return {
        "type": SNAPSHOT_PART,
        "id": SID,
        "partition": partition,
        "instance": instance,
        "cut": cut,
        "file": {"file": f"store=accounts/partition={partition}.parquet"},
    }


def test_a_member_that_joins_mid_snapshot_learns_all_of_it_from_one_announcement():
    old = Progress(4, 300)
    old.on_message({"type": SNAPSHOT_CREATE, "id": SID, "storage": "/s"}, now=0)
    old.on_message({"type": SNAPSHOT_REQUEST, "id": SID, "storage": "/s", "deadline_at": 60}, 1)
    old.on_message(part(0), now=2)
    old.on_message(
        {"type": SNAPSHOT_CLAIM, "id": SID, "partition": 1, "instance": "b", "cut": 7}, now=2
    )
    announced = {"type": SNAPSHOT_REQUEST, **old.snapshots[SID].announcement()}

    joiner = Progress(4, 300)
    first = joiner.on_message(announced, now=3)
    assert first is not None and first.started and first.deadline_at == 60
    assert sorted(first.parts) == [0]
    assert first.missing(4) == [1, 2, 3]
    # It exports what it serves and nobody reported, one snapshot per partition at a time.
    assert joiner.to_take(serving=[0, 1, 3], busy=[3]) == [(SID, 1)]


def test_a_request_is_taken_only_once_it_started_and_reports_are_kept_first_come():
    progress = Progress(2, 300)
    progress.on_message({"type": SNAPSHOT_CREATE, "id": SID, "storage": "/s"}, now=0)
    assert progress.to_take(serving=[0, 1], busy=[]) == [], "the before hooks have not run"
    progress.on_message({"type": SNAPSHOT_REQUEST, "id": SID, "storage": "/s"}, now=1)
    progress.on_message(part(0, "a", cut=5), now=2)
    progress.on_message(part(0, "b", cut=9), now=2)  # a second owner exported it too
    snapshot = progress.snapshots[SID]
    assert snapshot.parts[0]["instance"] == "a"
    assert not snapshot.complete(2)
    progress.on_message(part(1, "b"), now=3)
    assert snapshot.complete(2)


def test_a_report_of_an_unknown_snapshot_or_after_done_changes_nothing():
    progress = Progress(2, 300)
    assert progress.on_message(part(0), now=0) is None and not progress.snapshots
    progress.on_message({"type": SNAPSHOT_REQUEST, "id": SID, "storage": "/s"}, now=1)
    progress.on_message({"type": SNAPSHOT_DONE, "id": SID}, now=2)
    assert not progress.snapshots
    progress.on_message({"type": SNAPSHOT_REQUEST, "id": SID, "storage": "/s"}, now=3)
    assert not progress.snapshots, "a late announcement must not revive a finished snapshot"


def test_it_fails_at_its_deadline_naming_each_missing_partition_and_why():
    progress = Progress(4, 30)
    progress.on_message({"type": SNAPSHOT_REQUEST, "id": SID, "storage": "/s", "owners": {}}, 0)
    snapshot = progress.snapshots[SID]
    progress.on_message(part(0), now=1)
    progress.on_message(
        {"type": SNAPSHOT_CLAIM, "id": SID, "partition": 1, "instance": "b", "cut": 7}, now=1
    )
    snapshot.owners[2] = "b"
    assert progress.overdue(29, coordinator=True) == []
    assert progress.overdue(31, coordinator=True) == [snapshot]
    assert progress.overdue(31, coordinator=False) == [], "the coordinator says it first"
    assert progress.overdue(31 + FAIL_GRACE_S, coordinator=False) == [snapshot]
    assert snapshot.why_missing(4) == (
        "partitions [1, 2, 3] not exported (1: claimed by b at cut 7, never reported; "
        "2: last owned by b, not claimed; 3: no owner seen)"
    )


def test_a_file_written_by_a_writer_that_never_reported_fails_it_soon_and_says_so():
    progress = Progress(2, 300)
    progress.on_message({"type": SNAPSHOT_REQUEST, "id": SID, "storage": "/s"}, now=0)
    snapshot = progress.snapshots[SID]
    snapshot.orphans[1] = 5.0
    assert progress.to_take(serving=[1], busy=[]) == []
    assert progress.overdue(5 + ORPHAN_GRACE_S + 1, coordinator=True) == [snapshot]
    assert "1: its file was written by an instance that stopped" in snapshot.why_missing(2)
    progress.on_message(part(1), now=6)  # its writer was only slow: the report clears it
    assert not snapshot.orphans and snapshot.missing(2) == [0]


def test_stats_show_each_partition_written_cutting_or_waiting():
    progress = Progress(3, 60)
    progress.on_message({"type": SNAPSHOT_REQUEST, "id": SID, "storage": "/s"}, now=0)
    progress.on_message(part(0, "a", cut=4), now=1)
    progress.on_message(
        {"type": SNAPSHOT_CLAIM, "id": SID, "partition": 1, "instance": "b", "cut": 7}, now=1
    )
    [described] = progress.describe(now=10)
    assert described["written"] == 1 and described["seconds_left"] == 50
    assert described["partitions"] == {
        "0": {"state": "written", "by": "a", "cut": 4},
        "1": {"state": "cutting", "by": "b", "cut": 7},
        "2": {"state": "waiting", "owner": None},
    }


def test_the_cli_shows_every_partition_in_one_line():
    from enhydra.cli.snapshot import describe_progress

    progress = Progress(3, 60)
    progress.on_message({"type": SNAPSHOT_REQUEST, "id": SID, "storage": "/s"}, now=0)
    progress.on_message(part(0, "a", cut=4), now=1)
    progress.on_message(
        {"type": SNAPSHOT_CLAIM, "id": SID, "partition": 1, "instance": "b", "cut": 7}, now=1
    )
    progress.snapshots[SID].owners[2] = "b"
    [state] = progress.describe(now=2)
    assert describe_progress(state) == (
        f"snapshot {SID}: 1/3 written; p0 written by a at 4, p1 cutting at 7 on b, p2 waiting for b"
    )
