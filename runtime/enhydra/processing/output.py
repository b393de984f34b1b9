"""Publishing a processed batch: events, rejections and changelog records, by guarantee.

at_least_once: one idempotent producer. Events and rejections are acknowledged before the
changelog records are sent, so a changelog entry (which marks its command as applied) never
exists for a command whose events were lost. A crash in between duplicates events, never state.

exactly_once: Kafka transactions, one transactional producer per task whose id is derived from
the app id and the partition, so the next owner of a partition fences a zombie previous owner
(the "per-task producer" scheme; aiokafka's TxnOffsetCommit carries no group generation).
Events, rejections, changelog records and the input offset commit succeed or fail together.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from enhydra.aggregate import BoundAggregate, dumps
from enhydra.kafka.clients import Producer, close, new_producer, start
from enhydra.logs import get_logger
from enhydra.processing.core import BatchResult, encode_entry
from enhydra.settings import Settings

log = get_logger("enhydra.output")

# Every event carries the command that caused it: its id (for dedup when state is rebuilt from
# events) and its offset in the commands partition of the same number (for the cut of a
# snapshot rebuilt from events, so a clone resumes on the commands topic exactly after it).
COMMAND_ID_HEADER = "enhydra.command_id"
COMMAND_OFFSET_HEADER = "enhydra.command_offset"
# The event's position among its command's events: lets a fold tell a redelivered duplicate
# from the next event of the same command.
EVENT_INDEX_HEADER = "enhydra.event_index"

# (key, value, headers) of one output record; the topic and partition are where it is grouped.
Out = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]
# (topic, key, value, headers): a record whose topic travels with it (dead letters).
Record = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]
# The index header of an event's position, for the positions commands commonly reach.
_EVENT_INDEX = [(EVENT_INDEX_HEADER, b"%d" % i) for i in range(16)]


@dataclass
class PartitionBatch:
    """One partition's share of a batch and, once published, its changelog position."""

    partition: int
    result: BatchResult
    puts: list[tuple[bytes, bytes]]
    dead_letters: list[Record] = field(default_factory=list)
    changelog_offset: int | None = None


def partition_outputs(agg: BoundAggregate, batch: PartitionBatch) -> dict[str, list[Out]]:
    """Per topic, what a partition's batch publishes before its changelog.

    Events first, then rejections, then dead letters; within a topic, in input order. Built
    straight into per-topic lists because this runs once per output record.
    """
    events: list[Out] = []
    append = events.append
    for emitted in batch.result.emitted:
        key = emitted.key.encode("utf-8")
        command_id = (COMMAND_ID_HEADER, emitted.command_id.encode("utf-8"))
        command_offset = (COMMAND_OFFSET_HEADER, b"%d" % emitted.offset)
        for index, payload in enumerate(emitted.payloads):
            position = _EVENT_INDEX[index] if index < 16 else (EVENT_INDEX_HEADER, b"%d" % index)
            append((key, payload, [command_id, command_offset, position]))
    outputs = {agg.events_topic: events} if events else {}
    if batch.result.rejected:
        outputs[agg.rejections_topic] = [
            (
                r.key.encode("utf-8") if r.key is not None else None,
                dumps(r.to_value()),
                None,
            )
            for r in batch.result.rejected
        ]
    for topic, key, value, headers in batch.dead_letters:
        outputs.setdefault(topic, []).append((key, value, headers))
    return outputs


def changelog_puts(result: BatchResult) -> list[tuple[bytes, bytes]]:
    return [(k.encode("utf-8"), encode_entry(e)) for k, e in result.changed.items()]


async def warm_up(producer: Producer, agg: BoundAggregate) -> None:
    """Learn where the output topics' partitions live now, not while the first batch waits."""
    for topic in (agg.events_topic, agg.rejections_topic, agg.changelog_topic):
        await producer.partitions_for(topic)


def _producer_options(settings: Settings) -> dict:
    return {
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": settings.producer_linger_ms,
        "max_batch_size": 256 * 1024,
    }


class AtLeastOnceOutput:
    def __init__(self, settings: Settings, agg: BoundAggregate) -> None:
        self.agg = agg
        self.settings = settings
        self._producer = new_producer(
            settings.connection,
            client_id=f"{settings.instance_id}-producer",
            **_producer_options(settings),
        )

    async def start(self) -> None:
        await start(self._producer, self.settings.connection)
        await warm_up(self._producer, self.agg)

    async def stop(self) -> None:
        await close(self._producer)

    async def open_task(self, partition: int) -> None:
        """Nothing per task: one producer serves them all."""

    async def close_task(self, partition: int) -> None:
        """Nothing per task: one producer serves them all."""

    @property
    def commits_offsets(self) -> bool:
        return False

    async def publish(self, batches: list[PartitionBatch], group_id: str) -> None:
        outputs = {
            (topic, batch.partition): records
            for batch in batches
            for topic, records in partition_outputs(self.agg, batch).items()
        }
        acks = [f for _, f in await send_in_batches(self._producer, outputs)]
        if acks:
            await asyncio.gather(*acks)
        changelog = {
            (self.agg.changelog_topic, b.partition): [(k, v, None) for k, v in b.puts]
            for b in batches
            if b.puts
        }
        sent = await send_in_batches(self._producer, changelog)
        last: dict[int, int] = {}
        for (_, partition), future in sent:
            meta, count = await future
            last[partition] = max(last.get(partition, -1), meta.offset + count - 1)
        for batch in batches:
            batch.changelog_offset = last.get(batch.partition)


