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
Nothing fences a previous owner cut off from the brokers, so: no changelog record is sent
unless the group confirmed this member less than half a session timeout ago (kafka/liveness.py),
and every changelog record carries the owner's epoch, so a batch that still lands late is
skipped by readers and repaired by the current owner (runner/fencing.py).

exactly_once: Kafka transactions, one transactional producer per task whose id is derived from
the runner's prefix and the partition, so the next owner of a partition fences a zombie previous
owner (aiokafka's TxnOffsetCommit carries no group generation). Outputs, changelog records and
the input offsets commit together, inside the transaction.

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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from enhydra.contracts.headers import epoch_headers
from enhydra.kafka.clients import Producer, close, new_producer, start
from enhydra.kafka.liveness import GroupLiveness
from enhydra.kafka.reading import ReadStalled, read_spans
from enhydra.logs import get_logger
from enhydra.runner.batch import Out, PartitionWrite
from enhydra.runner.fencing import Range, gaps, next_epoch, stale_keys
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore

log = get_logger("enhydra.checkpoint")


@dataclass(frozen=True, slots=True)
class Written:
    """What one partition's batch made durable."""

    partition: int
    changelog_offset: int | None  # the last changelog record written, if any
    input_offset: int


class OutputTooLargeForBatch(ValueError):
    """A single record does not fit an empty producer batch (max_batch_size)."""


class StaleBatch(RuntimeError):
    """This process stalled long enough to have lost its tasks: the batch must not be written."""


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


def _begin(run: Callable[[Flight], Awaitable[list[Written]]]) -> Flight:
    published: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    # A failure is raised from `done`; the same error on `published` is only for the next flight.
    published.add_done_callback(lambda f: f.cancelled() or f.exception())
    flight = Flight(published)
    flight.done = asyncio.ensure_future(run(flight))
    return flight


def _settle(future: asyncio.Future[None], error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    elif isinstance(error, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(error)


class Checkpoint(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def open_task(self, partition: int) -> None: ...
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


def _producer_settings(settings: Settings) -> dict:
    return {
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": settings.producer_linger_ms,
        "max_batch_size": 256 * 1024,
    }


async def warm_up(producer: Producer, topics: list[str]) -> None:
    """Learn where the output topics' partitions live now, not while the first batch waits."""
    for topic in topics:
        await producer.partitions_for(topic)


def persist(
    written: list[tuple[PartitionWrite, int | None]],
    stores: Mapping[int, PartitionStore],
    epochs: Mapping[int, int] | None = None,
):
    """Step 2: the entries and both offsets (and the owner's epoch), one WriteBatch each."""
    result = []
    for write, changelog_offset in written:
        stores[write.partition].write(
            write.puts,
            changelog_offset=changelog_offset,
            input_offset=write.last_offset,
            owner_epoch=epochs.get(write.partition) if epochs else None,
        )
        result.append(Written(write.partition, changelog_offset, write.last_offset))
    return result


async def send_in_batches(
    producer: Producer, records: Mapping[tuple[str, int], list[Out]]
) -> list[tuple[tuple[str, int], asyncio.Future, int]]:
    """Send records grouped per topic-partition as whole record batches.

    One future per batch instead of one coroutine and future per record: this is most of the
    producer's per-record cost in Python. Returns (topic-partition, the future of the batch's
    base metadata, its record count) per batch.
    """
    now_ms = int(time.time() * 1000)
    sent: list[tuple[tuple[str, int], asyncio.Future, int]] = []

    async def flush(tp: tuple[str, int], builder: object, count: int) -> None:
        builder.close()  # type: ignore[attr-defined]
        future = await producer.send_batch(builder, tp[0], partition=tp[1])
        sent.append((tp, future, count))

    for tp, items in records.items():
        builder = producer.create_batch()
        count = 0
        for key, value, headers in items:
            appended = builder.append(key=key, value=value, timestamp=now_ms, headers=headers or [])
            if appended is None:  # batch full: send it and start another
                await flush(tp, builder, count)
                builder = producer.create_batch()
                count = 0
                appended = builder.append(
                    key=key, value=value, timestamp=now_ms, headers=headers or []
                )
                if appended is None:
                    raise OutputTooLargeForBatch(f"a record for {tp[0]} exceeds the batch size")
            count += 1
        if count:
            await flush(tp, builder, count)
    return sent


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
        self._producer = new_producer(
            settings.connection, client_id=client_id, **_producer_settings(settings)
        )

    async def start(self) -> None:
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
        flight = _begin(lambda flight: self._fly(flight, batch, stores, after, guard))
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
            guard()
            outputs = {
                (topic, write.partition): records
                for write in batch
                for topic, records in write.outputs.items()
                if records
            }
            flight.sent_at = time.time()
            if outputs:
                await self._retrying("publish", self._publish, outputs)
            flight.published_at = time.time()
            _settle(flight.published)
        except BaseException as exc:
            _settle(flight.published, exc)
            raise
        if after is not None:
            await after.done
        guard()  # a zombie never puts an old state into the changelog after the next owner's
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
        last = await self._send_changelog(changelog, owners) if changelog else {}
        epochs = {p: owner.epoch for p, owner in owners.items()}
        written = persist([(w, last.get(w.partition)) for w in batch], stores, epochs)
        await self._repair(owners)
        for w in batch:
            if w.last_offset >= 0:
                self._pending[TopicPartition(self.input_topic, w.partition)] = w.last_offset + 1
        flight.done_at = time.time()
        return written

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
        self, records: Mapping[tuple[str, int], list[Out]], owners: Mapping[int, _Owner]
    ) -> dict[int, int]:
        """Publish changelog records; note foreign records found between them per owner."""
        spans = await self._retrying("publish", self._publish_spans, records)
        last: dict[int, int] = {}
        for partition, ranges in spans.items():
            owner = owners[partition]
            found, owner.next_offset = gaps(owner.next_offset, ranges)
            owner.gaps += found
            last[partition] = owner.next_offset - 1
        return last

    async def _publish_spans(
        self, records: Mapping[tuple[str, int], list[Out]]
    ) -> dict[int, list[Range]]:
        """Send and wait for the acknowledgements: partition -> the [start, end) offsets the
        broker gave each record batch."""
        spans: dict[int, list[Range]] = {}
        for (_, partition), future, count in await send_in_batches(self._producer, records):
            meta = await future
            spans.setdefault(partition, []).append((meta.offset, meta.offset + count))
        return spans

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

    async def _publish(self, records: Mapping[tuple[str, int], list[Out]]) -> dict[int, int]:
        """Send and wait for the acknowledgements: partition -> the last offset written."""
        last: dict[int, int] = {}
        for (_, partition), future, count in await send_in_batches(self._producer, records):
            meta = await future
            last[partition] = max(last.get(partition, -1), meta.offset + count - 1)
        return last

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
        self._producers: dict[int, Producer] = {}

    async def start(self) -> None:
        """Producers are per task; they start when a task becomes active."""

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
            **_producer_settings(self.settings),
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
        return _begin(lambda flight: self._fly(flight, batch, stores, after))

    async def _fly(
        self,
        flight: Flight,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
    ) -> list[Written]:
        """A task's producer runs one transaction at a time: a flight waits for the last one."""
        try:
            if after is not None:
                await after.done
            flight.sent_at = time.time()
            offsets = await self._retrying("publish", self._transactions, batch)
            flight.published_at = time.time()
            _settle(flight.published)
        except BaseException as exc:
            _settle(flight.published, exc)
            raise
        written = persist(list(zip(batch, offsets, strict=True)), stores)
        flight.done_at = time.time()
        return written

    async def _transactions(self, batch: list[PartitionWrite]) -> list[int | None]:
        return list(await asyncio.gather(*(self._transaction(w) for w in batch)))

    async def _transaction(self, write: PartitionWrite) -> int | None:
        producer = self._producers[write.partition]
        async with producer.transaction():
            for topic, records in write.outputs.items():
                for key, value, headers in records:
                    await producer.send(
                        topic, value, key=key, partition=write.partition, headers=headers
                    )
            futures = [
                await producer.send(self.changelog_topic, v, key=k, partition=write.partition)
                for k, v in write.puts
            ]
            if write.last_offset >= 0:
                tp = TopicPartition(self.input_topic, write.partition)
                await producer.send_offsets_to_transaction(
                    {tp: OffsetAndMetadata(write.last_offset + 1, "")}, self.group_id
                )
        if not futures:
            return None
        return max(m.offset for m in await asyncio.gather(*futures))

    async def commit(self, force: bool = False) -> None:
        """Offsets were committed in each batch's transaction."""
