"""The Kafka engine: consume commands in batches, run the pure core, produce, persist, commit.

Order of a batch, chosen so that a crash at any point loses nothing and applies nothing twice:

1. run decide/apply for every record of the batch (pure, no I/O);
2. produce events and rejections, and wait for the broker's acknowledgement;
3. produce the changed entries to the changelog, and wait again;
4. write the entries and the changelog checkpoint to RocksDB in one WriteBatch;
5. commit the input offsets (at most every `commit_interval_ms`).

A crash before 2 completes re-runs the batch. A crash after 3 leaves entries in the changelog
that carry their input offset, so whoever restores them skips the redelivered commands instead of
applying them again; their events were acknowledged in step 2, so none is lost. Events may be
duplicated by a crash between 2 and 3 (at-least-once outputs); state never is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.partitioner import murmur2

from enhydra.aggregate import BoundAggregate, dumps
from enhydra.logs import get_logger
from enhydra.processing.core import (
    BatchResult,
    Entry,
    InputRecord,
    decode_entry,
    encode_entry,
    process_batch,
)
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore
from enhydra.stores.restore import Restorer
from enhydra.topics import TopicSpec, ensure_topics

log = get_logger("enhydra.engine")

# Every event carries the command that caused it: its id (for dedup when state is rebuilt from
# events) and its offset in the commands partition of the same number (for the cut of a
# snapshot rebuilt from events, so a clone resumes on the commands topic exactly after it).
COMMAND_ID_HEADER = "enhydra.command_id"
COMMAND_OFFSET_HEADER = "enhydra.command_offset"


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner, so routing agrees with every Kafka producer."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class TaskStatus(StrEnum):
    RESTORING = "restoring"
    ACTIVE = "active"
    SUSPENDED = "suspended"  # revoked during a rebalance; may come back without a restore


@dataclass
class Task:
    """One partition of the aggregate: its input partition and its store partition."""

    partition: int
    store: PartitionStore
    status: TaskStatus = TaskStatus.RESTORING
    processed: int = 0
    restore: dict[str, float] = field(default_factory=dict)


class LookupStatus(StrEnum):
    FOUND = "found"
    MISSING = "missing"
    NOT_HOSTED = "not_hosted"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Lookup:
    status: LookupStatus
    partition: int
    entry: Entry | None = None


class _Listener(ConsumerRebalanceListener):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.engine._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.engine._on_assigned(assigned)


class Engine:
    """Runs one aggregate for one instance; several instances share the work through the group."""

    def __init__(self, settings: Settings, aggregate: BoundAggregate) -> None:
        self.settings = settings
        self.aggregate = aggregate
        self.tasks: dict[int, Task] = {}
        self.joined = False
        self.rebalancing = False
        self.stats = {"processed": 0, "events": 0, "rejections": 0, "skipped": 0, "batches": 0}
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._pending_commit: dict[TopicPartition, int] = {}
        self._last_commit = 0.0
        self._loop_task: asyncio.Task[None] | None = None
        self._restore_task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._restorer: Restorer | None = None
        self.failure: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None

    # lifecycle -------------------------------------------------------------------------------
    def topic_specs(self) -> list[TopicSpec]:
        s, a = self.settings, self.aggregate
        rf = s.replication_factor
        return [
            TopicSpec(a.commands_topic, s.partitions, rf),
            TopicSpec(a.events_topic, s.partitions, rf),
            TopicSpec(a.rejections_topic, s.partitions, rf),
            TopicSpec(a.changelog_topic, s.partitions, rf, compacted=True),
        ]

    async def start(self) -> None:
        s = self.settings
        await ensure_topics(s.bootstrap_servers, self.topic_specs(), client_id=s.instance_id)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap_servers,
            client_id=f"{s.instance_id}-producer",
            acks="all",
            enable_idempotence=True,
            linger_ms=s.producer_linger_ms,
            max_batch_size=256 * 1024,
        )
        await self._producer.start()
        self._restorer = Restorer(s, self.aggregate.changelog_topic)
        await self._restorer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers,
            group_id=s.app_id,
            client_id=s.instance_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            rebalance_timeout_ms=s.rebalance_timeout_ms,
            max_poll_interval_ms=max(s.rebalance_timeout_ms, 60000),
            fetch_max_wait_ms=100,
        )
        self._consumer.subscribe([self.aggregate.commands_topic], listener=_Listener(self))
        await self._consumer.start()
        self._loop_task = asyncio.create_task(self._run(), name="enhydra-processing")
        log.info(
            "engine started",
            store=self.aggregate.name,
            commands=self.aggregate.commands_topic,
            partitions=s.partitions,
        )

    async def stop(self) -> None:
        """Finish the batch in flight, flush, commit, leave the group, close the stores."""
        self._stopping.set()
        if self._loop_task is not None:
            try:
                await asyncio.wait_for(self._loop_task, self.settings.shutdown_timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                self._loop_task.cancel()
            except Exception:  # already reported through on_failure
                pass
        await self._cancel_restore()
        if self._consumer is not None:
            async with self._lock:
                await self._commit(force=True)
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        if self._restorer is not None:
            await self._restorer.stop()
        for task in self.tasks.values():
            task.store.close()
        self.tasks.clear()
        log.info("engine stopped", **self.stats)

    @property
    def ready(self) -> bool:
        """In the group, not rebalancing, and every assigned task restored."""
        return (
            self.joined
            and not self.rebalancing
            and all(t.status is TaskStatus.ACTIVE for t in self.tasks.values())
        )

    # queries ---------------------------------------------------------------------------------
    def lookup(self, key: str) -> Lookup:
        """Read a key's current entry if this instance hosts its partition and it is current."""
        raw_key = key.encode("utf-8")
        partition = partition_for(raw_key, self.settings.partitions)
        task = self.tasks.get(partition)
        if task is None:
            return Lookup(LookupStatus.NOT_HOSTED, partition)
        if task.status is not TaskStatus.ACTIVE or self.rebalancing:
            return Lookup(LookupStatus.UNAVAILABLE, partition)
        raw = task.store.get(raw_key)
        if raw is None:
            return Lookup(LookupStatus.MISSING, partition)
        return Lookup(LookupStatus.FOUND, partition, decode_entry(raw))

    # rebalance -------------------------------------------------------------------------------
    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self.rebalancing = True
        await self._cancel_restore()
        async with self._lock:
            await self._commit(force=True)
            for tp in revoked:
                task = self.tasks.get(tp.partition)
                if task is not None:
                    task.status = TaskStatus.SUSPENDED
        if revoked:
            log.info("partitions revoked", partitions=sorted(tp.partition for tp in revoked))

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        keep = {tp.partition for tp in assigned}
        async with self._lock:
            for partition in [p for p in self.tasks if p not in keep]:
                self.tasks.pop(partition).store.close()
            for partition in keep:
                task = self.tasks.get(partition)
                if task is None:
                    path = self.settings.store_dir / self.aggregate.name / str(partition)
                    task = self.tasks[partition] = Task(partition, PartitionStore(path))
                task.status = TaskStatus.RESTORING
        if assigned:
            assert self._consumer is not None
            self._consumer.pause(*assigned)
        self.joined = True
        self.rebalancing = False
        log.info("partitions assigned", partitions=sorted(keep))
        if self.tasks:
            self._restore_task = asyncio.create_task(self._restore(list(self.tasks.values())))

    async def _cancel_restore(self) -> None:
        task, self._restore_task = self._restore_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _restore(self, tasks: list[Task]) -> None:
        """Catch every task's store up with its changelog, then let its input flow."""
        assert self._restorer is not None and self._consumer is not None
        try:
            await self._restorer.restore({t.partition: t for t in tasks})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
            return
        topic = self.aggregate.commands_topic
        for task in tasks:
            task.status = TaskStatus.ACTIVE
        assigned = self._consumer.assignment()
        self._consumer.resume(
            *[tp for tp in (TopicPartition(topic, t.partition) for t in tasks) if tp in assigned]
        )
        log.info("tasks active", partitions=sorted(t.partition for t in tasks))

    # processing ------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            log.error("processing failed", error=repr(exc), exc_info=exc)
            if self.on_failure is not None:
                self.on_failure(exc)

    async def _run(self) -> None:
        assert self._consumer is not None
        try:
            while not self._stopping.is_set():
                batch = await self._consumer.getmany(
                    timeout_ms=100, max_records=self.settings.max_batch_records
                )
                if batch:
                    async with self._lock:
                        await self._process(batch)
                if self._pending_commit:
                    async with self._lock:
                        await self._commit()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
            raise

    async def _process(self, batch: dict[TopicPartition, list]) -> None:
        assert self._consumer is not None and self._producer is not None
        agg = self.aggregate
        window = self.settings.dedup_window
        results: list[tuple[TopicPartition, Task, BatchResult]] = []
        for tp, records in batch.items():
            task = self.tasks.get(tp.partition)
            if task is None or task.status is not TaskStatus.ACTIVE:
                # Fetched just before a rebalance paused it: rewind so nothing is skipped.
                if tp in self._consumer.assignment():
                    self._consumer.seek(tp, records[0].offset)
                continue
            store = task.store

            def load(key: str, store: PartitionStore = store) -> Entry | None:
                raw = store.get(key.encode("utf-8"))
                return decode_entry(raw) if raw is not None else None

            inputs = [InputRecord(r.offset, r.key, r.value, r.timestamp) for r in records]
            results.append(
                (tp, task, process_batch(agg.aggregate, inputs, load, dedup_window=window))
            )
        if not results:
            return
        send = self._producer.send
        acks = []
        for tp, _task, result in results:
            for emitted in result.emitted:
                key = emitted.key.encode("utf-8")
                headers = [
                    (COMMAND_ID_HEADER, emitted.command_id.encode("utf-8")),
                    (COMMAND_OFFSET_HEADER, str(emitted.offset).encode()),
                ]
                for event in emitted.events:
                    acks.append(
                        await send(
                            agg.events_topic,
                            dumps(event),
                            key=key,
                            partition=tp.partition,
                            headers=headers,
                        )
                    )
            for rejected in result.rejected:
                key = rejected.key.encode("utf-8") if rejected.key is not None else None
                acks.append(
                    await send(
                        agg.rejections_topic,
                        dumps(rejected.to_value()),
                        key=key,
                        partition=tp.partition,
                    )
                )
        if acks:
            await asyncio.gather(*acks)
        writes: list[tuple[Task, list[tuple[bytes, bytes]], int, list]] = []
        for tp, task, result in results:
            puts = [(k.encode("utf-8"), encode_entry(e)) for k, e in result.changed.items()]
            futures = [
                await send(agg.changelog_topic, v, key=k, partition=tp.partition) for k, v in puts
            ]
            writes.append((task, puts, result.last_offset, futures))
        for task, puts, last_offset, futures in writes:
            changelog_offset = None
            if futures:
                metadata = await asyncio.gather(*futures)
                changelog_offset = max(m.offset for m in metadata)
            task.store.write(puts, changelog_offset=changelog_offset, input_offset=last_offset)
        stats = self.stats
        for tp, task, result in results:
            count = len(batch[tp])
            task.processed += count
            stats["processed"] += count
            stats["events"] += result.event_count
            stats["rejections"] += len(result.rejected)
            stats["skipped"] += result.skipped
            self._pending_commit[tp] = result.last_offset + 1
        stats["batches"] += 1

    async def _commit(self, force: bool = False) -> None:
        """Commit processed input offsets, at most every commit_interval_ms unless forced."""
        if not self._pending_commit or self._consumer is None:
            return
        now = time.monotonic()
        if not force and (now - self._last_commit) * 1000 < self.settings.commit_interval_ms:
            return
        offsets, self._pending_commit = self._pending_commit, {}
        try:
            await self._consumer.commit(offsets)
            self._last_commit = now
        except (CommitFailedError, IllegalStateError, KafkaError) as exc:
            # The records will be redelivered to the next owner, which skips what its
            # restored state already reflects: a failed commit costs time, never correctness.
            log.warning("commit failed; records will be redelivered and skipped", error=repr(exc))
