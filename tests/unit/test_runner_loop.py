"""The task runner's loop against fakes: a fake consumer and producer, real RocksDB stores.

In the manner of Kafka Streams' StreamThreadTest: drive the loop's steps one at a time
(process a batch, land the flights, stall, retry) and check what reaches the topics and the
stores. The checkpoint is the real at-least-once one, with a producer that acknowledges when
the test says so.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

from enhydra.assignment.protocol import MemberAssignment
from enhydra.runner import runner as runner_module
from enhydra.runner.batch import StepOutput
from enhydra.runner.checkpoint import AtLeastOnce, Flight, MembershipLost, begin_flight
from enhydra.runner.runner import TaskRunner
from enhydra.runner.tasks import TaskStatus
from enhydra.settings import Settings
from enhydra.sql.commit import PositionMoved

INPUT, CHANGELOG, EVENTS = "in", "in-changelog", "events"


@dataclass
class Record:
    offset: int
    key: bytes
    value: bytes
    timestamp: int = 0


class Step:
    """One event and one changelog put per record: the key's value is the record's offset."""

    counters = ()
    reads_unpersisted = True  # the next batch is computed while the previous one flies

    def __call__(self, task, records, give_up) -> StepOutput:
        return StepOutput(
            outputs={EVENTS: [(r.key, r.value, None) for r in records]},
            puts=[(r.key, str(r.offset).encode()) for r in records],
            last_offset=records[-1].offset if records else -1,
        )

    def new_cache(self) -> None:
        return None


class Builder:
    def __init__(self) -> None:
        self.records: list[tuple[bytes | None, bytes | None]] = []

    def append(self, *, key, value, timestamp, headers):
        self.records.append((key, value))
        return True

    def close(self) -> None:
        pass


@dataclass
class Meta:
    offset: int


class Producer:
    """Acknowledges batches at once, or holds them until `release` when `hold` is set."""

    def __init__(self) -> None:
        self.hold = False
        self.held: list[tuple[asyncio.Future, int]] = []
        self.logs: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = {}
        self.fail_next = 0  # the next sends fail with a transient error

    def create_batch(self) -> Builder:
        return Builder()

    async def send_batch(self, builder: Builder, topic: str, partition: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if self.fail_next:
            self.fail_next -= 1
            future.set_exception(KafkaTimeoutError("no answer"))
            return future
        log = self.logs.setdefault((topic, partition), [])
        base = len(log)
        log.extend(builder.records)
        if self.hold:
            self.held.append((future, base))
        else:
            future.set_result(Meta(base))
        return future

    def release(self) -> None:
        held, self.held = self.held, []
        for future, base in held:
            future.set_result(Meta(base))

    def topic(self, topic: str) -> list[bytes | None]:
        return [v for (t, _), log in sorted(self.logs.items()) if t == topic for _, v in log]

    async def stop(self) -> None:
        pass


class Consumer:
    def __init__(self, partitions: set[int]) -> None:
        self.assigned = {TopicPartition(INPUT, p) for p in partitions}
        self.seeks: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.highwaters: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}
        self.commit_hangs = False
        self.positions: dict[TopicPartition, int] = {}  # what aiokafka returns next

    @property
    def _subscription(self) -> SimpleNamespace:
        """aiokafka's subscription state, as much of it as kafka.reading.fetch_position reads."""
        positions = self.positions

        def state_value(tp: TopicPartition) -> SimpleNamespace | None:
            if tp not in positions:
                return None
            return SimpleNamespace(has_valid_position=True, position=positions[tp])

        assignment = SimpleNamespace(state_value=state_value)
        return SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters.get(tp)

    async def commit(self, offsets) -> None:
        if self.commit_hangs:  # aiokafka with no coordinator: waits, whatever its timeout says
            await asyncio.Event().wait()
        self.committed.update(offsets)


class Reader:
    failure = None

    def lag(self, partition: int, checkpoint: int) -> int | None:
        return 0

    def set_copies(self, restoring, following) -> None:
        pass

    async def stop(self) -> None:
        pass


