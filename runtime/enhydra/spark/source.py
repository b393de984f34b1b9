"""Reading an events topic into Spark, bounded: the end is fixed before the job reads anything.

Two readers with one schema (key, value, topic, partition, offset, timestamp, headers):
- `kafka`: Spark's own Kafka source (spark-sql-kafka-0-10, see jars.py) when it is on the
  classpath; the JVM reads, nothing passes through Python until the fold.
- `python`: a Python Data Source (format "enhydra-kafka") that reads each partition's offset
  range (or pieces of it) with aiokafka inside the Python workers. It needs no jars, so it also
  runs where jars cannot be added; the workers need aiokafka (`ship.py` sends a pure-Python
  copy along for workers that lack it).

Both keep one Kafka partition in one Spark partition unless `split_records` asks for pieces:
the fold can then run in place, without a shuffle (fold.py).

Both read with isolation.level=read_committed and fail when an offset in the range is gone
(retention): a rebuild from a silently shortened history would be wrong, not just incomplete.

Both reach Kafka with the job's Connection (TLS, SASL), translated once in
enhydra.kafka.spark_options: `kafka.*` options for Spark's source, the Connection itself for
the Python one, whose consumers come from enhydra.kafka.clients like every other client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from enhydra.spark.ship import DriverLog, import_aiokafka

if TYPE_CHECKING:
    from enhydra.settings import Connection

log = DriverLog("enhydra.spark.source")  # executors import this module; they have no structlog

FORMAT = "enhydra-kafka"
COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]
SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, headers array<struct<key: string, value: binary>>"
)
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
METHODS = ("auto", "kafka", "python")
POLL_RECORDS = 50_000  # records per poll of Spark's Kafka consumer
POLL_BYTES = 16 * 1024 * 1024


class SourceError(RuntimeError):
    """The events cannot be read as asked; the message says why."""


@dataclass(frozen=True)
class OffsetRange:
    """Records [start, end) of one partition."""

    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return max(0, self.end - self.start)


# --------------------------------------------------------------------------- offsets


def resolve_ranges(
    conn: Connection | str,
    topic: str,
    *,
    until_offsets: Mapping[int, int] | None = None,
    until_time: datetime | None = None,
) -> list[OffsetRange]:
    """Fix what a job reads: from each partition's beginning to its end now, or to the bound.

    `conn` is a Connection (TLS, SASL) or a PLAINTEXT bootstrap string. `until_offsets`
    {partition: offset} is exclusive (partitions not named read to their end). `until_time`
    stops each partition before its first record at or after that time. Kafka that cannot be
    reached or refuses the credentials raises enhydra.kafka's KafkaAccessError.
    """
    if until_offsets is not None and until_time is not None:
        raise SourceError("give until_offsets or until_time, not both")
    return asyncio.run(_resolve(conn, topic, until_offsets, until_time))


async def _resolve(
    conn: Connection | str,
    topic: str,
    until_offsets: Mapping[int, int] | None,
    until_time: datetime | None,
) -> list[OffsetRange]:
    from aiokafka import TopicPartition

    from enhydra.kafka.clients import as_connection, open_consumer
    from enhydra.kafka.reading import TopicMissing, offsets, refresh_metadata

    conn = as_connection(conn)
    async with open_consumer(conn, isolation_level="read_committed") as consumer:
        await refresh_metadata(consumer)
        try:
            starts, ends = await offsets(consumer, topic)
        except TopicMissing:
            raise SourceError(
                f"topic {topic!r} does not exist on {conn.bootstrap_servers} (is the app id right?)"
            ) from None
        bounds = dict(ends)
        if until_offsets is not None:
            unknown = sorted(set(until_offsets) - set(bounds))
            if unknown:
                raise SourceError(f"until_offsets names partitions {unknown} that {topic} lacks")
            for p, offset in until_offsets.items():
                if offset < 0 or offset > bounds[p]:
                    raise SourceError(
                        f"until_offsets[{p}] = {offset} is outside 0..{bounds[p]} "
                        f"(the end of {topic}[{p}] now)"
                    )
                bounds[p] = offset
        if until_time is not None:
            if until_time.tzinfo is None:
                until_time = until_time.replace(tzinfo=UTC)
            ms = int(until_time.timestamp() * 1000)
            found = await consumer.offsets_for_times(
                {TopicPartition(topic, p): ms for p in sorted(bounds)}
            )
            for tp, hit in found.items():
                if hit is not None:
                    bounds[tp.partition] = min(bounds[tp.partition], hit.offset)
        ranges = [OffsetRange(p, starts[p], bounds[p]) for p in sorted(bounds)]
    truncated = {r.partition: r.start for r in ranges if r.start > 0}
    if truncated:
        log.warning(
            "events topic does not start at offset 0; history before is gone (retention)",
            topic=topic,
            first_offsets=truncated,
        )
    return ranges


def split_ranges(ranges: list[OffsetRange], max_records: int | None) -> list[OffsetRange]:
    """Cut ranges into pieces of at most `max_records`, so big partitions read in parallel.

    `max_records` None (or 0) keeps one piece per non-empty partition.
    """
    if not max_records:
        return [r for r in ranges if r.count > 0]
    pieces = []
    for r in ranges:
        start = r.start
        while start < r.end:
            end = min(r.end, start + max_records)
            pieces.append(OffsetRange(r.partition, start, end))
            start = end
    return pieces


# --------------------------------------------------------------------------- python source


class _Split(InputPartition):
    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


class KafkaEventsDataSource(DataSource):
    """`spark.read.format("enhydra-kafka")` with options connection, topic, ranges (JSON).

    `connection` is `enhydra.kafka.spark_options.connection_option(conn)`: the executors
    rebuild the driver's Connection from it (it holds secrets; session.py redacts it).
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return _KafkaReader(dict(self.options))


