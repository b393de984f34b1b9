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
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from enhydra.aggregate import BoundAggregate, dumps
from enhydra.logs import get_logger
from enhydra.processing.core import BatchResult, encode_entry
from enhydra.settings import Settings

log = get_logger("enhydra.output")

# Every event carries the command that caused it: its id (for dedup when state is rebuilt from
# events) and its offset in the commands partition of the same number (for the cut of a
# snapshot rebuilt from events, so a clone resumes on the commands topic exactly after it).
COMMAND_ID_HEADER = "enhydra.command_id"
COMMAND_OFFSET_HEADER = "enhydra.command_offset"

Record = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]


@dataclass
class PartitionBatch:
    """One partition's share of a batch and, once published, its changelog position."""

    partition: int
    result: BatchResult
    puts: list[tuple[bytes, bytes]]
    dead_letters: list[Record] = field(default_factory=list)
    changelog_offset: int | None = None


def output_records(agg: BoundAggregate, result: BatchResult) -> list[Record]:
    """Events and rejections of one partition's batch, as (topic, key, value, headers)."""
    records: list[Record] = []
    for emitted in result.emitted:
        key = emitted.key.encode("utf-8")
        headers = [
            (COMMAND_ID_HEADER, emitted.command_id.encode("utf-8")),
            (COMMAND_OFFSET_HEADER, str(emitted.offset).encode()),
        ]
        records.extend((agg.events_topic, key, payload, headers) for payload in emitted.payloads)
    for rejected in result.rejected:
        key = rejected.key.encode("utf-8") if rejected.key is not None else None
        records.append((agg.rejections_topic, key, dumps(rejected.to_value()), None))
    return records


def batch_records(agg: BoundAggregate, batch: PartitionBatch) -> list[Record]:
    """Everything a partition's batch publishes before its changelog: outputs, dead letters."""
    return [*output_records(agg, batch.result), *batch.dead_letters]


def changelog_puts(result: BatchResult) -> list[tuple[bytes, bytes]]:
    return [(k.encode("utf-8"), encode_entry(e)) for k, e in result.changed.items()]


def _producer_options(settings: Settings) -> dict:
    return {
        "bootstrap_servers": settings.bootstrap_servers,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": settings.producer_linger_ms,
        "max_batch_size": 256 * 1024,
    }


class AtLeastOnceOutput:
    def __init__(self, settings: Settings, agg: BoundAggregate) -> None:
        self.agg = agg
        self._producer = AIOKafkaProducer(
            client_id=f"{settings.instance_id}-producer", **_producer_options(settings)
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def open_task(self, partition: int) -> None:
        """Nothing per task: one producer serves them all."""

    async def close_task(self, partition: int) -> None:
        """Nothing per task: one producer serves them all."""

    @property
    def commits_offsets(self) -> bool:
        return False

    async def publish(self, batches: list[PartitionBatch], group_id: str) -> None:
        send = self._producer.send
        acks = []
        for batch in batches:
            for topic, key, value, headers in batch_records(self.agg, batch):
                acks.append(
                    await send(topic, value, key=key, partition=batch.partition, headers=headers)
                )
        if acks:
            await asyncio.gather(*acks)
        pending = []
        for batch in batches:
            futures = [
                await send(self.agg.changelog_topic, v, key=k, partition=batch.partition)
                for k, v in batch.puts
            ]
            pending.append((batch, futures))
        for batch, futures in pending:
            if futures:
                batch.changelog_offset = max(m.offset for m in await asyncio.gather(*futures))


class ExactlyOnceOutput:
    def __init__(self, settings: Settings, agg: BoundAggregate) -> None:
        self.settings = settings
        self.agg = agg
        self._producers: dict[int, AIOKafkaProducer] = {}

    async def start(self) -> None:
        """Producers are per task; they start when a task becomes active."""

    async def stop(self) -> None:
        for partition in list(self._producers):
            await self.close_task(partition)

    async def open_task(self, partition: int) -> None:
        """Initialising the task's transactional id fences any previous owner of it."""
        if partition in self._producers:
            return
        producer = AIOKafkaProducer(
            client_id=f"{self.settings.instance_id}-p{partition}",
            transactional_id=f"{self.settings.app_id}-task-{partition}",
            **_producer_options(self.settings),
        )
        await producer.start()
        self._producers[partition] = producer

    async def close_task(self, partition: int) -> None:
        producer = self._producers.pop(partition, None)
        if producer is not None:
            await producer.stop()

    @property
    def commits_offsets(self) -> bool:
        return True

    async def publish(self, batches: list[PartitionBatch], group_id: str) -> None:
        await asyncio.gather(*(self._publish_one(b, group_id) for b in batches))

    async def _publish_one(self, batch: PartitionBatch, group_id: str) -> None:
        producer = self._producers[batch.partition]
        async with producer.transaction():
            for topic, key, value, headers in batch_records(self.agg, batch):
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
