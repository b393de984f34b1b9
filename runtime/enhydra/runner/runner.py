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
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError

from enhydra import tracing
from enhydra.assignment import AssignmentConfig
from enhydra.assignment.protocol import MemberAssignment, TaskAssignor
from enhydra.kafka.clients import Consumer, close, new_consumer, start
from enhydra.kafka.errors import transient
from enhydra.kafka.groups import fenced, leave_group, member_id, request_rejoin
from enhydra.kafka.liveness import GroupLiveness
from enhydra.kafka.reading import fetch_position
from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.logs import get_logger
from enhydra.runner.batch import PartitionWrite, Step, StepOutput
from enhydra.runner.changelog_reader import ChangelogReader
from enhydra.runner.checkpoint import AtLeastOnce, Checkpoint, ExactlyOnce, Flight, StaleBatch
from enhydra.runner.cuts import Cuts
from enhydra.runner.histogram import Histogram
from enhydra.runner.rebalance import ForwardingListener
from enhydra.runner.registry import TaskRegistry
from enhydra.runner.retries import RetryTracker
from enhydra.runner.tasks import Role, Task, TaskStatus
from enhydra.settings import Settings
from enhydra.stores.partition import configure_memory as configure_store_memory

log = get_logger("enhydra.engine")
STALL_TICK_S = 0.1
WATCHDOG_TICK_S = 1.0
# An offset commit waits at most this long (a failed commit only costs skipped redeliveries).
COMMIT_TIMEOUT_S = 5.0
# stop() ends this much before shutdown_timeout_s: the process still has to exit.
STOP_MARGIN_S = 3.0
# One call of stop() that only tidies up (leave, close) waits at most this long.
CALL_TIMEOUT_S = 5.0


class FencedInstance(RuntimeError):
    """Another process joined the group with this instance's id: two instances share one."""


# Records the step takes between two yields to the event loop (~3 ms of decide/apply).
YIELD_EVERY = 256
# Flights that may still fly while the next batch is fetched and computed.
IN_FLIGHT = 1
# The first offset of a task's work that had no records (a turn for timed work only).
NO_RECORDS = -1
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
    started_at: float = 0.0  # wall clock when the step began (the batch's span)


