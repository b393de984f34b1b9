"""Reading the dead-letter queue and replaying from it (the I/O behind `enhydra dlq`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from enhydra.errors.dlq import DeadLetter
from enhydra.kafka.clients import as_connection, open_consumer, open_producer
from enhydra.kafka.reading import TopicMissing, read_to_end
from enhydra.settings import Connection


class DlqError(RuntimeError):
    """The DLQ cannot be read or a replay target is unusable."""


async def read_dead_letters(conn: Connection | str, topic: str) -> list[DeadLetter]:
    """Every record in the DLQ topic, oldest first per partition (a bounded read to the end)."""
    letters: list[DeadLetter] = []
    async with open_consumer(as_connection(conn), isolation_level="read_committed") as consumer:
        try:
            async for partition, records in read_to_end(consumer, topic, max_records=5000):
                letters.extend(
                    DeadLetter(partition, r.offset, r.key, r.value, tuple(r.headers or ()))
                    for r in records
                )
        except TopicMissing:
            raise DlqError(
                f"no topic {topic!r}: is the app id right, and does it use a DLQ?"
            ) from None
    return letters


async def replay(
    conn: Connection | str,
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
    for letter in letters:
        if not (to_topic or letter.origin_topic):
            raise DlqError(
                f"dead letter {letter.dlq_partition}@{letter.dlq_offset} "
                "has no origin topic header; pass --to-topic"
            )
        if letter.truncated_from is not None:
            raise DlqError(
                f"dead letter {letter.dlq_partition}@{letter.dlq_offset} holds only part of its "
                f"record ({letter.truncated_from} bytes, cut to fit the DLQ); leave it out "
                f"(--partition, --from-offset, --to-offset) and resend the original from "
                f"{letter.origin_topic}[{letter.origin_partition}]@{letter.origin_offset}"
            )
    async with open_producer(as_connection(conn), acks="all", enable_idempotence=True) as producer:
        futures = []
        for letter in letters:
            target = to_topic or letter.origin_topic
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
