"""The fold's pure core against the runtime's own batch core, without Spark.

A small engine simulation runs `process_batch` per partition like the Kafka engine does and
writes the events it would produce (with their headers) to per-partition logs, optionally
re-producing a batch's events as a crash between producing and persisting would. Folding those
logs must give exactly the entries the runtime stored.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enhydra.aggregate import Aggregate, Rejection
from enhydra.contracts.codec import Entry, decode_entry
from enhydra.contracts.fold_input import kafka_events_batch
from enhydra.contracts.headers import COMMAND_ID_HEADER, COMMAND_OFFSET_HEADER, EVENT_INDEX_HEADER
from enhydra.processing.core import InputRecord, process_batch
from enhydra.snapshots.format import partition_for
from enhydra.spark.fold import EventFold, FoldError, applied_events, fold_batches
from ledger.domain import accounts
from ledger.workload import generate


def _decide_counter(state: Any, command: dict[str, Any]) -> list[dict[str, Any]]:
    if command.get("times", 1) < 1:
        raise Rejection("times must be >= 1")
    return [{"add": command.get("amount", 1)}] * command.get("times", 1)


def _apply_counter(state: Any, event: dict[str, Any]) -> Any:
    total, count = state or (0, 0)
    return [total + event["add"], count + 1]


counter = Aggregate("counter", decide=_decide_counter, apply=_apply_counter)
# (key, events per command, amount, command number): commands of the counter
COUNTER_COMMANDS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.integers(0, 3),
        st.integers(-5, 5),
        st.integers(0, 12),
    ),
    max_size=60,
)


def run_engine(
    aggregate: Aggregate,
    commands: list[tuple[str, dict[str, Any]]],
    *,
    partitions: int = 3,
    batch: int = 5,
    window: int = 100,
    crash_every: int = 0,
    index_header: bool = False,
) -> tuple[dict[bytes, Entry], list[tuple[Any, ...]]]:
    """(stored entries, event rows) as the engine would leave them."""
    by_partition: dict[int, list[tuple[str, dict[str, Any]]]] = {p: [] for p in range(partitions)}
    for key, command in commands:
        by_partition[partition_for(key.encode(), partitions)].append((key, command))
    entries: dict[bytes, Entry] = {}
    rows: list[tuple[Any, ...]] = []
    for p, cmds in by_partition.items():
        store: dict[str, Entry] = {}
        log: list[tuple[Any, ...]] = []
        for number, start in enumerate(range(0, len(cmds), batch)):
            records = [
                InputRecord(start + i, key.encode(), orjson.dumps(command))
                for i, (key, command) in enumerate(cmds[start : start + batch])
            ]
            copies = 2 if crash_every and number % crash_every == 1 else 1
            for _ in range(copies):  # a crash before the store write re-runs the batch
                result = process_batch(aggregate, records, store.get, dedup_window=window)
                for emitted in result.emitted:
                    for i, event in enumerate(emitted.events):
                        index = str(i).encode() if index_header else None
                        cid, coff = emitted.command_id.encode(), str(emitted.offset).encode()
                        log.append((emitted.key.encode(), orjson.dumps(event), cid, coff, index))
            store.update(result.changed)
        entries.update((k.encode(), e) for k, e in store.items())
        rows.extend(
            (key, p, offset, value, cid, coff, index)
            for offset, (key, value, cid, coff, index) in enumerate(log)
        )
    return entries, rows


def kafka_batches(rows: list[tuple[Any, ...]], seed: int) -> list:
    """Engine rows as Kafka-shaped Arrow batches of random sizes (1 to 9 rows)."""
    rng = random.Random(seed)
    records = [
        (key, p, offset, value, _headers(cid, coff, index))
        for key, p, offset, value, cid, coff, index in rows
    ]
    batches, i = [], 0
    while i < len(records):  # Kafka-shaped batches, as both readers hand them to the fold
        size = rng.randint(1, 9)
        batches.append(kafka_events_batch(records[i : i + size]))
        i += size
    return batches


def fold(
    aggregate: Aggregate, rows: list[tuple[Any, ...]], *, window: int = 100, seed: int = 0
) -> dict[bytes, Entry]:
    """Sort like the Spark job, cut into batches of random sizes, fold."""
    batches = kafka_batches(sorted(rows, key=lambda r: (r[0], r[1], r[2])), seed)
    out: dict[bytes, Entry] = {}
    for batch in fold_batches(batches, aggregate, dedup_window=window):
        for row in batch.to_pylist():
            assert row["key"] not in out, "one row per key"
            out[row["key"]] = decode_entry(row["value"])
            assert orjson.loads(row["state"]) == out[row["key"]].state
            assert row["last_offset"] == out[row["key"]].offset
            assert row["key_text"] == row["key"].decode()
    return out


def _headers(cid: Any, coff: Any, index: Any) -> list[tuple[str, bytes]]:
    names = (COMMAND_ID_HEADER, COMMAND_OFFSET_HEADER, EVENT_INDEX_HEADER)
    named = zip(names, (cid, coff, index), strict=True)
    return [(name, value) for name, value in named if value is not None]


def same(a: dict[bytes, Entry], b: dict[bytes, Entry]) -> None:
    assert {k: (e.state, e.offset, e.command_ids) for k, e in a.items()} == {
        k: (e.state, e.offset, e.command_ids) for k, e in b.items()
    }


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    accounts_n=st.integers(1, 30),
    window=st.sampled_from([0, 1, 3, 100]),
)
def test_ledger_fold_equals_the_runtime_entries(seed: int, accounts_n: int, window: int) -> None:
    commands = generate(accounts_n, accounts_n * 8, seed=seed)
    entries, rows = run_engine(accounts, commands, window=window)
    same(fold(accounts, rows, window=window, seed=seed), entries)


@settings(max_examples=40, deadline=None)
@given(
    commands=COUNTER_COMMANDS,
    crash_every=st.sampled_from([0, 2, 3]),
    batch=st.integers(1, 6),
)
def test_multi_event_commands_and_crash_duplicates_with_an_event_index(
    commands: list[tuple[str, int, int, int]], crash_every: int, batch: int
) -> None:
    """With the event index the fold skips exactly what a redelivery re-produced."""
    cmds = [
        (key, {"command_id": f"{key}-{n}", "times": times, "amount": amount})
        for key, times, amount, n in commands
    ]
    entries, rows = run_engine(
        counter, cmds, batch=batch, crash_every=crash_every, index_header=True, window=4
    )
    same(fold(counter, rows, window=4), entries)


def test_multi_event_commands_without_an_index_are_applied_whole() -> None:
    cmds = [("k", {"command_id": f"c{i}", "times": 1 + i % 3, "amount": i}) for i in range(20)]
    entries, rows = run_engine(counter, cmds, batch=4)
    same(fold(counter, rows), entries)
    assert entries[b"k"].state == [sum(i * (1 + i % 3) for i in range(20)), 39]


def test_redelivered_events_of_a_batch_are_skipped_without_an_index() -> None:
    """A batch re-produced after a crash: the copies come after later commands of the key."""
    cmds = [("k", {"command_id": f"c{i}", "times": 1, "amount": i}) for i in range(12)]
    entries, rows = run_engine(counter, cmds, batch=3, crash_every=2)
    assert len(rows) > 12  # the log really holds duplicates
    same(fold(counter, rows), entries)


def test_command_ids_keep_the_window_oldest_first() -> None:
    cmds = [("k", {"command_id": f"c{i}", "times": 2}) for i in range(7)]
    _, rows = run_engine(counter, cmds, window=3)
    folded = fold(counter, rows, window=3)
    assert folded[b"k"].command_ids == ["c4", "c5", "c6"]
    assert folded[b"k"].offset == 6


def test_state_is_carried_across_batches() -> None:
    """One key's events spread over many Arrow batches still make one row."""
    cmds = [("only", {"command_id": f"c{i}", "amount": 1}) for i in range(100)]
    _, rows = run_engine(counter, cmds, partitions=1)
    folded = fold(counter, rows, seed=3)
    assert folded[b"only"].state == [100, 100]


