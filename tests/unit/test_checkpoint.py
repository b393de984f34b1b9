"""The commit unit (runner/checkpoint.py) against fake producers and stores: no broker.

What is checked is the order of durable steps and what a retry sends again: flights keep batch
order, a failed flight fails every later one, the commit interval holds unless forced, the
stall guard stops a flight before its changelog, exactly-once runs a committed transaction
once and persists only what committed, at-least-once resends only unacknowledged batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.errors import (
    KafkaError,
    NotEnoughReplicasError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)

from enhydra.contracts.sizes import record_size
from enhydra.kafka.errors import transient
from enhydra.runner import checkpoint as ckpt
from enhydra.runner.batch import PartitionWrite
from enhydra.runner.checkpoint import (
    AtLeastOnce,
    ExactlyOnce,
    Flight,
    Publication,
    StaleBatch,
    TransactionOutcomeUnknown,
    send_in_batches,
)
from enhydra.settings import Settings

TP = tuple[str, int]
EVENTS, CHANGELOG = "app-events", "app-changelog"


@dataclass
class Meta:
    offset: int


class FakeBuilder:
    """aiokafka's BatchBuilder as the checkpoint uses it."""

    def __init__(self) -> None:
        self.records: list[tuple] = []
        self.closed = False

    def append(self, *, key, value, timestamp, headers):
        if self.closed:
            return None
        self.records.append((key, value, headers))
        return object()

    def size(self) -> int:
        return sum(record_size(k, v, h) for k, v, h in self.records)

    def close(self) -> None:
        self.closed = True


class FakeProducer:
    """Acknowledged batches land in `logs`; `fail_once` makes matching batches fail one time;
    with `hold`, batch futures stay open until `release`."""

    def __init__(self) -> None:
        self.logs: dict[TP, list[tuple]] = defaultdict(list)
        self.sent: list[tuple[TP, list[tuple]]] = []
        self.failures: list[tuple[Callable[[TP, list], bool], BaseException]] = []
        self.hold = False
        self.held: list[tuple[TP, list[tuple], asyncio.Future]] = []

    def fail_once(self, match: Callable[[TP, list], bool], error: BaseException) -> None:
        self.failures.append((match, error))

    def create_batch(self) -> FakeBuilder:
        return FakeBuilder()

    async def send_batch(self, builder: FakeBuilder, topic: str, *, partition: int):
        assert builder.closed, "a batch is closed before it is sent"
        tp, records = (topic, partition), list(builder.records)
        self.sent.append((tp, records))
        future = asyncio.get_running_loop().create_future()
        if self.hold:
            self.held.append((tp, records, future))
        else:
            self._settle(tp, records, future)
        return future

    def _settle(self, tp: TP, records: list, future: asyncio.Future) -> None:
        for i, (match, error) in enumerate(self.failures):
            if match(tp, records):
                del self.failures[i]
                future.set_exception(error)
                return
        future.set_result(Meta(len(self.logs[tp])))
        self.logs[tp] += records

    def release(self, topic: str) -> None:
        for item in [h for h in self.held if h[0][0] == topic]:
            self.held.remove(item)
            self._settle(*item)

    def topics_sent(self) -> list[str]:
        return [tp[0] for tp, _ in self.sent]


class FakeStore:
    def __init__(self, log: list) -> None:
        self.log = log  # shared by the stores of a test: the order of writes across partitions
        self.writes: list[tuple] = []
        self.owner_epoch = 0
        self.changelog_offset = -1

    def write(self, puts, *, changelog_offset=None, input_offset=None, owner_epoch=None) -> None:
        self.writes.append((list(puts), changelog_offset, input_offset))
        self.log.append((self, input_offset))


def stores_for(*partitions: int) -> dict[int, FakeStore]:
    log: list = []
    return {p: FakeStore(log) for p in partitions}


async def retrying(what: str, call, *args):
    """The runner's retry, without its backoff: transient Kafka errors are retried."""
    for attempt in range(10):
        try:
            return await call(*args)
        except KafkaError as exc:
            if not transient(exc) or attempt == 9:
                raise
            await asyncio.sleep(0)


def settings(tmp_path: Path, **given) -> Settings:
    return Settings.from_env({}, app_id="app", instance_id="i1", state_dir=tmp_path, **given)