class _KafkaReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        try:
            self.connection = options["connection"]
            self.topic = options["topic"]
            self.ranges = [OffsetRange(*r) for r in json.loads(options["ranges"])]
        except (KeyError, ValueError, TypeError) as exc:
            raise SourceError(
                f"{FORMAT} needs options connection, topic and ranges: {exc}"
            ) from None
        self.split_records = int(options.get("split_records", "0"))  # 0: whole partitions
        self.batch_records = int(options.get("batch_records", "10000"))
        self.timeout_s = float(options.get("timeout_s", "120"))

    def partitions(self) -> list[InputPartition]:
        pieces = split_ranges(self.ranges, self.split_records)
        return [_Split(p.partition, p.start, p.end) for p in pieces] or [_Split(0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        split: _Split = partition  # type: ignore[assignment]
        if split.end <= split.start:
            return
        from enhydra.kafka.spark_options import connection_from_option

        yield from read_range(
            connection_from_option(self.connection),
            self.topic,
            OffsetRange(split.partition, split.start, split.end),
            batch_records=self.batch_records,
            timeout_s=self.timeout_s,
        )


def read_range(
    conn: Connection | str,
    topic: str,
    rng: OffsetRange,
    *,
    batch_records: int = 10000,
    timeout_s: float = 120.0,
) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of one partition as Arrow batches, from a synchronous caller."""
    import_aiokafka()  # on a worker without aiokafka: the copy the job shipped
    from aiokafka.errors import OffsetOutOfRangeError

    from enhydra.kafka.clients import as_connection, close, new_consumer, start
    from enhydra.kafka.errors import KafkaAccessError
    from enhydra.kafka.reading import ReadStalled, read_ranges

    conn = as_connection(conn)
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete

    async def open_consumer() -> Any:
        # aiokafka binds to the running loop, so the consumer is created inside it.
        consumer = new_consumer(
            conn,
            isolation_level="read_committed",
            auto_offset_reset="none",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
        )
        await start(consumer, conn, doing=f"read {topic}")
        return consumer

    consumer = batches = None
    try:
        try:
            consumer = run(open_consumer())
        except KafkaAccessError as exc:  # one line the driver shows (cli/backfill.py)
            raise SourceError("; ".join(exc.lines())) from None
        batches = read_ranges(
            consumer,
            topic,
            {rng.partition: (rng.start, rng.end)},
            max_records=batch_records,
            stall_timeout_s=timeout_s,
        )
        while True:
            try:
                _, records = run(anext(batches))
            except StopAsyncIteration:
                return
            except OffsetOutOfRangeError as exc:
                raise SourceError(
                    f"{topic}[{rng.partition}] offsets {rng.start}..{rng.end} are no longer all "
                    f"in Kafka (deleted by retention?): {exc}"
                ) from None
            except ReadStalled as exc:
                raise SourceError(
                    f"{exc} (range {rng.start}..{rng.end} of partition {rng.partition}); "
                    f"is {conn.bootstrap_servers} reachable?"
                ) from None
            yield _to_arrow(topic, records)
    finally:
        if batches is not None:
            run(batches.aclose())
        if consumer is not None:
            run(close(consumer))
        loop.close()


def _to_arrow(topic: str, records: list[Any]) -> pa.RecordBatch:
    headers = [[{"key": k, "value": v} for k, v in r.headers] or None for r in records]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            pa.array([topic] * len(records), pa.string()),
            pa.array([r.partition for r in records], pa.int32()),
            pa.array([r.offset for r in records], pa.int64()),
            pa.array([r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")),
            pa.array(headers, ARROW_SCHEMA.field("headers").type),
        ],
        schema=ARROW_SCHEMA,
    )


# --------------------------------------------------------------------------- entry point


def read_events(
    spark: Any,
    topic: str,
    conn: Connection | str,
    until_offsets: Mapping[int, int] | None = None,
    until_time: datetime | None = None,
    method: str = "auto",
    *,
    ranges: list[OffsetRange] | None = None,
    split_records: int | None = None,
) -> Any:
    """A bounded DataFrame of `topic`: offsets fixed now (or by until_*), same schema either way.

    `conn` is how to reach Kafka (a Connection with TLS/SASL, or a PLAINTEXT bootstrap string).
    method "kafka" uses Spark's Kafka source and fails without its jars; "python" uses the
    Python Data Source; "auto" prefers Spark's source and falls back to the Python one (also
    for OAUTHBEARER, whose token provider is Python code the JVM cannot call).
    `ranges` skips resolving offsets (the job resolves them once and reuses them for the cut).
    Each Kafka partition is one Spark partition, unless `split_records` cuts partitions into
    pieces of about that many records (more read tasks than partitions, but then a fold must
    shuffle).
    """
    from enhydra.kafka.spark_options import connection_option

    if method not in METHODS:
        raise SourceError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    conn = _connection(conn)
    if ranges is None:
        ranges = resolve_ranges(conn, topic, until_offsets=until_offsets, until_time=until_time)
    options = jvm_options(conn, method, "reading")
    if options is not None:
        try:
            df = _spark_kafka(spark, topic, options, ranges, split_records)
            log.info("reading events with spark's kafka source", topic=topic)
            return df
        except Exception as exc:
            if method == "kafka" or not _connector_missing(exc):
                raise
            log.info("spark's kafka source is not on the classpath; using the python source")
    spark.dataSource.register(KafkaEventsDataSource)
    log.info("reading events with the python data source", topic=topic)
    return (
        spark.read.format(FORMAT)
        .option("connection", connection_option(conn))
        .option("topic", topic)
        .option("ranges", json.dumps([[r.partition, r.start, r.end] for r in ranges]))
        .option("split_records", str(split_records or 0))
        .load()
    )


def _connection(conn: Connection | str) -> Connection:
    from enhydra.kafka.clients import as_connection

    return as_connection(conn)


def jvm_options(conn: Connection, method: str, doing: str | None) -> dict[str, str] | None:
    """Spark's Kafka options for `conn`, or None when the Python reader/writer must do it.

    OAUTHBEARER cannot go to the JVM: "auto" falls back to Python (and logs why, unless
    `doing` is None), "kafka" fails plainly. A TLS file Kafka's Java client cannot use raises
    SettingsError. Options are built only when Spark's connector may be used.
    """
    from enhydra.kafka.spark_options import NotForTheJvm, spark_kafka_options

    if method == "python":
        return None
    try:
        return spark_kafka_options(conn)
    except NotForTheJvm as exc:
        if method == "kafka":
            raise SourceError(
                f"{exc}: use --method python (the Python reader and writer)"
            ) from None
        if doing is not None:
            log.info(f"{doing} kafka from python, not with spark's connector", why=str(exc))
        return None


def _connector_missing(exc: Exception) -> bool:
    text = str(exc)
    return "DATA_SOURCE_NOT_FOUND" in text or "Failed to find data source: kafka" in text


def _spark_kafka(
    spark: Any,
    topic: str,
    options: Mapping[str, str],
    ranges: list[OffsetRange],
    split_records: int | None,
) -> Any:
    starts = {topic: {str(r.partition): r.start for r in ranges}}
    ends = {topic: {str(r.partition): r.end for r in ranges}}
    reader = (
        spark.read.format("kafka")
        .options(**options)
        .option("kafka.isolation.level", "read_committed")
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps(starts))
        .option("endingOffsets", json.dumps(ends))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
        # Spark's consumer asks the broker for the partition's first and last offsets after
        # every poll and seeks again (which drops what it prefetched): three round trips per
        # poll, so a poll must bring many records (default 500 records / 1 MB per partition).
        .option("kafka.max.poll.records", str(POLL_RECORDS))
        .option("kafka.max.partition.fetch.bytes", str(POLL_BYTES))
        .option("kafka.fetch.max.bytes", str(POLL_BYTES))
    )
    if split_records:  # without minPartitions, Spark maps each topic partition to one task
        total = sum(r.count for r in ranges)
        pieces = max(len(ranges), -(-total // split_records))
        reader = reader.option("minPartitions", str(pieces))
    return reader.load().select(*COLUMNS)
