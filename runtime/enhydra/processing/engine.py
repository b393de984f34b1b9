"""The Kafka engine: consume commands in batches, run the pure core, publish, persist, commit.

Order of a batch, chosen so that a crash at any point loses nothing and applies nothing twice:

1. run decide/apply for every record of the batch (pure, no I/O);
2. publish events, rejections and changed entries (see output.py for the two guarantees);
3. write the entries and the changelog checkpoint to RocksDB in one WriteBatch;
4. commit the input offsets (at most every `commit_interval_ms`; in the transaction for
   exactly_once).

Every changelog entry carries the input offset that last changed its key, so whoever restores
it skips redelivered commands instead of applying them again.

Besides its active tasks, an instance keeps standby and warm-up copies of other tasks by
following their changelogs (assignment/ decides which); an active whose instance is lost moves
to a caught-up copy and resumes after restoring only the tail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.partitioner import murmur2

from enhydra.aggregate import BoundAggregate
from enhydra.assignment import AssignmentConfig
from enhydra.assignment.protocol import GroupMap, MemberAssignment, MemberReport, TaskAssignor
from enhydra.control.channel import control_topic_spec
from enhydra.errors.dlq import dead_letter_headers
from enhydra.errors.policies import ErrorAction, ErrorPolicies, RecordFailed, fails
from enhydra.kafka.clients import Consumer, new_consumer, start
from enhydra.kafka.errors import transient
from enhydra.kafka.groups import request_rejoin
from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.logs import get_logger
from enhydra.processing.cache import EntryCache
from enhydra.processing.core import Entry, Failure, decode_entry, process_batch
from enhydra.processing.output import (
    AtLeastOnceOutput,
    ExactlyOnceOutput,
    PartitionBatch,
    changelog_puts,
    make_output,
)
from enhydra.processing.rebalance import ForwardingListener
from enhydra.processing.retries import RetryTracker
from enhydra.settings import Settings
from enhydra.stores.changelog_reader import ChangelogReader
from enhydra.stores.partition import PartitionStore
from enhydra.stores.partition import configure_memory as configure_store_memory

log = get_logger("enhydra.engine")


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner, so routing agrees with every Kafka producer."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Role(StrEnum):
    ACTIVE = "active"
    STANDBY = "standby"
    WARMUP = "warmup"


class TaskStatus(StrEnum):
    RESTORING = "restoring"  # active, catching up with its changelog before input flows
    RUNNING = "running"  # active: processing; standby/warm-up: following the changelog
    SUSPENDED = "suspended"  # revoked during a rebalance; may come back without a restore


@dataclass
class Task:
    """One partition of the aggregate held here: input partition + store partition copy."""

    partition: int
    store: PartitionStore
    role: Role = Role.ACTIVE
    status: TaskStatus = TaskStatus.RESTORING
    processed: int = 0
    restore: dict[str, float] = field(default_factory=dict)
    cache: EntryCache = field(default_factory=lambda: EntryCache(0))


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


class Engine:
    """Runs one aggregate for one instance; several instances share the work through the group."""

    def __init__(
        self,
        settings: Settings,
        aggregate: BoundAggregate,
        *,
        policies: ErrorPolicies | None = None,
        transient: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.settings = settings
        self.aggregate = aggregate
        self.policies = policies or ErrorPolicies(
            settings.deserialization_exception_handler,
            settings.processing_exception_handler,
            settings.production_exception_handler,
        )
        self.transient = transient
        self.failures: dict[str, int] = {}  # "stage:ErrorClass" -> records that failed
        # Snapshot cuts: partition -> (offset to stop at, resolved with the actual cut offset).
        self._stops: dict[int, tuple[int, asyncio.Future[int]]] = {}
        self._retries = RetryTracker(
            settings.retry_backoff_ms / 1000, settings.task_timeout_ms / 1000
        )
        self.tasks: dict[int, Task] = {}
        self.group = GroupMap()
        self.joined = False
        self.rebalancing = False
        self.rebalances = 0
        self.stats = {"processed": 0, "events": 0, "rejections": 0, "skipped": 0, "batches": 0}
        self.failure: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self._assignment = MemberAssignment()
        self._disk_checkpoints: dict[int, int] = {}
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._pending_commit: dict[TopicPartition, int] = {}
        self._last_commit = 0.0
        self._background: list[asyncio.Task[None]] = []
        self._consumer: Consumer | None = None
        # Kafka clients need the running loop: they are created in start().
        self._output: AtLeastOnceOutput | ExactlyOnceOutput
        self._reader: ChangelogReader
        self.assignment_config = AssignmentConfig(
            num_standby_replicas=settings.num_standby_replicas,
            acceptable_recovery_lag=settings.acceptable_recovery_lag,
            max_warmup_replicas=settings.max_warmup_replicas,
            rack_aware_assignment_tags=settings.rack_aware_assignment_tags,
        )

    # lifecycle -------------------------------------------------------------------------------
    def topic_specs(self) -> list[TopicSpec]:
        s, a = self.settings, self.aggregate
        rf = s.replication_factor
        return [
            TopicSpec(a.commands_topic, s.partitions, rf),
            TopicSpec(a.events_topic, s.partitions, rf, history=True),
            TopicSpec(a.rejections_topic, s.partitions, rf),
            TopicSpec(a.changelog_topic, s.partitions, rf, compacted=True),
            *(
                [TopicSpec(s.dlq_topic, s.partitions, rf, history=True)]
                if self.policies.uses_dlq()
                else []
            ),
            control_topic_spec(s.app_id, rf),
        ]

    async def start(self) -> None:
        s = self.settings
        configure_store_memory(s.store_memory_mb)
        await ensure_topics(s.connection, self.topic_specs(), client_id=s.instance_id)
        self._scan_local_stores()
        self._output = make_output(s, self.aggregate)
        self._reader = ChangelogReader(s, self.aggregate.changelog_topic, self._on_restored)
        await self._output.start()
        await self._reader.start()  # fetches end offsets first: the join reports real lags
        assignor = TaskAssignor(
            self.aggregate.commands_topic,
            self.assignment_config,
            self._report,
            self._on_assignment,
        )
        self._consumer = new_consumer(
            s.connection,
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
            partition_assignment_strategy=(assignor,),
        )
        self._consumer.subscribe([self.aggregate.commands_topic], listener=ForwardingListener(self))
        await start(self._consumer, s.connection, doing=f"join the group {s.app_id}")
        self._background = [
            asyncio.create_task(self._run(), name="enhydra-processing"),
            asyncio.create_task(self._probe(), name="enhydra-probing"),
        ]
        log.info(
            "engine started",
            store=self.aggregate.name,
            commands=self.aggregate.commands_topic,
            partitions=s.partitions,
            guarantee=s.processing_guarantee,
            standbys=s.num_standby_replicas,
            local_stores=sorted(self._disk_checkpoints),
        )

    async def stop(self) -> None:
        """Finish the batch in flight, flush, commit, leave the group, close the stores."""
        self._stopping.set()
        processing, *others = self._background or [None]
        for task in others:
            task.cancel()
        if processing is not None:
            try:
                await asyncio.wait_for(processing, self.settings.shutdown_timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                processing.cancel()
            except Exception:  # already reported through on_failure
                pass
        if hasattr(self, "_reader"):  # start() may have failed before creating it
            await self._reader.stop()
        if self._consumer is not None:
            async with self._lock:
                await self._commit(force=True)
            await self._consumer.stop()
        if hasattr(self, "_output"):
            await self._output.stop()
        for task in self.tasks.values():
            task.store.close()
        self.tasks.clear()
        if self._consumer is not None:
            log.info("engine stopped", **self.stats)

    def _scan_local_stores(self) -> None:
        """Checkpoints of store copies left on disk by earlier runs: reported as lags."""
        root = self.settings.store_dir / self.aggregate.name
        for path in sorted(root.glob("*")) if root.is_dir() else ():
            if path.name.isdigit() and int(path.name) < self.settings.partitions:
                store = PartitionStore(path)
                self._disk_checkpoints[int(path.name)] = store.changelog_offset
                store.close()

    @property
    def ready(self) -> bool:
        """In the group, not rebalancing, and every active task restored."""
        return (
            self.joined
            and not self.rebalancing
            and all(
                t.status is TaskStatus.RUNNING for t in self.tasks.values() if t.role is Role.ACTIVE
            )
        )

    def active_partitions(self) -> list[int]:
        return sorted(p for p, t in self.tasks.items() if t.role is Role.ACTIVE)

    # group protocol --------------------------------------------------------------------------
    def task_lag(self, task: Task) -> int | None:
        """Changelog records this copy is behind; 0 for a running active (it writes them)."""
        if task.role is Role.ACTIVE and task.status is TaskStatus.RUNNING:
            return 0
        return self._lag(task, task.partition)

    def _lag(self, task_or_checkpoint: Task | int, partition: int) -> int | None:
        checkpoint = (
            task_or_checkpoint.store.changelog_offset
            if isinstance(task_or_checkpoint, Task)
            else task_or_checkpoint
        )
        return self._reader.lag(partition, checkpoint)

    def _report(self) -> MemberReport:
        """What this instance tells the leader when it joins (called inside the join)."""
        lags: dict[int, int] = {}
        # A task with no local copy lags by its whole changelog: a small one is cheap to
        # restore, so such an instance can count as caught up (acceptable_recovery_lag).
        for partition in range(self.settings.partitions):
            lag = self._lag(-1, partition)
            if lag is not None:
                lags[partition] = lag
        for partition, checkpoint in self._disk_checkpoints.items():
            lag = self._lag(checkpoint, partition)
            if lag is not None:
                lags[partition] = lag
        for partition, task in self.tasks.items():
            running_active = task.role is Role.ACTIVE and task.status is not TaskStatus.RESTORING
            lag = 0 if running_active else self._lag(task, partition)
            if lag is not None:
                lags[partition] = lag
        return MemberReport(
            instance_id=self.settings.instance_id,
            url=self.settings.advertised_url,
            tags=self.settings.client_tags,
            active=frozenset(p for p, t in self.tasks.items() if t.role is Role.ACTIVE),
            standby=frozenset(p for p, t in self.tasks.items() if t.role is not Role.ACTIVE),
            lags=lags,
        )

    def _on_assignment(self, assignment: MemberAssignment) -> None:
        self._assignment = assignment  # arrives just before on_partitions_assigned

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self.rebalancing = True
        async with self._lock:
            await self._commit(force=True)
            for tp in revoked:
                task = self.tasks.get(tp.partition)
                if task is not None and task.role is Role.ACTIVE:
                    task.status = TaskStatus.SUSPENDED
            # Stop restoring what may go elsewhere; standbys keep following meanwhile.
            self._reader.set_copies({}, self._following())
        if revoked:
            log.info("partitions revoked", partitions=sorted(tp.partition for tp in revoked))

    def _following(self) -> dict[int, Task]:
        return {p: t for p, t in self.tasks.items() if t.role is not Role.ACTIVE}

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        extra = self._assignment
        active = {tp.partition for tp in assigned}
        roles = {p: Role.WARMUP for p in extra.warmup}
        roles.update({p: Role.STANDBY for p in extra.standby})
        roles.update({p: Role.ACTIVE for p in active})
        async with self._lock:
            for partition in [p for p in self.tasks if p not in roles]:
                await self._close_task(partition)
            for partition, role in sorted(roles.items()):
                task = self.tasks.get(partition)
                if task is None:
                    path = self.settings.store_dir / self.aggregate.name / str(partition)
                    task = self.tasks[partition] = Task(
                        partition,
                        PartitionStore(path),
                        cache=EntryCache(self.settings.state_cache_entries),
                    )
                    self._disk_checkpoints.pop(partition, None)
                task.cache.clear()  # the store may have changed while the task was elsewhere
                if role is not Role.ACTIVE and task.role is Role.ACTIVE:
                    await self._output.close_task(partition)
                task.role = role
                task.status = TaskStatus.RESTORING if role is Role.ACTIVE else TaskStatus.RUNNING
            for partition in sorted(active):
                await self._output.open_task(partition)
            if assigned:
                assert self._consumer is not None
                self._consumer.pause(*assigned)
            restoring = {p: t for p, t in self.tasks.items() if t.role is Role.ACTIVE}
            self._reader.set_copies(restoring, self._following())
        self.group = extra.group
        self.joined = True
        self.rebalancing = False
        self.rebalances += 1
        log.info(
            "tasks assigned",
            active=sorted(active),
            standby=sorted(extra.standby),
            warmup=sorted(extra.warmup),
            probing=extra.probing_rebalance_needed,
        )

    async def _close_task(self, partition: int) -> None:
        task = self.tasks.pop(partition)
        if task.role is Role.ACTIVE:
            await self._output.close_task(partition)
        self._disk_checkpoints[partition] = task.store.changelog_offset
        task.store.close()

    def _on_restored(self, task: Task) -> None:
        """The reader caught an active task up with its changelog: let its input flow."""
        if self.tasks.get(task.partition) is not task or task.role is not Role.ACTIVE:
            return
        task.cache.clear()  # restored: the store is newer than anything cached
        task.status = TaskStatus.RUNNING
        assert self._consumer is not None
        tp = TopicPartition(self.aggregate.commands_topic, task.partition)
        if tp in self._consumer.assignment():
            self._consumer.resume(tp)
        if self.ready:
            log.info("all active tasks running", active=self.active_partitions())

    async def _probe(self) -> None:
        """Ask for a probing rebalance once this instance's warm-ups have caught up.

        The leader planned to move tasks here once their copies are current; the earliest
        moment is when every such copy is within acceptable_recovery_lag. If that takes longer
        than probing_rebalance_interval, probe anyway so the leader sees the progress.
        """
        interval = self.settings.probing_rebalance_interval_ms / 1000
        acceptable = self.settings.acceptable_recovery_lag
        waiting_since = time.monotonic()
        seen_rebalances = self.rebalances
        while not self._stopping.is_set():
            await asyncio.sleep(0.5)
            if self.rebalances != seen_rebalances:
                seen_rebalances, waiting_since = self.rebalances, time.monotonic()
            extra = self._assignment
            if not extra.probing_rebalance_needed or self.rebalancing:
                continue
            warming = [t for p, t in self.tasks.items() if p in extra.warmup | extra.standby]
            lags = [self._lag(t, t.partition) for t in warming]
            caught_up = bool(warming) and all(lag is not None and lag <= acceptable for lag in lags)
            if caught_up or time.monotonic() - waiting_since >= interval:
                log.info(
                    "requesting probing rebalance", caught_up=caught_up, warmup=sorted(extra.warmup)
                )
                self._request_rebalance()
                waiting_since = time.monotonic()

    def _request_rebalance(self) -> None:
        if self._consumer is not None:
            request_rejoin(self._consumer)

    # queries ---------------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """stop() has begun: the group may already have moved this instance's tasks away."""
        return self._stopping.is_set()

    def input_lag(self) -> dict[int, int]:
        """Per running active partition, input records fetched-known but not yet processed."""
        lags: dict[int, int] = {}
        consumer = self._consumer
        if consumer is None:
            return lags
        assigned = consumer.assignment()
        for partition, task in self.tasks.items():
            tp = TopicPartition(self.aggregate.commands_topic, partition)
            if task.role is not Role.ACTIVE or tp not in assigned:
                continue
            highwater = consumer.highwater(tp)
            if highwater is not None:
                lags[partition] = max(0, highwater - (task.store.input_offset + 1))
        return lags

    def lookup(self, key: str) -> Lookup:
        """Read a key's current entry if this instance runs its partition's active task."""
        raw_key = key.encode("utf-8")
        partition = partition_for(raw_key, self.settings.partitions)
        task = self.tasks.get(partition)
        if task is None or task.role is not Role.ACTIVE:
            return Lookup(LookupStatus.NOT_HOSTED, partition)
        if task.status is not TaskStatus.RUNNING or self.rebalancing:
            return Lookup(LookupStatus.UNAVAILABLE, partition)
        raw = task.store.get(raw_key)
        if raw is None:
            return Lookup(LookupStatus.MISSING, partition)
        return Lookup(LookupStatus.FOUND, partition, decode_entry(raw))

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
                if self._reader.failure is not None:
                    raise self._reader.failure
                batch = await self._consumer.getmany(
                    timeout_ms=100, max_records=self.settings.max_batch_records
                )
                if batch:
                    async with self._lock:
                        await self._process(batch)
                if self._stops:
                    async with self._lock:
                        await self._check_stops()
                if self._pending_commit:
                    async with self._lock:
                        await self._commit()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
            raise

    async def _process(self, batch: dict[TopicPartition, list]) -> None:
        assert self._consumer is not None
        agg = self.aggregate
        s = self.settings
        work: list[tuple[TopicPartition, Task, PartitionBatch]] = []
        for tp, records in batch.items():
            task = self.tasks.get(tp.partition)
            if (
                task is None
                or task.role is not Role.ACTIVE
                or task.status is not TaskStatus.RUNNING
            ):
                # Fetched just before a rebalance paused it: rewind so nothing is skipped.
                if tp in self._consumer.assignment():
                    self._consumer.seek(tp, records[0].offset)
                continue
            store = task.store

            def load(
                key: str, store: PartitionStore = store, cached=task.cache.get
            ) -> Entry | None:
                entry = cached(key)
                if entry is not None:
                    return entry
                raw = store.get(key.encode("utf-8"))
                return decode_entry(raw) if raw is not None else None

            stop = self._stops.get(tp.partition)
            if stop is not None and records[-1].offset >= stop[0]:
                # A snapshot cut: process exactly up to it, hold the rest back.
                self._consumer.seek(tp, stop[0])
                self._consumer.pause(tp)
                records = [r for r in records if r.offset < stop[0]]
                if not records:
                    continue
            result = process_batch(
                agg.aggregate,
                records,
                load,
                dedup_window=s.dedup_window,
                transient=self.transient,
                give_up=self._retries.give_up(tp.partition),
                max_output_bytes=s.max_output_bytes,
            )
            out = PartitionBatch(tp.partition, result, changelog_puts(result))
            out.dead_letters = self._handle_failures(tp, result.failures)
            if result.interrupted is not None:
                self._retry_later(tp, result.interrupted)
            work.append((tp, task, out))
        if not work:
            return
        await self._with_retries("publish", self._output.publish, [b for _, _, b in work], s.app_id)
        stats = self.stats
        for tp, task, out in work:
            result = out.result
            task.store.write(
                out.puts, changelog_offset=out.changelog_offset, input_offset=result.last_offset
            )
            task.cache.persisted(result.changed)
            count = result.last_offset - batch[tp][0].offset + 1
            task.processed += count
            stats["processed"] += count
            stats["events"] += result.event_count
            stats["rejections"] += len(result.rejected)
            stats["skipped"] += result.skipped
            for failure in result.failures:
                self._retries.forget(tp.partition, failure.record.offset)
                key = f"{failure.stage}:{type(failure.error).__name__}"
                self.failures[key] = self.failures.get(key, 0) + 1
            if not self._output.commits_offsets and result.last_offset >= batch[tp][0].offset:
                self._pending_commit[tp] = result.last_offset + 1
        stats["batches"] += 1

    def _handle_failures(self, tp: TopicPartition, failures: list[Failure]) -> list:
        """Apply each failure's policy: dead letters to publish, a log line, or stop."""
        letters = []
        for failure in failures:
            action = self.policies.action(failure)
            context = {
                "stage": str(failure.stage),
                "partition": tp.partition,
                "offset": failure.record.offset,
                "key": failure.key,
                "error": f"{type(failure.error).__name__}: {failure.error}",
                "attempts": failure.attempts,
            }
            if fails(action):
                log.error("record failed; stopping the worker", action=str(action), **context)
                raise RecordFailed(failure, tp.topic, tp.partition)
            if action is ErrorAction.DLQ:
                headers = dead_letter_headers(
                    failure,
                    topic=tp.topic,
                    partition=tp.partition,
                    app_id=self.settings.app_id,
                    instance_id=self.settings.instance_id,
                )
                letters.append(
                    (self.settings.dlq_topic, failure.record.key, failure.record.value, headers)
                )
                log.warning(
                    "record sent to the dead-letter queue", dlq=self.settings.dlq_topic, **context
                )
            else:
                log.warning("record skipped", action=str(action), **context)
        return letters

    # snapshot cuts ----------------------------------------------------------------------------
    def stop_at(self, partition: int, offset: int) -> asyncio.Future[int]:
        """Process `partition` up to `offset` (exclusive), then hold it for an export.

        The future resolves with the actual cut: `offset`, or the position already reached if
        the partition had processed further before the request arrived.
        """
        previous = self._stops.get(partition)
        if previous is not None and not previous[1].done():
            return previous[1]
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._stops[partition] = (offset, future)
        return future

    def release(self, partition: int) -> None:
        """The export is done (or abandoned): let the partition's input flow again."""
        stop = self._stops.pop(partition, None)
        if stop is not None and not stop[1].done():
            stop[1].cancel()
        self._resume_after_backoff(TopicPartition(self.aggregate.commands_topic, partition))

    async def end_offset(self, partition: int) -> int:
        """The input partition's end offset now: the default cut of a snapshot."""
        assert self._consumer is not None
        tp = TopicPartition(self.aggregate.commands_topic, partition)
        return (await self._consumer.end_offsets([tp]))[tp]

    def active_store(self, partition: int) -> PartitionStore | None:
        task = self.tasks.get(partition)
        if task is None or task.role is not Role.ACTIVE or task.status is not TaskStatus.RUNNING:
            return None
        return task.store

    async def _check_stops(self) -> None:
        """Resolve cuts whose partition has processed up to its offset (no batch in flight)."""
        assert self._consumer is not None
        for partition, (offset, future) in list(self._stops.items()):
            tp = TopicPartition(self.aggregate.commands_topic, partition)
            if future.done() or self.active_store(partition) is None:
                continue
            if tp not in self._consumer.assignment():
                continue
            position = await self._consumer.position(tp)
            if position >= offset:
                self._consumer.pause(tp)
                future.set_result(position)

    def _retry_later(self, tp: TopicPartition, failure: Failure) -> None:
        """A transient error: rewind to the record and pause the partition for a backoff."""
        assert self._consumer is not None
        attempts, backoff = self._retries.record(tp.partition, failure.record.offset)
        log.warning(
            "transient error; retrying after backoff",
            partition=tp.partition,
            offset=failure.record.offset,
            error=f"{type(failure.error).__name__}: {failure.error}",
            attempts=attempts,
            backoff_ms=round(backoff * 1000),
        )
        self._consumer.seek(tp, failure.record.offset)
        self._consumer.pause(tp)
        loop = asyncio.get_running_loop()
        loop.call_later(backoff, self._resume_after_backoff, tp)

    def _resume_after_backoff(self, tp: TopicPartition) -> None:
        task = self.tasks.get(tp.partition)
        if (
            self._consumer is not None
            and not self._stopping.is_set()
            and task is not None
            and task.role is Role.ACTIVE
            and task.status is TaskStatus.RUNNING
            and tp in self._consumer.assignment()
        ):
            self._consumer.resume(tp)

    async def _with_retries(self, what: str, call, *args, timeout: float | None = None):
        """Retry Kafka operations that fail with a retriable error until task_timeout (KIP-572)."""
        limit = self.settings.task_timeout_ms / 1000 if timeout is None else timeout
        deadline = time.monotonic() + limit
        backoff = self.settings.retry_backoff_ms / 1000
        while True:
            try:
                return await call(*args)
            except KafkaError as exc:
                if not transient(exc) or time.monotonic() + backoff > deadline:
                    raise
                log.warning(f"{what} timed out; retrying", error=repr(exc), backoff_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _commit(self, force: bool = False) -> None:
        """Commit processed input offsets, at most every commit_interval_ms unless forced."""
        if not self._pending_commit or self._consumer is None:
            return
        now = time.monotonic()
        if not force and (now - self._last_commit) * 1000 < self.settings.commit_interval_ms:
            return
        offsets, self._pending_commit = self._pending_commit, {}
        try:
            # A failed commit only costs redelivery (skipped on arrival): never wait long for it.
            await self._with_retries("commit", self._consumer.commit, offsets, timeout=5.0)
            self._last_commit = now
        except (CommitFailedError, IllegalStateError, KafkaError) as exc:
            # The records will be redelivered to the next owner, which skips what its
            # restored state already reflects: a failed commit costs time, never correctness.
            log.warning("commit failed; records will be redelivered and skipped", error=repr(exc))
