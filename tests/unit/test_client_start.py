"""A client's start: a join the group holds is waited for, a broker that does not answer is not.

The consumer is aiokafka's, unstarted; its start() and its coordinator's state are played by
the test, so the many states of a start are checked in milliseconds.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from enhydra.kafka import clients
from enhydra.kafka.clients import new_consumer, start
from enhydra.kafka.errors import KafkaAccessError

TIMEOUT = 0.3


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "JOIN_POLL_S", 0.02)


def consumer_joining(coordinator_id: int | None, join_takes: float):
    """A consumer whose start finds (or not) its coordinator at once, then joins in `join_takes`."""
    consumer = new_consumer("127.0.0.1:9", group_id="g")

    async def fake_start() -> None:
        consumer._coordinator = SimpleNamespace(coordinator_id=coordinator_id)
        await asyncio.sleep(join_takes)

    consumer.start = fake_start  # type: ignore[method-assign]
    return consumer


async def test_a_join_held_longer_than_the_timeout_is_waited_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = consumer_joining(coordinator_id=1, join_takes=TIMEOUT * 4)
    with caplog.at_level("INFO", logger="enhydra.kafka"):
        await start(consumer, "127.0.0.1:9", doing="join the group g", timeout=TIMEOUT)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "the group holds this join" in said[0], said
    assert "joined after" in said[1] and "join the group g" in said[1]


async def test_no_coordinator_within_the_timeout_is_no_answer() -> None:
    consumer = consumer_joining(coordinator_id=None, join_takes=60)
    with pytest.raises(KafkaAccessError, match=r"no answer from Kafka at .* join the group g"):
        await start(consumer, "127.0.0.1:9", doing="join the group g", timeout=TIMEOUT)


async def test_a_coordinator_lost_while_the_join_is_held_ends_the_wait_after_the_timeout() -> None:
    consumer = consumer_joining(coordinator_id=1, join_takes=60)
    loop = asyncio.get_running_loop()

    def lose_it() -> None:
        consumer._coordinator.coordinator_id = None  # aiokafka: a request to it failed

    loop.call_later(TIMEOUT * 2, lose_it)
    begun = loop.time()
    with pytest.raises(KafkaAccessError, match="no answer from Kafka"):
        await start(consumer, "127.0.0.1:9", doing="join the group g", timeout=TIMEOUT)
    assert TIMEOUT * 3 - 0.1 <= loop.time() - begun < TIMEOUT * 3 + 1  # lost at 2x, then 1x


async def test_a_client_without_a_group_keeps_its_plain_timeout() -> None:
    consumer = consumer_joining(coordinator_id=None, join_takes=60)
    consumer._coordinator = None
    with pytest.raises(KafkaAccessError, match="no answer"):
        await start(consumer, "127.0.0.1:9", timeout=TIMEOUT)


def test_the_admin_looks_topics_up_without_having_the_broker_create_them() -> None:
    """A broker with auto.create.topics.enable=true (Kafka's default) creates a topic a
    metadata request names when the request allows it: with its own retention and replicas,
    outside kafka/topics.py. The admin's lookups (the partition counts and the layout check at
    every start) do not allow it."""
    from aiokafka.protocol.metadata import MetadataRequest_v4

    sent = []

    async def send(request):
        sent.append(request)
        return SimpleNamespace(to_object=lambda: {"topics": [{"topic": "app-events"}]})

    async def look_up() -> list:
        admin = clients.new_admin("127.0.0.1:9")
        admin._send_request = send
        return await admin.describe_topics(["app-events"])

    assert asyncio.run(look_up()) == [{"topic": "app-events"}]
    (request,) = sent
    built = request.build(MetadataRequest_v4)
    assert (built.topics, built.allow_auto_topic_creation) == (["app-events"], False)