def _row(key: bytes, partition: int, offset: int, value: bytes, coff: bytes = b"0") -> tuple:
    return (key, partition, offset, value, b"c" + coff, coff, None, None, None)


def test_errors_name_the_key_partition_and_offset() -> None:
    fold_ = EventFold(_apply_counter)
    with pytest.raises(FoldError, match="has events in partitions 0 and 1"):
        fold_.feed([_row(b"k", 0, 0, b'{"add":1}'), _row(b"k", 1, 5, b'{"add":1}', b"1")])
    with pytest.raises(FoldError, match=r"key b'x' at partition 2 offset 7: the event is not"):
        EventFold(_apply_counter).feed([_row(b"x", 2, 7, b"{not json")])
    with pytest.raises(FoldError, match=r"offset 3: apply failed on \{'nope': 1\}"):
        EventFold(_apply_counter).feed([_row(b"x", 0, 3, b'{"nope":1}')])
    with pytest.raises(FoldError, match=r"enhydra\.command_offset = b'x1' is not a number"):
        EventFold(_apply_counter).feed([_row(b"x", 0, 3, b'{"add":1}', b"x1")])
    with pytest.raises(FoldError, match="must be grouped by key"):
        EventFold(_apply_counter).feed(
            [_row(b"b", 0, 0, b'{"add":1}'), _row(b"a", 0, 1, b'{"add":1}', b"1")]
        )


