"""The control channel keeps reading whatever a handler does with one message (real broker).

A handler that raised ended the channel's reading loop without a word: on 3d34c8a a snapshot
request hit a method the task runner split had removed, and the instance ignored every later
control message (`enhydra snapshot create` on the 3-node cluster got no answer).
"""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from enhydra.control.channel import ControlChannel, control_topic_spec
from enhydra.kafka.clients import as_connection
from enhydra.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration


def test_a_handler_that_raises_is_logged_and_later_messages_still_arrive(
    kafka_bootstrap, app_id
) -> None:
    conn = as_connection(kafka_bootstrap)
    handled: list[str] = []

    async def on_message(message: dict) -> None:
        if message["type"] == "broken":
            raise AttributeError("'Engine' object has no attribute 'active_store'")
        handled.append(message["type"])

    async def main() -> None:
        await ensure_topics(conn, [control_topic_spec(app_id)])
        channel = ControlChannel(conn, app_id, "c1", on_message)
        await channel.start()
        try:
            for kind in ("broken", "broken", "shutdown_application"):
                await channel.send(kind)
            async with asyncio.timeout(15):
                while not handled:
                    await asyncio.sleep(0.1)
        finally:
            await channel.stop()

    with capture_logs() as logged:
        asyncio.run(main())
    assert handled == ["shutdown_application"]
    failures = [e for e in logged if e["event"] == "control message not handled"]
    assert len(failures) == 1, logged  # the kind's second failure within a minute: counted
    assert failures[0]["type"] == "broken" and "active_store" in failures[0]["error"]
