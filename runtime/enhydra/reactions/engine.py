"""A reaction's engine: the task runner with a reaction as its step.

It runs beside the aggregate's engine in the same process with its own consumer group on the
upstream events topic. A batch goes through the same commit unit as everything else
(runner/checkpoint.py): react (pure), publish the commands, record the input offset in the
task's store, commit the upstream offsets (every commit_interval_ms, or in the transaction
with exactly_once). A crash anywhere reads upstream events again; the commands they make
carry the same ids, and the aggregate skips them (model.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from enhydra import tracing
from enhydra.contracts.sizes import MAX_REQUEST_SIZE
from enhydra.errors.policies import ErrorPolicies
from enhydra.kafka.clients import open_admin
from enhydra.kafka.topics import TopicSpec, partition_counts
from enhydra.processing.step import dead_letters
from enhydra.reactions.model import Reaction, react_batch
from enhydra.runner.batch import StepOutput
from enhydra.runner.runner import TaskRunner
from enhydra.runner.tasks import Task
from enhydra.settings import Settings


class UnknownTarget(ValueError):
    """A reaction (or a saga) wrote to a commands topic it did not declare in `sends_to`."""


async def learn_partitions(
    settings: Settings, what: str, others: list[str], *, client_id: str
) -> dict[str, int]:
    """The partition counts of other services' commands topics `what` sends to (at start):
    a missing one stops the start with a hint, not the first command sent to it."""
    if not others:
        return {}
    async with open_admin(settings.connection, client_id=client_id) as admin:
        counts = await partition_counts(admin, others)
    missing = sorted(set(others) - set(counts))
    if missing:
        raise UnknownTarget(
            f"{what} sends to {', '.join(missing)}, which does not exist: start that service "
            "first, or create its commands topic"
        )
    return counts


def command_writer_topics(
    settings: Settings,
    policies: ErrorPolicies,
    input_spec: TopicSpec,
    commands_topic: str,
    changelog_topic: str,
) -> list[TopicSpec]:
    """The topics of a runner that turns its input into commands (a reaction, a saga)."""
    s = settings
    specs = [
        input_spec,
        TopicSpec(commands_topic, s.partitions),
        TopicSpec(changelog_topic, s.partitions, compacted=True),
    ]
    if policies.uses_dlq():
        specs.append(TopicSpec(s.dlq_topic, s.partitions, history=True))
    return specs


class ReactionStep:
    """A reaction over one upstream partition's events (the runner's step)."""

    counters = ("commands", "ignored")

    def __init__(
        self,
        settings: Settings,
        reaction: Reaction,
        commands_topic: str,
        policies: ErrorPolicies,
        transient: tuple[type[BaseException], ...],
    ) -> None:
        self.settings = settings
        self.reaction = reaction
        self.commands_topic = commands_topic
        self.policies = policies
        self.transient = transient
        self.max_record_bytes = MAX_REQUEST_SIZE  # set by the runner once it knows the topics
        # commands topic -> partitions; others' are learned at start (ReactionEngine.start)
        self.partitions: dict[str, int] = {commands_topic: settings.partitions}
        self.tracing = tracing.current(settings.app_id)  # None: off

    def new_cache(self) -> None:
        return None

    def partitions_of(self, topic: str) -> int:
        count = self.partitions.get(topic)
        if count is None:
            raise UnknownTarget(
                f"reaction {self.reaction.name!r} wrote to {topic!r}: list it in sends_to"
            )
        return count

    def __call__(self, task: Task, records: list[Any], give_up: Mapping[int, int]) -> StepOutput:
        s = self.settings
        topic = self.reaction.upstream_topic
        traced = trace = None
        if self.tracing is not None:
            traced = self.tracing.batch(f"react {self.reaction.name}", task.partition)

            def trace(record: Any) -> list[tuple[str, bytes]] | None:
                return traced.follow(record.headers, record.offset)

        result = react_batch(
            self.reaction,
            records,
            topic=topic,
            partition=task.partition,
            commands_topic=self.commands_topic,
            partitions_of=self.partitions_of,
            transient=self.transient,
            give_up=give_up,
            max_record_bytes=min(s.max_output_bytes, self.max_record_bytes),
            trace=trace,
        )
        outputs: dict[Any, list[Any]] = dict(result.outputs)
        letters = dead_letters(
            result.failures,
            self.policies,
            s,
            topic=topic,
            partition=task.partition,
            limit=self.max_record_bytes,
        )
        if letters:
            outputs[s.dlq_topic] = letters
        return StepOutput(
            outputs=outputs,
            puts=[],
            last_offset=result.last_offset,
            counts={"commands": result.commands, "ignored": result.ignored},
            failed=[f"{f.stage}:{type(f.error).__name__}" for f in result.failures],
            interrupted=result.interrupted,
            traced=traced.finish() if traced is not None else (),
        )


class ReactionEngine(TaskRunner):
    """Turns one upstream events topic into commands, for this instance's partitions."""

    label = "reaction"

    def __init__(
        self,
        settings: Settings,
        reaction: Reaction,
        commands_topic: str,
        *,
        policies: ErrorPolicies,
        transient: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.reaction = reaction
        self.commands_topic = commands_topic
        self.policies = policies
        super().__init__(
            settings,
            name=f"reaction-{reaction.name}",
            group_id=reaction.group_id(settings.app_id),
            input_topic=reaction.upstream_topic,
            changelog_topic=reaction.changelog_topic(settings.app_id),
            step=ReactionStep(settings, reaction, commands_topic, policies, transient),
            output_topics=[commands_topic, *reaction.sends_to],
            transactional_prefix=f"{settings.app_id}-{reaction.name}-task-",
            client_id=f"{settings.instance_id}-{reaction.name}",
            log_fields={"reaction": reaction.name, "source": reaction.source},
        )

    def topic_specs(self) -> list[TopicSpec]:
        s = self.settings
        upstream = TopicSpec(self.reaction.upstream_topic, s.partitions, history=True)
        return command_writer_topics(
            s, self.policies, upstream, self.commands_topic, self.changelog_topic
        )

    async def start(self) -> None:
        counts = await learn_partitions(
            self.settings,
            f"reaction {self.reaction.name!r}",
            list(self.reaction.sends_to),
            client_id=self.client_id,
        )
        self.step.partitions.update(counts)  # type: ignore[attr-defined]
        await super().start()

    def describe(self) -> dict[str, object]:
        return {
            "source": self.reaction.source,
            "input": self.input_topic,
            "ready": self.registry.ready,
            "partitions": {str(p): t.status.value for p, t in sorted(self.registry.tasks.items())},
            "failures": dict(self.failures),
            **self.stats,
        }
