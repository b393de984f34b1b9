"""Reading topics from the outside: partitions, offsets, and offset ranges up to a fixed end.

One loop serves the DLQ listing, time travel, the Spark Python reader and the tests: assign,
seek to each range's start, fetch until every partition's position has reached its end. The
end is fixed before reading, so a topic that keeps growing is still read in bounded time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiokafka import TopicPartition

from enhydra.kafka.clients import Consumer, Producer, open_consumer
from enhydra.settings import Connection

Range = tuple[int, int]  # [start, end) offsets of one partition


class TopicMissing(LookupError):
    """The topic does not exist (or this client may not see it)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"no topic {topic!r}")
        self.topic = topic


class ReadStalled(TimeoutError):
    """No record arrived for a while although the range's end was not reached."""


def fetch_position(consumer: Any, tp: TopicPartition) -> int | None:
    """The offset `consumer` returns next for `tp`, without waiting; None when not known yet.

    aiokafka's `position()` is awaitable and may wait for an offset reset; the watchdog and the
    lag gauges need a look that never blocks. Past a transaction's commit marker (an offset
    with no record) the position is beyond the last record returned: the only sign that the
    rest of the log up to the high watermark is not work waiting.
    """
    subscription = getattr(getattr(consumer, "_subscription", None), "subscription", None)
    assignment = getattr(subscription, "assignment", None)
    state = assignment.state_value(tp) if assignment is not None else None
    if state is None or not state.has_valid_position:
        return None
    return state.position


async def partitions_of(consumer: Consumer, topic: str) -> list[int]:
    """The topic's partitions, asking the cluster when the client's metadata does not know it."""
    found = consumer.partitions_for_topic(topic)
    if not found:
        await consumer._client.force_metadata_update()
        found = consumer.partitions_for_topic(topic)
    return sorted(found or ())


async def known_topics(client: Consumer | Producer) -> set[str]:
    """Every topic the cluster has now (fresh metadata, not the client's cache)."""
    metadata = (
        await client._client.fetch_all_metadata()
        if isinstance(client, Consumer)
        else await client.client.fetch_all_metadata()
    )
    return set(metadata.topics())


async def refresh_metadata(consumer: Consumer) -> None:
    """Forget cached metadata (a topic was just created elsewhere)."""
    await consumer._client.force_metadata_update()


async def offsets(
    consumer: Consumer, topic: str, partitions: list[int] | None = None
) -> tuple[dict[int, int], dict[int, int]]:
    """(beginning, end) offset of each partition of `topic` (all of them by default)."""
    if partitions is None:
        partitions = await partitions_of(consumer, topic)
        if not partitions:
            raise TopicMissing(topic)
    tps = [TopicPartition(topic, p) for p in partitions]
    begins = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    return (
        {tp.partition: o for tp, o in begins.items()},
        {tp.partition: o for tp, o in ends.items()},
    )


async def read_ranges(
    consumer: Consumer,
    topic: str,
    ranges: Mapping[int, Range],
    *,
    max_records: int = 10_000,
    stall_timeout_s: float | None = None,
) -> AsyncIterator[tuple[int, list[Any]]]:
    """Yield (partition, records) until every range [start, end) has been read.

    Records at or beyond a range's end are dropped. `stall_timeout_s` raises ReadStalled when
    nothing arrives for that long (a broker gone, or records deleted under the reader).
    """
    tps = {p: TopicPartition(topic, p) for p in ranges}
    consumer.assign(list(tps.values()))
    pending = set()
    for partition, (start, end) in ranges.items():
        if end > start:
            consumer.seek(tps[partition], start)
            pending.add(partition)
    last_progress = time.monotonic()
    while pending:
        fetched = await consumer.getmany(
            *(tps[p] for p in sorted(pending)), timeout_ms=500, max_records=max_records
        )
        for tp, records in fetched.items():
            end = ranges[tp.partition][1]
            kept = [r for r in records if r.offset < end]
            if kept:
                last_progress = time.monotonic()
                yield tp.partition, kept
        for partition in list(pending):
            if await consumer.position(tps[partition]) >= ranges[partition][1]:
                pending.discard(partition)
        if (
            pending
            and stall_timeout_s is not None
            and time.monotonic() - last_progress > stall_timeout_s
        ):
            stuck = {p: await consumer.position(tps[p]) for p in sorted(pending)}
            raise ReadStalled(
                f"no progress reading {topic} for {stall_timeout_s:.0f}s at offsets {stuck}"
            )


async def read_to_end(
    consumer: Consumer, topic: str, *, max_records: int = 10_000
) -> AsyncIterator[tuple[int, list[Any]]]:
    """Every record now in `topic`, oldest first per partition (the end is fixed at the start)."""
    begins, ends = await offsets(consumer, topic)
    async for item in read_ranges(
        consumer, topic, {p: (begins[p], ends[p]) for p in ends}, max_records=max_records
    ):
        yield item


async def read_all(conn: Connection | str, topic: str, *, isolation_level: str = "read_committed"):
    """Every record now in a small topic, as one list (the DLQ, a test's output)."""
    records: list[Any] = []
    async with open_consumer(conn, isolation_level=isolation_level) as consumer:
        async for _, batch in read_to_end(consumer, topic):
            records.extend(batch)
    return records


async def end_offsets(conn: Connection | str, topic: str) -> dict[int, int]:
    """The end offset of every partition of `topic` ({} when it does not exist)."""
    async with open_consumer(conn) as consumer:
        try:
            return (await offsets(consumer, topic))[1]
        except TopicMissing:
            return {}


async def read_spans(
    conn: Connection | str, topic: str, ranges: Mapping[int, Range], *, stall_timeout_s: float
) -> dict[int, list[Any]]:
    """The records of each partition's range [start, end), read once with a fresh consumer."""
    found: dict[int, list[Any]] = {}
    async with open_consumer(conn, isolation_level="read_committed") as consumer:
        reading = read_ranges(consumer, topic, ranges, stall_timeout_s=stall_timeout_s)
        async for partition, records in reading:
            found.setdefault(partition, []).extend(records)
    return found