def records(partition_offsets: range, key: bytes = b"k") -> list[Record]:
    return [Record(o, key, str(o).encode()) for o in partition_offsets]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env(
        {},
        app_id="loop",
        state_dir=tmp_path,
        partitions=2,
        retry_backoff_ms=1,
        task_watchdog_ms=5000,
        shutdown_timeout_s=5,
    )


async def running(settings: Settings, partitions: set[int]) -> tuple[TaskRunner, Producer]:
    """A runner whose tasks are assigned and restored, with fake clients attached."""
    runner = TaskRunner(
        settings,
        name="store",
        group_id="loop",
        input_topic=INPUT,
        changelog_topic=CHANGELOG,
        step=Step(),
        output_topics=[EVENTS],
        transactional_prefix="loop-",
    )
    producer = Producer()
    checkpoint = AtLeastOnce(
        settings,
        client_id="t",
        input_topic=INPUT,
        changelog_topic=CHANGELOG,
        output_topics=[EVENTS],
        commit_offsets=runner._commit_offsets,
        retrying=runner._retrying,
    )
    checkpoint._producer = producer  # type: ignore[assignment]
    runner.attach(Consumer(partitions), checkpoint, Reader())  # type: ignore[arg-type]
    runner.registry.assign(partitions, MemberAssignment())
    for task in list(runner.registry.tasks.values()):
        assert runner.registry.restored(task)
    return runner, producer


def fail_next_flight(runner: TaskRunner, error: BaseException) -> None:
    """The commit unit's next flight fails with `error`; later ones fly as usual."""
    checkpoint = runner._checkpoint
    real_begin = checkpoint.begin

    def failing(*args: object) -> Flight:
        async def fly(flight: Flight) -> list:
            raise error

        checkpoint.begin = real_begin  # type: ignore[method-assign]
        return begin_flight(fly)

    checkpoint.begin = failing  # type: ignore[method-assign]


def stored(runner: TaskRunner, partition: int) -> tuple[int, bytes | None]:
    store = runner.registry.tasks[partition].store
    return store.input_offset, store.get(b"k")


async def test_batches_land_in_order_and_the_store_follows(settings: Settings) -> None:
    runner, producer = await running(settings, {0})
    tp = TopicPartition(INPUT, 0)
    await runner._process({tp: records(range(0, 3))})
    await runner._process({tp: records(range(3, 5))})
    await runner._land()
    assert producer.topic(EVENTS) == [b"0", b"1", b"2", b"3", b"4"]
    assert producer.topic(CHANGELOG) == [b"0", b"1", b"2", b"3", b"4"]
    assert stored(runner, 0) == (4, b"4")
    assert runner.stats["processed"] == 5 and runner._last_flight is None
    runner.registry.close_all()


async def test_a_batch_dropped_after_a_stall_does_not_hold_back_the_next_ones(
    settings: Settings,
) -> None:
    """The stall guard drops a flight whose outputs were acknowledged; the batch is read again.

    Before: the next flight still waited on the dropped one, was dropped in turn and
    published its events again, forever (5,306,270 events for 42,000 commands in the issue).
    """
    runner, producer = await running(settings, {0})
    tp = TopicPartition(INPUT, 0)
    producer.hold = True
    await runner._process({tp: records(range(0, 3))})  # flies: its events wait for an ack
    runner._stalled = True  # the process froze with the batch in hand
    producer.hold = False
    producer.release()
    await runner._land()  # the guard stops it before its changelog records
    assert runner.registry.tasks[0].store.get(b"k") is None
    assert runner._consumer.seeks[tp] == 0  # read again from its first record
    runner._stalled = False  # the group's next heartbeat said the tasks are still ours
    runner._rewinds.clear()
    for _ in range(3):  # the retry lands at once; later batches too
        await runner._process({tp: records(range(0, 3))})
        await runner._land()
        if stored(runner, 0)[0] == 2:
            break
    assert stored(runner, 0) == (2, b"2")
    await runner._process({tp: records(range(3, 4))})
    await runner._land()
    assert stored(runner, 0) == (3, b"3")
    # One batch's worth of duplicates for the fault, no more.
    assert producer.topic(EVENTS) == [b"0", b"1", b"2", b"0", b"1", b"2", b"3"]
    assert producer.topic(CHANGELOG) == [b"0", b"1", b"2", b"3"]
    runner.registry.close_all()


