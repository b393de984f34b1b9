"""A saga's engine: the task runner with a saga as its step, over the saga's inbox.

The inbox (`<app>-<saga>-saga-inbox`) holds the upstream events re-keyed by correlation id
(the forwarders, host.py). A batch goes through the commit unit every engine uses
(runner/checkpoint.py): handle and fire (pure, model.py), publish the commands, write the
changelog (owner epochs and fencing as for an aggregate's) and the store, commit the inbox
offsets. The step also says when a task has a deadline due (`due`), so the runner gives it a
turn without records: a partition with no traffic still fires its deadlines.

`clock` is the task's wall clock (time.time); the Driver replaces it to advance time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from enhydra.contracts.sizes import MAX_REQUEST_SIZE
from enhydra.errors.policies import ErrorPolicies
from enhydra.kafka.clients import open_admin
from enhydra.kafka.topics import TopicSpec, partition_counts
from enhydra.processing.step import dead_letters
from enhydra.runner.batch import StepOutput
from enhydra.runner.runner import TaskRunner
from enhydra.runner.tasks import Task
from enhydra.sagas.model import COUNTERS, TIMERS, Saga, due_index, saga_batch, timer_due
from enhydra.settings import Settings

Clock = Callable[[], float]


class UnknownTarget(ValueError):
    """A saga wrote to a commands topic it did not declare in `sends_to`."""


class SagaStep:
    """A saga over one inbox partition's records, then its due deadlines (the runner's step)."""

    counters = COUNTERS

    def __init__(
        self,
        settings: Settings,
        saga: Saga,
        commands_topic: str,
        policies: ErrorPolicies,
        transient: tuple[type[BaseException], ...],
        clock: Clock = time.time,
    ) -> None:
        self.settings = settings
        self.saga = saga
        self.commands_topic = commands_topic
        self.input_topic = saga.inbox_topic(settings.app_id)
        self.policies = policies
        self.transient = transient
        self.clock = clock
        self.max_record_bytes = MAX_REQUEST_SIZE  # set by the runner once it knows the topics
        self.partitions: dict[str, int] = {commands_topic: settings.partitions}

    def new_cache(self) -> None:
        return None

    def partitions_of(self, topic: str) -> int:
        count = self.partitions.get(topic)
        if count is None:
            raise UnknownTarget(f"saga {self.saga.name!r} wrote to {topic!r}: list it in sends_to")
        return count

    def due(self, task: Task) -> bool:
        """Whether `task` has a deadline due now: one seek into its timer index."""
        now_ms = int(self.clock() * 1000)
        return any(True for _ in due_index(task.store.items(TIMERS), now_ms))

    def __call__(self, task: Task, records: list[Any], give_up: Mapping[int, int]) -> StepOutput:
        s = self.settings
        store = task.store
        result = saga_batch(
            self.saga,
            records,
            load=store.get,
            due=lambda now_ms: due_index(store.items(TIMERS), now_ms),
            now=self.clock(),
            commands_topic=self.commands_topic,
            partitions_of=self.partitions_of,
            last_offset=store.input_offset,
            transient=self.transient,
            give_up=give_up,
            max_record_bytes=min(s.max_output_bytes, self.max_record_bytes),
        )
        outputs: dict[Any, list[Any]] = dict(result.outputs)
        letters = dead_letters(
            result.failures,
            self.policies,
            s,
            topic=self.input_topic,
            partition=task.partition,
            limit=self.max_record_bytes,
        )
        if letters:
            outputs[s.dlq_topic] = letters
        return StepOutput(
            outputs=outputs,
            puts=list(result.puts.items()),
            last_offset=result.last_offset,
            counts=result.counts,
            failed=[f"{f.stage}:{type(f.error).__name__}" for f in result.failures],
            interrupted=result.interrupted,
        )


class SagaEngine(TaskRunner):
    """Runs one saga over its inbox, for this instance's partitions."""

    label = "saga"

    def __init__(
        self,
        settings: Settings,
        saga: Saga,
        commands_topic: str,
        *,
        policies: ErrorPolicies,
        transient: tuple[type[BaseException], ...] = (),
        clock: Clock = time.time,
    ) -> None:
        self.saga = saga
        self.commands_topic = commands_topic
        self.policies = policies
        app = settings.app_id
        super().__init__(
            settings,
            name=f"saga-{saga.name}",
            group_id=saga.group_id(app),
            input_topic=saga.inbox_topic(app),
            changelog_topic=saga.changelog_topic(app),
            step=SagaStep(settings, saga, commands_topic, policies, transient, clock),
            output_topics=[commands_topic, *saga.sends_to],
            transactional_prefix=f"{app}-saga-{saga.name}-task-",
            client_id=f"{settings.instance_id}-saga-{saga.name}",
            log_fields={"saga": saga.name},
        )

    def topic_specs(self) -> list[TopicSpec]:
        s = self.settings
        specs = [
            TopicSpec(self.input_topic, s.partitions),
            TopicSpec(self.commands_topic, s.partitions),
            TopicSpec(self.changelog_topic, s.partitions, compacted=True),
        ]
        if self.policies.uses_dlq():
            specs.append(TopicSpec(s.dlq_topic, s.partitions, history=True))
        return specs

    async def start(self) -> None:
        others = list(self.saga.sends_to)
        if others:
            async with open_admin(self.settings.connection, client_id=self.client_id) as admin:
                counts = await partition_counts(admin, others)
            missing = sorted(set(others) - set(counts))
            if missing:
                raise UnknownTarget(
                    f"saga {self.saga.name!r} sends to {', '.join(missing)}, which does not "
                    "exist: start that service first, or create its commands topic"
                )
            self.step.partitions.update(counts)  # type: ignore[attr-defined]
        await super().start()

    def deadlines(self) -> tuple[int, float | None]:
        """(deadlines pending in this instance's active tasks, the earliest due time)."""
        pending, earliest = 0, None
        for task in self.registry.active_tasks():
            if not task.serving:
                continue
            for timer, _ in task.store.items(TIMERS):
                if not timer.startswith(TIMERS):
                    break
                pending += 1
                due = timer_due(timer) / 1000
                earliest = due if earliest is None else min(earliest, due)
        return pending, earliest

    def describe(self) -> dict[str, object]:
        pending, earliest = self.deadlines()
        return {
            "sources": list(self.saga.sources),
            "input": self.input_topic,
            "ready": self.registry.ready,
            "partitions": {str(p): t.status.value for p, t in sorted(self.registry.tasks.items())},
            "deadlines_pending": pending,
            "next_deadline": earliest,
            "failures": dict(self.failures),
            **self.stats,
        }