def test_events_without_headers_change_state_not_bookkeeping() -> None:
    fold_ = EventFold(_apply_counter)
    fold_.feed([(b"k", 0, 0, b'{"add":2}', None, None, None, None, None)])
    (row,) = fold_.finish()
    assert decode_entry(row[2]) == Entry([2, 1], -1, [])


def test_keys_may_come_in_any_fixed_order_but_not_twice() -> None:
    """Spark sorts by a hash of the key first (fold_order): grouped, not sorted by key."""

    def row(key: bytes, order: int, offset: int) -> tuple:
        return (*_row(key, 0, offset, b'{"add":1}', str(offset).encode())[:-1], order)

    fold_ = EventFold(_apply_counter)
    out = fold_.feed([row(b"z", 1, 0), row(b"z", 1, 3), row(b"a", 2, 1)]) + fold_.finish()
    assert [(r[0], decode_entry(r[2]).state) for r in out] == [(b"z", [2, 2]), (b"a", [1, 1])]
    with pytest.raises(FoldError, match="must be grouped by key"):
        EventFold(_apply_counter).feed([row(b"z", 1, 0), row(b"a", 2, 1), row(b"z", 1, 3)])


# --------------------------------------------------------------------------- the hash fold


def log_order(rows: list[tuple[Any, ...]], seed: int) -> list[tuple[Any, ...]]:
    """Whole partitions as one task may get them: each in offset order, interleaved at random."""
    rng = random.Random(seed)
    queues = {}
    for row in sorted(rows, key=lambda r: (r[1], r[2])):
        queues.setdefault(row[1], []).append(row)
    out: list[tuple[Any, ...]] = []
    while queues:
        p = rng.choice(sorted(queues))
        take = rng.randint(1, 7)
        out += queues[p][:take]
        del queues[p][:take]
        if not queues[p]:
            del queues[p]
    return out


def output_rows(
    aggregate: Aggregate, rows: list[tuple[Any, ...]], *, hashed: bool, window: int, seed: int
) -> list[dict[str, Any]]:
    """Every output column of every key, as the hash fold (log order) or the sort fold gives it."""
    ordered = log_order(rows, seed) if hashed else sorted(rows, key=lambda r: (r[0], r[1], r[2]))
    batches = kafka_batches(ordered, seed)
    return [
        row
        for batch in fold_batches(batches, aggregate, dedup_window=window, hashed=hashed)
        for row in batch.to_pylist()
    ]


