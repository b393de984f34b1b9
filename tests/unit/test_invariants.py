"""The fault tests' invariant checker on hand-made records: it must catch what it is meant to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from enhydra.contracts.codec import Entry, encode_entry
from enhydra.contracts.headers import epoch_headers, event_headers
from enhydra.testing.invariants import (
    Progress,
    Verdict,
    compare_state,
    event_copies,
    restored_state,
    resumed_partitions,
    zombie_writes,
)


@dataclass
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any = ()


def put(partition: int, offset: int, key: str, entry_offset: int, balance: int) -> Rec:
    state = {"balance": balance, "status": "open", "version": 1}
    value = encode_entry(Entry(state=state, offset=entry_offset, command_ids=["c"]))
    return Rec(partition, offset, key.encode(), value)


def event(command_id: str, command_offset: int, index: int, value: bytes = b"{}") -> Rec:
    return Rec(0, 0, b"k", value, event_headers(command_id.encode(), command_offset, index))


def test_offsets_that_only_grow_are_no_zombie_writes():
    log = [put(0, 0, "a", 3, 1), put(0, 1, "b", 1, 1), put(0, 2, "a", 3, 1), put(0, 3, "a", 7, 2)]
    assert zombie_writes(log) == []


def test_an_entry_older_than_an_earlier_one_of_its_key_is_a_zombie_write():
    log = [put(0, 0, "a", 5, 1), put(0, 1, "a", 9, 2), put(0, 2, "a", 6, 1), put(0, 3, "a", 10, 3)]
    [zombie] = zombie_writes(log)
    assert (zombie.offset, zombie.key, zombie.entry_offset, zombie.previous) == (2, "a", 6, 9)


def fenced(rec: Rec, epoch: int) -> Rec:
    return Rec(rec.partition, rec.offset, rec.key, rec.value, epoch_headers(epoch))


def test_a_late_record_of_an_older_owner_is_skipped_by_readers_not_a_zombie_write():
    """Readers skip it (runner/fencing.py) and the owner writes over it: not state."""
    log = [
        fenced(put(0, 0, "a", 5, 1), 1),
        fenced(put(0, 1, "a", 9, 2), 2),  # the new owner, epoch 2
        fenced(put(0, 2, "a", 6, 1), 1),  # the cut-off owner's batch lands late
    ]
    assert zombie_writes(log) == []
    assert restored_state(log)["a"]["balance"] == 2
    # The same late record without an epoch is what readers would apply: a zombie write.
    log[2] = put(0, 2, "a", 6, 1)
    assert len(zombie_writes(log)) == 1 and restored_state(log)["a"]["balance"] == 1


def test_keys_and_partitions_are_checked_apart():
    log = [put(0, 0, "a", 9, 1), put(1, 0, "a", 2, 1), put(0, 1, "b", 1, 1)]
    assert zombie_writes(log) == []


def test_restore_takes_each_keys_last_entry_and_tombstones_delete():
    log = [put(0, 0, "a", 1, 1), put(0, 1, "a", 2, 5), put(1, 0, "b", 1, 3)]
    log.append(Rec(1, 1, b"b", None))
    assert restored_state(log) == {"a": {"balance": 5, "status": "open", "version": 1}}


def test_state_diff_counts_matches_and_names_what_differs():
    diff = compare_state({"a": 1, "b": 2, "x": 0}, {"a": 1, "b": 3, "c": 4})
    assert (diff.matching, diff.expected, diff.missing, diff.extra) == (1, 3, ["c"], ["x"])
    assert diff.differing == [("b", 3, 2)] and not diff.ok
    assert compare_state({"a": 1}, {"a": 1}).ok


def test_one_event_per_command_and_index_holds_under_exactly_once():
    copies = event_copies([event("c1", 10, 0), event("c1", 10, 1), event("c2", 11, 0)])
    assert (copies.distinct, copies.duplicated) == (3, 0)
    assert copies.ok("exactly_once", expected=3)
    assert not copies.ok("exactly_once", expected=4)  # an event lost


def test_a_redelivered_copy_is_allowed_only_under_at_least_once():
    copies = event_copies([event("c1", 10, 0), event("c1", 10, 0)])
    assert copies.duplicated == 1 and not copies.conflicting
    assert copies.ok("at_least_once", expected=1)
    assert not copies.ok("exactly_once", expected=1)


def test_a_copy_from_another_command_offset_means_it_was_applied_twice():
    copies = event_copies([event("c1", 10, 0), event("c1", 12, 0)])
    assert copies.conflicting == [("c1", 0)]
    assert not copies.ok("at_least_once")
    different_payload = event_copies([event("c1", 10, 0, b"1"), event("c1", 10, 0, b"2")])
    assert not different_payload.ok("at_least_once")


def test_events_without_headers_fail_the_check():
    assert not event_copies([Rec(0, 0, b"k", b"{}", [])]).ok("at_least_once")


def test_a_partition_resumes_when_its_commit_moves_or_it_had_nothing_to_do():
    at_heal = {0: (10, 20), 1: (5, 5), 2: (7, 30)}
    resumed: dict[int, float | None] = {}
    resumed_partitions(at_heal, {0: (10, 25), 1: (5, 5), 2: (7, 31)}, 1.0, resumed)
    assert resumed == {0: None, 1: 1.0, 2: None}
    resumed_partitions(at_heal, {0: (15, 25), 1: (5, 5), 2: (7, 31)}, 2.5, resumed)
    assert resumed == {0: 2.5, 1: 1.0, 2: None}
    stuck = Progress(resumed_s=resumed, drained_s=None, lag={2: 24})
    assert not stuck.ok(resume_within=10)
    assert Progress(resumed_s={0: 2.5, 1: 1.0}, drained_s=4.0).ok(resume_within=10)
    assert not Progress(resumed_s={0: 12.0}, drained_s=14.0).ok(resume_within=10)


def test_a_verdict_lists_every_broken_invariant_with_its_numbers():
    log = [put(0, 0, "a", 5, 1), put(0, 1, "a", 4, 1)]
    verdict = Verdict(
        guarantee="exactly_once",
        state=compare_state(restored_state(log), {"a": {"balance": 2}}),
        zombies=zombie_writes(log),
        events=event_copies([event("c1", 1, 0), event("c1", 1, 0)]),
        expected_events=1,
        progress=Progress(resumed_s={0: None}, drained_s=None, lag={0: 7}),
    )
    problems = verdict.problems
    assert len(problems) == 4, problems
    assert "0/1 accounts match" in problems[0] and "1 zombie" in problems[1]
    assert "1 duplicated" in problems[2] and "lag {0: 7}" in problems[3]
    assert "accounts matching the model: 0/1" in verdict.summary()
