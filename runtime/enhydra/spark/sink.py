"""Writing corrected events back to Kafka: Spark's Kafka sink, or aiokafka in the Python workers.

Rows carry their partition, so an event lands in the partition number of its key (the events
partition = store partition rule holds in the new topic too). Each key's events are written by
one task in fold order, so per-key order is kept whichever writer runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from enhydra.spark.ship import DriverLog, import_aiokafka
from enhydra.spark.source import METHODS, SourceError, _connector_missing

if TYPE_CHECKING:
    from enhydra.settings import Connection

log = DriverLog("enhydra.spark.sink")  # executors import this module; they have no structlog


def ensure_topic(conn: Connection | str, topic: str, partitions: int) -> None:
    """Create the target topic with the events topic's partition count, or check it has it.

    Its replication is the connection's (ENHYDRA_REPLICATION_FACTOR, else the broker's).
    """
    from enhydra.kafka.topics import TopicSpec, ensure_topics

    asyncio.run(ensure_topics(conn, [TopicSpec(topic, partitions, history=True)]))


def write_events(
    spark: Any, events: Any, topic: str, conn: Connection | str, method: str = "auto"
) -> int:
    """Produce (key, value, partition, headers) rows to `topic`; returns how many were added.

    `conn` (TLS, SASL) reaches Spark's Kafka sink as `kafka.*` options, or the Python producer
    on the executors (OAUTHBEARER always goes that way, see source.jvm_options).
    """
    from enhydra.kafka.spark_options import connection_option
    from enhydra.spark.source import _connection, jvm_options, resolve_ranges

    if method not in METHODS:
        raise SourceError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    conn = _connection(conn)
    before = sum(r.end for r in resolve_ranges(conn, topic))
    written = False
    options = jvm_options(conn, method, "writing")
    if options is not None:
        try:
            (
                events.write.format("kafka")
                .options(**options)
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
        events.mapInArrow(_Producer(connection_option(conn), topic), "written long").collect()
    return sum(r.end for r in resolve_ranges(conn, topic)) - before


class _Producer:
    """mapInArrow: produce a task's rows with aiokafka (acks=all, idempotent), then count.

    Holds the connection as `connection_option` wrote it; each task rebuilds the Connection
    and gets its producer from enhydra.kafka.clients.
    """

    def __init__(self, connection: str, topic: str) -> None:
        self.connection = connection
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
        from enhydra.kafka.clients import close, new_producer, start
        from enhydra.kafka.errors import KafkaAccessError
        from enhydra.kafka.spark_options import connection_from_option

        conn = connection_from_option(self.connection)
        producer = new_producer(conn, acks="all", enable_idempotence=True, linger_ms=5)
        try:
            await start(producer, conn, doing=f"write {self.topic}")
        except KafkaAccessError as exc:  # one line the driver shows (cli/backfill.py)
            raise SourceError("; ".join(exc.lines())) from None
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
            await close(producer)
        return written
