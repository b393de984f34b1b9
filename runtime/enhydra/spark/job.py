"""The backfill job: rebuild a service's state from its events topic with its own `apply`.

    read_events (bounded) -> fold_events -> state as Parquet and/or a snapshot (+ its cut)

Written for a real cluster: events never reach the driver; the driver resolves offsets, ships
the job's code (ship.py), collects one small row per store partition (file metadata) and per
events partition (the cut), and writes the manifest. The events topic is keyed by the
aggregate key, so each Kafka partition holds every event of its keys: read one Spark partition
per Kafka partition and the fold runs in place, with no shuffle (`plan_layout`), and, as each
task then gets its partitions' events in offset order, with no sort either (the hash fold).

The command line is `enhydra backfill` (enhydra/cli/backfill.py); every generated service's
`jobs/backfill.py` runs the same command with its target fixed, under python or spark-submit.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enhydra.aggregate import Aggregate
from enhydra.contracts.fingerprint import store_fingerprint
from enhydra.kafka.clients import as_connection
from enhydra.logs import get_logger
from enhydra.settings import Connection
from enhydra.snapshots.format import (
    Cut,
    Manifest,
    PartitionFile,
    SnapshotWriter,
)
from enhydra.spark.fold import FOLDS, FoldError, fold_events, load_aggregate
from enhydra.spark.partition_files import FILE_DDL, SnapshotPartitions
from enhydra.spark.session import is_local
from enhydra.spark.ship import ship
from enhydra.spark.source import (
    METHODS,
    OffsetRange,
    SourceError,
    jvm_options,
    read_events,
    resolve_ranges,
)

log = get_logger("enhydra.backfill")

SNAPSHOT_SOURCE = "spark-backfill"


class BackfillError(RuntimeError):
    """The backfill cannot run as asked; the message says why."""


@dataclass
class BackfillResult:
    app_id: str
    events_topic: str
    ranges: list[OffsetRange]
    keys: int = 0
    events: int = 0
    seconds: float = 0.0
    cut: Cut | None = None
    output: str | None = None
    snapshot: Manifest | None = None
    emitted: int | None = None
    sql: dict[str, Any] | None = None  # a SQL projection's backfill: name, positions, refused
    layout: Layout | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """What the job needs to know about the service it rebuilds."""

    spec: str
    aggregate: Aggregate
    app_id: str | None
    dedup_window: int
    connection: Connection | None  # a Service's (its settings: code defaults, then ENHYDRA_*)


def resolve_target(spec: str) -> Target:
    """Import `module:attr` (a Service or an Aggregate) and read the service's defaults."""
    try:
        aggregate = load_aggregate(spec)
    except FoldError as exc:
        raise BackfillError(str(exc)) from exc
    from enhydra.plugins import PluginError
    from enhydra.service import Service
    from enhydra.settings import SettingsError

    module_name, _, attr = spec.partition(":")
    obj = getattr(importlib.import_module(module_name), attr)
    if isinstance(obj, Service):
        try:
            s = obj.settings
            # the aggregate the service runs: extended by the installed plugins' handlers
            aggregate = obj.resolved().aggregate
        except (SettingsError, PluginError) as exc:
            raise BackfillError(f"{spec}: {exc}") from exc
        return Target(spec, aggregate, s.app_id, s.dedup_window, s.connection)
    return Target(spec, aggregate, None, 100, None)


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """How events reach the fold: in place (one task per Kafka partition) or shuffled by key,
    and how a task folds them: "hash" (log order, a dict of keys) or "sort" (grouped by key)."""

    in_place: bool
    split_records: int | None  # read pieces of about this many records (None: whole partitions)
    tasks: int | None  # fold tasks after a shuffle (None: spark.sql.shuffle.partitions)
    reason: str
    fold: str = "sort"


