"""A saga's step on the task runner's loop (fake clients, real RocksDB): deadlines fire on a
turn without records, and survive the store being closed and opened again."""

from __future__ import annotations

import dataclasses

import orjson
from aiokafka import TopicPartition

from enhydra.assignment.protocol import MemberAssignment
from enhydra.errors.policies import ErrorPolicies
from enhydra.runner.checkpoint import AtLeastOnce
from enhydra.runner.runner import TaskRunner
from enhydra.sagas.engine import SagaEngine, SagaStep
from enhydra.settings import Settings
from tests.sagas.checkout_service import checkout_saga
from tests.sagas.seeks import Seeks
from tests.sagas.test_saga_model import message
from tests.unit.test_runner_loop import CHANGELOG, INPUT, Consumer, Producer, Reader
from tests.unit.test_runner_loop import settings as settings

COMMANDS = "shop-commands"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def saga_runner(settings: Settings, clock: Clock) -> tuple[TaskRunner, Producer]:
    step = SagaStep(settings, checkout_saga("shop"), COMMANDS, ErrorPolicies(), (), clock)
    runner = TaskRunner(
        settings,
        name="saga-checkout",
        group_id="loop",
        input_topic=INPUT,
        changelog_topic=CHANGELOG,
        step=step,
        output_topics=[COMMANDS],
        transactional_prefix="loop-",
    )
    producer = Producer()
    checkpoint = AtLeastOnce(
        settings,
        client_id="t",
        input_topic=INPUT,
        changelog_topic=CHANGELOG,
        output_topics=[COMMANDS],
        commit_offsets=runner._commit_offsets,
        retrying=runner._retrying,
    )
    checkpoint._producer = producer  # type: ignore[assignment]
    runner.attach(Consumer({0, 1}), checkpoint, Reader())  # type: ignore[arg-type]
    runner.registry.assign({0, 1}, MemberAssignment())
    for task in list(runner.registry.tasks.values()):
        assert runner.registry.restored(task)
    return runner, producer


def commands(producer: Producer) -> list[str]:
    return [orjson.loads(v)["command_id"] for v in producer.topic(COMMANDS)]


async def test_a_partition_without_traffic_fires_its_deadline_on_a_later_turn(settings):
    clock = Clock()
    runner, producer = saga_runner(settings, clock)
    tp = TopicPartition(INPUT, 0)
    await runner._process({tp: [message(0, "o1", {"type": "placed", "order": "o1"}, 3)]})
    assert runner._with_due({}) == {}  # nothing due yet: no turn
    clock.now += 900
    batch = runner._with_due({})
    assert batch == {tp: []}  # partition 0 gets a turn without records
    await runner._process(batch)
    assert commands(producer) == ["checkout:o1:deadline:unpaid:1"]
    assert runner._with_due({}) == {}  # fired, removed, and nothing read again
    assert runner.stats["fired"] == 1 and runner.stats["processed"] == 1
    assert runner.registry.tasks[0].store.input_offset == 0
    runner.registry.close_all()


async def test_pending_deadlines_survive_closing_and_opening_the_store(settings):
    clock = Clock()
    runner, producer = saga_runner(settings, clock)
    tp = TopicPartition(INPUT, 1)
    await runner._process({tp: [message(0, "o2", {"type": "placed", "order": "o2"}, 4)]})
    runner.registry.close_all()
    clock.now += 901
    again, producer = saga_runner(settings, clock)  # the same state dir: the local store
    await again._process(again._with_due({}))
    assert commands(producer) == ["checkout:o2:deadline:unpaid:1"]
    again.registry.close_all()


def placed_records(orders: range) -> list:
    return [message(n, f"o{n}", {"type": "placed", "order": f"o{n}"}, n) for n in orders]


async def test_a_turn_that_only_fires_deadlines_commits_no_input_offset(settings):
    # Another owner took the partition further and committed 1501; this store came back with
    # input offset 0 and a deadline due: committing 1 would move the group backwards.
    clock = Clock()
    runner, producer = saga_runner(settings, clock)
    tp = TopicPartition(INPUT, 0)
    await runner._process({tp: placed_records(range(1))})
    await runner._checkpoint.commit(force=True)
    runner._consumer.committed[tp] = 1501  # the other owner's commit
    clock.now += 900
    await runner._process(runner._with_due({}))
    await runner._checkpoint.commit(force=True)
    assert commands(producer) == ["checkout:o0:deadline:unpaid:1"]
    assert runner._consumer.committed[tp] == 1501
    assert runner.registry.tasks[0].store.input_offset == 0
    runner.registry.close_all()


async def test_deadlines_due_at_once_fire_at_most_max_batch_records_per_turn(settings):
    clock = Clock()
    runner, producer = saga_runner(dataclasses.replace(settings, max_batch_records=2), clock)
    tp = TopicPartition(INPUT, 0)
    await runner._process({tp: placed_records(range(3))})
    clock.now += 900
    fired = []
    while batch := runner._with_due({}):
        await runner._process(batch)
        fired.append(len(commands(producer)) - sum(fired))
    assert fired == [2, 1] and runner.stats["fired"] == 3
    runner.registry.close_all()


async def test_the_status_counts_pending_deadlines_without_reading_them(settings):
    clock = Clock()
    runner, _ = saga_runner(settings, clock)
    tp = TopicPartition(INPUT, 0)
    task = runner.registry.tasks[0]
    reads = task.store = Seeks(task.store)  # type: ignore[assignment]
    await runner._process({tp: placed_records(range(20))})
    runner.registry.joined = True
    reads.read = 0
    assert SagaEngine.deadlines(runner) == (20, 1900.0)  # type: ignore[arg-type]
    assert reads.read <= 1  # one seek for the earliest, no scan
    runner.registry.close_all()


async def test_a_turn_without_records_waits_while_its_partition_is_held_at_a_cut(settings):
    clock = Clock()
    runner, producer = saga_runner(settings, clock)
    tp = TopicPartition(INPUT, 0)
    await runner._process({tp: placed_records(range(1))})
    clock.now += 900
    batch = runner._with_due({})
    runner.cuts.stop_at(0, 1)  # a snapshot cut arrives between the due check and the turn
    await runner._process(batch)
    assert commands(producer) == []  # the state stays as it is for the export
    runner.cuts.release(0)
    await runner._process(runner._with_due({}))
    assert commands(producer) == ["checkout:o0:deadline:unpaid:1"]
    runner.registry.close_all()