def write(partition: int, first: int, n: int = 2, *, puts: int = 1) -> PartitionWrite:
    """n commands from offset `first`: an event each, and `puts` changed entries."""
    events = [(b"k%d" % (first + i), b"e%d" % (first + i), None) for i in range(n)]
    changed = [(b"k%d" % (first + i), b"s%d" % (first + i)) for i in range(puts)]
    return PartitionWrite(partition, {EVENTS: events}, changed, first + n - 1)


def kv(records: list[tuple]) -> list[tuple]:
    return [(key, value) for key, value, *_ in records]


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def producer(monkeypatch) -> FakeProducer:
    fake = FakeProducer()
    monkeypatch.setattr(ckpt, "new_producer", lambda *a, **k: fake)
    return fake


def at_least_once(tmp_path: Path, commits: list | None = None, **given) -> AtLeastOnce:
    async def commit_offsets(offsets):
        if commits is not None:
            commits.append(dict(offsets))

    return AtLeastOnce(
        settings(tmp_path, **given),
        client_id="c",
        input_topic="app-commands",
        changelog_topic=CHANGELOG,
        output_topics=[EVENTS],
        commit_offsets=commit_offsets,
        retrying=retrying,
    )


# at-least-once --------------------------------------------------------------------------------
async def test_a_publish_retry_sends_only_the_batches_that_failed(tmp_path, producer) -> None:
    unit = at_least_once(tmp_path)
    producer.fail_once(lambda tp, _: tp == (EVENTS, 1), NotEnoughReplicasError())
    batch = [write(0, 10), write(1, 20)]
    stores = stores_for(0, 1)
    written = await unit.begin(batch, stores, None).done

    assert kv(producer.logs[(EVENTS, 0)]) == kv(batch[0].outputs[EVENTS])  # once, not twice
    assert kv(producer.logs[(EVENTS, 1)]) == kv(batch[1].outputs[EVENTS])
    assert kv(producer.logs[(CHANGELOG, 0)]) == [(b"k10", b"s10")]
    assert [(w.partition, w.changelog_offset, w.input_offset) for w in written] == [
        (0, 0, 11),
        (1, 0, 21),
    ]
    assert stores[1].writes == [([(b"k20", b"s20")], 0, 21)]


async def test_outputs_placed_by_key_from_two_partitions_all_land(tmp_path, producer) -> None:
    """A reaction's commands go to their key's partition: two input partitions' batches may
    place records on one topic-partition, and none of them may be dropped."""
    commands = "other-commands"
    first = PartitionWrite(0, {(commands, 1): [(b"a", b"1", None)]}, [], 10)
    second = PartitionWrite(1, {(commands, 1): [(b"b", b"2", None)]}, [], 20)
    await at_least_once(tmp_path).begin([first, second], stores_for(0, 1), None).done
    assert kv(producer.logs[(commands, 1)]) == [(b"a", b"1"), (b"b", b"2")]


async def test_a_failed_batch_goes_again_with_the_later_ones_of_its_partition(producer) -> None:
    """Order within a partition is kept: the later batch goes again, after the failed one."""
    records = {(EVENTS, 0): [(b"k", b"x" * 600, None) for _ in range(4)]}
    producer.fail_once(lambda tp, recs: True, RequestTimedOutError())  # the first batch
    publication = Publication(producer, records, max_bytes=2 * record_size(b"k", b"x" * 600))
    with pytest.raises(RequestTimedOutError):
        await publication()
    assert [len(recs) for _, recs in producer.sent] == [2, 2]
    assert publication.pending == records  # both batches: the second must follow the first
    last = await publication()
    assert last == {0: 5}
    assert len(producer.logs[(EVENTS, 0)]) == 6  # the second batch twice, the last copy in order


async def test_batches_stay_within_the_record_limit(producer) -> None:
    """A broker refuses a batch above max.message.bytes however small its records."""
    records = {(EVENTS, 0): [(b"k%d" % i, b"v" * 100, None) for i in range(50)]}
    limit = 1000
    sent = await send_in_batches(producer, records, limit)
    assert sum(count for *_, count in sent) == 50
    assert all(sum(record_size(*r) for r in recs) <= limit for _, recs in producer.sent)
    assert kv([r for _, recs in producer.sent for r in recs]) == kv(records[(EVENTS, 0)])


