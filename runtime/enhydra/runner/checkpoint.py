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

from enhydra.kafka.clients import Producer, close, new_producer, start
from enhydra.logs import get_logger
from enhydra.runner.batch import Out, PartitionWrite
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


def persist(written: list[tuple[PartitionWrite, int | None]], stores: Mapping[int, PartitionStore]):
    """Step 2: the entries and both offsets, one WriteBatch per partition."""
    result = []
    for write, changelog_offset in written:
        stores[write.partition].write(
            write.puts, changelog_offset=changelog_offset, input_offset=write.last_offset
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
    ) -> None:
        self.settings = settings
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
        """Nothing per task: one producer serves them all."""

    async def close_task(self, partition: int) -> None:
        """Nothing per task: one producer serves them all."""

    def begin(
        self,
        batch: list[PartitionWrite],
        stores: Mapping[int, PartitionStore],
        after: Flight | None,
        guard: Guard = _no_guard,
    ) -> Flight:
        return _begin(lambda flight: self._fly(flight, batch, stores, after, guard))

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
        changelog = {
            (self.changelog_topic, w.partition): [(k, v, None) for k, v in w.puts]
            for w in batch
            if w.puts
        }
        last = await self._retrying("publish", self._publish, changelog) if changelog else {}
        written = persist([(w, last.get(w.partition)) for w in batch], stores)
        for w in batch:
            if w.last_offset >= 0:
                self._pending[TopicPartition(self.input_topic, w.partition)] = w.last_offset + 1
        flight.done_at = time.time()
        return written

    async def _publish(self, records: Mapping[tuple[str, int], list[Out]]) -> dict[int, int]:
        """Send and wait for the acknowledgements: partition -> the last offset written."""
        last: dict[int, int] = {}
        for (_, partition), future, count in await send_in_batches(self._producer, records):
            meta = await future
            last[partition] = max(last.get(partition, -1), meta.offset + count - 1)
        return last

    async def commit(self, force: bool = False) -> None:
        """Commit processed input offsets, at most every commit_interval_ms unless forced."""
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
