"""What the status page reads about rejections and the DLQ, from the pure parts: the step's
ring buffer of recent rejections (filled once a batch is durable), its view newest first, and
the DLQ count from offsets."""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from types import SimpleNamespace

import orjson

from enhydra.aggregate import Aggregate, Rejection
from enhydra.errors.policies import ErrorPolicies
from enhydra.processing.core import InputRecord, Rejected
from enhydra.processing.step import AggregateStep
from enhydra.query import rejections
from enhydra.query.dlq import DeadLetterCount, count
from enhydra.runner.tasks import Task
from enhydra.settings import Connection, Settings
from enhydra.stores.partition import PartitionStore


def decide(state, command):
    if command["type"] == "refuse":
        raise Rejection("refused")
    return [{"type": "noted"}]


def test_the_step_keeps_the_recent_rejections_once_their_batch_is_durable(tmp_path) -> None:
    books = Aggregate("books", decide, lambda state, event: 1)
    settings = Settings.from_env(
        {}, app_id="lib", instance_id="i1", state_dir=tmp_path, partitions=1
    )
    step = AggregateStep(settings, books.bind("lib"), ErrorPolicies("dlq", "dlq", "dlq"), ())
    store = PartitionStore(tmp_path / "0")
    task = Task(0, store)
    task.cache = step.new_cache()
    records = [
        InputRecord(n, key.encode(), orjson.dumps({"command_id": f"c{n}", "type": kind}))
        for n, (key, kind) in enumerate([("k1", "refuse"), ("k2", "note")])
    ]
    try:
        out = step(task, records, {})
    finally:
        store.close()
    assert not step.recent_rejections  # published, not durable yet: a retry would repeat it
    out.persisted()
    engine = SimpleNamespace(step=step)
    (row,) = rejections.recent(engine)
    assert (row["key"], row["command_id"], row["type"], row["reason"]) == (
        "k1",
        "c0",
        "refuse",
        "refused",
    )
    assert row["partition"] == 0 and row["at"].endswith("+00:00")


def test_recent_rejections_are_newest_first_and_bounded() -> None:
    buffer: deque = deque(maxlen=3)
    for i in range(5):
        rejected = Rejected(f"k{i}", f"c{i}", i, "no", {"type": "t"})
        rejected.payload = orjson.dumps(rejected.to_value())
        buffer.append((0, 1_700_000_000 + i, rejected))
    rows = rejections.recent(SimpleNamespace(step=SimpleNamespace(recent_rejections=buffer)))
    assert [r["command_id"] for r in rows] == ["c4", "c3", "c2"]


def test_the_dlq_count_is_end_minus_start_per_partition() -> None:
    assert count({0: 2, 1: 0}, {0: 5, 1: 1, 2: 0}) == 4
    assert count({0: 5}, {0: 5}) == 0


def test_a_broker_that_does_not_answer_leaves_the_count_unknown_not_the_page_failing() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def ask() -> dict:
        dead_letters = DeadLetterCount(
            Connection.plain(f"127.0.0.1:{port}"), "lib-dlq", timeout_s=5, wait_s=10
        )
        try:
            return await dead_letters.get()
        finally:
            await dead_letters.close()

    answer = asyncio.run(ask())
    assert answer["topic"] == "lib-dlq" and answer["records"] is None
    assert answer["error"].startswith("cannot read the DLQ's offsets now")