async def test_a_flight_publishes_after_the_previous_outputs_and_persists_after_it(
    tmp_path, producer
) -> None:
    unit = at_least_once(tmp_path)
    producer.hold = True
    stores = stores_for(0)
    first = unit.begin([write(0, 0)], stores, None)
    second = unit.begin([write(0, 2)], stores, first)
    await turns()
    assert producer.topics_sent() == [EVENTS]  # the second waits for the first's outputs

    producer.release(EVENTS)  # the first's outputs acked: its changelog, the second's outputs
    await turns()
    assert producer.topics_sent() == [EVENTS, CHANGELOG, EVENTS]
    assert first.published.done() and not first.done.done()

    producer.release(EVENTS)  # the second's outputs: its changelog still waits for the first
    await turns()
    assert producer.topics_sent() == [EVENTS, CHANGELOG, EVENTS]
    assert stores[0].writes == []

    producer.release(CHANGELOG)
    await turns()
    assert producer.topics_sent() == [EVENTS, CHANGELOG, EVENTS, CHANGELOG]
    producer.release(CHANGELOG)
    await asyncio.gather(first.done, second.done)
    assert [w[2] for w in stores[0].writes] == [1, 3]  # the store sees batches in input order
    assert [r[0] for r in producer.logs[(CHANGELOG, 0)]] == [b"k0", b"k2"]


async def test_a_failed_flight_fails_every_later_one(tmp_path, producer) -> None:
    unit = at_least_once(tmp_path)
    producer.fail_once(lambda tp, _: True, TopicAuthorizationFailedError())
    stores = stores_for(0)
    first = unit.begin([write(0, 0)], stores, None)
    second = unit.begin([write(0, 2)], stores, first)
    third = unit.begin([write(0, 4)], stores, second)
    for flight in (first, second, third):
        with pytest.raises(TopicAuthorizationFailedError):
            await flight.done
    assert len(producer.sent) == 1 and stores[0].writes == []


async def test_offsets_are_committed_at_most_every_interval_unless_forced(
    tmp_path, producer
) -> None:
    commits: list = []
    unit = at_least_once(tmp_path, commits, commit_interval_ms=60_000)
    stores = stores_for(0)
    await unit.begin([write(0, 0)], stores, None).done
    await unit.commit()
    assert len(commits) == 1  # the first commit is due at once
    await unit.begin([write(0, 2)], stores, None).done
    await unit.commit()
    assert len(commits) == 1
    await unit.commit(force=True)
    assert [list(c.values()) for c in commits] == [[2], [4]]
    await unit.commit(force=True)
    assert len(commits) == 2  # nothing new to commit


async def test_the_guard_is_asked_before_each_publish(tmp_path, producer) -> None:
    unit = at_least_once(tmp_path)
    asked: list[str] = []

    def stale_before_the_changelog() -> None:
        asked.append(producer.topics_sent()[-1] if producer.sent else "")
        if len(asked) == 2:
            raise StaleBatch("stalled")

    stores = stores_for(0)
    flight = unit.begin([write(0, 0)], stores, None, stale_before_the_changelog)
    with pytest.raises(StaleBatch):
        await flight.done
    assert asked == ["", EVENTS]
    assert producer.topics_sent() == [EVENTS]  # no changelog record, no store write
    assert stores[0].writes == []


async def test_the_guard_is_asked_again_before_a_retry(tmp_path, producer) -> None:
    unit = at_least_once(tmp_path)
    producer.fail_once(lambda tp, _: True, NotEnoughReplicasError())
    calls: list[int] = []

    def stale_on_retry() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise StaleBatch("stalled during the backoff")

    flight = unit.begin([write(0, 0)], stores_for(0), None, stale_on_retry)
    with pytest.raises(StaleBatch):
        await flight.done
    assert len(producer.sent) == 1