async def test_a_flight_its_commit_unit_calls_stale_is_read_again_after_a_heartbeat(
    settings: Settings,
) -> None:
    """A commit unit that finds another writer ahead (a SQL projection's position moved by a
    previous owner's late batch) stops its flight with PositionMoved: the runner reads the batch
    again and first lets the group's heartbeat say who owns the task; it does not fail."""
    runner, producer = await running(settings, {0})
    tp = TopicPartition(INPUT, 0)
    fail_next_flight(runner, PositionMoved("another writer folded ahead"))
    await runner._process({tp: records(range(0, 3))})
    await runner._land()
    assert runner.failure is None and runner._stalled
    assert runner._consumer.seeks[tp] == 0 and stored(runner, 0)[0] == -1
    await runner._process({tp: records(range(0, 3))})  # fetched before the heartbeat: again
    assert runner._consumer.seeks[tp] == 0 and producer.topic(EVENTS) == []
    runner._stalled = False  # the heartbeat: still ours
    runner._rewinds.clear()
    await runner._process({tp: records(range(0, 3))})
    await runner._land()
    assert stored(runner, 0) == (2, b"2") and producer.topic(EVENTS) == [b"0", b"1", b"2"]
    runner.registry.close_all()


async def test_a_flight_dropped_for_an_unconfirmed_membership_does_not_hold_the_tasks(
    settings: Settings,
) -> None:
    """MembershipLost drops the batch but leaves the watchdog free to call a task stuck: a
    member the group never confirms must end in a restart, not hold its tasks quietly."""
    runner, _ = await running(settings, {0})
    tp = TopicPartition(INPUT, 0)
    fail_next_flight(runner, MembershipLost("not confirmed"))
    await runner._process({tp: records(range(0, 3))})
    await runner._land()
    assert runner.failure is None and not runner._stalled
    assert runner._consumer.seeks[tp] == 0
    runner.registry.close_all()


async def test_a_batch_fetched_during_a_stall_is_read_again_not_processed(
    settings: Settings,
) -> None:
    runner, producer = await running(settings, {0, 1})
    tp0, tp1 = TopicPartition(INPUT, 0), TopicPartition(INPUT, 1)
    runner._stalled = True
    await runner._process({tp0: records(range(5, 9)), tp1: records(range(2, 4))})
    assert runner._consumer.seeks == {tp0: 5, tp1: 2}
    assert producer.topic(EVENTS) == [] and runner.stats["batches"] == 0
    # A second drop while still stalled never moves a partition forward past the first.
    await runner._process({tp0: records(range(9, 12))})
    assert runner._consumer.seeks[tp0] == 5
    runner.registry.close_all()


async def test_records_of_a_partition_not_running_here_are_rewound_not_skipped(
    settings: Settings,
) -> None:
    runner, _ = await running(settings, {0, 1})
    runner.registry.tasks[1].status = TaskStatus.SUSPENDED  # a rebalance began
    tp0, tp1 = TopicPartition(INPUT, 0), TopicPartition(INPUT, 1)
    await runner._process({tp0: records(range(0, 2)), tp1: records(range(7, 9))})
    await runner._land()
    assert runner._consumer.seeks == {tp1: 7}
    assert stored(runner, 0)[0] == 1 and stored(runner, 1)[0] == -1
    runner.registry.close_all()


async def test_a_task_with_input_waiting_and_no_progress_is_reported_stuck(
    settings: Settings,
) -> None:
    runner, _ = await running(settings, {0, 1})
    consumer = runner._consumer
    consumer.highwaters = {TopicPartition(INPUT, 0): 50, TopicPartition(INPUT, 1): 0}
    runner._check_progress(100.0)
    runner._check_progress(104.0)
    assert runner.registry.stuck == {}
    runner._check_progress(106.0)  # 6 s without progress, 50 records waiting (limit 5 s)
    stuck = runner.registry.stuck
    assert list(stuck) == [0] and stuck[0].waiting == 50 and stuck[0].phase == "processing"
    assert "partition 0 made no processing progress" in stuck[0].reason()
    assert runner.registry.watchdog.trips == 1
    # Progress clears it.
    await runner._process({TopicPartition(INPUT, 0): records(range(0, 10))})
    await runner._land()
    runner._check_progress(107.0)
    assert runner.registry.stuck == {}
    runner.registry.close_all()


