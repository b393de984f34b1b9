"""A projection's engine: the task runner with a projection's fold as its step.

It runs beside the aggregate's engine in the same process with its own consumer group, so its
partitions are balanced among the instances independently of the aggregate's. A batch goes
through the same commit unit as the aggregate's (runner/checkpoint.py): fold (pure), publish
the changelog records, write them to RocksDB with the changelog checkpoint, commit the events
offsets (every commit_interval_ms, or in the transaction with exactly_once). A crash anywhere
redelivers events whose offsets are at or below what the stored entries remember; they are
skipped. A transient error in `project` is retried with a backoff until task_timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from enhydra.aggregate import Aggregate
from enhydra.contracts.headers import EVENT_VERSION_HEADER, header
from enhydra.contracts.partitioner import partition_for
from enhydra.evolution import reader
from enhydra.kafka.topics import TopicSpec
from enhydra.projections.model import (
    EventRecord,
    ProjectedEntry,
    Projection,
    decode,
    encode,
    event_source,
    fold_batch,
)
from enhydra.runner.batch import StepOutput
from enhydra.runner.registry import Verdict
from enhydra.runner.runner import TaskRunner
from enhydra.runner.tasks import Task
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore


class ProjectionStep:
    """A projection's fold over one partition's events (the runner's step)."""

    counters = ("skipped", "duplicates", "changed")

    def __init__(
        self,
        projection: Projection,
        transient: tuple[type[BaseException], ...],
        aggregate: Aggregate | None = None,
    ) -> None:
        self.projection = projection
        self.transient = transient
        # the service's aggregate declares the events' versions and upcasters
        self.read = reader(aggregate) if aggregate is not None else None

    def new_cache(self) -> None:
        return None

    def __call__(self, task: Task, records: list[Any], give_up: Mapping[int, int]) -> StepOutput:
        store = task.store

        def load(key: str, store: PartitionStore = store) -> ProjectedEntry | None:
            raw = store.get(key.encode("utf-8"))
            return decode(raw) if raw is not None else None

        result = fold_batch(
            self.projection,
            (
                EventRecord(
                    r.offset,
                    r.key,
                    r.value,
                    event_source(r.headers),
                    header(r.headers, EVENT_VERSION_HEADER),
                )
                for r in records
            ),
            load,
            transient=self.transient,
            give_up=give_up,
            read=self.read,
        )
        puts = [(k.encode("utf-8"), encode(e)) for k, e in result.changed.items()]
        return StepOutput(
            outputs={},
            puts=puts,
            last_offset=result.last_offset,
            counts={
                "skipped": result.skipped,
                "duplicates": result.duplicates,
                "changed": len(puts),
            },
            interrupted=result.interrupted,
        )


def read_model_runner(
    settings: Settings, projection: Any, events_topic: str, plugin: str | None
) -> dict[str, Any]:
    """A read model's task runner settings (a RocksDB or a SQL projection): its own group over
    the events topic, named after the projection, writing no topic of its own."""
    return {
        "name": projection.name,
        "group_id": projection.group_id(settings.app_id),
        "input_topic": events_topic,
        "changelog_topic": projection.changelog_topic(settings.app_id),
        "output_topics": [],
        "transactional_prefix": f"{settings.app_id}-{projection.name}-task-",
        "client_id": f"{settings.instance_id}-{projection.name}",
        "log_fields": {"projection": projection.name, "plugin": plugin},
    }


class ProjectionEngine(TaskRunner):
    """Builds one projection's store from the events topic, for this instance's partitions."""

    label = "projection"

    def __init__(
        self,
        settings: Settings,
        projection: Projection,
        events_topic: str,
        *,
        plugin: str | None = None,
        transient: tuple[type[BaseException], ...] = (),
        aggregate: Aggregate | None = None,
    ) -> None:
        self.projection = projection
        self.events_topic = events_topic
        self.plugin = plugin
        super().__init__(
            settings,
            step=ProjectionStep(projection, transient, aggregate),
            **read_model_runner(settings, projection, events_topic, plugin),
        )

    def topic_specs(self) -> list[TopicSpec]:
        s = self.settings
        return [
            TopicSpec(self.events_topic, s.partitions, history=True),
            TopicSpec(self.changelog_topic, s.partitions, compacted=True),
        ]

    # queries ---------------------------------------------------------------------------------
    def read(self, key: str) -> tuple[str, int, Any]:
        """(status, partition, state) of a key in this instance's partitions of the read model.

        status: "found", "missing", "not_hosted" (another instance holds the partition) or
        "unavailable" (being restored or rebalanced).
        """
        raw_key = key.encode("utf-8")
        partition = partition_for(raw_key, self.settings.partitions)
        access = self.registry.access(partition)
        if not access.readable:
            # Until the group has settled this instance may be about to get the partition.
            hosted_elsewhere = access.verdict is Verdict.NOT_HOSTED and access.settled
            return "not_hosted" if hosted_elsewhere else "unavailable", partition, None
        assert access.store is not None
        raw = access.store.get(raw_key)
        entry = decode(raw) if raw is not None else None
        if entry is None or entry.deleted:  # a deleted key keeps its offsets, not a value
            return "missing", partition, None
        return "found", partition, entry.state

    def describe(self) -> dict[str, object]:
        return {
            "plugin": self.plugin,
            "ready": self.registry.ready,
            "partitions": {str(p): t.status.value for p, t in sorted(self.registry.tasks.items())},
            **self.stats,
        }