@settings(max_examples=40, deadline=None)
@given(
    commands=COUNTER_COMMANDS,
    crash_every=st.sampled_from([0, 2, 3]),
    batch=st.integers(1, 6),
    index_header=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_the_hash_fold_writes_the_sort_folds_rows_byte_for_byte(
    commands: list[tuple[str, int, int, int]],
    crash_every: int,
    batch: int,
    index_header: bool,
    seed: int,
) -> None:
    """Republished duplicates (a crash re-produces a batch), multi-event commands, with and
    without the event index: the same entries, and the same bytes, in the same (key) order."""
    cmds = [
        (key, {"command_id": f"{key}-{n}", "times": times, "amount": amount})
        for key, times, amount, n in commands
    ]
    entries, rows = run_engine(
        counter, cmds, batch=batch, crash_every=crash_every, index_header=index_header, window=4
    )
    hashed = output_rows(counter, rows, hashed=True, window=4, seed=seed)
    assert [r["key"] for r in hashed] == sorted(r["key"] for r in hashed)  # sorted by key
    assert hashed == sorted(
        output_rows(counter, rows, hashed=False, window=4, seed=seed), key=lambda r: r["key"]
    )
    if index_header:  # without the index, a duplicate right after its original is applied
        assert {r["key"]: decode_entry(r["value"]) for r in hashed} == entries


def test_the_hash_fold_of_a_ledger_with_crashes_is_the_runtimes() -> None:
    commands = generate(200, 3000, seed=7)
    entries, rows = run_engine(
        accounts, commands, crash_every=3, batch=20, partitions=4, index_header=True
    )
    assert len(rows) > len({(r[0], r[5]) for r in rows})  # the log holds republished copies
    hashed = output_rows(accounts, rows, hashed=True, window=100, seed=7)
    same({r["key"]: decode_entry(r["value"]) for r in hashed}, entries)
    assert hashed == sorted(
        output_rows(accounts, rows, hashed=False, window=100, seed=7), key=lambda r: r["key"]
    )


def test_the_hash_fold_applies_the_same_events_per_key() -> None:
    """The corrected history (`--emit-events`): per key the same events, in the same order."""
    cmds = [(k, {"command_id": f"{k}{i}", "times": 2}) for i in range(30) for k in "xyz"]
    _, rows = run_engine(counter, cmds, batch=4, crash_every=2, index_header=True)

    def per_key(hashed: bool) -> dict[bytes, list[tuple[Any, ...]]]:
        ordered = log_order(rows, 1) if hashed else sorted(rows, key=lambda r: (r[0], r[2]))
        out: dict[bytes, list[tuple[Any, ...]]] = {}
        for batch in applied_events(kafka_batches(ordered, 1), counter, hashed=hashed):
            for row in batch.to_pylist():
                out.setdefault(row["key"], []).append((row["value"], row["headers"]))
        return out

    assert per_key(True) == per_key(False)
    assert sum(map(len, per_key(True).values())) < len(rows)  # the copies were dropped


def test_offsets_that_go_backwards_are_refused_not_folded() -> None:
    """A reader that broke the offset order must not give a wrong state silently: hashed, a
    partition's offsets must rise (whatever the keys, across batches too); either way, each
    key's."""
    rows = [
        (b"a", 0, 0, b'{"add":1}', b"c0", b"0", None),
        (b"b", 0, 1, b'{"add":1}', b"c1", b"1", None),
        (b"a", 0, 3, b'{"add":1}', b"c3", b"3", None),
        (b"b", 0, 2, b'{"add":1}', b"c2", b"2", None),  # b is in order, the partition is not
        (b"c", 1, 0, b'{"add":1}', b"c0", b"0", None),
    ]
    for seed in range(5):  # whatever the batch boundaries
        with pytest.raises(
            FoldError,
            match=r"key b'b' at partition 0 offset 2: it comes after offset 3 of partition 0: "
            r".*rerun with --fold sort",
        ):
            list(fold_batches(kafka_batches(rows, seed), counter, hashed=True))
    assert len(list(fold_batches(kafka_batches(sorted(rows), 0), counter))) == 1  # sorted: fine
    key_backwards = [_row(b"a", 0, 0, b'{"add":1}'), _row(b"a", 0, 3, b'{"add":1}', b"3")]
    key_backwards.append(_row(b"a", 0, 2, b'{"add":1}', b"2"))
    where = r"key b'a' at partition 0 offset 2: it comes after offset 3 of the same key"
    for hashed in (True, False):
        with pytest.raises(FoldError, match=where):
            EventFold(_apply_counter, hashed=hashed).feed(key_backwards)
    with pytest.raises(FoldError, match="has events in partitions 0 and 1"):
        EventFold(_apply_counter, hashed=True).feed(
            [(*rows[0][:7], None, None), _row(b"a", 1, 9, b"{}")]
        )
