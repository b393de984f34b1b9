"""A small engine per projection: consume the events topic, fold, publish the changelog, commit.

It runs beside the aggregate's engine in the same process with its own consumer group, so its
partitions are balanced among the instances independently of the aggregate's. A batch is
handled in the aggregate's order, for the same reason: fold (pure), publish the changelog
records and wait for their acknowledgement, write them to RocksDB with the changelog
checkpoint, commit the events offsets. A crash anywhere redelivers events whose offsets are at
or below what the stored entries remember; they are skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from enhydra.kafka.clients import Consumer, Producer, close, new_consumer, new_producer, start
from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.logs import get_logger
from enhydra.processing.core import Entry
from enhydra.processing.engine import Lookup, LookupStatus, TaskStatus, partition_for
from enhydra.processing.rebalance import ForwardingListener
from enhydra.projections.model import (
    EventRecord,
    ProjectedEntry,
    Projection,
    decode,
    encode,
    event_source,
    fold_batch,
)
from enhydra.settings import Settings
from enhydra.stores.changelog_reader import ChangelogReader
from enhydra.stores.partition import PartitionStore

log = get_logger("enhydra.projection")


@dataclass
class ProjectionTask:
    """One partition of a projection held here (a `Copy` for the changelog reader)."""

    partition: int
    store: PartitionStore
    status: TaskStatus = TaskStatus.RESTORING
    processed: int = 0
    restore: dict[str, float] = field(default_factory=dict)


class ProjectionEngine:
    """Builds one projection's store from the events topic, for this instance's partitions."""

    def __init__(
        self,
        settings: Settings,
        projection: Projection,
        events_topic: str,
        *,
        plugin: str | None = None,
    ) -> None:
        self.settings = settings
        self.projection = projection
        self.events_topic = events_topic
        self.plugin = plugin
        self.name = projection.name
        self.group_id = projection.group_id(settings.app_id)
        self.changelog_topic = projection.changelog_topic(settings.app_id)
        self.tasks: dict[int, ProjectionTask] = {}
        self.rebalancing = True
        self.stats = {"processed": 0, "skipped": 0, "duplicates": 0, "changed": 0, "batches": 0}
        self.failure: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._reader: ChangelogReader | None = None

    def topic_specs(self) -> list[TopicSpec]:
        s = self.settings
        return [
            TopicSpec(self.events_topic, s.partitions, s.replication_factor, history=True),
            TopicSpec(self.changelog_topic, s.partitions, s.replication_factor, compacted=True),
        ]

    async def start(self) -> None:
        s = self.settings
        client = f"{s.instance_id}-{self.name}"
        await ensure_topics(s.connection, self.topic_specs(), client_id=client)
        self._producer = new_producer(
            s.connection,
            client_id=client,
            acks="all",
            enable_idempotence=True,
            linger_ms=s.producer_linger_ms,
        )
        await start(self._producer, s.connection)
        self._reader = ChangelogReader(s, self.changelog_topic, self._on_restored)
        await self._reader.start()
        self._consumer = new_consumer(
            s.connection,
            group_id=self.group_id,
            client_id=client,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            rebalance_timeout_ms=s.rebalance_timeout_ms,
            max_poll_interval_ms=max(s.rebalance_timeout_ms, 60000),
            fetch_max_wait_ms=100,
        )
        self._consumer.subscribe([self.events_topic], listener=ForwardingListener(self))
        await start(self._consumer, s.connection, doing=f"join the group {self.group_id}")
        self._task = asyncio.create_task(self._run(), name=f"enhydra-projection-{self.name}")
        log.info(
            "projection started",
            projection=self.name,
            plugin=self.plugin,
            source=self.events_topic,
            group=self.group_id,
            changelog=self.changelog_topic,
        )

    async def stop(self) -> None:
        """Finish the batch in flight, commit, leave the group, close the stores."""
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, self.settings.shutdown_timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            except Exception:  # already reported through on_failure
                pass
        if self._reader is not None:
            await self._reader.stop()
        if self._consumer is not None:
            await close(self._consumer)
        if self._producer is not None:
            await close(self._producer)
        for task in self.tasks.values():
            task.store.close()
        self.tasks.clear()
        log.info("projection stopped", projection=self.name, **self.stats)

    @property
    def ready(self) -> bool:
        return not self.rebalancing and all(
            t.status is TaskStatus.RUNNING for t in self.tasks.values()
        )

    # group protocol --------------------------------------------------------------------------
    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self.rebalancing = True
        async with self._lock:
            for task in self.tasks.values():
                task.status = TaskStatus.SUSPENDED
            if self._reader is not None:
                self._reader.set_copies({}, {})

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        wanted = {tp.partition for tp in assigned}
        async with self._lock:
            for partition in [p for p in self.tasks if p not in wanted]:
                self.tasks.pop(partition).store.close()
            for partition in sorted(wanted):
                task = self.tasks.get(partition)
                if task is None:
                    path = self.settings.store_dir / self.name / str(partition)
                    task = self.tasks[partition] = ProjectionTask(partition, PartitionStore(path))
                task.status = TaskStatus.RESTORING
            if assigned:
                assert self._consumer is not None
                self._consumer.pause(*assigned)
            assert self._reader is not None
            self._reader.set_copies(dict(self.tasks), {})
        self.rebalancing = False
        log.info("projection partitions assigned", projection=self.name, partitions=sorted(wanted))

    def _on_restored(self, task: ProjectionTask) -> None:
        if self.tasks.get(task.partition) is not task:
            return
        task.status = TaskStatus.RUNNING
        assert self._consumer is not None
        tp = TopicPartition(self.events_topic, task.partition)
        if tp in self._consumer.assignment():
            self._consumer.resume(tp)

    # queries ---------------------------------------------------------------------------------
    def lookup(self, key: str) -> Lookup:
        """A key's read model if this instance holds its partition of the projection."""
        raw_key = key.encode("utf-8")
        partition = partition_for(raw_key, self.settings.partitions)
        task = self.tasks.get(partition)
        if task is None:
            return Lookup(LookupStatus.NOT_HOSTED, partition)
        if task.status is not TaskStatus.RUNNING or self.rebalancing:
            return Lookup(LookupStatus.UNAVAILABLE, partition)
        raw = task.store.get(raw_key)
        if raw is None:
            return Lookup(LookupStatus.MISSING, partition)
        projected = decode(raw)
        return Lookup(LookupStatus.FOUND, partition, Entry(projected.state, projected.offset))

    def describe(self) -> dict[str, object]:
        return {
            "plugin": self.plugin,
            "ready": self.ready,
            "partitions": {str(p): t.status.value for p, t in sorted(self.tasks.items())},
            **self.stats,
        }

    # processing ------------------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._consumer is not None and self._reader is not None
        try:
            while not self._stopping.is_set():
                if self._reader.failure is not None:
                    raise self._reader.failure
                batch = await self._consumer.getmany(
                    timeout_ms=100, max_records=self.settings.max_batch_records
                )
                if batch:
                    async with self._lock:
                        await self._process(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.failure is None:
                self.failure = exc
                log.error("projection failed", projection=self.name, error=repr(exc), exc_info=exc)
                if self.on_failure is not None:
                    self.on_failure(exc)
            raise

    async def _process(self, batch: dict[TopicPartition, list]) -> None:
        assert self._consumer is not None and self._producer is not None
        work = []
        for tp, records in batch.items():
            task = self.tasks.get(tp.partition)
            if task is None or task.status is not TaskStatus.RUNNING:
                if tp in self._consumer.assignment():
                    self._consumer.seek(tp, records[0].offset)
                continue
            store = task.store

            def load(key: str, store: PartitionStore = store) -> ProjectedEntry | None:
                raw = store.get(key.encode("utf-8"))
                return decode(raw) if raw is not None else None

            result = fold_batch(
                self.projection,
                (EventRecord(r.offset, r.key, r.value, event_source(r.headers)) for r in records),
                load,
            )
            puts = [
                (k.encode("utf-8"), encode(e) if e is not None else None)
                for k, e in result.changed.items()
            ]
            work.append((tp, task, result, puts, len(records)))
        if not work:
            return
        sends = []
        for tp, _task, _result, puts, _count in work:
            for key, value in puts:
                future = await self._producer.send(
                    self.changelog_topic, value, key=key, partition=tp.partition
                )
                sends.append((tp.partition, future))
        acked = await asyncio.gather(*(f for _, f in sends))
        last: dict[int, int] = {}
        for (partition, _), metadata in zip(sends, acked, strict=True):
            last[partition] = max(last.get(partition, -1), metadata.offset)
        offsets = {}
        for tp, task, result, puts, count in work:
            task.store.write(
                puts, changelog_offset=last.get(tp.partition), input_offset=result.last_offset
            )
            task.processed += count
            self.stats["processed"] += count
            self.stats["skipped"] += result.skipped
            self.stats["duplicates"] += result.duplicates
            self.stats["changed"] += len(puts)
            offsets[tp] = result.last_offset + 1
        self.stats["batches"] += 1
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError, KafkaError) as exc:
            # Redelivered events are skipped by the offsets the entries remember.
            log.warning("projection commit failed", projection=self.name, error=repr(exc))
