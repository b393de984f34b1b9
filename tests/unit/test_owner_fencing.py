"""A cut-off previous owner's late changelog write, at-least-once: skipped by readers, repaired.

Real RocksDB stores; the Kafka clients are fakes that keep a changelog partition as a list, so
a "zombie" record can land exactly between two of the owner's batches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from enhydra.contracts.headers import epoch_headers, record_epoch
from enhydra.kafka.liveness import GroupLiveness
from enhydra.runner import changelog_reader, checkpoint
from enhydra.runner.batch import PartitionWrite
from enhydra.runner.checkpoint import AtLeastOnce, MembershipLost
from enhydra.runner.fencing import admit, gaps, next_epoch, stale_keys
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore

TOPIC = "app-accounts-changelog"


@dataclass
class Record:
    offset: int
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def written(offset: int, key: bytes, value: bytes | None, epoch: int | None) -> Record:
    return Record(offset, key, value, epoch_headers(epoch) if epoch is not None else [])


# the pure core ------------------------------------------------------------------------------
def test_a_new_owner_writes_above_every_epoch_applied_and_at_least_its_generation() -> None:
    assert next_epoch(-1, -1) == 1
    assert next_epoch(6, 3) == 7
    assert next_epoch(2, 9) == 9


def test_admit_skips_only_records_below_the_highest_epoch_applied() -> None:
    records = [
        written(10, b"a", b"1", 2),
        written(11, b"b", b"1", 3),
        written(12, b"a", b"old", 2),  # a cut-off owner of epoch 2, landing late
        written(13, b"c", b"1", None),  # claims no epoch: applied
        written(14, b"a", b"2", 3),
    ]
    admitted = admit(records, highest=1)
    assert admitted.puts == [(b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"a", b"2")]
    assert (admitted.last, admitted.epoch, admitted.skipped) == (14, 3, 1)
    assert admit(records[:1], highest=3).skipped == 1


def test_gaps_are_the_offsets_between_an_owners_batches() -> None:
    assert gaps(5, [(5, 8), (8, 9)]) == ([], 9)
    assert gaps(5, [(9, 12), (6, 8)]) == ([(5, 6), (8, 9)], 12)
    records = [written(6, b"a", b"x", 4), written(7, b"b", b"x", 5), written(8, b"a", b"y", 4)]
    assert stale_keys(records, 5) == [b"a"]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Record], dict[bytes, bytes]]:
    """Owners of rising epochs write in turn (each at least once); writes an earlier owner had
    handed over before it was cut off land among a later owner's."""
    keys = st.sampled_from([b"a", b"b", b"c", b"d"])
    log: list[tuple[bytes, bytes, int]] = []
    truth: dict[bytes, bytes] = {}
    late: list[tuple[bytes, bytes, int]] = []
    for epoch in range(1, draw(st.integers(2, 5)) + 1):
        for key in draw(st.lists(keys, min_size=1, max_size=4)):
            value = b"%s-%d-%d" % (key, epoch, len(log))
            log.append((key, value, epoch))
            truth[key] = value
            if late and draw(st.booleans()):
                log.append(late.pop(draw(st.integers(0, len(late) - 1))))
        late += [(k, b"late-%d" % epoch, epoch) for k in draw(st.lists(keys, max_size=3))]
    return [written(i, k, v, e) for i, (k, v, e) in enumerate(log)], truth


@given(histories())
def test_admit_keeps_exactly_the_writes_of_current_owners(history) -> None:
    records, truth = history
    state: dict[bytes, bytes | None] = {}
    for key, value in admit(records, -1).puts:
        state[key] = value
    assert state == truth


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4)), max_size=12), st.integers(0, 50))
def test_gaps_are_exactly_the_foreign_offsets(runs, start) -> None:
    ours, foreign, offset = [], set(), start
    for mine, length in runs:
        if mine:
            ours.append((offset, offset + length))
        else:
            foreign.update(range(offset, offset + length))
        offset += length
    found, expected = gaps(start, ours)
    assert {o for a, b in found for o in range(a, b)} == {o for o in foreign if o < expected}
    assert expected == (max(b for _, b in ours) if ours else start)


