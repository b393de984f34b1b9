"""Both Kafka readers return the same rows, bounded the same way, on a real broker."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import AIOKafkaProducer

from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.spark.source import (
    FORMAT,
    SourceError,
    read_events,
    resolve_ranges,
    split_ranges,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BASE = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def topic(kafka_bootstrap: str, app_id: str) -> str:
    """600 records over 3 partitions, timestamps one second apart, some without headers."""
    name = f"{app_id}-events"

    async def produce() -> None:
        await ensure_topics(kafka_bootstrap, [TopicSpec(name, 3, history=True)], client_id="test")
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
        await producer.start()
        try:
            for i in range(600):
                headers = [("enhydra.command_id", f"c{i}".encode()), ("n", str(i).encode())]
                await producer.send(
                    name,
                    f'{{"n": {i}}}'.encode(),
                    key=f"k{i % 23}".encode(),
                    partition=i % 3,
                    timestamp_ms=int((BASE + timedelta(seconds=i)).timestamp() * 1000),
                    headers=headers if i % 4 else [],
                )
        finally:
            await producer.stop()

    asyncio.run(produce())
    return name


def rows(df) -> list[tuple]:
    return sorted(
        (
            r.partition,
            r.offset,
            r.key,
            r.value,
            r.topic,
            r.timestamp,
            [(h.key, h.value) for h in r.headers] if r.headers is not None else None,
        )
        for r in df.collect()
    )


def test_both_readers_return_the_same_rows(spark, kafka_bootstrap: str, topic: str) -> None:
    kafka = read_events(spark, topic, kafka_bootstrap, method="kafka")
    python = read_events(spark, topic, kafka_bootstrap, method="python", split_records=37)
    assert kafka.schema == python.schema
    assert [f.name for f in kafka.schema] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "headers",
    ]
    assert python.rdd.getNumPartitions() == 3 * 6  # 200 records per partition, split by 37
    expected = rows(kafka)
    assert len(expected) == 600
    assert rows(python) == expected
    first = next(r for r in expected if r[0] == 1 and r[1] == 0)  # record i = 1
    assert first[5] == (BASE + timedelta(seconds=1)).replace(tzinfo=None)
    assert first[6] == [("enhydra.command_id", b"c1"), ("n", b"1")]
    assert next(r for r in expected if r[0] == 0 and r[1] == 0)[6] is None  # i = 0: no headers


@pytest.mark.parametrize("method", ["kafka", "python"])
def test_reads_are_bounded_by_offsets_or_time(
    spark, kafka_bootstrap: str, topic: str, method: str
) -> None:
    by_offsets = rows(
        read_events(spark, topic, kafka_bootstrap, until_offsets={0: 10, 2: 0}, method=method)
    )
    assert {(p, len([r for r in by_offsets if r[0] == p])) for p in range(3)} == {
        (0, 10),
        (1, 200),
        (2, 0),
    }
    # Records i < 90 were stamped before BASE + 90 s: 30 per partition.
    until = BASE + timedelta(seconds=90)
    by_time = rows(read_events(spark, topic, kafka_bootstrap, until_time=until, method=method))
    assert len(by_time) == 90
    assert all(r[5] < until.replace(tzinfo=None) for r in by_time)


def test_bounds_are_checked_with_clear_errors(kafka_bootstrap: str, topic: str) -> None:
    with pytest.raises(SourceError, match=r"until_offsets\[1\] = 999 is outside 0\.\.200"):
        resolve_ranges(kafka_bootstrap, topic, until_offsets={1: 999})
    with pytest.raises(SourceError, match=r"names partitions \[7\]"):
        resolve_ranges(kafka_bootstrap, topic, until_offsets={7: 1})
    with pytest.raises(SourceError, match="does not exist"):
        resolve_ranges(kafka_bootstrap, topic + "-nope")
    with pytest.raises(SourceError, match="not both"):
        resolve_ranges(kafka_bootstrap, topic, until_offsets={0: 1}, until_time=BASE)


def test_unknown_method_is_refused(spark, kafka_bootstrap: str, topic: str) -> None:
    with pytest.raises(SourceError, match="expected one of auto, kafka, python"):
        read_events(spark, topic, kafka_bootstrap, method="jdbc")
    assert FORMAT == "enhydra-kafka"


def test_split_ranges_covers_every_offset_once() -> None:
    from enhydra.spark.source import OffsetRange

    pieces = split_ranges([OffsetRange(0, 5, 27), OffsetRange(1, 0, 0), OffsetRange(2, 3, 4)], 10)
    assert [(p.partition, p.start, p.end) for p in pieces] == [
        (0, 5, 15),
        (0, 15, 25),
        (0, 25, 27),
        (2, 3, 4),
    ]
