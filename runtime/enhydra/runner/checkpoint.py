"""The commit unit of a batch: publish, persist, commit, in the one order that loses nothing.

1. publish the batch's outputs (events, rejections, dead letters) and its changelog records;
2. persist: write the changed entries to RocksDB with the changelog offset (and the input
   offset) in one WriteBatch;
3. commit the input offsets.

A crash before 1 completes redelivers the input; the state does not reflect it yet. A crash
between 1 and 2 leaves a changelog ahead of the store: a restore catches up. A crash between 2
and 3 redelivers input the store already reflects: every entry carries the input offset of the
last command that changed it, so the redelivered records are skipped.

Two guarantees, one interface (`write` returns what it made durable; `commit` is due):

at_least_once: one idempotent producer. Outputs are acknowledged before the changelog records
are sent, so a changelog entry (which marks its input as applied) never exists for a record
whose outputs were lost; a crash in between duplicates outputs, never state. Input offsets are
committed at most every `commit_interval_ms` (a late commit costs only skipped redeliveries).
A transient error is retried for what the broker has not acknowledged only (`Publication`).
Nothing fences a previous owner cut off from the brokers, so: no changelog record is sent
unless the group confirmed this member less than half a session timeout ago (kafka/liveness.py),
and every changelog record carries the owner's epoch, so a batch that still lands late is
skipped by readers and repaired by the current owner (runner/fencing.py).

exactly_once: Kafka transactions, one transactional producer per task whose id is derived from
the runner's prefix and the partition, so the next owner of a partition fences a zombie previous
owner (aiokafka's TxnOffsetCommit carries no group generation). Outputs, changelog records and
the input offsets commit together, inside the transaction. Each partition's transaction is
retried alone, a committed one never again; one whose outcome is unknown stops the task.

Every record a batch writes fits `max_record_bytes` (record_limit): the pure step checks it
before anything of the batch is published, so no batch fails halfway for a record too large.

A batch on its way is a `Flight` (`begin` starts one): the runner computes the next batch while
the previous one flies, and flights keep the order of batches at every step. A flight publishes
its outputs only once the previous flight's outputs are acknowledged (exactly_once: once its
transaction is committed), and sends its changelog records and writes the store only once the
previous flight is done. So every topic and every store sees batches in input order, exactly as
if they were made durable one after the other; a failed flight fails every flight after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from enhydra.contracts.headers import epoch_headers
from enhydra.contracts.sizes import MAX_REQUEST_SIZE, record_size
from enhydra.kafka.clients import Producer, close, new_producer, start
from enhydra.kafka.errors import transient
from enhydra.kafka.liveness import GroupLiveness
from enhydra.kafka.reading import ReadStalled, read_spans
from enhydra.kafka.topics import max_message_bytes
from enhydra.logs import get_logger
from enhydra.runner.batch import Out, PartitionWrite, placed
from enhydra.runner.fencing import Range, gaps, next_epoch, stale_keys
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore

log = get_logger("enhydra.checkpoint")

MAX_BATCH_SIZE = 256 * 1024
ABORT_TIMEOUT_S = 30.0  # an abort that takes longer leaves the transaction's outcome unknown


@dataclass(frozen=True, slots=True)
class Written:
    """What one partition's batch made durable."""

    partition: int
    changelog_offset: int | None  # the last changelog record written, if any
    input_offset: int


class StaleBatch(RuntimeError):
    """This process stalled long enough to have lost its tasks: the batch must not be written.

    `ask_the_group`: the runner waits for the group's next heartbeat before reading again, as
    after a stall (a commit unit that found another writer ahead of it sets it)."""

    ask_the_group = False


Guard = Callable[[], None]  # raises StaleBatch when the batch may no longer be this process's


def _no_guard() -> None:
    """Exactly-once needs none: the next owner's transactions fence this producer."""


# Retries a Kafka operation that failed with a transient error: (what, call, *args) -> result.
Retrying = Callable[..., Awaitable[Any]]


