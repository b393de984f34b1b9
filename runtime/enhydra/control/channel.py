"""One small topic per application that every instance reads from its end.

It carries decisions that concern the whole application rather than one partition, such as
SHUTDOWN_APPLICATION: the instance that decides writes it once, and every instance (itself
included) acts on it. Messages are sealed and checked by signing.py; a message that fails the
check, or that `admit` refuses (snapshots/admission.py), is counted and never reaches `on_message`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import TopicPartition

from enhydra.contracts.names import control_topic_name
from enhydra.control.signing import RejectionLog, Verifier, seal
from enhydra.kafka.clients import Consumer, Producer, close, new_consumer, new_producer, start
from enhydra.kafka.topics import TopicSpec
from enhydra.logs import get_logger
from enhydra.settings import Connection

log = get_logger("enhydra.control")

SHUTDOWN_APPLICATION = "shutdown_application"


# Readers start at the end and refuse messages older than a minute (control/signing.py):
# an hour of beacons and requests is plenty to look back at by hand.
CONTROL_RETENTION_MS = "3600000"


def control_topic_spec(app_id: str) -> TopicSpec:
    return TopicSpec(control_topic_name(app_id), 1, {"retention.ms": CONTROL_RETENTION_MS})


class ControlChannel:
    def __init__(
        self,
        conn: Connection,
        app_id: str,
        instance_id: str,
        on_message: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        secret: bytes | None = None,
        admit: Callable[[dict[str, Any]], str | None] = lambda message: None,
    ) -> None:
        self.topic = control_topic_name(app_id)
        self.instance_id = instance_id
        self.on_message = on_message
        self._secret = secret
        self._verifier = Verifier(secret)
        self._admit = admit
        self._rejections = RejectionLog(log)
        self._conn = conn
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._producer = new_producer(self._conn, acks="all")
        await start(self._producer, self._conn)
        self._consumer = new_consumer(self._conn)
        await start(self._consumer, self._conn)
        tp = TopicPartition(self.topic, 0)
        self._consumer.assign([tp])
        await self._consumer.seek_to_end(tp)  # only what is said from now on concerns us
        await self._consumer.position(tp)
        self._task = asyncio.create_task(self._run(), name="enhydra-control")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer is not None:
            await close(self._consumer)
        if self._producer is not None:
            await close(self._producer)

    async def send(self, kind: str, **fields: Any) -> None:
        assert self._producer is not None
        value, headers = seal({"type": kind, "origin": self.instance_id, **fields}, self._secret)
        await self._producer.send_and_wait(self.topic, value, headers=headers)

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    message, reason = self._verifier.check(record.value, record.headers or ())
                    if message is not None and reason is None:
                        reason = self._admit(message)
                    if reason is not None:
                        self._rejections.reject(reason, message, record.offset)
                        continue
                    assert message is not None
                    await self.on_message(message)