# restore and standbys ----------------------------------------------------------------------
class FakeConsumer:
    def assign(self, tps: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        pass

    def highwater(self, tp: TopicPartition) -> None:
        return None


@dataclass
class Copy:
    partition: int
    store: PartitionStore
    restore: dict[str, float] = field(default_factory=dict)


@pytest.mark.parametrize("role", ["restoring", "standby"])
async def test_restore_and_standby_skip_a_record_of_an_older_owner(
    role: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(changelog_reader, "new_consumer", lambda *a, **k: FakeConsumer())
    reader = changelog_reader.ChangelogReader(Settings(app_id="app"), TOPIC, lambda copy: None)
    store = PartitionStore(tmp_path / "0")
    copy = Copy(0, store)
    copies = {0: copy}
    reader.set_copies(copies if role == "restoring" else {}, copies if role == "standby" else {})
    reader._checked.add(store)
    tp = TopicPartition(TOPIC, 0)
    first = [written(0, b"a", b"a1", 1), written(1, b"b", b"b1", 1), written(2, b"a", b"a2", 2)]
    reader._write({tp: first})
    # The owner of epoch 1 was cut off; its last batch lands after the owner of epoch 2 wrote.
    reader._write({tp: [written(3, b"a", b"a1-late", 1), written(4, b"b", b"b1-late", 1)]})
    assert store.get(b"a") == b"a2"
    assert store.get(b"b") == b"b1"
    assert store.changelog_offset == 4
    assert store.owner_epoch == 2
    assert store.last_record is not None and store.last_record[0] == 2  # the last one applied
    reader._write({tp: [written(5, b"b", b"b2", 2)]})
    assert store.get(b"b") == b"b2"
    store.close()


# the owner ---------------------------------------------------------------------------------
@dataclass
class Meta:
    offset: int


class FakeBatch:
    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None, list]] = []

    def append(self, *, key, value, timestamp, headers):
        self.records.append((key, value, list(headers)))
        return True

    def close(self) -> None:
        pass


class FakeProducer:
    """Appends each batch to the partition's log at once, as a broker would."""

    def __init__(self, logs: dict[tuple[str, int], list[Record]]) -> None:
        self.logs = logs

    def create_batch(self) -> FakeBatch:
        return FakeBatch()

    async def send_batch(self, batch: FakeBatch, topic: str, partition: int):
        log = self.logs.setdefault((topic, partition), [])
        base = len(log)
        log.extend(Record(base + i, k, v, h) for i, (k, v, h) in enumerate(batch.records))
        future = asyncio.get_running_loop().create_future()
        future.set_result(Meta(base))
        return future


class FakeGroup:
    def __init__(self, generation: int) -> None:
        self.gen = generation
        self.fresh = True

    def assigned(self) -> None:
        pass

    def generation(self) -> int:
        return self.gen

    def age(self) -> float:
        return 0.0 if self.fresh else 99.0

    async def confirmed_within(self, max_age_s: float, wait_s: float) -> bool:
        return self.fresh


async def no_retries(what: str, call: Any, *args: Any) -> Any:
    return await call(*args)


async def nothing(offsets: Any) -> None:
    pass


def owner(
    monkeypatch: pytest.MonkeyPatch, logs: dict, group: FakeGroup, ends: Any = None
) -> AtLeastOnce:
    monkeypatch.setattr(checkpoint, "new_producer", lambda *a, **k: FakeProducer(logs))

    async def read_spans(conn, topic, spans, *, stall_timeout_s):
        return {p: logs[(topic, p)][start:end] for p, (start, end) in spans.items()}

    monkeypatch.setattr(checkpoint, "read_spans", read_spans)
    return AtLeastOnce(
        Settings(app_id="app"),
        client_id="c",
        input_topic="app-commands",
        changelog_topic=TOPIC,
        output_topics=[],
        commit_offsets=nothing,
        retrying=no_retries,
        group=group,  # type: ignore[arg-type]
        changelog_ends=ends,
    )


async def fly(ckpt: AtLeastOnce, store: PartitionStore, puts: list, last_offset: int) -> None:
    flight = ckpt.begin([PartitionWrite(0, {}, puts, last_offset)], {0: store}, None)
    await flight.done


def last_per_key(log: list[Record]) -> dict[bytes, tuple[bytes | None, int | None]]:
    return {r.key: (r.value, record_epoch(r.headers)) for r in log}