class TaskRunner:
    """Runs one store's tasks for this instance; instances share the work through the group.

    The loop lives here (poll, run the step, land the flights, commit); which tasks this
    instance holds, and whether a partition may be read, live in `registry` (registry.py).
    """

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
        self.registry = TaskRegistry(
            settings,
            settings.store_dir / name,
            new_cache=step.new_cache,
            changelog_lag=self._lag,
            watchdog_s=settings.task_watchdog_ms / 1000,
        )
        self.failures: dict[str, int] = {}  # "stage:ErrorClass" -> records that failed
        self.stats = {"processed": 0, **dict.fromkeys(step.counters, 0), "batches": 0}
        self.failure: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self.cuts = Cuts()
        self._retries = RetryTracker(
            settings.retry_backoff_ms / 1000, settings.task_timeout_ms / 1000
        )
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
        self._received: dict[int, int] = {}  # partition -> the last input offset fetched
        # Where the commit unit resumed each partition at its assignment (open_task), when it
        # keeps the position itself: records fetched before that seek are not read.
        self._resumed_at: dict[int, int] = {}
        # Kafka clients need the running loop: they are created in start() (or attached).
        self._checkpoint: Checkpoint | None = None
        self._reader: ChangelogReader | None = None
        self._overlaps = bool(getattr(step, "reads_unpersisted", False))
        self._slices = self._overlaps and hasattr(step, "slices")
        # A step with timed work (a saga's deadlines) says when a task has some due: that
        # task then gets a turn without records (`_with_due`).
        self._timed = hasattr(step, "due")
        self._flights: deque[_Landing] = deque()
        self._last_flight: Flight | None = None
        # seconds from a command's timestamp to its outputs acknowledged; per batch by phase
        self.latency = Histogram()
        self.batch_time = Histogram()
        self._tracing = tracing.current(settings.app_id)  # None: off

    # to configure --------------------------------------------------------------------------
    def topic_specs(self) -> list[TopicSpec]:
        """The topics this runner needs, created at start."""
        raise NotImplementedError

    def background(self) -> list[Coroutine[Any, Any, None]]:
        """More loops to run beside the batch loop while started."""
        return []

    # lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        configure_store_memory(s.store_memory_mb)
        await ensure_topics(s.connection, self.topic_specs(), client_id=self.client_id)
        self.registry.scan_local_stores()
        checkpoint = self._new_checkpoint()
        reader = ChangelogReader(s, self.changelog_topic, self._on_restored)
        await checkpoint.start()
        if hasattr(self.step, "max_record_bytes"):  # it checks each record against the limit
            self.step.max_record_bytes = checkpoint.max_record_bytes  # type: ignore[attr-defined]
        await reader.start()  # fetches end offsets first: the join reports real lags
        options: dict[str, Any] = {}
        if self.assignment_config is not None:
            options["partition_assignment_strategy"] = (
                TaskAssignor(
                    self.input_topic,
                    self.assignment_config,
                    self.registry.report,
                    self._on_assignment,
                ),
            )
        if s.static_membership:
            # KIP-345: a restart under the same id gets its tasks back without a rebalance.
            options["group_instance_id"] = s.instance_id
        consumer = new_consumer(
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
        self.attach(consumer, checkpoint, reader)
        consumer.subscribe([self.input_topic], listener=ForwardingListener(self))
        await start(consumer, s.connection, doing=f"join the group {self.group_id}")
        self._background = [
            asyncio.create_task(self._run(), name=f"enhydra-{self.name}"),
            asyncio.create_task(self._watch(), name=f"enhydra-{self.name}-watch"),
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
            local_stores=sorted(self.registry.disk_checkpoints),
        )

    def attach(self, consumer: Consumer, checkpoint: Checkpoint, reader: ChangelogReader) -> None:
        """The clients the loop drives: built by start(), or fakes in the runner's unit tests."""
        self._consumer = consumer
        self._checkpoint = checkpoint
        self._reader = reader

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
        # aiokafka's own timeout does not bound a commit whose coordinator is unknown.
        commit = _bounded(self._consumer.commit, COMMIT_TIMEOUT_S)
        await self._retrying("commit", commit, offsets, timeout=COMMIT_TIMEOUT_S)

    async def stop(self) -> None:
        """Finish the batch in flight, flush, commit, leave the group, close the stores.

        Bounded by shutdown_timeout_s as a whole, whatever the brokers do: an orchestrator
        kills a process that takes longer (Kubernetes: 30 s after SIGTERM), and what was not
        made durable by then is read again by the next owner, skipped where it was applied.
        """
        self._stopping.set()
        self.registry.stopping = True
        deadline = time.monotonic() + max(1.0, self.settings.shutdown_timeout_s - STOP_MARGIN_S)

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        processing, *others = self._background or [None]
        for task in others:
            task.cancel()
        if processing is not None:
            try:
                await asyncio.wait_for(processing, left())
            except (TimeoutError, asyncio.CancelledError):
                processing.cancel()
            except Exception:  # already reported through on_failure
                pass
        if self._reader is not None:
            await self._bounded_step("stop the changelog reader", self._reader.stop(), left())
        if self._consumer is not None:
            if self._checkpoint is not None:
                await self._bounded_step("make the last batch durable", self._finish(), left())
            if self.leave_on_stop and self.settings.static_membership:
                leave = min(left(), CALL_TIMEOUT_S)  # the session timeout removes it anyway
                await self._bounded_step("leave the group", self._leave(), leave)
            closing = min(left(), CALL_TIMEOUT_S)
            await self._bounded_step("close the consumer", close(self._consumer), closing)
        if self._checkpoint is not None:
            closing = min(left(), CALL_TIMEOUT_S)
            await self._bounded_step("close the producer", self._checkpoint.stop(), closing)
        self.registry.close_all()
        if self._consumer is not None:
            self.log.info(f"{self.label} stopped", **self.stats)

    async def _finish(self) -> None:
        assert self._checkpoint is not None
        async with self._lock:
            with contextlib.suppress(Exception):  # a failed flight is already reported
                await self._land()
            await self._checkpoint.commit(force=True)

    async def _bounded_step(self, what: str, step: Awaitable[Any], timeout: float) -> None:
        """One step of stop(): given up (logged) when it outlasts the stop's time left."""
        try:
            await asyncio.wait_for(step, timeout)
        except TimeoutError:
            self.log.warning(f"stop: could not {what} in time; going on", seconds=round(timeout, 1))
        except Exception as exc:
            self.log.warning(f"stop: could not {what}", error=repr(exc))

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

    @property
    def stopping(self) -> bool:
        """stop() has begun: the group may already have moved this instance's tasks away."""
        return self._stopping.is_set()

    # group protocol --------------------------------------------------------------------------
    def _lag(self, partition: int, checkpoint: int) -> int | None:
        return None if self._reader is None else self._reader.lag(partition, checkpoint)

    def _on_assignment(self, assignment: MemberAssignment) -> None:
        self.registry.assignment = assignment  # arrives just before on_partitions_assigned

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        registry = self.registry
        registry.rebalancing = True
        assert self._reader is not None and self._checkpoint is not None
        async with self._lock:
            await self._land()
            await self._checkpoint.commit(force=True)
            registry.suspend({tp.partition for tp in revoked})
            for tp in revoked:
                self._resumed_at.pop(tp.partition, None)
                self._received.pop(tp.partition, None)
            # Stop restoring what may go elsewhere; standbys keep following meanwhile.
            self._reader.set_copies({}, registry.following())
        if revoked:
            self.log.info("partitions revoked", partitions=sorted(tp.partition for tp in revoked))

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        registry = self.registry
        extra = registry.assignment
        active = {tp.partition for tp in assigned}
        assert self._reader is not None and self._checkpoint is not None
        async with self._lock:
            await self._land()  # revocation landed them already; a task may close below
            roles = {p: Role.WARMUP for p in extra.warmup}
            roles.update({p: Role.STANDBY for p in extra.standby})
            roles.update({p: Role.ACTIVE for p in active})
            for partition in registry.leaving_active(roles):
                await self._checkpoint.close_task(partition)
            change = registry.assign(active, extra)
            for partition in change.active:
                resume_at = await self._checkpoint.open_task(partition)
                if resume_at is not None:  # the commit unit keeps the input position itself
                    assert self._consumer is not None
                    self._consumer.seek(TopicPartition(self.input_topic, partition), resume_at)
                    self._resumed_at[partition] = resume_at
                    # Lags and the watchdog read the position in the task's store: mirror it,
                    # or a restarted task with nothing new to read looks stuck at -1.
                    registry.tasks[partition].store.write([], input_offset=resume_at - 1)
            if assigned:
                assert self._consumer is not None
                self._consumer.pause(*assigned)
            self._reader.set_copies(registry.restoring(), registry.following())
        self.log.info(
            "tasks assigned",
            active=change.active,
            standby=sorted(extra.standby),
            warmup=sorted(extra.warmup),
            probing=extra.probing_rebalance_needed,
        )

    def _on_restored(self, task: Task) -> None:
        """The reader caught an active task up with its changelog: let its input flow."""
        if not self.registry.restored(task):
            return
        assert self._consumer is not None
        tp = TopicPartition(self.input_topic, task.partition)
        if tp in self._consumer.assignment():
            self._consumer.resume(tp)
        if self.registry.ready:
            self.log.info("all active tasks running", active=self.registry.active_partitions())

    def request_rebalance(self) -> None:
        """Ask the group to rebalance now (a probing rebalance)."""
        if self._consumer is not None:
            request_rejoin(self._consumer)

    # what the loop knows of its partitions ---------------------------------------------------
    def input_lag(self) -> dict[int, int]:
        """Per running active partition, input records fetched-known but not yet processed.

        That is the records in hand (returned by the consumer, not processed yet) plus those not
        fetched yet (the high watermark past the consumer's position). Offsets between the last
        record returned and the position are no work: transaction markers (an input written
        under exactly-once: a reaction's commands, a saga's inbox) and aborted records, which
        would otherwise read as one record waiting forever, and a stuck task to the watchdog.
        """
        lags: dict[int, int] = {}
        consumer = self._consumer
        if consumer is None:
            return lags
        assigned = consumer.assignment()
        for task in self.registry.active_tasks():
            tp = TopicPartition(self.input_topic, task.partition)
            if tp not in assigned:
                continue
            highwater = consumer.highwater(tp)
            if highwater is None:
                continue
            done = task.store.input_offset + 1
            position = fetch_position(consumer, tp)
            if position is None or position <= done:
                lags[task.partition] = max(0, highwater - done)
                continue
            in_hand = max(0, min(self._received.get(task.partition, -1) + 1, position) - done)
            lags[task.partition] = in_hand + max(0, highwater - position)
        return lags

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
                positions = self._positions_after(batch)  # before anything can seek
                batch = self._past_markers(batch, positions)
                if self._timed:
                    batch = self._with_due(batch)
                if batch:
                    async with self._lock:
                        await self._process(batch, positions)
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
                        serving = {t.partition for t in self.registry.active_tasks() if t.serving}
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

    def _with_due(self, batch: dict[TopicPartition, list]) -> dict[TopicPartition, list]:
        """`batch`, with an empty record list for each running task whose step has work due."""
        if self.cuts.pending:
            return batch  # held at a snapshot cut: the state must stay as it is
        due = [t for t in self.registry.active_tasks() if t.serving and self.step.due(t)]  # type: ignore[attr-defined]
        if not due:
            return batch
        batch = dict(batch)
        for task in due:
            batch.setdefault(TopicPartition(self.input_topic, task.partition), [])
        return batch

    def _positions_after(self, batch: dict[TopicPartition, list]) -> dict[TopicPartition, int]:
        """Where the consumer stands on each partition it just returned records of.

        Past the last record when the fetch also went over what has no record to return (a
        transaction's commit marker, aborted records): see `_process`.
        """
        consumer = self._consumer
        found = {}
        for tp, fetched in batch.items():
            if fetched and (position := fetch_position(consumer, tp)) is not None:
                found[tp] = position
        return found

    def _past_markers(
        self, batch: dict[TopicPartition, list], positions: dict[TopicPartition, int]
    ) -> dict[TopicPartition, list]:
        """`batch`, and an empty turn for each serving partition the consumer moved past offsets
        with no record (a transaction's marker, aborted records, fetched alone) since the last
        durable batch: committed through them by `_process`, or the group's committed offset
        would stay short of the end until the next record. Only with nothing in flight, no cut
        or retry pending and no stall, so the store's offset is all that was handled."""
        if self._flights or self.cuts.pending or self._stalled:
            return batch
        consumer = self._consumer
        added: dict[TopicPartition, list] | None = None
        for task in self.registry.active_tasks():
            tp = TopicPartition(self.input_topic, task.partition)
            if not task.serving or batch.get(tp) or self._retries.retrying(task.partition):
                continue
            position = fetch_position(consumer, tp)
            if position is None or position <= task.store.input_offset + 1:
                continue
            if added is None:
                added = dict(batch)
            added[tp] = []
            positions[tp] = position
        return added if added is not None else batch

    async def _process(
        self,
        batch: dict[TopicPartition, list],
        positions: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        """Step each partition's records and start making the batch durable.

        `positions`: the consumer's position on each partition right after the fetch. When the
        step handled every record fetched and the position is further on, what lies between is
        no record (an input written under exactly-once ends each transaction with a marker), and
        the batch is committed through it, as Kafka Streams commits the consumer's position:
        otherwise the group's committed offset stays one short of the end for good, and every
        lag monitor outside reads an idle service as one record behind.
        """
        for tp, fetched in batch.items():
            if fetched:  # what the consumer returned: in hand until processed (input_lag)
                self._received[tp.partition] = fetched[-1].offset
        consumer = self._consumer
        checkpoint = self._checkpoint
        assert consumer is not None and checkpoint is not None
        if self._stalled:
            await self._land()  # rewinds to the first batch not yet durable, if any
            self._drop_stale({tp: records[0].offset for tp, records in batch.items() if records})
            return
        started_at = time.time()
        step = self.step
        slices = YIELD_EVERY if self._slices else 0
        work: list[tuple[Task, StepOutput, int]] = []
        stamps: list[int] = []
        busy = 0.0
        through: dict[int, int] = {}  # partition -> a marker's offset past its last record
        for tp, records in batch.items():
            fetched = records
            task = self.registry.tasks.get(tp.partition)
            floor = self._resumed_at.get(tp.partition, -1)
            if task is None or not task.serving:
                # Fetched just before a rebalance paused it: rewind so nothing is skipped.
                if records and tp in consumer.assignment():
                    consumer.seek(tp, max(records[0].offset, floor))
                continue
            if records and records[0].offset < floor:  # fetched before open_task's seek
                records = [r for r in records if r.offset >= floor]
                if not records:
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
                position = positions.get(tp) if positions else None
                if position is not None and not self.cuts.pending:  # a cut stops at its offset
                    last = consumed_through(fetched, records, out.last_offset, position, task)
                    if last is not None:
                        through[tp.partition] = last
            else:
                self._retry_later(tp, *out.interrupted)
                stamps += [r.timestamp for r in records if r.offset <= out.last_offset]
            work.append((task, out, records[0].offset if records else NO_RECORDS))
            if slices:
                await _yield_to_io()
        if not work:
            return
        writes = [
            PartitionWrite(
                t.partition, o.outputs, o.puts, through.get(t.partition, o.last_offset), o.rows
            )
            for t, o, _ in work
        ]
        stores = {task.partition: task.store for task, _, _ in work}
        flight = checkpoint.begin(writes, stores, self._last_flight, self._guard)
        self._last_flight = flight
        self._flights.append(_Landing(flight, work, stamps, busy, started_at))
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
            if not flights:
                # Nothing flies any more: the next flight waits for none. Kept, a dropped
                # flight would fail every later one, and each retry would publish again.
                self._last_flight = None
            try:
                await head.flight.done
            except StaleBatch as stale:
                self._drop_landing(head)
                if stale.ask_the_group:  # the next heartbeat says who owns the tasks
                    self._stalled = True
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
            count = out.last_offset - first + 1 if first != NO_RECORDS else 0
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
        if self._tracing is not None:
            self._tracing.record_batch(
                self.name,
                topic=self.input_topic,
                records=len(landing.stamps),
                partitions=[task.partition for task, _, _ in landing.work],
                started=landing.started_at,
                process_s=landing.process_s,
                sent_at=flight.sent_at,
                published_at=flight.published_at,
                done_at=flight.done_at,
                links=(c for _, out, _ in landing.work for c in out.traced),  # if sampled
            )

    async def _watch(self) -> None:
        """Notice stalls of this process (it cannot notice while frozen) and stuck tasks."""
        last = time.monotonic()
        next_check = last + WATCHDOG_TICK_S
        while True:
            await asyncio.sleep(STALL_TICK_S)
            now = time.monotonic()
            if now - last > self._stall_limit_s:
                self._stalled = True
                self.log.warning("this process stalled", seconds=round(now - last, 2))
            last = now
            if now >= next_check:
                next_check = now + WATCHDOG_TICK_S
                self._check_progress(now)

    def _check_progress(self, now: float) -> None:
        """Tell the watchdog where every active task stands; log a task that became stuck."""
        registry = self.registry
        if self._consumer is None or self._reader is None:
            return
        lags = self.input_lag()
        # A commit unit that waits out an outage of its own store (a SQL projection's database)
        # says why; its tasks are held, not stuck: a restart would not bring the database back.
        waiting_for = getattr(self._checkpoint, "waiting", None)
        for task in registry.active_tasks():
            p = task.partition
            if task.status is TaskStatus.RUNNING:
                stuck = registry.watchdog.observe(
                    p,
                    now,
                    phase="processing",
                    position=task.store.input_offset,
                    waiting=lags.get(p),
                    held=self.cuts.holds(p)
                    or self._retries.retrying(p)
                    or self._stalled
                    or waiting_for is not None,
                )
            elif task.status is TaskStatus.RESTORING:
                offset = task.store.changelog_offset
                stuck = registry.watchdog.observe(
                    p,
                    now,
                    phase="restoring",
                    position=offset,
                    waiting=self._reader.lag(p, offset),
                )
            else:  # suspended in a rebalance: the group decides next
                stuck = registry.watchdog.observe(
                    p, now, phase="suspended", position=0, waiting=0, held=True
                )
            if stuck is not None:
                self.log.error(
                    "task stuck: liveness fails until it moves",
                    partition=p,
                    reason=stuck.reason(),
                    input=self.input_topic,
                )

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
            if first != NO_RECORDS:  # a turn without records has nothing to read again
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
        task = self.registry.tasks.get(tp.partition)
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


def consumed_through(
    fetched: list, records: list, last_offset: int, position: int, task: Task
) -> int | None:
    """The offset a partition's batch is durable through when the consumer's `position` is
    past what the step handled with nothing but offsets without a record between (markers,
    aborted records); None when it is not. `fetched`: what the consumer returned (empty: an
    empty turn of `_past_markers`); `records`: what the step was given of it."""
    if fetched:  # handled to the last record fetched, nothing filtered out at the end
        whole = records and records[-1] is fetched[-1] and last_offset == fetched[-1].offset
        handled = last_offset if whole else None
    else:  # only what has no record since the last durable batch
        handled = task.store.input_offset if last_offset < 0 else None
    return position - 1 if handled is not None and position > handled + 1 else None


async def _yield_to_io() -> None:
    """Let the event loop run what is ready (acknowledgements, fetches, heartbeats)."""
    for _ in range(YIELD_HOPS):
        await asyncio.sleep(0)


def _bounded(call: Callable[..., Awaitable[Any]], timeout: float) -> Callable[..., Awaitable[Any]]:
    """`call`, failing with a KafkaTimeoutError (transient: retried) after `timeout` seconds."""

    async def bounded(*args: Any) -> Any:
        try:
            return await asyncio.wait_for(call(*args), timeout)
        except TimeoutError:
            raise KafkaTimeoutError(f"no answer within {timeout:g}s") from None

    return bounded
