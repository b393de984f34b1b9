"""One small topic per application that every instance reads from its end.

It carries decisions that concern the whole application rather than one partition, such as
SHUTDOWN_APPLICATION: the instance that decides writes it once, and every instance (itself
included) acts on it. Messages are sealed and checked by signing.py; a message that fails the
check, or that `admit` refuses (snapshots/admission.py), is counted and never reaches `on_message`.
A handler that raises is logged and the channel reads on: when one message's failure ended the
loop, the instance went deaf to every later shutdown, snapshot request and beacon, silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
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
READ_RETRY_S = 1.0  # a failed read of the control topic is tried again after this
READING = "<reading>"  # FailureLog's kind for a failed read (message types have no brackets)
REPORT_EVERY_S = 60.0  # a handler failing on every beacon: one line a minute, not five a second


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
        self._app_id = app_id
        self._verifier = Verifier(secret, app=app_id)
        self._admit = admit
        self._rejections = RejectionLog(log)
        self._failures = FailureLog()
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
        message = {"type": kind, "origin": self.instance_id, **fields}
        value, headers = seal(message, self._secret, app=self._app_id)
        await self._producer.send_and_wait(self.topic, value, headers=headers)

    async def _run(self) -> None:
        """Read until stopped. Nothing ends the loop but `stop`: a dead loop would leave the
        instance deaf to every later shutdown, snapshot request and beacon, without a word."""
        assert self._consumer is not None
        while True:
            try:
                batch = await self._consumer.getmany(timeout_ms=500)
            except Exception as exc:  # the topic gone, or not readable: say so, then retry
                self._failures.record(READING, exc, offset=None)
                await asyncio.sleep(READ_RETRY_S)
                continue
            for records in batch.values():
                for record in records:
                    message, reason = self._verifier.check(record.value, record.headers or ())
                    if message is not None and reason is None:
                        reason = self._admit(message)
                    if reason is not None:
                        self._rejections.reject(reason, message, record.offset)
                        continue
                    assert message is not None
                    try:
                        await self.on_message(message)
                    except Exception as exc:  # one message's handler: the next ones still count
                        self._failures.record(str(message.get("type"))[:100], exc, record.offset)


class FailureLog:
    """Logs a failure of each kind at once, then at most every REPORT_EVERY_S with a count."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._last: dict[str, float] = {}

    def record(self, kind: str, exc: Exception, offset: int | None) -> None:
        self.counts[kind] += 1
        now = time.monotonic()
        if now - self._last.get(kind, -REPORT_EVERY_S) < REPORT_EVERY_S:
            return
        self._last[kind] = now
        log.error(
            "control topic not read" if kind == READING else "control message not handled",
            type=kind,
            offset=offset,
            failures=self.counts[kind],
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