@dataclass(eq=False)
class Flight:
    """One batch on its way to durable; wall-clock times of its steps, for the metrics."""

    published: asyncio.Future[None]  # its outputs are acknowledged: the next batch may publish
    done: asyncio.Task[list[Written]] = field(init=False)  # changelog acknowledged, store written
    sent_at: float = 0.0  # outputs handed to the producer
    published_at: float = 0.0
    done_at: float = 0.0


def consume_errors(futures: Iterable[asyncio.Future]) -> None:
    """Mark futures' errors as seen: one error reported for all, not one log line per record."""
    for future in futures:
        future.add_done_callback(lambda f: f.cancelled() or f.exception())


def begin_flight(run: Callable[[Flight], Awaitable[list[Written]]]) -> Flight:
    published: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    # A failure is raised from `done`; the same error on `published` is only for the next flight.
    consume_errors([published])
    flight = Flight(published)
    flight.done = asyncio.ensure_future(run(flight))
    return flight


def settle_future(future: asyncio.Future[None], error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    elif isinstance(error, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(error)


class Checkpoint(Protocol):
    max_record_bytes: int  # known once started (record_limit)

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def open_task(self, partition: int) -> int | None:
        """Where the task's input resumes when the unit stores it (a SQL projection's
        positions); None: at the group's committed offset."""
        ...

    async def close_task(self, partition: int) -> None: ...
    def begin(
        self,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
        guard: Guard = _no_guard,
    ) -> Flight:
        """Start making `batch` durable, in order after the flight `after` (None: the first).

        `guard` is asked before each publish (at-least-once): it raises StaleBatch when this
        process stalled and may have lost its tasks, so a zombie writes nothing more.
        """
        ...

    async def commit(self, force: bool = False) -> None: ...


def _producer_settings(settings: Settings, max_record_bytes: int = MAX_REQUEST_SIZE) -> dict:
    return {
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": settings.producer_linger_ms,
        "max_request_size": MAX_REQUEST_SIZE,
        # A batch of small records must not outgrow what the topics accept either.
        "max_batch_size": min(MAX_BATCH_SIZE, max_record_bytes),
    }


async def record_limit(settings: Settings, topics: list[str], client_id: str) -> int:
    """The largest record the broker takes from a batch: the smaller of the producers'
    max_request_size and the max.message.bytes of every topic written (outputs, changelog,
    DLQ). The pure step checks each record against it before anything of the batch is sent."""
    limits = await max_message_bytes(settings.connection, topics, client_id=client_id)
    # No limit read (a broker that does not know the topics just created yet): the request size.
    return min([MAX_REQUEST_SIZE, *limits.values()])


async def warm_up(producer: Producer, topics: list[str]) -> None:
    """Learn where the output topics' partitions live now, not while the first batch waits."""
    for topic in topics:
        await producer.partitions_for(topic)


def persist(
    written: list[tuple[PartitionWrite, int | None]],
    stores: Mapping[int, PartitionStore],
    epochs: Mapping[int, int] | None = None,
):
    """Step 2: the entries and both offsets (and the owner's epoch), one WriteBatch each.

    A write without an input offset (last_offset < 0: a turn that only fired timers) leaves
    the store's input offset as it is: that offset may be older than the group's committed
    one (another owner went further), and must not be committed or recorded as progress.
    """
    result = []
    for write, changelog_offset in written:
        stores[write.partition].write(
            write.puts,
            changelog_offset=changelog_offset,
            input_offset=write.last_offset if write.last_offset >= 0 else None,
            owner_epoch=epochs.get(write.partition) if epochs else None,
        )
        result.append(Written(write.partition, changelog_offset, write.last_offset))
    return result


def _batches(
    producer: Producer, items: list[Out], max_bytes: int, now_ms: int
) -> Iterator[tuple[int, Any, int]]:
    """One topic-partition's records as closed record batches: (first record's index, batch,
    record count). A batch holds records while it stays within the producer's max_batch_size
    and `max_bytes`: a broker refuses a bigger one, however small its records."""
    capped = max_bytes < MAX_BATCH_SIZE  # else max_batch_size is the tighter bound
    builder, first, count = producer.create_batch(), 0, 0
    for index, (key, value, headers) in enumerate(items):
        headers = headers or []
        if capped and count and builder.size() + record_size(key, value, headers) > max_bytes:
            builder.close()
            yield first, builder, count
            builder, first, count = producer.create_batch(), index, 0
        if builder.append(key=key, value=value, timestamp=now_ms, headers=headers) is None:
            yield first, builder, count  # full at max_batch_size (append closed it)
            builder, first, count = producer.create_batch(), index, 0
            # An empty batch takes any one record: the step has checked its size already.
            builder.append(key=key, value=value, timestamp=now_ms, headers=headers)
        count += 1
    if count:
        builder.close()
        yield first, builder, count


async def send_in_batches(
    producer: Producer,
    records: Mapping[tuple[str, int], list[Out]],
    max_bytes: int = MAX_REQUEST_SIZE,
) -> list[tuple[tuple[str, int], asyncio.Future, int]]:
    """Send records grouped per topic-partition as whole record batches.

    One future per batch instead of one coroutine and future per record: this is most of the
    producer's per-record cost in Python. Returns (topic-partition, the future of the batch's
    base metadata, its record count) per batch.
    """
    now_ms = int(time.time() * 1000)
    sent: list[tuple[tuple[str, int], asyncio.Future, int]] = []
    for tp, items in records.items():
        for _, builder, count in _batches(producer, items, max_bytes, now_ms):
            sent.append((tp, await producer.send_batch(builder, tp[0], partition=tp[1]), count))
    return sent


class Publication:
    """Records to publish, and how far each topic-partition is acknowledged.

    Calling it sends what is not acknowledged yet and waits for every batch; on an error it
    raises (the caller retries it) and keeps only the unacknowledged rest, so a retry never
    sends again a batch the broker has acknowledged. Within one topic-partition the rest starts
    at its first failed batch: a later batch acknowledged meanwhile goes again with it, since
    order within a partition (a key's events) matters more than a duplicate, which
    at-least-once allows. `guard` is asked before every send, retries included.
    """

    def __init__(
        self,
        producer: Producer,
        records: Mapping[tuple[str, int], list[Out]],
        *,
        max_bytes: int = MAX_REQUEST_SIZE,
        guard: Guard | None = None,
    ) -> None:
        self._producer = producer
        self._max_bytes = max_bytes
        self._guard = guard or _no_guard
        self.pending = {tp: list(items) for tp, items in records.items() if items}
        self.last: dict[int, int] = {}  # partition -> the last offset acknowledged
        self.spans: dict[int, list[Range]] = {}  # partition -> [start, end) of each batch

    async def __call__(self) -> dict[int, int]:
        self._guard()
        producer = self._producer
        now_ms = int(time.time() * 1000)
        sent: list[tuple[tuple[str, int], int, int, asyncio.Future]] = []
        failed_at: dict[tuple[str, int], int] = {}  # topic-partition -> first record to resend
        error: BaseException | None = None
        for tp, items in self.pending.items():
            for first, builder, count in _batches(producer, items, self._max_bytes, now_ms):
                try:
                    future = await producer.send_batch(builder, tp[0], partition=tp[1])
                except KafkaError as exc:
                    failed_at[tp], error = first, _worse(error, exc)
                    break
                sent.append((tp, first, count, future))
        if sent:
            futures = [future for *_, future in sent]
            consume_errors(futures)  # each error is looked at below, or sent again after one
            await asyncio.wait(futures)
        for tp, first, count, future in sent:
            if tp in failed_at and failed_at[tp] <= first:
                continue  # after a failed batch of its partition: it goes again, in order
            exc = future.exception()
            if exc is not None:
                failed_at[tp], error = first, _worse(error, exc)
                continue
            base = future.result().offset
            self.spans.setdefault(tp[1], []).append((base, base + count))
            self.last[tp[1]] = max(self.last.get(tp[1], -1), base + count - 1)
        self.pending = {tp: self.pending[tp][first:] for tp, first in failed_at.items()}
        if error is not None:
            raise error
        return self.last


def _worse(known: BaseException | None, new: BaseException) -> BaseException:
    """The error to raise for an attempt: one that no retry cures wins over a transient one."""
    if known is None or (transient(known) and not transient(new)):
        return new
    return known


# The membership must have been confirmed within this part of the session timeout for a
# changelog record to be sent: the rest covers the time the record takes to land.
FRESH_SESSION_PART = 0.5
GAP_READ_TIMEOUT_S = 10.0
IDLE_CHECK_EVERY_S = 2.0  # how often a partition nobody writes to now is checked for late writes


class MembershipLost(StaleBatch):
    """The group has not confirmed this member recently: it may have lost its tasks."""


@dataclass(slots=True)
class _Owner:
    """This process as the owner of one changelog partition since the group gave it the task."""

    epoch: int
    store: PartitionStore
    next_offset: int  # where its next record lands if nobody else writes
    gaps: list[Range] = field(default_factory=list)  # foreign records not yet inspected
    headers: list[tuple[str, bytes]] = field(init=False)  # on each of its changelog records

    def __post_init__(self) -> None:
        self.headers = epoch_headers(self.epoch)


class AtLeastOnce:
    def __init__(
        self,
        settings: Settings,
        *,
        client_id: str,
        input_topic: str,
        changelog_topic: str,
        output_topics: list[str],
        commit_offsets: Callable[[dict[TopicPartition, int]], Awaitable[None]],
        retrying: Retrying,
        group: GroupLiveness | None = None,
        changelog_ends: Callable[[], Mapping[int, int]] | None = None,
    ) -> None:
        self.settings = settings
        self._group = group
        self._generations: dict[int, int] = {}  # partition -> generation that gave it to us
        self._owners: dict[int, _Owner] = {}
        self._changelog_ends = changelog_ends  # recent end offsets of the changelog
        self._flying = 0
        self._last_idle_check = 0.0
        self.input_topic = input_topic
        self.changelog_topic = changelog_topic
        self.output_topics = output_topics
        self._commit_offsets = commit_offsets
        self._retrying = retrying
        self._interval_s = settings.commit_interval_ms / 1000
        self._pending: dict[TopicPartition, int] = {}
        self._last_commit = 0.0
        self.client_id = client_id
        self.max_record_bytes = MAX_REQUEST_SIZE
        self._producer = new_producer(
            settings.connection, client_id=client_id, **_producer_settings(settings)
        )

    async def start(self) -> None:
        topics = [*self.output_topics, self.changelog_topic, self.settings.dlq_topic]
        self.max_record_bytes = await record_limit(self.settings, topics, self.client_id)
        await start(self._producer, self.settings.connection)
        await warm_up(self._producer, [*self.output_topics, self.changelog_topic])

    async def stop(self) -> None:
        await close(self._producer)

    async def open_task(self, partition: int) -> None:
        """The group (re)gave us the task: its next changelog record starts a new epoch."""
        if self._group is not None:
            self._group.assigned()
        generation = self._group.generation() if self._group is not None else 0
        self._generations[partition] = generation
        self._owners.pop(partition, None)

    async def close_task(self, partition: int) -> None:
        self._generations.pop(partition, None)
        self._owners.pop(partition, None)

    def begin(
        self,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
        guard: Guard = _no_guard,
    ) -> Flight:
        flight = begin_flight(lambda flight: self._fly(flight, batch, stores, after, guard))
        self._flying += 1
        flight.done.add_done_callback(self._landed)
        return flight

    def _landed(self, _: asyncio.Task) -> None:
        self._flying -= 1

    async def _fly(
        self,
        flight: Flight,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
        guard: Guard,
    ) -> list[Written]:
        """Publish, then persist; `guard` is asked before each publish."""
        try:
            if after is not None:
                await after.published
            outputs: dict[tuple[str, int], list[Out]] = {}
            for write in batch:  # two partitions' batches may write to one topic-partition
                for target, records in write.outputs.items():
                    if records:
                        outputs.setdefault(placed(target, write.partition), []).extend(records)
            flight.sent_at = time.time()
            await self._publish(outputs, guard)
            flight.published_at = time.time()
            settle_future(flight.published)
        except BaseException as exc:
            settle_future(flight.published, exc)
            raise
        if after is not None:
            await after.done
        # The guard is asked again: a zombie never puts an old state into the changelog after
        # the next owner's.
        guard()
        owners = {w.partition: self._owner(w.partition, stores[w.partition]) for w in batch}
        changelog = {
            (self.changelog_topic, w.partition): [
                (k, v, owners[w.partition].headers) for k, v in w.puts
            ]
            for w in batch
            if w.puts
        }
        if changelog:
            await self._check_membership()
        last = await self._send_changelog(changelog, owners, guard) if changelog else {}
        epochs = {p: owner.epoch for p, owner in owners.items()}
        written = persist([(w, last.get(w.partition)) for w in batch], stores, epochs)
        await self._repair(owners)
        for w in batch:
            if w.last_offset >= 0:
                self._pending[TopicPartition(self.input_topic, w.partition)] = w.last_offset + 1
        flight.done_at = time.time()
        return written

    async def _publish(
        self, records: Mapping[tuple[str, int], list[Out]], guard: Guard
    ) -> dict[int, int]:
        """Send, retrying only what is not acknowledged; partition -> the last offset written.

        `guard` is asked before every attempt, also when there is nothing to send.
        """
        publication = Publication(
            self._producer, records, max_bytes=self.max_record_bytes, guard=guard
        )
        return await self._retrying("publish", publication)

    def _owner(self, partition: int, store: PartitionStore) -> _Owner:
        """This task's owner state; the first batch after the task was given picks the epoch
        (the store is restored by then: it applied every epoch the changelog held)."""
        owner = self._owners.get(partition)
        if owner is None:
            epoch = next_epoch(store.owner_epoch, self._generations.get(partition, 0))
            owner = _Owner(epoch, store, store.changelog_offset + 1)
            self._owners[partition] = owner
        return owner

    async def _confirmed(self) -> bool:
        """Whether the group still counts this member (waiting a little for a heartbeat)."""
        if self._group is None:
            return True
        session_s = self.settings.session_timeout_ms / 1000
        wait_s = 2 * self.settings.heartbeat_interval_ms / 1000
        return await self._group.confirmed_within(session_s * FRESH_SESSION_PART, wait_s)

    async def _check_membership(self) -> None:
        """Raise MembershipLost when the group may have given this member's tasks away."""
        if not await self._confirmed():
            assert self._group is not None
            raise MembershipLost(
                f"no heartbeat confirmed for {self._group.age():.1f}s: the tasks may be "
                "another member's now"
            )

    async def _send_changelog(
        self,
        records: Mapping[tuple[str, int], list[Out]],
        owners: Mapping[int, _Owner],
        guard: Guard = _no_guard,
    ) -> dict[int, int]:
        """Publish changelog records; note foreign records found between them per owner."""
        publication = Publication(
            self._producer, records, max_bytes=self.max_record_bytes, guard=guard
        )
        await self._retrying("publish", publication)
        last: dict[int, int] = {}
        for partition, ranges in publication.spans.items():
            owner = owners[partition]
            found, owner.next_offset = gaps(owner.next_offset, ranges)
            owner.gaps += found
            last[partition] = owner.next_offset - 1
        return last

    async def _check_idle(self) -> None:
        """Look for late writes in partitions that nobody writes to now.

        With no flight in the air, every record this process wrote lies before its owners'
        `next_offset`: a changelog end beyond it means someone else wrote since.
        """
        now = time.monotonic()
        if self._flying or self._changelog_ends is None:
            return
        if now - self._last_idle_check < IDLE_CHECK_EVERY_S:
            return
        self._last_idle_check = now
        ends = self._changelog_ends()
        for partition, owner in self._owners.items():
            end = ends.get(partition)
            if end is not None and end > owner.next_offset:
                owner.gaps.append((owner.next_offset, end))
                owner.next_offset = end
        await self._repair(self._owners)

    async def _repair(self, owners: Mapping[int, _Owner]) -> None:
        """Write the current value again for every key an older owner wrote between ours.

        Readers skip such a record already; this makes the newest state the key's last record
        again, the one compaction keeps. A gap that cannot be read (or written) now is tried
        again after the next batch, or when the runner next loops if the partition is idle.
        """
        pending = {p: owner for p, owner in owners.items() if owner.gaps}
        if not pending or not await self._confirmed():
            return
        spans = {p: (o.gaps[0][0], o.gaps[-1][1]) for p, o in pending.items()}
        try:
            found = await read_spans(
                self.settings.connection,
                self.changelog_topic,
                spans,
                stall_timeout_s=GAP_READ_TIMEOUT_S,
            )
        except (KafkaError, ReadStalled) as exc:
            log.warning("could not read foreign changelog records yet", error=repr(exc))
            return
        repairs: dict[tuple[str, int], list[Out]] = {}
        for partition, owner in pending.items():
            inside = [
                r
                for r in found.get(partition, ())
                if any(start <= r.offset < end for start, end in owner.gaps)
            ]
            owner.gaps = []
            keys = stale_keys(inside, owner.epoch)
            if not keys:
                continue  # our own records sent twice by a retried publish
            log.warning(
                "a previous owner's changelog records landed after ours; writing the "
                "current values again",
                changelog=self.changelog_topic,
                partition=partition,
                keys=len(keys),
                epoch=owner.epoch,
            )
            values = owner.store.get_many(keys)
            repairs[(self.changelog_topic, partition)] = [
                (k, v, owner.headers) for k, v in zip(keys, values, strict=True)
            ]
        if not repairs:
            return
        last = await self._send_changelog(repairs, owners)
        for (_, partition), records in repairs.items():
            owners[partition].store.write(
                [(k, v) for k, v, _ in records],
                changelog_offset=last[partition],
                owner_epoch=owners[partition].epoch,
            )

    async def commit(self, force: bool = False) -> None:
        """Commit processed input offsets, at most every commit_interval_ms unless forced.

        Called whenever the runner loops: idle partitions are checked for late writes too.
        """
        await self._check_idle()
        if not self._pending:
            return
        now = time.monotonic()
        if not force and now - self._last_commit < self._interval_s:
            return
        offsets, self._pending = self._pending, {}
        try:
            await self._commit_offsets(offsets)
            self._last_commit = now
        except (CommitFailedError, IllegalStateError, KafkaError) as exc:
            # The records will be redelivered to the next owner, which skips what its
            # restored state already reflects: a failed commit costs time, never correctness.
            log.warning("commit failed; records will be redelivered and skipped", error=repr(exc))


class TransactionOutcomeUnknown(RuntimeError):
    """A transaction failed and could not be aborted: it may have committed. Not retried."""


async def _abort(producer: Producer, partition: int, error: BaseException) -> None:
    try:
        await asyncio.wait_for(producer.abort_transaction(), ABORT_TIMEOUT_S)
    except Exception as exc:
        raise TransactionOutcomeUnknown(
            f"the transaction of partition {partition} failed ({type(error).__name__}: {error}) "
            f"and could not be aborted ({type(exc).__name__}): it may have committed, so the "
            "task stops and its next producer settles it"
        ) from error


class ExactlyOnce:
    def __init__(
        self,
        settings: Settings,
        *,
        client_id: str,
        transactional_prefix: str,
        group_id: str,
        input_topic: str,
        changelog_topic: str,
        output_topics: list[str],
        retrying: Retrying,
    ) -> None:
        self.settings = settings
        self._retrying = retrying
        self.client_id = client_id
        self.transactional_prefix = transactional_prefix
        self.group_id = group_id
        self.input_topic = input_topic
        self.changelog_topic = changelog_topic
        self.output_topics = output_topics
        self.max_record_bytes = MAX_REQUEST_SIZE
        self._producers: dict[int, Producer] = {}

    async def start(self) -> None:
        """Producers are per task; they start when a task becomes active."""
        topics = [*self.output_topics, self.changelog_topic, self.settings.dlq_topic]
        self.max_record_bytes = await record_limit(self.settings, topics, self.client_id)

    async def stop(self) -> None:
        for partition in list(self._producers):
            await self.close_task(partition)

    async def open_task(self, partition: int) -> None:
        """Initialising the task's transactional id fences any previous owner of it."""
        if partition in self._producers:
            return
        producer = new_producer(
            self.settings.connection,
            client_id=f"{self.client_id}-p{partition}",
            transactional_id=f"{self.transactional_prefix}{partition}",
            **_producer_settings(self.settings, self.max_record_bytes),
        )
        await start(producer, self.settings.connection, doing="start a transactional producer")
        await warm_up(producer, [*self.output_topics, self.changelog_topic])
        self._producers[partition] = producer

    async def close_task(self, partition: int) -> None:
        producer = self._producers.pop(partition, None)
        if producer is not None:
            await close(producer)

    def begin(
        self,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
        guard: Guard = _no_guard,
    ) -> Flight:
        """`guard` is not needed: the next owner's transactions fence this producer."""
        return begin_flight(lambda flight: self._fly(flight, batch, stores, after))

    async def _fly(
        self,
        flight: Flight,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
    ) -> list[Written]:
        """Each partition's transaction is retried alone, and its store written once it commits.

        A task's producer runs one transaction at a time: a flight waits for the last one. A
        transaction that committed is never run again, whatever happens to the others: its
        events, changelog records and offsets are in Kafka once, and its store is written at
        once, so the store never lags what Kafka holds by more than the transaction in hand.
        The flight fails if any partition fails for good; the ones that committed stay written.
        """
        try:
            if after is not None:
                await after.done
            flight.sent_at = time.time()
            done = await asyncio.gather(
                *(self._commit_one(write, stores) for write in batch), return_exceptions=True
            )
            for result in done:
                if isinstance(result, BaseException):
                    raise result
            flight.published_at = flight.done_at = time.time()
            settle_future(flight.published)
        except BaseException as exc:
            settle_future(flight.published, exc)
            raise
        return done  # type: ignore[return-value]

    async def _commit_one(
        self, write: PartitionWrite, stores: Mapping[int, PartitionStore]
    ) -> Written:
        offset = await self._retrying("publish", self._transaction, write)
        return persist([(write, offset)], stores)[0]

    async def _transaction(self, write: PartitionWrite) -> int | None:
        """One partition's outputs, changelog records and input offset, in one transaction.

        On any failure the transaction is aborted before the error leaves, so running it again
        is safe. aiokafka aborts only what did not commit: a commit refused before it was sent
        (an abortable error: a send failed, a leader was down) aborts cleanly; a commit whose
        outcome the producer does not know (its sender died, the producer was fenced) leaves it
        in a fatal state where the abort fails too. Then the transaction may have committed and
        must not run again: TransactionOutcomeUnknown fails the task, and the next producer of
        the transactional id settles it when it initialises (init_transactions completes or
        aborts it), before the partition is read again from its committed offset.
        """
        producer = self._producers[write.partition]
        await producer.begin_transaction()
        outputs: list[asyncio.Future] = []
        futures: list[asyncio.Future] = []
        try:
            for target, records in write.outputs.items():
                topic, partition = placed(target, write.partition)
                for key, value, headers in records:
                    outputs.append(
                        await producer.send(
                            topic, value, key=key, partition=partition, headers=headers
                        )
                    )
            for k, v in write.puts:
                futures.append(
                    await producer.send(self.changelog_topic, v, key=k, partition=write.partition)
                )
            if write.last_offset >= 0:
                tp = TopicPartition(self.input_topic, write.partition)
                await producer.send_offsets_to_transaction(
                    {tp: OffsetAndMetadata(write.last_offset + 1, "")}, self.group_id
                )
            await producer.commit_transaction()
        except asyncio.CancelledError:
            raise  # the runner is stopping: the producer is closed, the next one settles it
        except Exception as exc:
            # The records' futures fail with the transaction; this error is raised for them all.
            consume_errors([*outputs, *futures])
            await _abort(producer, write.partition, exc)
            raise
        if not futures:
            return None
        return max(m.offset for m in await asyncio.gather(*futures))

    async def commit(self, force: bool = False) -> None:
        """Offsets were committed in each batch's transaction."""