async def test_a_transaction_marker_after_the_last_record_is_no_work_waiting(
    settings: Settings,
) -> None:
    """An input written under exactly-once ends with a commit marker: the high watermark is one
    past the last record. Counted as a record waiting, every idle task would read as stuck."""
    runner, _ = await running(settings, {0})
    tp = TopicPartition(INPUT, 0)
    await runner._process({tp: records(range(0, 10))})
    await runner._land()
    consumer = runner._consumer
    consumer.highwaters, consumer.positions = {tp: 11}, {tp: 11}  # offset 10: the marker
    assert runner.input_lag() == {0: 0}
    for now in (100.0, 104.0, 110.0):
        runner._check_progress(now)
    assert runner.registry.stuck == {}
    # Records fetched and in hand, or not fetched yet, are work waiting.
    # 10..19 skipped by the fetcher (markers, aborted records); 20..29 not fetched yet.
    consumer.highwaters, consumer.positions = {tp: 30}, {tp: 20}
    assert runner.input_lag() == {0: 10}
    runner._received[0] = 15  # 10..15 returned, not processed yet (a stalled batch)
    assert runner.input_lag() == {0: 6 + 10}
    runner.registry.close_all()


async def test_a_partition_held_at_a_snapshot_cut_is_not_stuck(settings: Settings) -> None:
    runner, _ = await running(settings, {0})
    runner._consumer.highwaters = {TopicPartition(INPUT, 0): 50}
    runner.stop_at(0, 0)
    for now in (100.0, 110.0, 120.0):
        runner._check_progress(now)
    assert runner.registry.stuck == {}
    runner.registry.close_all()


