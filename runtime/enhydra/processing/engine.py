"""The aggregate's engine: the task runner with decide/apply as its step, standbys on top.

Order of a batch, chosen so that a crash at any point loses nothing and applies nothing twice:

1. run decide/apply for every record of the batch (pure, no I/O; step.py);
2. publish events, rejections and changed entries;
3. write the entries and the changelog checkpoint to RocksDB in one WriteBatch;
4. commit the input offsets (at most every `commit_interval_ms`; in the transaction for
   exactly_once). Steps 2-4 are the checkpoint (runner/checkpoint.py).

Every changelog entry carries the input offset that last changed its key, so whoever restores
it skips redelivered commands instead of applying them again.

Besides its active tasks, an instance keeps standby and warm-up copies of other tasks by
following their changelogs (assignment/ decides which); an active whose instance is lost moves
to a caught-up copy and resumes after restoring only the tail. Once warm-ups have caught up,
the engine asks for a probing rebalance so the leader can move their tasks (KIP-441).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from enhydra.aggregate import BoundAggregate
from enhydra.assignment import AssignmentConfig
from enhydra.control.channel import control_topic_spec
from enhydra.errors.policies import ErrorPolicies
from enhydra.kafka.topics import TopicSpec
from enhydra.processing.step import AggregateStep
from enhydra.runner.runner import TaskRunner
from enhydra.settings import Settings


class Engine(TaskRunner):
    """Runs one aggregate for one instance; several instances share the work through the group."""

    def __init__(
        self,
        settings: Settings,
        aggregate: BoundAggregate,
        *,
        policies: ErrorPolicies | None = None,
        transient: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.aggregate = aggregate
        self.policies = policies or ErrorPolicies(
            settings.deserialization_exception_handler,
            settings.processing_exception_handler,
            settings.production_exception_handler,
        )
        outputs = [aggregate.events_topic, aggregate.rejections_topic]
        super().__init__(
            settings,
            name=aggregate.name,
            group_id=settings.app_id,
            input_topic=aggregate.commands_topic,
            changelog_topic=aggregate.changelog_topic,
            step=AggregateStep(settings, aggregate, self.policies, transient),
            output_topics=outputs,
            transactional_prefix=f"{settings.app_id}-task-",
            assignment=AssignmentConfig(
                num_standby_replicas=settings.num_standby_replicas,
                acceptable_recovery_lag=settings.acceptable_recovery_lag,
                max_warmup_replicas=settings.max_warmup_replicas,
                rack_aware_assignment_tags=settings.rack_aware_assignment_tags,
            ),
            log_fields={"store": aggregate.name},
        )

    def topic_specs(self) -> list[TopicSpec]:
        s, a = self.settings, self.aggregate
        return [
            TopicSpec(a.commands_topic, s.partitions),
            TopicSpec(a.events_topic, s.partitions, history=True),
            TopicSpec(a.rejections_topic, s.partitions),
            TopicSpec(a.changelog_topic, s.partitions, compacted=True),
            *(
                [TopicSpec(s.dlq_topic, s.partitions, history=True)]
                if self.policies.uses_dlq()
                else []
            ),
            control_topic_spec(s.app_id),
        ]

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._probe()]

    async def _probe(self) -> None:
        """Ask for a probing rebalance once this instance's warm-ups have caught up.

        The leader planned to move tasks here once their copies are current; the earliest
        moment is when every such copy is within acceptable_recovery_lag. If that takes longer
        than probing_rebalance_interval, probe anyway so the leader sees the progress.
        """
        interval = self.settings.probing_rebalance_interval_ms / 1000
        acceptable = self.settings.acceptable_recovery_lag
        waiting_since = time.monotonic()
        registry = self.registry
        seen_rebalances = registry.rebalances
        while not self.stopping:
            await asyncio.sleep(0.5)
            if registry.rebalances != seen_rebalances:
                seen_rebalances, waiting_since = registry.rebalances, time.monotonic()
            extra = registry.assignment
            if not extra.probing_rebalance_needed or registry.rebalancing:
                continue
            warming = [t for p, t in registry.tasks.items() if p in extra.warmup | extra.standby]
            lags = [registry.task_lag(t) for t in warming]
            caught_up = bool(warming) and all(lag is not None and lag <= acceptable for lag in lags)
            if caught_up or time.monotonic() - waiting_since >= interval:
                self.log.info(
                    "requesting probing rebalance", caught_up=caught_up, warmup=sorted(extra.warmup)
                )
                self.request_rebalance()
                waiting_since = time.monotonic()
