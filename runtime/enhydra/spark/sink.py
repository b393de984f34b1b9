"""Writing corrected events back to Kafka: Spark's Kafka sink, or aiokafka in the Python workers.

Rows carry their partition, so an event lands in the partition number of its key (the events
partition = store partition rule holds in the new topic too). Each key's events are written by
one task in fold order, so per-key order is kept whichever writer runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from enhydra.spark.ship import DriverLog, import_aiokafka
from enhydra.spark.source import METHODS, SourceError, _connector_missing

log = DriverLog("enhydra.spark.sink")  # executors import this module; they have no structlog


def ensure_topic(bootstrap: str, topic: str, partitions: int, replication: int = 1) -> None:
    """Create the target topic with the events topic's partition count, or check it has it."""
    from enhydra.kafka.topics import TopicSpec, ensure_topics

    asyncio.run(ensure_topics(bootstrap, [TopicSpec(topic, partitions, replication, history=True)]))


def write_events(spark: Any, events: Any, topic: str, bootstrap: str, method: str = "auto") -> int:
    """Produce (key, value, partition, headers) rows to `topic`; returns how many were added."""
    from enhydra.spark.source import resolve_ranges

    if method not in METHODS:
        raise SourceError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    before = sum(r.end for r in resolve_ranges(bootstrap, topic))
    written = False
    if method in ("auto", "kafka"):
        try:
            (
                events.write.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("kafka.acks", "all")
                .option("kafka.enable.idempotence", "true")
                .option("topic", topic)
                .save()
            )
            written = True
        except Exception as exc:
            if method == "kafka" or not _connector_missing(exc):
                raise
            log.info("spark's kafka sink is not on the classpath; producing from python")
    if not written:
        events.mapInArrow(_Producer(bootstrap, topic), "written long").collect()
    return sum(r.end for r in resolve_ranges(bootstrap, topic)) - before


class _Producer:
    """mapInArrow: produce a task's rows with aiokafka (acks=all, idempotent), then count."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        loop = asyncio.new_event_loop()
        try:
            written = loop.run_until_complete(self._produce(batches))
        finally:
            loop.close()
        yield pa.RecordBatch.from_pydict({"written": [written]})

    async def _produce(self, batches: Iterable[pa.RecordBatch]) -> int:
        import_aiokafka()  # on a worker without aiokafka: the copy the job shipped
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        await producer.start()
        written = 0
        try:
            for batch in batches:
                futures = []
                for row in batch.to_pylist():
                    headers = [(h["key"], h["value"]) for h in row["headers"] or []]
                    futures.append(
                        await producer.send(
                            self.topic,
                            row["value"],
                            key=row["key"],
                            partition=row["partition"],
                            headers=headers,
                        )
                    )
                await asyncio.gather(*futures)
                written += len(futures)
        finally:
            await producer.stop()
        return written
