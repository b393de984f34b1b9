"""TaskRunner: consume an input topic in batches, run a pure step per partition, make it durable.

A batch goes: fetch (up to max_batch_records) -> the step, per partition, pure -> the
checkpoint (publish, persist, commit; checkpoint.py). When the step reads what earlier batches
changed before they are durable (`reads_unpersisted`, the aggregate's step), two things keep
latency low without giving up that order:

- the step runs on slices of YIELD_EVERY records, and the loop yields between them, so the
  producer's acknowledgements, fetches and heartbeats are handled during a long batch;
- the batch's checkpoint flies (checkpoint.Flight) while the loop fetches and computes the
  next batch; flights keep the batch order at every step, and at most one flies while the
  next batch is computed. Everything that needs the state durable (a rebalance, a snapshot
  cut, stop) lands the flights first.

Around it, what every engine needs:

- group membership: revocation suspends the revoked tasks (after a forced commit), assignment
  opens a store copy per task and hands it to the changelog reader, which restores it; the
  task's input stays paused until its copy is current;
- with `assignment` (an AssignmentConfig), the group runs Enhydra's assignor and this instance
  also keeps standby and warm-up copies following their changelogs, and reports its lags when
  it joins (assignment/);
- transient errors in the step pause the partition and retry the record with a backoff until
  task_timeout; Kafka errors of the checkpoint are retried the same way (KIP-572);
- snapshot cuts (cuts.py) stop a partition exactly at an offset.

Subclasses only configure: the step, the topics, which assignor (processing/engine.py,
projections/engine.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from enhydra.assignment import AssignmentConfig
from enhydra.assignment.protocol import GroupMap, MemberAssignment, MemberReport, TaskAssignor
from enhydra.kafka.clients import Consumer, close, new_consumer, start
from enhydra.kafka.errors import transient
from enhydra.kafka.groups import fenced, leave_group, member_id, request_rejoin
from enhydra.kafka.liveness import GroupLiveness
from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.logs import get_logger
from enhydra.runner.batch import PartitionWrite, Step, StepOutput
from enhydra.runner.changelog_reader import ChangelogReader
from enhydra.runner.checkpoint import AtLeastOnce, Checkpoint, ExactlyOnce, Flight, StaleBatch
from enhydra.runner.cuts import Cuts
from enhydra.runner.histogram import Histogram
from enhydra.runner.rebalance import ForwardingListener
from enhydra.runner.retries import RetryTracker
from enhydra.runner.tasks import Role, Task, TaskStatus
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore
from enhydra.stores.partition import configure_memory as configure_store_memory

log = get_logger("enhydra.engine")
STALL_TICK_S = 0.1


class FencedInstance(RuntimeError):
    """Another process joined the group with this instance's id: two instances share one."""


# Records the step takes between two yields to the event loop (~3 ms of decide/apply).
YIELD_EVERY = 256
# Flights that may still fly while the next batch is fetched and computed.
IN_FLIGHT = 1
# Steps of the event loop run at each yield: one step moves an acknowledgement one hop
# (socket -> response -> request future -> batch future -> the flight waiting for it).
YIELD_HOPS = 6


@dataclass(slots=True)
class _Landing:
    """A batch whose checkpoint flies: what to account for once it is durable."""

    flight: Flight
    work: list[tuple[Task, StepOutput, int]]
    stamps: list[int]  # the input records' timestamps (ms), for the end-to-end latency
    process_s: float  # time spent in the step