async def test_an_offset_commit_with_no_coordinator_is_given_up_not_waited_for(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka's commit waits for a coordinator however long: the runner bounds it."""
    monkeypatch.setattr(runner_module, "COMMIT_TIMEOUT_S", 0.2)
    runner, _ = await running(settings, {0})
    await runner._process({TopicPartition(INPUT, 0): records(range(0, 2))})
    await runner._land()
    runner._consumer.commit_hangs = True
    started = asyncio.get_running_loop().time()
    await runner._checkpoint.commit(force=True)  # logged; redelivery is skipped later
    assert asyncio.get_running_loop().time() - started < 2.0
    runner.registry.close_all()


async def test_stop_is_bounded_when_the_brokers_do_not_answer(settings: Settings) -> None:
    runner, producer = await running(settings, {0})
    producer.hold = True  # acknowledgements never come
    await runner._process({TopicPartition(INPUT, 0): records(range(0, 2))})
    runner._consumer.commit_hangs = True

    async def hangs() -> None:
        await asyncio.Event().wait()

    runner._background = [asyncio.ensure_future(hangs())]
    started = asyncio.get_running_loop().time()
    await runner.stop()
    took = asyncio.get_running_loop().time() - started
    assert took < settings.shutdown_timeout_s, took
    assert runner.registry.tasks == {}  # stores closed


async def test_a_transient_commit_failure_is_retried(settings: Settings) -> None:
    runner, _ = await running(settings, {0})
    calls = []

    async def flaky(offsets: Any) -> None:
        calls.append(offsets)
        if len(calls) == 1:
            raise KafkaTimeoutError("coordinator moving")

    runner._consumer.commit = flaky  # type: ignore[method-assign]
    await runner._commit_offsets({TopicPartition(INPUT, 0): 3})
    assert len(calls) == 2
    runner.registry.close_all()


async def test_a_batch_is_committed_through_a_transaction_marker_past_its_last_record(
    settings: Settings,
) -> None:
    """An input written under exactly-once ends each transaction with a commit marker: an offset
    with no record, which the consumer goes over. A batch that handled every record fetched is
    committed through it (the consumer's position), as Kafka Streams does; before, the group's
    committed offset stayed one short of the end, and every outside lag monitor read 1."""
    runner, _ = await running(settings, {0, 1})
    first, second = TopicPartition(INPUT, 0), TopicPartition(INPUT, 1)
    # partition 0: records 0..9 then the marker at 10; partition 1: no marker after 4
    await runner._process(
        {first: records(range(0, 10)), second: records(range(0, 5))}, {first: 11, second: 5}
    )
    await runner._land()
    await runner._checkpoint.commit()
    assert runner._consumer.committed == {first: 11, second: 5}
    assert stored(runner, 0) == (10, b"9") and stored(runner, 1) == (4, b"4")
    assert runner.stats["processed"] == 15  # the marker is not a record
    runner._consumer.highwaters = {first: 11, second: 5}
    assert runner.input_lag() == {0: 0, 1: 0}
    runner.registry.close_all()


async def test_a_batch_not_handled_to_its_end_is_not_committed_past_its_last_record(
    settings: Settings,
) -> None:
    """Only a step that handled every record fetched moves past what follows them: a transient
    error stops it at a record (the rest is read again), and records past a snapshot's cut are
    held back; either way the commit stays at the last record handled."""
    runner, _ = await running(settings, {0})
    tp = TopicPartition(INPUT, 0)

    class Interrupted(Step):
        def __call__(self, task, records, give_up) -> StepOutput:
            out = super().__call__(task, records[:3], give_up)
            out.interrupted = (records[3].offset, KafkaTimeoutError("later"))
            return out

    runner.step = Interrupted()
    await runner._process({tp: records(range(0, 6))}, {tp: 7})
    await runner._land()
    await runner._checkpoint.commit()
    assert runner._consumer.committed == {tp: 3}
    assert stored(runner, 0) == (2, b"2")
    runner.registry.close_all()


async def test_a_marker_fetched_alone_is_committed_through_by_an_empty_turn(
    settings: Settings,
) -> None:
    """A transaction's marker may come in a fetch of its own (the records before it were cut
    by max_records, or the transaction was aborted at the end of the log): the fetch returns
    no record but moves the position. An empty turn commits through it, once, and only with
    nothing in flight."""
    runner, producer = await running(settings, {0, 1})
    first, second = TopicPartition(INPUT, 0), TopicPartition(INPUT, 1)
    consumer = runner._consumer
    await runner._process({first: records(range(0, 10))}, {first: 10})
    await runner._land()
    consumer.positions = {first: 11, second: 3}  # the marker at 10 fetched alone
    producer.hold = True
    await runner._process({second: records(range(0, 3))}, {second: 3})
    assert runner._flights and runner._past_markers({}, {}) == {}  # a batch flies: not yet
    producer.hold = False
    producer.release()
    await runner._land()
    positions: dict = {}
    batch = runner._past_markers({}, positions)
    assert batch == {first: []} and positions == {first: 11}  # partition 1: nothing skipped
    await runner._process(batch, positions)
    await runner._land()
    await runner._checkpoint.commit()
    assert consumer.committed[first] == 11 and stored(runner, 0) == (10, b"9")
    assert runner.stats["processed"] == 13
    assert runner._past_markers({}, {}) == {}  # done once
    runner.registry.close_all()


async def test_a_batch_held_at_a_snapshot_cut_is_committed_at_the_cut(settings: Settings) -> None:
    """Records past a cut are read again after the export: the commit stays at the cut even
    when the consumer's position is past a marker beyond them."""
    runner, _ = await running(settings, {0})
    tp = TopicPartition(INPUT, 0)
    runner.cuts.stop_at(0, 5)
    await runner._process({tp: records(range(0, 10))}, {tp: 11})
    await runner._land()
    await runner._checkpoint.commit()
    assert runner._consumer.committed == {tp: 5} and stored(runner, 0) == (4, b"4")
    assert runner._consumer.seeks[tp] == 5
    runner.registry.close_all()
