"""Reading the dead-letter queue and replaying from it (the I/O behind `enhydra dlq`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from enhydra.errors.dlq import DeadLetter


class DlqError(RuntimeError):
    """The DLQ cannot be read or a replay target is unusable."""


async def read_dead_letters(
    bootstrap: str, topic: str, *, timeout: float = 60.0
) -> list[DeadLetter]:
    """Every record in the DLQ topic, oldest first per partition (a bounded read to the end)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise DlqError(f"no topic {topic!r}: is the app id right, and does it use a DLQ?")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        letters: list[DeadLetter] = []
        deadline = time.monotonic() + timeout
        while True:
            positions = {tp: await consumer.position(tp) for tp in tps}
            if all(positions[tp] >= ends[tp] for tp in tps):
                return letters
            if time.monotonic() > deadline:
                raise DlqError(f"reading {topic} took longer than {timeout}s")
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                letters.extend(
                    DeadLetter(tp.partition, r.offset, r.key, r.value, tuple(r.headers or ()))
                    for r in records
                    if r.offset < ends[tp]
                )
    finally:
        await consumer.stop()


async def replay(
    bootstrap: str,
    dlq_topic: str,
    letters: Sequence[DeadLetter],
    *,
    to_topic: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Send each dead letter back to its source topic (or `to_topic`), keyed as it was.

    The key decides the partition, as it did for the original producer, so per-key order
    with newer commands is that of arrival; the headers say it is a replay and from where.
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = []
        for letter in letters:
            target = to_topic or letter.origin_topic
            if not target:
                raise DlqError(
                    f"dead letter {letter.dlq_partition}@{letter.dlq_offset} "
                    "has no origin topic header; pass --to-topic"
                )
            futures.append(
                await producer.send(
                    target, letter.value, key=letter.key, headers=letter.replay_headers(dlq_topic)
                )
            )
            if progress is not None:
                progress(1)
        for future in futures:
            await future
        return len(futures)
    finally:
        await producer.stop()