# exactly-once ---------------------------------------------------------------------------------
class FakeTransactionalProducer:
    """aiokafka's transactional producer as a state machine, committing into shared logs.

    `commit_errors` are raised by the next commits: an "abortable" one leaves the transaction
    to abort (aiokafka's ABORTABLE_ERROR), an "unknown" one a dead producer whose abort fails
    (its FATAL_ERROR: the commit may have reached the coordinator).
    """

    def __init__(self, logs: dict[TP, list]) -> None:
        self.logs = logs
        self.state = "ready"
        self.commit_errors: list[tuple[str, BaseException]] = []
        self.commits = self.aborts = 0
        self.abort_hangs = False
        self._records: list[tuple[TP, tuple, asyncio.Future]] = []

    async def begin_transaction(self) -> None:
        assert self.state == "ready", f"Invalid state transition {self.state} -> in transaction"
        self.state, self._records, self.offsets = "in", [], None

    async def send(self, topic, value, key=None, partition=None, headers=None):
        assert self.state == "in"
        future = asyncio.get_running_loop().create_future()
        self._records.append(((topic, partition), (key, value, headers), future))
        return future

    async def send_offsets_to_transaction(self, offsets, group_id) -> None:
        self.offsets = offsets

    async def commit_transaction(self) -> None:
        if self.commit_errors:
            kind, error = self.commit_errors.pop(0)
            self.state = "abortable" if kind == "abortable" else "fatal"
            for *_, future in self._records:  # aiokafka fails every record of the transaction
                future.set_exception(error)
            raise error
        for tp, record, future in self._records:
            future.set_result(Meta(len(self.logs[tp])))
            self.logs[tp].append(record)
        self.state = "ready"
        self.commits += 1

    async def abort_transaction(self) -> None:
        assert self.state in ("in", "abortable"), f"Invalid state transition {self.state}"
        if self.abort_hangs:  # the coordinator does not answer
            await asyncio.Event().wait()
        self.state = "ready"
        self.aborts += 1

    @contextlib.asynccontextmanager
    async def transaction(self):
        """aiokafka's TransactionContext: aborts on an error inside, unless the producer died."""
        await self.begin_transaction()
        try:
            yield self
        except BaseException:
            if self.state != "fatal":
                await self.abort_transaction()
            raise
        await self.commit_transaction()


@pytest.fixture
def transactional(monkeypatch) -> dict[int, FakeTransactionalProducer]:
    logs: dict[TP, list] = defaultdict(list)
    producers: dict[int, FakeTransactionalProducer] = {}

    def new_producer(conn, *, transactional_id: str, **_):
        partition = int(transactional_id.rsplit("-", 1)[-1])
        return producers.setdefault(partition, FakeTransactionalProducer(logs))

    async def nothing(*args, **kwargs) -> None:
        return None

    monkeypatch.setattr(ckpt, "new_producer", new_producer)
    monkeypatch.setattr(ckpt, "start", nothing)
    monkeypatch.setattr(ckpt, "warm_up", nothing)
    monkeypatch.setattr(ckpt, "close", nothing)
    return producers


async def exactly_once(tmp_path: Path, *partitions: int) -> ExactlyOnce:
    unit = ExactlyOnce(
        settings(tmp_path, processing_guarantee="exactly_once"),
        client_id="c",
        transactional_prefix="app-task-",
        group_id="app",
        input_topic="app-commands",
        changelog_topic=CHANGELOG,
        output_topics=[EVENTS],
        retrying=retrying,
    )
    for partition in partitions:
        await unit.open_task(partition)
    return unit


async def test_a_committed_transaction_is_not_run_again_when_another_partition_retries(
    tmp_path, transactional
) -> None:
    unit = await exactly_once(tmp_path, 0, 1)
    transactional[1].commit_errors = [("abortable", NotEnoughReplicasError())]
    batch = [write(0, 10), write(1, 20)]
    stores = stores_for(0, 1)
    written = await unit.begin(batch, stores, None).done

    assert (transactional[0].commits, transactional[0].aborts) == (1, 0)
    assert (transactional[1].commits, transactional[1].aborts) == (1, 1)
    logs = transactional[0].logs
    assert kv(logs[(EVENTS, 0)]) == kv(batch[0].outputs[EVENTS])  # read_committed: once
    assert kv(logs[(EVENTS, 1)]) == kv(batch[1].outputs[EVENTS])
    assert [(w.partition, w.changelog_offset, w.input_offset) for w in written] == [
        (0, 0, 11),
        (1, 0, 21),
    ]
    assert [len(stores[p].writes) for p in (0, 1)] == [1, 1]


async def test_a_transaction_sends_outputs_placed_by_key_to_their_partition(
    tmp_path, transactional
) -> None:
    unit = await exactly_once(tmp_path, 0)
    placed = PartitionWrite(0, {("other-commands", 3): [(b"a", b"1", None)]}, [], 10)
    await unit.begin([placed], stores_for(0), None).done
    assert kv(transactional[0].logs[("other-commands", 3)]) == [(b"a", b"1")]