async def send_in_batches(
    producer: Producer, records: dict[tuple[str, int], list[Out]]
) -> list[tuple[tuple[str, int], asyncio.Future]]:
    """Send records grouped per topic-partition as whole record batches.

    One future per batch instead of one coroutine and future per record: this is most of the
    producer's per-record cost in Python. Each future resolves to (base metadata, count).
    """
    now_ms = int(time.time() * 1000)
    sent: list[tuple[tuple[str, int], asyncio.Future]] = []

    async def flush(tp: tuple[str, int], builder: object, count: int) -> None:
        builder.close()  # type: ignore[attr-defined]
        future = await producer.send_batch(builder, tp[0], partition=tp[1])
        sent.append((tp, asyncio.ensure_future(_with_count(future, count))))

    for tp, items in records.items():
        builder = producer.create_batch()
        count = 0
        for key, value, headers in items:
            appended = builder.append(key=key, value=value, timestamp=now_ms, headers=headers or [])
            if appended is None:  # batch full: send it and start another
                await flush(tp, builder, count)
                builder = producer.create_batch()
                count = 0
                appended = builder.append(
                    key=key, value=value, timestamp=now_ms, headers=headers or []
                )
                if appended is None:
                    raise OutputTooLargeForBatch(f"a record for {tp[0]} exceeds the batch size")
            count += 1
        if count:
            await flush(tp, builder, count)
    return sent


async def _with_count(future: asyncio.Future, count: int) -> tuple[object, int]:
    return await future, count


class OutputTooLargeForBatch(ValueError):
    """A single record does not fit an empty producer batch (max_batch_size)."""


class ExactlyOnceOutput:
    def __init__(self, settings: Settings, agg: BoundAggregate) -> None:
        self.settings = settings
        self.agg = agg
        self._producers: dict[int, Producer] = {}

    async def start(self) -> None:
        """Producers are per task; they start when a task becomes active."""

    async def stop(self) -> None:
        for partition in list(self._producers):
            await self.close_task(partition)

    async def open_task(self, partition: int) -> None:
        """Initialising the task's transactional id fences any previous owner of it."""
        if partition in self._producers:
            return
        producer = new_producer(
            self.settings.connection,
            client_id=f"{self.settings.instance_id}-p{partition}",
            transactional_id=f"{self.settings.app_id}-task-{partition}",
            **_producer_options(self.settings),
        )
        await start(producer, self.settings.connection, doing="start a transactional producer")
        await warm_up(producer, self.agg)
        self._producers[partition] = producer

    async def close_task(self, partition: int) -> None:
        producer = self._producers.pop(partition, None)
        if producer is not None:
            await close(producer)

    @property
    def commits_offsets(self) -> bool:
        return True

    async def publish(self, batches: list[PartitionBatch], group_id: str) -> None:
        await asyncio.gather(*(self._publish_one(b, group_id) for b in batches))

    async def _publish_one(self, batch: PartitionBatch, group_id: str) -> None:
        producer = self._producers[batch.partition]
        async with producer.transaction():
            for topic, records in partition_outputs(self.agg, batch).items():
                for key, value, headers in records:
                    await producer.send(
                        topic, value, key=key, partition=batch.partition, headers=headers
                    )
            futures = [
                await producer.send(self.agg.changelog_topic, v, key=k, partition=batch.partition)
                for k, v in batch.puts
            ]
            if batch.result.last_offset >= 0:
                tp = TopicPartition(self.agg.commands_topic, batch.partition)
                await producer.send_offsets_to_transaction(
                    {tp: OffsetAndMetadata(batch.result.last_offset + 1, "")}, group_id
                )
        if futures:
            batch.changelog_offset = max(m.offset for m in await asyncio.gather(*futures))


def make_output(settings: Settings, agg: BoundAggregate) -> AtLeastOnceOutput | ExactlyOnceOutput:
    if settings.processing_guarantee == "exactly_once":
        return ExactlyOnceOutput(settings, agg)
    return AtLeastOnceOutput(settings, agg)
