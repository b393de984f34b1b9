"""Properties of the batch core that make state effectively-once and batch-size independent."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from enhydra.contracts.codec import Entry, decode_entry, encode_entry
from enhydra.processing.core import InputRecord, process_batch
from ledger.domain import accounts
from ledger.workload import generate


def records(commands: list, start: int = 0) -> list[InputRecord]:
    import orjson

    return [
        InputRecord(start + i, key.encode(), orjson.dumps(cmd))
        for i, (key, cmd) in enumerate(commands)
    ]


def run(batches: list[list[InputRecord]], window: int = 100) -> dict[str, Entry]:
    store: dict[str, Entry] = {}
    for batch in batches:
        store.update(process_batch(accounts, batch, store.get, dedup_window=window).changed)
    return store


COMMANDS = generate(40, 600, seed=5)


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, len(COMMANDS)), max_size=12))
def test_batch_boundaries_do_not_change_the_state(cuts: list[int]) -> None:
    recs = records(COMMANDS)
    bounds = [0, *sorted(set(cuts)), len(recs)]
    batches = [recs[a:b] for a, b in itertools.pairwise(bounds)]
    assert {k: e.state for k, e in run(batches).items()} == {
        k: e.state for k, e in run([recs]).items()
    }


@settings(max_examples=60, deadline=None)
@given(replay_from=st.integers(0, len(COMMANDS)), crash_at=st.integers(0, len(COMMANDS)))
def test_redelivered_records_are_not_applied_twice(replay_from: int, crash_at: int) -> None:
    """At-least-once delivery: after a crash, records from an earlier offset come again."""
    recs = records(COMMANDS)
    replay_from = min(replay_from, crash_at)
    once = run([recs])
    twice = run([recs[:crash_at], recs[replay_from:]])
    assert {k: e.state for k, e in twice.items()} == {k: e.state for k, e in once.items()}


def test_redelivery_is_counted_as_skipped() -> None:
    recs = records(COMMANDS[:50])
    store: dict[str, Entry] = {}
    store.update(process_batch(accounts, recs, store.get).changed)
    again = process_batch(accounts, recs, store.get)
    assert again.changed == {} and again.emitted == []
    assert again.skipped == len({r.offset for r in recs if r.key}) - len(again.rejected)


def test_dedup_window_is_bounded() -> None:
    cmds = [("k", {"command_id": "open", "type": "open", "account": "k"})] + [
        ("k", {"command_id": f"d{i}", "type": "deposit", "account": "k", "amount": 1})
        for i in range(10)
    ]
    store = run([records(cmds)], window=3)
    assert store["k"].command_ids == ["d7", "d8", "d9"]
    # An id that fell out of the window is accepted again: the window is the retry horizon.
    late = records([("k", cmds[1][1])], start=100)
    assert process_batch(accounts, late, store.get, dedup_window=3).emitted


def test_entry_round_trip() -> None:
    entry = Entry({"balance": 3, "status": "open", "version": 2}, 41, ["a", "b"])
    assert decode_entry(encode_entry(entry)) == entry


def test_entries_given_by_load_are_never_changed() -> None:
    """The engine serves `load` from a cache of persisted entries: the core may not touch them."""
    store = run([records(COMMANDS[:300])])
    before = {key: encode_entry(entry) for key, entry in store.items()}
    result = process_batch(accounts, records(COMMANDS[300:], start=300), store.get)
    assert result.changed  # the batch did update keys that were loaded...
    assert {key: encode_entry(entry) for key, entry in store.items()} == before  # ...as copies


def test_many_updates_of_one_key_in_a_batch_keep_the_window() -> None:
    cmds = [("k", {"command_id": "open", "type": "open", "account": "k"})] + [
        ("k", {"command_id": f"d{i}", "type": "deposit", "account": "k", "amount": 1})
        for i in range(6)
    ]
    result = process_batch(accounts, records(cmds), {}.get, dedup_window=4)
    entry = result.changed["k"]
    assert (entry.state["balance"], entry.offset) == (6, 6)
    assert entry.command_ids == ["d2", "d3", "d4", "d5"]
    assert [e.command_id for e in result.emitted] == ["open", *(f"d{i}" for i in range(6))]