async def test_a_commit_of_unknown_outcome_stops_the_task_and_is_not_run_again(
    tmp_path, transactional
) -> None:
    unit = await exactly_once(tmp_path, 0, 1)
    transactional[1].commit_errors = [("unknown", RequestTimedOutError())]
    stores = stores_for(0, 1)
    flight = unit.begin([write(0, 10), write(1, 20)], stores, None)
    with pytest.raises(TransactionOutcomeUnknown, match=r"partition 1 .* may have committed"):
        await flight.done
    assert transactional[1].commits == 0 and transactional[1].state == "fatal"
    # Only what committed is persisted: partition 0's store, not partition 1's.
    assert [len(stores[p].writes) for p in (0, 1)] == [1, 0]
    with pytest.raises(TransactionOutcomeUnknown):
        await flight.published


async def test_an_abort_that_does_not_end_leaves_the_outcome_unknown(
    tmp_path, transactional, monkeypatch
) -> None:
    monkeypatch.setattr(ckpt, "ABORT_TIMEOUT_S", 0.01)
    unit = await exactly_once(tmp_path, 0)
    transactional[0].commit_errors = [("abortable", RequestTimedOutError())]
    transactional[0].abort_hangs = True
    stores = stores_for(0)
    with pytest.raises(TransactionOutcomeUnknown, match="could not be aborted"):
        await unit.begin([write(0, 0)], stores, None).done
    assert transactional[0].commits == 0 and stores[0].writes == []


async def test_a_transaction_failing_for_good_is_aborted_and_fails_later_flights(
    tmp_path, transactional
) -> None:
    unit = await exactly_once(tmp_path, 0)
    transactional[0].commit_errors = [("abortable", TopicAuthorizationFailedError())]
    stores = stores_for(0)
    first = unit.begin([write(0, 0)], stores, None)
    second = unit.begin([write(0, 2)], stores, first)
    for flight in (first, second):
        with pytest.raises(TopicAuthorizationFailedError):
            await flight.done
    assert (transactional[0].commits, transactional[0].aborts) == (0, 1)
    assert stores[0].writes == []


async def test_a_failed_transaction_logs_its_error_once_not_once_per_record(
    tmp_path, transactional
) -> None:
    """A fenced producer fails every record's future: none may log 'never retrieved'."""
    unreported: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: unreported.append(context))
    unit = await exactly_once(tmp_path, 0)
    transactional[0].commit_errors = [("unknown", RequestTimedOutError())]
    flight = unit.begin([write(0, 0), write(0, 2)], stores_for(0), None)
    with pytest.raises(TransactionOutcomeUnknown):
        await flight.done
    del flight
    transactional[0]._records.clear()
    gc.collect()
    await asyncio.sleep(0)
    assert [c["message"] for c in unreported] == []


async def test_exactly_once_flights_run_one_transaction_at_a_time_in_order(
    tmp_path, transactional
) -> None:
    unit = await exactly_once(tmp_path, 0)
    stores = stores_for(0)
    flights: list[Flight] = []
    for first in (0, 2, 4):
        flights.append(unit.begin([write(0, first)], stores, flights[-1] if flights else None))
    await asyncio.gather(*(f.done for f in flights))
    assert [w[2] for w in stores[0].writes] == [1, 3, 5]
    assert [r[0] for r in transactional[0].logs[(CHANGELOG, 0)]] == [b"k0", b"k2", b"k4"]


# a turn without input records (a saga's deadlines) ---------------------------------------------
def timers_only(partition: int) -> PartitionWrite:
    """What a turn that only fired timers writes: outputs and entries, no input offset."""
    return PartitionWrite(partition, {EVENTS: [(b"k", b"fired", None)]}, [(b"t", None)], -1)


async def test_at_least_once_commits_and_records_no_input_offset_for_a_turn_without_records(
    tmp_path, producer
) -> None:
    # The store's input offset may be older than the group's (another owner went further):
    # committing it would move the group backwards.
    commits: list = []
    unit = at_least_once(tmp_path, commits)
    stores = stores_for(0)
    [written] = await unit.begin([timers_only(0)], stores, None).done
    await unit.commit(force=True)
    assert commits == [] and stores[0].writes == [([(b"t", None)], 0, None)]
    assert written.input_offset == -1


async def test_exactly_once_sends_no_input_offset_for_a_turn_without_records(
    tmp_path, transactional
) -> None:
    unit = await exactly_once(tmp_path, 0)
    stores = stores_for(0)
    await unit.begin([timers_only(0)], stores, None).done
    assert transactional[0].commits == 1 and transactional[0].offsets is None
    assert stores[0].writes == [([(b"t", None)], 0, None)]