async def test_the_owner_writes_the_current_value_again_after_a_late_older_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs: dict[tuple[str, int], list[Record]] = {}
    store = PartitionStore(tmp_path / "0")
    store.write([], changelog_offset=-1, owner_epoch=3)  # restored: epoch 3 was the highest
    ckpt = owner(monkeypatch, logs, FakeGroup(generation=2))
    await ckpt.open_task(0)
    await fly(ckpt, store, [(b"a", b"a-new"), (b"b", b"b-new")], 10)
    log = logs[(TOPIC, 0)]
    assert {record_epoch(r.headers) for r in log} == {4}
    # The previous owner (epoch 3), cut off, had handed this to its producer before we took over.
    log.append(written(len(log), b"a", b"a-old", 3))
    await fly(ckpt, store, [(b"c", b"c-new")], 11)
    assert last_per_key(log) == {
        b"a": (b"a-new", 4),
        b"b": (b"b-new", 4),
        b"c": (b"c-new", 4),
    }
    assert store.changelog_offset == len(log) - 1
    assert store.owner_epoch == 4
    # A fresh copy restored from this changelog holds the newest state, compacted or not.
    fresh = PartitionStore(tmp_path / "fresh")
    compacted = sorted({r.key: r for r in log}.values(), key=lambda r: r.offset)
    fresh.write(admit(compacted, -1).puts)
    assert {k: fresh.get(k) for k in (b"a", b"b", b"c")} == {
        b"a": b"a-new",
        b"b": b"b-new",
        b"c": b"c-new",
    }
    store.close()
    fresh.close()


async def test_a_late_write_into_a_partition_nobody_writes_to_now_is_repaired_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs: dict[tuple[str, int], list[Record]] = {}
    store = PartitionStore(tmp_path / "0")
    ckpt = owner(monkeypatch, logs, FakeGroup(generation=5), ends=lambda: {0: len(log)})
    await ckpt.open_task(0)
    await fly(ckpt, store, [(b"a", b"a-new")], 3)
    log = logs[(TOPIC, 0)]
    await ckpt.commit()
    assert len(log) == 1  # nothing foreign: nothing written
    log.append(written(len(log), b"a", b"a-old", 4))  # lands after our last batch
    monkeypatch.setattr(checkpoint, "IDLE_CHECK_EVERY_S", 0.0)
    await ckpt.commit()
    assert last_per_key(log) == {b"a": (b"a-new", 5)}
    assert store.changelog_offset == len(log) - 1
    store.close()


async def test_no_changelog_record_is_sent_while_the_membership_is_unconfirmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs: dict[tuple[str, int], list[Record]] = {}
    store = PartitionStore(tmp_path / "0")
    group = FakeGroup(generation=1)
    ckpt = owner(monkeypatch, logs, group)
    await ckpt.open_task(0)
    group.fresh = False  # cut off: no heartbeat confirmed for a while
    with pytest.raises(MembershipLost):
        await fly(ckpt, store, [(b"a", b"1")], 0)
    assert logs.get((TOPIC, 0), []) == []
    assert store.get(b"a") is None and store.input_offset == -1
    group.fresh = True
    await fly(ckpt, store, [(b"a", b"1")], 0)
    assert store.get(b"a") == b"1"
    store.close()


# the membership, from aiokafka's coordinator -----------------------------------------------
class FakeCoordinator:
    def __init__(self) -> None:
        self.generation = 7
        self.answer = True

    async def _do_heartbeat(self) -> bool:
        await asyncio.sleep(0.01)
        return self.answer


class FakeGroupConsumer:
    def __init__(self) -> None:
        self._coordinator = FakeCoordinator()


async def test_the_membership_is_confirmed_by_the_join_and_by_successful_heartbeats() -> None:
    consumer = FakeGroupConsumer()
    group = GroupLiveness(lambda: consumer)
    assert group.age() == float("inf")  # never confirmed
    group.assigned()
    assert group.generation() == 7
    assert await group.confirmed_within(1.0, wait_s=0)
    await asyncio.sleep(0.2)
    assert not await group.confirmed_within(0.1, wait_s=0.05)  # no heartbeat came
    consumer._coordinator.answer = False
    await consumer._coordinator._do_heartbeat()
    assert group.age() >= 0.2  # a failed heartbeat confirms nothing
    consumer._coordinator.answer = True

    async def heartbeat_soon() -> None:
        await asyncio.sleep(0.05)
        await consumer._coordinator._do_heartbeat()

    beat = asyncio.create_task(heartbeat_soon())
    assert await group.confirmed_within(0.1, wait_s=1.0)
    await beat