class TaskRunner:
    """Runs one store's tasks for this instance; instances share the work through the group."""

    label = "engine"  # what the lifecycle log lines call this runner

    def __init__(
        self,
        settings: Settings,
        *,
        name: str,
        group_id: str,
        input_topic: str,
        changelog_topic: str,
        step: Step,
        output_topics: list[str],
        transactional_prefix: str,
        client_id: str | None = None,
        assignment: AssignmentConfig | None = None,
        log_fields: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.name = name
        self.group_id = group_id
        self.input_topic = input_topic
        self.changelog_topic = changelog_topic
        self.step = step
        self.output_topics = output_topics
        self.transactional_prefix = transactional_prefix
        self.client_id = client_id or settings.instance_id
        self.assignment_config = assignment
        self.log = log.bind(**(log_fields or {}))
        self.failures: dict[str, int] = {}  # "stage:ErrorClass" -> records that failed
        self.tasks: dict[int, Task] = {}
        self.group = GroupMap()
        self.joined = False
        self.rebalancing = False
        self.rebalances = 0
        self.stats = {"processed": 0, **dict.fromkeys(step.counters, 0), "batches": 0}
        self.failure: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self.cuts = Cuts()
        self._assignment = MemberAssignment()
        self._retries = RetryTracker(
            settings.retry_backoff_ms / 1000, settings.task_timeout_ms / 1000
        )
        self._disk_checkpoints: dict[int, int] = {}
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self._consumer: Consumer | None = None
        # On stop, leave the group at once (a scale-down) rather than be expected back.
        self.leave_on_stop = settings.leave_group_on_shutdown
        # A stall this long (a SIGSTOP, a frozen VM) may have got this instance removed from
        # the group by its peers (failover/): the batch in hand is dropped, not written.
        self._stall_limit_s = settings.failure_probe_window_ms / 2000
        self._stalled = False
        self._rewinds: dict[TopicPartition, int] = {}  # partitions read again after a stall
        # Kafka clients need the running loop: they are created in start().
        self._checkpoint: Checkpoint | None = None
        self._reader: ChangelogReader | None = None
        self._overlaps = bool(getattr(step, "reads_unpersisted", False))
        self._slices = self._overlaps and hasattr(step, "slices")
        self._flights: deque[_Landing] = deque()
        self._last_flight: Flight | None = None
        # seconds from a command's timestamp to its outputs acknowledged; per batch by phase
        self.latency = Histogram()
        self.batch_time = Histogram()

    # to configure --------------------------------------------------------------------------
    def topic_specs(self) -> list[TopicSpec]:
        """The topics this runner needs, created at start."""
        raise NotImplementedError

    def background(self) -> list[Coroutine[Any, Any, None]]:
        """More loops to run beside the batch loop while started."""
        return []

    # lifecycle -------------------------------------------------------------------------------
    @property
    def store_root(self) -> Path:
        return self.settings.store_dir / self.name

    async def start(self) -> None:
        s = self.settings
        configure_store_memory(s.store_memory_mb)
        await ensure_topics(s.connection, self.topic_specs(), client_id=self.client_id)
        self._scan_local_stores()
        self._checkpoint = self._new_checkpoint()
        self._reader = ChangelogReader(s, self.changelog_topic, self._on_restored)
        await self._checkpoint.start()
        await self._reader.start()  # fetches end offsets first: the join reports real lags
        options: dict[str, Any] = {}
        if self.assignment_config is not None:
            options["partition_assignment_strategy"] = (
                TaskAssignor(
                    self.input_topic, self.assignment_config, self._report, self._on_assignment
                ),
            )
        if s.static_membership:
            # KIP-345: a restart under the same id gets its tasks back without a rebalance.
            options["group_instance_id"] = s.instance_id
        self._consumer = new_consumer(
            s.connection,
            group_id=self.group_id,
            client_id=self.client_id,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            rebalance_timeout_ms=s.rebalance_timeout_ms,
            max_poll_interval_ms=max(s.rebalance_timeout_ms, 60000),
            fetch_max_wait_ms=100,
            **options,
        )
        self._consumer.subscribe([self.input_topic], listener=ForwardingListener(self))
        await start(self._consumer, s.connection, doing=f"join the group {self.group_id}")
        self._background = [
            asyncio.create_task(self._run(), name=f"enhydra-{self.name}"),
            asyncio.create_task(self._watch_stalls(), name=f"enhydra-{self.name}-stalls"),
            *(asyncio.create_task(loop) for loop in self.background()),
        ]
        self.log.info(
            f"{self.label} started",
            input=self.input_topic,
            group=self.group_id,
            changelog=self.changelog_topic,
            partitions=s.partitions,
            guarantee=s.processing_guarantee,
            standbys=self.assignment_config.num_standby_replicas if self.assignment_config else 0,
            local_stores=sorted(self._disk_checkpoints),
        )

    def _new_checkpoint(self) -> Checkpoint:
        s = self.settings
        if s.processing_guarantee == "exactly_once":
            return ExactlyOnce(
                s,
                client_id=self.client_id,
                transactional_prefix=self.transactional_prefix,
                group_id=self.group_id,
                input_topic=self.input_topic,
                changelog_topic=self.changelog_topic,
                output_topics=self.output_topics,
                retrying=self._retrying,
            )
        return AtLeastOnce(
            s,
            client_id=f"{self.client_id}-producer",
            input_topic=self.input_topic,
            changelog_topic=self.changelog_topic,
            output_topics=self.output_topics,
            commit_offsets=self._commit_offsets,
            retrying=self._retrying,
            group=GroupLiveness(lambda: self._consumer),
            changelog_ends=lambda: self._reader.end_offsets if self._reader else {},
        )

    async def _commit_offsets(self, offsets: dict[TopicPartition, int]) -> None:
        assert self._consumer is not None
        # A failed commit only costs redelivery (skipped on arrival): never wait long for it.
        await self._retrying("commit", self._consumer.commit, offsets, timeout=5.0)

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
        if self._reader is not None:
            await self._reader.stop()
        if self._consumer is not None:
            if self._checkpoint is not None:
                async with self._lock:
                    with contextlib.suppress(Exception):  # a failed flight is already reported
                        await self._land()
                    await self._checkpoint.commit(force=True)
            if self.leave_on_stop and self.settings.static_membership:
                await self._leave()
            await close(self._consumer)
        if self._checkpoint is not None:
            await self._checkpoint.stop()
        for task in self.tasks.values():
            task.store.close()
        self.tasks.clear()
        if self._consumer is not None:
            self.log.info(f"{self.label} stopped", **self.stats)

    async def _leave(self) -> None:
        """Leave the group now, so the others take the tasks over without waiting."""
        assert self._consumer is not None
        try:
            if await leave_group(self._consumer, self.group_id, self.settings.instance_id):
                self.log.info("left the group", group=self.group_id)
            else:  # a newer process holds this instance id: it is its member now, not ours
                self.log.warning("not removed from the group: a newer member holds its id")
        except Exception as exc:  # the session timeout removes this member anyway
            self.log.warning("could not leave the group", group=self.group_id, error=repr(exc))

    @property
    def member_id(self) -> str | None:
        """The member id the group gave this runner's consumer (None before it joined)."""
        return member_id(self._consumer)

    def _scan_local_stores(self) -> None:
        """Checkpoints of store copies left on disk by earlier runs: reported as lags."""
        root = self.store_root
        for path in sorted(root.glob("*")) if root.is_dir() else ():
            if path.name.isdigit() and int(path.name) < self.settings.partitions:
                store = PartitionStore(path)
                self._disk_checkpoints[int(path.name)] = store.changelog_offset
                store.close()

    @property
    def stopping(self) -> bool:
        """stop() has begun: the group may already have moved this instance's tasks away."""
        return self._stopping.is_set()

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
        if task.serving:
            return 0
        return self._lag(task.store.changelog_offset, task.partition)

    def _lag(self, checkpoint: int, partition: int) -> int | None:
        return None if self._reader is None else self._reader.lag(partition, checkpoint)

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
            lag = 0 if running_active else self._lag(task.store.changelog_offset, partition)
            if lag is not None:
                lags[partition] = lag
        s = self.settings
        return MemberReport(
            instance_id=s.instance_id,
            url=s.advertised_url,
            tags=s.client_tags,
            active=frozenset(p for p, t in self.tasks.items() if t.role is Role.ACTIVE),
            standby=frozenset(p for p, t in self.tasks.items() if t.role is not Role.ACTIVE),
            lags=lags,
        )

    def _on_assignment(self, assignment: MemberAssignment) -> None:
        self._assignment = assignment  # arrives just before on_partitions_assigned

    @property
    def assignment(self) -> MemberAssignment:
        """This instance's part of the last assignment (standbys, warm-ups, probing)."""
        return self._assignment

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self.rebalancing = True
        assert self._reader is not None and self._checkpoint is not None
        async with self._lock:
            await self._land()
            await self._checkpoint.commit(force=True)
            for tp in revoked:
                task = self.tasks.get(tp.partition)
                if task is not None and task.role is Role.ACTIVE:
                    task.status = TaskStatus.SUSPENDED
            # Stop restoring what may go elsewhere; standbys keep following meanwhile.
            self._reader.set_copies({}, self._following())
        if revoked:
            self.log.info("partitions revoked", partitions=sorted(tp.partition for tp in revoked))

    def _following(self) -> dict[int, Task]:
        return {p: t for p, t in self.tasks.items() if t.role is not Role.ACTIVE}

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        extra = self._assignment
        active = {tp.partition for tp in assigned}
        roles = {p: Role.WARMUP for p in extra.warmup}
        roles.update({p: Role.STANDBY for p in extra.standby})
        roles.update({p: Role.ACTIVE for p in active})
        assert self._reader is not None and self._checkpoint is not None
        async with self._lock:
            await self._land()  # revocation landed them already; a task may close below
            for partition in [p for p in self.tasks if p not in roles]:
                await self._close_task(partition)
            for partition, role in sorted(roles.items()):
                task = self.tasks.get(partition)
                if task is None:
                    store = PartitionStore(self.store_root / str(partition))
                    task = self.tasks[partition] = Task(
                        partition, store, cache=self.step.new_cache()
                    )
                    self._disk_checkpoints.pop(partition, None)
                task.clear_cache()  # the store may have changed while the task was elsewhere
                if role is not Role.ACTIVE and task.role is Role.ACTIVE:
                    await self._checkpoint.close_task(partition)
                task.role = role
                task.status = TaskStatus.RESTORING if role is Role.ACTIVE else TaskStatus.RUNNING
            for partition in sorted(active):
                await self._checkpoint.open_task(partition)
            if assigned:
                assert self._consumer is not None
                self._consumer.pause(*assigned)
            restoring = {p: t for p, t in self.tasks.items() if t.role is Role.ACTIVE}
            self._reader.set_copies(restoring, self._following())
        self.group = extra.group
        self.joined = True
        self.rebalancing = False
        self.rebalances += 1
        self.log.info(
            "tasks assigned",
            active=sorted(active),
            standby=sorted(extra.standby),
            warmup=sorted(extra.warmup),
            probing=extra.probing_rebalance_needed,
        )

    async def _close_task(self, partition: int) -> None:
        task = self.tasks.pop(partition)
        if task.role is Role.ACTIVE:
            assert self._checkpoint is not None
            await self._checkpoint.close_task(partition)
        self._disk_checkpoints[partition] = task.store.changelog_offset
        task.store.close()

    def _on_restored(self, task: Task) -> None:
        """The reader caught an active task up with its changelog: let its input flow."""
        if self.tasks.get(task.partition) is not task or task.role is not Role.ACTIVE:
            return
        task.clear_cache()  # restored: the store is newer than anything cached
        task.status = TaskStatus.RUNNING
        assert self._consumer is not None
        tp = TopicPartition(self.input_topic, task.partition)
        if tp in self._consumer.assignment():
            self._consumer.resume(tp)
        if self.ready:
            self.log.info("all active tasks running", active=self.active_partitions())

    def request_rebalance(self) -> None:
        """Ask the group to rebalance now (a probing rebalance)."""
        if self._consumer is not None:
            request_rejoin(self._consumer)

    # queries ---------------------------------------------------------------------------------
    def input_lag(self) -> dict[int, int]:
        """Per running active partition, input records fetched-known but not yet processed."""
        lags: dict[int, int] = {}
        consumer = self._consumer
        if consumer is None:
            return lags
        assigned = consumer.assignment()
        for partition, task in self.tasks.items():
            tp = TopicPartition(self.input_topic, partition)
            if task.role is not Role.ACTIVE or tp not in assigned:
                continue
            highwater = consumer.highwater(tp)
            if highwater is not None:
                lags[partition] = max(0, highwater - (task.store.input_offset + 1))
        return lags

    def active_store(self, partition: int) -> PartitionStore | None:
        task = self.tasks.get(partition)
        return task.store if task is not None and task.serving else None

    async def end_offset(self, partition: int) -> int:
        """The input partition's end offset now: the default cut of a snapshot."""
        assert self._consumer is not None
        tp = TopicPartition(self.input_topic, partition)
        return (await self._consumer.end_offsets([tp]))[tp]

    def stop_at(self, partition: int, offset: int) -> asyncio.Future[int]:
        """Process `partition` up to `offset` (exclusive), then hold it (a snapshot cut)."""
        return self.cuts.stop_at(partition, offset)

    def release(self, partition: int) -> None:
        """The export is done (or abandoned): let the partition's input flow again."""
        self.cuts.release(partition)
        self._resume(TopicPartition(self.input_topic, partition))

    # processing ------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            self.log.error(f"{self.label} failed", error=repr(exc), exc_info=exc)
            if self.on_failure is not None:
                self.on_failure(exc)

    async def _run(self) -> None:
        assert self._consumer is not None and self._reader is not None
        assert self._checkpoint is not None
        try:
            while not self._stopping.is_set():
                if self._reader.failure is not None:
                    raise self._reader.failure
                await self._land(keep=len(self._flights))  # account for what has landed
                batch = await self._consumer.getmany(
                    timeout_ms=100, max_records=self.settings.max_batch_records
                )
                if batch:
                    async with self._lock:
                        await self._process(batch)
                if self._stalled:
                    async with self._lock:
                        await self._land()  # flights in the air stop at the guard, are dropped
                    # Let the group's next heartbeat say whether the tasks are still ours.
                    await asyncio.sleep(2 * self.settings.heartbeat_interval_ms / 1000)
                    self._stalled = False
                    self._rewinds.clear()
                if self.cuts.pending:
                    async with self._lock:
                        await self._land()  # a cut needs the state durable up to it
                        serving = {p for p, t in self.tasks.items() if t.serving}
                        await self.cuts.settle(self._consumer, self.input_topic, serving)
                async with self._lock:
                    await self._checkpoint.commit()
            async with self._lock:
                await self._land()
        except asyncio.CancelledError:
            await self._abandon()
            raise
        except Exception as exc:
            if self.settings.static_membership and fenced(exc):
                exc = FencedInstance(
                    f"another process joined the group {self.group_id} as instance "
                    f"{self.settings.instance_id!r}: every instance needs its own "
                    "ENHYDRA_INSTANCE_ID"
                )
            self._fail(exc)
            await self._abandon()
            raise exc from None

    async def _process(self, batch: dict[TopicPartition, list]) -> None:
        consumer = self._consumer
        checkpoint = self._checkpoint
        assert consumer is not None and checkpoint is not None
        if self._stalled:
            await self._land()  # rewinds to the first batch not yet durable, if any
            self._drop_stale({tp: records[0].offset for tp, records in batch.items() if records})
            return
        step = self.step
        slices = YIELD_EVERY if self._slices else 0
        work: list[tuple[Task, StepOutput, int]] = []
        stamps: list[int] = []
        busy = 0.0
        for tp, records in batch.items():
            task = self.tasks.get(tp.partition)
            if task is None or not task.serving:
                # Fetched just before a rebalance paused it: rewind so nothing is skipped.
                if tp in consumer.assignment():
                    consumer.seek(tp, records[0].offset)
                continue
            if self.cuts.pending:
                records = self.cuts.hold(consumer, tp, records)
                if not records:
                    continue
            give_up = self._retries.give_up(tp.partition)
            started = time.perf_counter()
            if slices:
                run = step.slices(task, records, give_up, slices)  # type: ignore[attr-defined]
                while True:
                    try:
                        next(run)
                    except StopIteration as done:
                        out = done.value
                        break
                    busy += time.perf_counter() - started
                    await _yield_to_io()
                    started = time.perf_counter()
            else:
                out = step(task, records, give_up)
            busy += time.perf_counter() - started
            if out.interrupted is None:
                stamps += [r.timestamp for r in records]
            else:
                self._retry_later(tp, *out.interrupted)
                stamps += [r.timestamp for r in records if r.offset <= out.last_offset]
            work.append((task, out, records[0].offset))
            if slices:
                await _yield_to_io()
        if not work:
            return
        writes = [PartitionWrite(t.partition, o.outputs, o.puts, o.last_offset) for t, o, _ in work]
        stores = {task.partition: task.store for task, _, _ in work}
        flight = checkpoint.begin(writes, stores, self._last_flight, self._guard)
        self._last_flight = flight
        self._flights.append(_Landing(flight, work, stamps, busy))
        if self._overlaps:
            # The flight hands its outputs to the producer now, not at the next batch's first
            # pause; then one flight may fly while the next batch is fetched and computed.
            await _yield_to_io()
            await self._land(keep=IN_FLIGHT)
        else:
            await self._land()

    async def _land(self, keep: int = 0) -> None:
        """Account for the flights that are done, waiting until at most `keep` still fly.

        A flight's failure is the runner's failure: raised here, and reported. A flight stopped
        by the stall guard is not: its batch is read again (and every later flight stops too,
        as each waits for the one before it).
        """
        flights = self._flights
        while flights:
            head = flights[0]
            if len(flights) <= keep and not head.flight.done.done():
                return
            flights.popleft()
            try:
                await head.flight.done
            except StaleBatch:
                self._drop_landing(head)
                continue
            except Exception as exc:
                self._fail(exc)
                raise
            self._account(head)

    async def _abandon(self) -> None:
        """The runner stops on a failure or a cancel: flights still flying are cancelled."""
        flights = [landing.flight.done for landing in self._flights]
        self._flights.clear()
        self._last_flight = None  # a cancelled flight must not hold back a later one
        for done in flights:
            done.cancel()
        if flights:
            await asyncio.gather(*flights, return_exceptions=True)

    def _account(self, landing: _Landing) -> None:
        """A batch is durable: its stats, its cache entries, its metrics."""
        stats = self.stats
        for task, out, first in landing.work:
            if out.persisted is not None:
                out.persisted()
            count = out.last_offset - first + 1
            task.processed += count
            stats["processed"] += count
            for name, value in out.counts.items():
                stats[name] += value
            self._retries.forget_through(task.partition, out.last_offset)
            for key in out.failed:
                self.failures[key] = self.failures.get(key, 0) + 1
        stats["batches"] += 1
        flight = landing.flight
        self.batch_time.observe(landing.process_s, phase="process")
        self.batch_time.observe(flight.published_at - flight.sent_at, phase="publish")
        self.batch_time.observe(flight.done_at - flight.published_at, phase="durable")
        self.latency.observe_since(flight.published_at * 1000, landing.stamps, per_second=1000)

    async def _watch_stalls(self) -> None:
        """Notice when this process did not run for a while (it cannot notice while frozen)."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(STALL_TICK_S)
            now = time.monotonic()
            if now - last > self._stall_limit_s:
                self._stalled = True
                self.log.warning("this process stalled", seconds=round(now - last, 2))
            last = now

    def _guard(self) -> None:
        if self._stalled:
            raise StaleBatch("the process stalled while the batch was in hand")

    def _drop_stale(self, firsts: Mapping[TopicPartition, int]) -> None:
        """Read these partitions again from these offsets later, and give the group a heartbeat
        to say who owns what. A later drop never moves a partition past an earlier one."""
        assert self._consumer is not None
        assignment = self._consumer.assignment()
        for tp, offset in firsts.items():
            offset = self._rewinds[tp] = min(offset, self._rewinds.get(tp, offset))
            if tp in assignment:
                self._consumer.seek(tp, offset)
        self.log.warning("batch dropped after a stall; reading it again", partitions=len(firsts))

    def _drop_landing(self, landing: _Landing) -> None:
        """A flight the stall guard stopped: its batch is read again, from the store's state.

        Its entries (and any later batch's) were staged in the task caches: dropped with them.
        """
        firsts: dict[TopicPartition, int] = {}
        for task, _, first in landing.work:
            task.clear_cache()
            firsts[TopicPartition(self.input_topic, task.partition)] = first
        self._drop_stale(firsts)

    def _retry_later(self, tp: TopicPartition, offset: int, error: BaseException) -> None:
        """A transient error: rewind to the record and pause the partition for a backoff."""
        assert self._consumer is not None
        attempts, backoff = self._retries.record(tp.partition, offset)
        self.log.warning(
            "transient error; retrying after backoff",
            partition=tp.partition,
            offset=offset,
            error=f"{type(error).__name__}: {error}",
            attempts=attempts,
            backoff_ms=round(backoff * 1000),
        )
        self._consumer.seek(tp, offset)
        self._consumer.pause(tp)
        asyncio.get_running_loop().call_later(backoff, self._resume, tp)

    def _resume(self, tp: TopicPartition) -> None:
        """Let a paused partition's input flow, if it is still ours and running."""
        task = self.tasks.get(tp.partition)
        if (
            self._consumer is not None
            and not self._stopping.is_set()
            and task is not None
            and task.serving
            and tp in self._consumer.assignment()
        ):
            self._consumer.resume(tp)

    async def _retrying(self, what: str, call, *args, timeout: float | None = None):
        """Retry Kafka operations that fail with a transient error until task_timeout (KIP-572)."""
        limit = self.settings.task_timeout_ms / 1000 if timeout is None else timeout
        deadline = time.monotonic() + limit
        backoff = self.settings.retry_backoff_ms / 1000
        while True:
            try:
                return await call(*args)
            except KafkaError as exc:
                if not transient(exc) or time.monotonic() + backoff > deadline:
                    raise
                self.log.warning(f"{what} timed out; retrying", error=repr(exc), backoff_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)


async def _yield_to_io() -> None:
    """Let the event loop run what is ready (acknowledgements, fetches, heartbeats)."""
    for _ in range(YIELD_HOPS):
        await asyncio.sleep(0)