def plan_layout(
    ranges: list[OffsetRange],
    cores: int,
    *,
    shuffle: bool | None = None,
    tasks: int | None = None,
    fold: str | None = None,
) -> Layout:
    """Fold in place unless asked not to, or unless there are fewer partitions than cores.

    In place, Spark reads each Kafka partition into one task, which gets its records in offset
    order and folds them as they come (`fold` "hash", the default) or sorts them by key first
    ("sort": one key in memory at a time, for tasks whose keys do not fit in memory): no event
    crosses the network or touches shuffle files. With fewer non-empty partitions than cores
    that leaves cores idle, so the read is split and the events are shuffled by key and sorted
    instead, unless `fold` is "hash", which folds in place (a shuffle mixes the offset order).
    """
    if fold is not None and fold not in FOLDS:
        raise BackfillError(f"--fold {fold!r}: expected one of {', '.join(FOLDS)}")
    total = sum(r.count for r in ranges)
    filled = sum(1 for r in ranges if r.count > 0)
    in_place = fold or "hash"
    if tasks is not None or shuffle is True:
        if fold == "hash":
            raise BackfillError(
                "--fold hash folds Kafka partitions in place: drop --shuffle/--tasks"
            )
        why = f"--tasks {tasks}" if tasks is not None else "--shuffle"
    elif shuffle is False or fold == "hash":
        return Layout(
            True, None, None, "--no-shuffle" if shuffle is False else "--fold hash", in_place
        )
    elif filled >= cores or total == 0:
        why = f"{filled} partitions with events >= {cores} cores"
        return Layout(True, None, None, why, in_place)
    else:
        why = f"{filled} partitions with events < {cores} cores"
    pieces = max(2 * cores, filled, 1)
    return Layout(False, max(10_000, -(-total // pieces)), tasks, why, "sort")


def local_cores(master: str) -> int | None:
    """Task slots of a local master (`local`, `local[4]`, `local[*]`, `local[4,2]`), else None."""
    master = master.strip()
    if not is_local(master):
        return None
    if "[" not in master:
        return 1
    first = master[master.find("[") + 1 : master.find("]")].split(",")[0].strip()
    if first == "*":
        return os.cpu_count() or 1
    return max(1, int(first))


def spark_cores(spark: Any) -> int:
    """Task slots the job can count on: local[N], else the cluster's configured cores."""
    sc = spark.sparkContext
    local = local_cores(sc.master)
    if local is not None:
        return local
    conf = sc.getConf()
    if conf.get("spark.cores.max"):
        return int(conf.get("spark.cores.max"))
    if conf.get("spark.executor.instances") and conf.get("spark.executor.cores"):
        return int(conf.get("spark.executor.instances")) * int(conf.get("spark.executor.cores"))
    return max(1, sc.defaultParallelism)


# --------------------------------------------------------------------------- progress


class _Progress:
    """Every few seconds, one line on stderr: the step, its tasks done, the events folded.

    Tasks come from Spark's status tracker; events folded from an accumulator each fold task
    adds to when it ends (the Kafka source reports no live record counts).
    """

    def __init__(self, spark: Any, total: int, folded: Any, every_s: float = 5.0) -> None:
        self.spark = spark
        self.total = total
        self.folded = folded
        self.every_s = every_s
        self.step = "starting"
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="enhydra-progress", daemon=True)

    def __enter__(self) -> _Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=2)

    def begin(self, step: str) -> None:
        """Name what runs next, in the progress lines and in Spark's UI."""
        self.step = step
        self.spark.sparkContext.setJobDescription(f"enhydra backfill: {step}")
        log.info("backfill step", step=step)

    def _run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self.done.wait(self.every_s):
            try:
                stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                folded = int(self.folded.value)
            except Exception:  # the context is stopping
                return
            stages = [s for s in stages if s is not None]
            if not stages:
                continue
            log.info(
                "backfill progress",
                step=self.step,
                tasks=f"{sum(s.numCompletedTasks for s in stages)}/"
                f"{sum(s.numTasks for s in stages)}",
                events_folded=f"{folded:,}/{self.total:,}",
            )


# --------------------------------------------------------------------------- the job


@dataclass
class BackfillPlan:
    """Everything decided before Spark starts: what to read, where to write, how."""

    info: Target
    app_id: str
    connection: Connection
    bound: Any  # BoundAggregate
    window: int
    ranges: list[OffsetRange]
    writer: SnapshotWriter | None
    output: str | None
    snapshot: str | None
    emit_events: str | None
    method: str
    tasks: int | None
    shuffle: bool | None
    fold: str | None = None
    sql: SqlTarget | None = None
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class SqlTarget:
    """A SQL projection of the service whose tables the backfill fills (enhydra.spark.sql_sink)."""

    projection: Any  # SqlProjection
    settings: Any  # the service's Settings (Kafka for the rebuild's catch-up)
    database: Any  # DatabaseSettings


def sql_target(target: str, name: str, connection: Connection) -> SqlTarget:
    """The service's SQL projection NAME and the database (ENHYDRA_DATABASE_URL), or one line."""
    import dataclasses

    from enhydra.service import Service

    module_name, _, attr = target.partition(":")
    service = getattr(importlib.import_module(module_name), attr)
    if not isinstance(service, Service):
        raise BackfillError(f"--sql-projection needs a Service target; {target} is not one")
    try:
        from enhydra.sql.config import DatabaseConfigError, DatabaseSettings
        from enhydra.sql.model import SqlProjection
    except ImportError as exc:
        raise BackfillError(
            f"{exc}: install the postgres extra: pip install 'enhydra[postgres]'"
        ) from None
    found = {p.name: p for p in service.projections if isinstance(p, SqlProjection)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise BackfillError(
            f"{target} has no SQL projection {name!r} (its SQL projections: {known})"
        )
    try:
        database = DatabaseSettings.from_env()
    except DatabaseConfigError as exc:
        raise BackfillError(str(exc)) from None
    settings = service.settings
    if settings.bootstrap_servers != connection.bootstrap_servers:  # --bootstrap given
        settings = dataclasses.replace(settings, bootstrap_servers=connection.bootstrap_servers)
    return SqlTarget(found[name], settings, database)


def plan_backfill(
    target: str,
    *,
    connection: Connection | str | None = None,
    app_id: str | None = None,
    until_offsets: Mapping[int, int] | None = None,
    until_time: datetime | None = None,
    output: str | None = None,
    snapshot: str | Path | None = None,
    method: str = "auto",
    dedup_window: int | None = None,
    tasks: int | None = None,
    shuffle: bool | None = None,
    emit_events: str | None = None,
    fold: str | None = None,
    sql_projection: str | None = None,
) -> BackfillPlan:
    """Check the request and fix the offsets to read, without Spark: a mistake (target, app,
    Kafka address or credentials, bounds, an existing snapshot) ends here, before a JVM starts.

    `connection` (a Connection with TLS/SASL, or a PLAINTEXT bootstrap string) defaults to the
    service's; Kafka that cannot be used raises enhydra.kafka's KafkaAccessError.
    """
    if output is None and snapshot is None and emit_events is None and sql_projection is None:
        raise BackfillError(
            "nothing to write: give --output, --snapshot, --emit-events and/or --sql-projection"
        )
    if method not in METHODS:
        raise BackfillError(f"--method {method!r}: expected one of {', '.join(METHODS)}")
    if fold is not None and fold not in FOLDS:
        raise BackfillError(f"--fold {fold!r}: expected one of {', '.join(FOLDS)}")
    if fold == "hash" and (shuffle or tasks is not None):
        raise BackfillError("--fold hash folds Kafka partitions in place: drop --shuffle/--tasks")
    info = resolve_target(target)
    app_id = app_id or info.app_id
    if not app_id:
        raise BackfillError(f"{target} is an Aggregate: give the application id (--app)")
    if connection is None and info.connection is None:
        raise BackfillError("give the Kafka bootstrap servers (--bootstrap)")
    conn = info.connection if connection is None else as_connection(connection)
    try:  # OAUTHBEARER with --method kafka, or a TLS file Spark's connector cannot use
        jvm_options(conn, method, None)
    except SourceError as exc:
        raise BackfillError(str(exc)) from None
    window = info.dedup_window if dedup_window is None else dedup_window
    bound = info.aggregate.bind(app_id)
    if emit_events is not None and emit_events == bound.events_topic:
        raise BackfillError(
            f"--emit-events {emit_events}: write the corrected events to another topic"
        )
    sql = sql_target(target, sql_projection, conn) if sql_projection is not None else None
    started = time.monotonic()
    ranges = resolve_ranges(
        conn, bound.events_topic, until_offsets=until_offsets, until_time=until_time
    )
    writer = None
    if snapshot is not None:  # refuses an existing snapshot before Spark does any work
        writer = SnapshotWriter(
            Path(snapshot),
            app_id=app_id,
            store=bound.name,
            fingerprint=store_fingerprint(
                app_id=app_id,
                store=bound.name,
                partitions=len(ranges),
                commands_topic=bound.commands_topic,
                changelog_topic=bound.changelog_topic,
            ),
            source=SNAPSHOT_SOURCE,
        )
    return BackfillPlan(
        info=info,
        app_id=app_id,
        connection=conn,
        bound=bound,
        window=window,
        ranges=ranges,
        writer=writer,
        output=output,
        snapshot=str(snapshot) if snapshot is not None else None,
        emit_events=emit_events,
        method=method,
        tasks=tasks,
        shuffle=shuffle,
        fold=fold,
        sql=sql,
        started=started,
    )


def run_backfill(spark: Any, target: str, **options: Any) -> BackfillResult:
    """Rebuild TARGET's state from its events topic; write Parquet and/or a snapshot.

    Options are `plan_backfill`'s. `emit_events` names a topic that receives the corrected
    history: every event the fold applied, once, in per-key order, with the command headers.
    `shuffle`/`tasks`/`fold` override the layout `plan_layout` picks.
    """
    return execute_backfill(spark, plan_backfill(target, **options))


def execute_backfill(spark: Any, plan: BackfillPlan) -> BackfillResult:
    """Run a plan on a SparkSession: the state's outputs, then a SQL projection's tables."""
    if plan.output is None and plan.snapshot is None and plan.emit_events is None:
        result = BackfillResult(plan.app_id, plan.bound.events_topic, plan.ranges)
    else:
        result = _fold_state(spark, plan)
    if plan.sql is not None:
        _fill_sql(spark, plan, result)
    result.seconds = time.monotonic() - plan.started
    return result


def _fill_sql(spark: Any, plan: BackfillPlan, result: BackfillResult) -> None:
    """The projection's tables: the rebuild's new tables, filled by Spark (sql_sink), swapped."""
    import asyncio
    from functools import partial

    import psycopg

    from enhydra.spark.sql_sink import fill_tables
    from enhydra.sql.fold import SqlStep
    from enhydra.sql.rebuild import Rebuild, RebuildError

    sql = plan.sql
    assert sql is not None
    topic = plan.bound.events_topic
    if result.layout is None:  # the state's fold did not ship the code already
        _ship(spark, plan)
    job = Rebuild(sql.settings, sql.database, sql.projection, topic, aggregate=plan.bound.aggregate)
    step = SqlStep(sql.projection, aggregate=plan.bound.aggregate)
    stage = time.monotonic()

    def read(ranges: list[OffsetRange]) -> Any:
        return read_events(spark, topic, plan.connection, method=plan.method, ranges=ranges)

    async def run() -> dict[int, int]:
        search_path = (job.schema, await _live_schema(sql.database))
        filler = partial(fill_tables, spark, read, step, sql.database, search_path, job.key, topic)
        return await job.run(filler=filler)

    spark.sparkContext.setJobDescription(f"enhydra backfill: sql projection {sql.projection.name}")
    try:
        positions = asyncio.run(run())
    except RebuildError as exc:
        raise BackfillError(str(exc)) from None
    except psycopg.Error as exc:  # rows and positions stay: run it again to resume
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise BackfillError(
            f"the SQL backfill stopped: {type(exc).__name__}: {first}; run it again to resume"
        ) from None
    result.timings["sql_s"] = time.monotonic() - stage
    result.sql = {
        "projection": sql.projection.name,
        "version": sql.projection.version,
        "folded": job.folded,
        "refused": job.refused,
        "positions": positions,
    }
    log.info("sql projection backfilled and swapped in", **result.sql, **_rate(job.folded, stage))


def _ship(spark: Any, plan: BackfillPlan) -> None:
    """The job's code to the executors, once: the service's packages, and the SQL projection's
    (its `project` may live in another package than the aggregate)."""
    local = is_local(spark.sparkContext.master)
    also = (plan.sql.projection.project,) if plan.sql is not None else ()
    ship(spark, plan.info.aggregate, python_reader=not local and plan.method != "kafka", also=also)


async def _live_schema(database: Any) -> str:
    from psycopg import AsyncConnection

    async with await AsyncConnection.connect(database.conninfo()) as conn:
        cur = await conn.execute("SELECT current_schema()")
        return (await cur.fetchone())[0]  # type: ignore[index]


def _fold_state(spark: Any, plan: BackfillPlan) -> BackfillResult:
    """The service's state folded with `apply`: Parquet, a snapshot, corrected events."""
    ranges, bound, writer, output = plan.ranges, plan.bound, plan.writer, plan.output
    total = sum(r.count for r in ranges)
    layout = plan_layout(
        ranges, spark_cores(spark), shuffle=plan.shuffle, tasks=plan.tasks, fold=plan.fold
    )
    result = BackfillResult(plan.app_id, bound.events_topic, ranges, events=total, layout=layout)
    _ship(spark, plan)
    log.info(
        "backfill started",
        app_id=plan.app_id,
        events_topic=bound.events_topic,
        events=total,
        kafka=plan.connection.describe(),
        ranges={r.partition: [r.start, r.end] for r in ranges},
        fold="in place" if layout.in_place else "shuffled by key",
        why=layout.reason,
        fold_by=layout.fold,
    )
    counter = spark.sparkContext.accumulator(0)
    folded = fold_events(
        _read(spark, plan, layout),
        plan.info.aggregate,
        dedup_window=plan.window,
        tasks=layout.tasks,
        shuffle=not layout.in_place,
        counter=counter,
        fold=layout.fold,
    )
    from pyspark import StorageLevel

    folded = folded.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with _Progress(spark, total, counter) as progress:
            progress.begin("fold")
            stage = time.monotonic()
            result.keys = folded.count()
            result.timings["fold_s"] = time.monotonic() - stage
            log.info("events folded", keys=result.keys, events=total, **_rate(total, stage))
            progress.begin("cut")
            result.cut = _cut(folded, bound.commands_topic, ranges, layout)
            if output is not None:
                progress.begin("write parquet")
                stage = time.monotonic()
                folded.select(
                    "key_text", "partition", "state", "last_offset", "events", "key", "value"
                ).write.mode("overwrite").parquet(str(output))
                result.output = str(output)
                result.timings["output_s"] = time.monotonic() - stage
                log.info("state written as parquet", path=str(output), keys=result.keys)
            if writer is not None:
                progress.begin("write snapshot")
                stage = time.monotonic()
                result.snapshot = _write_snapshot(folded, writer, len(ranges), result.cut)
                result.timings["snapshot_s"] = time.monotonic() - stage
                log.info(
                    "snapshot written",
                    path=plan.snapshot,
                    rows=result.snapshot.rows,
                    cut=result.cut.offsets,
                )
            if plan.emit_events is not None:
                progress.begin("emit corrected events")
                stage = time.monotonic()
                result.emitted = _emit(spark, plan, layout)
                result.timings["emit_s"] = time.monotonic() - stage
                log.info("corrected events", topic=plan.emit_events, events=result.emitted)
    finally:
        folded.unpersist()
    seconds = round(time.monotonic() - plan.started, 1)
    log.info("backfill done", seconds=seconds, keys=result.keys, events=total)
    return result


def _read(spark: Any, plan: BackfillPlan, layout: Layout) -> Any:
    return read_events(
        spark,
        plan.bound.events_topic,
        plan.connection,
        method=plan.method,
        ranges=plan.ranges,
        split_records=layout.split_records,
    )


def _emit(spark: Any, plan: BackfillPlan, layout: Layout) -> int:
    from enhydra.spark.fold import corrected_events
    from enhydra.spark.sink import ensure_topic, write_events

    assert plan.emit_events is not None
    ensure_topic(plan.connection, plan.emit_events, len(plan.ranges))
    corrected = corrected_events(
        _read(spark, plan, layout),
        plan.info.aggregate,
        dedup_window=plan.window,
        tasks=layout.tasks,
        shuffle=not layout.in_place,
        fold=layout.fold,
    )
    return write_events(spark, corrected, plan.emit_events, plan.connection, method=plan.method)


def _rate(count: int, since: float) -> dict[str, Any]:
    seconds = max(time.monotonic() - since, 1e-9)
    return {"seconds": round(seconds, 2), "events_per_s": int(count / seconds)}


def _cut(folded: Any, commands_topic: str, ranges: list[OffsetRange], layout: Layout) -> Cut:
    """Per commands partition: after the last command applied (0 where no event was read).

    Folded in place, each events partition must have been folded by one task: two tasks
    would each hold part of a key's events and give it two rows.
    """
    from pyspark.sql import functions as F

    rows = (
        folded.groupBy("partition")
        .agg(F.max("last_offset").alias("last"), F.countDistinct("task").alias("tasks"))
        .collect()
    )
    split = {r["partition"]: r["tasks"] for r in rows if r["tasks"] > 1}
    if layout.in_place and split:
        raise BackfillError(
            f"events partitions {sorted(split)} were each read by several Spark tasks, so the "
            "fold in place could give a key two rows; nothing was written. Rerun with --shuffle"
        )
    offsets = {r.partition: 0 for r in ranges}
    for row in rows:
        offsets[row["partition"]] = max(row["last"] + 1, 0)
    return Cut(commands_topic, offsets)


def _write_snapshot(folded: Any, writer: SnapshotWriter, partitions: int, cut: Cut) -> Manifest:
    """Executors write the partition files; the driver checks them and writes the manifest."""
    directory = str(writer.directory.resolve())
    files = (
        folded.select("partition", "key", "value", "key_text", "state", "last_offset")
        .repartition(partitions, "partition")
        .sortWithinPartitions("partition", "key")
        .mapInArrow(SnapshotPartitions(directory, writer.store), FILE_DDL)
        .collect()
    )
    for row in files:
        writer.add_partition(PartitionFile(**row.asDict()))
    return writer.finish(cut, partitions=partitions)


# --------------------------------------------------------------------------- parsing


def parse_until_offsets(text: str) -> dict[int, int]:
    """`0=120,1=98` or `{"0": 120, "1": 98}`: exclusive end offsets of the events topic."""
    text = text.strip()
    try:
        if text.startswith("{"):
            raw = json.loads(text)
            return {int(p): int(o) for p, o in raw.items()}
        pairs = (item.split("=", 1) for item in text.split(",") if item.strip())
        return {int(p): int(o) for p, o in pairs}
    except (ValueError, TypeError, AttributeError):
        raise BackfillError(
            f"--until-offsets {text!r}: expected PARTITION=OFFSET[,...] or a JSON object"
        ) from None


def parse_until_time(text: str) -> datetime:
    """ISO 8601 (`2025-01-31T12:00:00Z`; no zone means UTC) or epoch milliseconds."""
    try:
        if text.isdigit():
            return datetime.fromtimestamp(int(text) / 1000, UTC)
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BackfillError(
            f"--until-time {text!r}: expected ISO 8601 (2025-01-31T12:00:00Z) or epoch ms"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def summary(result: BackfillResult) -> str:
    """What a person wants to read at the end of a run."""
    lines = [
        f"backfill: {result.keys} keys from {result.events} events of {result.events_topic} "
        f"in {result.seconds:.1f}s"
        if result.sql is None or result.layout is not None
        else f"backfill of {result.events_topic} in {result.seconds:.1f}s"
    ]
    if result.output:
        lines.append(f"  state (parquet): {result.output}")
    if result.snapshot is not None and result.cut is not None:
        lines.append(f"  snapshot: {result.snapshot.rows} rows, cut {result.cut.to_json()}")
    if result.emitted is not None:
        lines.append(f"  corrected events written: {result.emitted}")
    if result.sql is not None:
        q = result.sql
        lines.append(
            f"  sql projection {q['projection']} (version {q['version']}): {q['folded']} events "
            f"folded into new tables and swapped in ({q['refused']} refused), "
            f"positions {q['positions']}"
        )
    return "\n".join(lines)
