"""The backfill job: rebuild a service's state from its events topic with its own `apply`.

    read_events (bounded) -> fold_events -> state as Parquet and/or a snapshot (+ its cut)

Written for a real cluster: events never reach the driver; the driver resolves offsets, collects
one small row per store partition (file metadata) and per events partition (the cut), and
writes the manifest. Every generated service calls `main` from `jobs/backfill.py`, so the same
file runs with `enhydra backfill`, `python jobs/backfill.py` and `spark-submit`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from enhydra.aggregate import Aggregate
from enhydra.logs import configure_logging, get_logger
from enhydra.snapshots.format import (
    Cut,
    Manifest,
    PartitionFile,
    SnapshotError,
    SnapshotWriter,
    topology_fingerprint,
    write_partition_file,
)
from enhydra.spark.fold import fold_events, load_aggregate
from enhydra.spark.source import (
    METHODS,
    OffsetRange,
    SourceError,
    read_events,
    resolve_ranges,
)

log = get_logger("enhydra.backfill")

SNAPSHOT_SOURCE = "spark-backfill"
_FILE_DDL = "partition int, file string, rows long, sha256 string, bytes long"


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
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """What the job needs to know about the service it rebuilds."""

    spec: str
    aggregate: Aggregate
    app_id: str | None
    dedup_window: int
    bootstrap: str | None


def resolve_target(spec: str) -> Target:
    """Import `module:attr` (a Service or an Aggregate) and read the service's defaults."""
    from enhydra.service import Service
    from enhydra.spark.fold import FoldError

    try:
        aggregate = load_aggregate(spec)
    except FoldError as exc:
        raise BackfillError(str(exc)) from exc
    module_name, _, attr = spec.partition(":")
    obj = getattr(importlib.import_module(module_name), attr)
    if isinstance(obj, Service):
        s = obj.settings
        return Target(spec, aggregate, s.app_id, s.dedup_window, s.bootstrap_servers)
    return Target(spec, aggregate, None, 100, None)


class _Progress:
    """Logs the running Spark stages every few seconds (tasks done / total)."""

    def __init__(self, spark: Any, every_s: float = 5.0) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.every_s = every_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="enhydra-progress", daemon=True)

    def __enter__(self) -> _Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=2)

    def _run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                stages = [self.tracker.getStageInfo(s) for s in self.tracker.getActiveStageIds()]
            except Exception:  # the context is stopping
                return
            for stage in filter(None, stages):
                log.info(
                    "backfill progress",
                    stage=stage.name.split(" at ")[0],
                    tasks_done=stage.numCompletedTasks,
                    tasks_running=stage.numActiveTasks,
                    tasks=stage.numTasks,
                )


class _SnapshotPartitions:
    """mapInArrow: write the store partitions a task holds, rows sorted by (partition, key)."""

    def __init__(self, directory: str, store: str) -> None:
        self.directory = directory
        self.store = store

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        written: list[PartitionFile] = []
        source = _PeekBatches(iter(batches))
        while (partition := source.next_partition()) is not None:
            rows = source.rows_of(partition)
            written.append(write_partition_file(self.directory, self.store, partition, rows))
        yield pa.RecordBatch.from_pylist(
            [w.__dict__ for w in written],
            schema=pa.schema(
                [
                    ("partition", pa.int32()),
                    ("file", pa.string()),
                    ("rows", pa.int64()),
                    ("sha256", pa.string()),
                    ("bytes", pa.int64()),
                ]
            ),
        )


class _PeekBatches:
    """Splits a stream of batches sorted by partition into one stream per partition."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self.batches = batches
        self.head: pa.RecordBatch | None = None

    def _fill(self) -> bool:
        while self.head is None or self.head.num_rows == 0:
            self.head = next(self.batches, None)
            if self.head is None:
                return False
        return True

    def next_partition(self) -> int | None:
        return self.head.column("partition")[0].as_py() if self._fill() else None

    def rows_of(self, partition: int) -> Iterator[pa.RecordBatch]:
        while self._fill():
            assert self.head is not None
            parts = self.head.column("partition").to_pylist()
            stop = next((i for i, p in enumerate(parts) if p != partition), len(parts))
            if stop == 0:
                return
            yield self.head.slice(0, stop).select(
                ["key", "value", "key_text", "state", "last_offset"]
            )
            self.head = self.head.slice(stop)


def run_backfill(
    spark: Any,
    target: str,
    *,
    bootstrap: str | None = None,
    app_id: str | None = None,
    until_offsets: Mapping[int, int] | None = None,
    until_time: datetime | None = None,
    output: str | None = None,
    snapshot: str | Path | None = None,
    method: str = "auto",
    dedup_window: int | None = None,
    tasks: int | None = None,
    emit_events: str | None = None,
) -> BackfillResult:
    """Rebuild TARGET's state from its events topic; write Parquet and/or a snapshot.

    `emit_events` names a topic that receives the corrected history: every event the fold
    applied, once, in per-key order, with the command headers.
    """
    if output is None and snapshot is None and emit_events is None:
        raise BackfillError("nothing to write: give --output, --snapshot and/or --emit-events")
    info = resolve_target(target)
    app_id = app_id or info.app_id
    bootstrap = bootstrap or info.bootstrap
    if not app_id:
        raise BackfillError(f"{target} is an Aggregate: give the app id (--app-id)")
    if not bootstrap:
        raise BackfillError("give the Kafka bootstrap servers (--bootstrap)")
    window = info.dedup_window if dedup_window is None else dedup_window
    bound = info.aggregate.bind(app_id)
    started = time.monotonic()
    ranges = resolve_ranges(
        bootstrap, bound.events_topic, until_offsets=until_offsets, until_time=until_time
    )
    writer = None
    if snapshot is not None:  # refuses an existing snapshot before Spark does any work
        writer = SnapshotWriter(
            Path(snapshot),
            app_id=app_id,
            store=bound.name,
            fingerprint=topology_fingerprint(
                app_id=app_id,
                store=bound.name,
                partitions=len(ranges),
                commands_topic=bound.commands_topic,
                changelog_topic=bound.changelog_topic,
            ),
            source=SNAPSHOT_SOURCE,
        )
    total = sum(r.count for r in ranges)
    result = BackfillResult(app_id, bound.events_topic, ranges, events=total)
    log.info(
        "backfill started",
        app_id=app_id,
        events_topic=bound.events_topic,
        events=total,
        ranges={r.partition: [r.start, r.end] for r in ranges},
    )
    events = read_events(spark, bound.events_topic, bootstrap, method=method, ranges=ranges)
    folded = fold_events(events, target, dedup_window=window, tasks=tasks)
    from pyspark import StorageLevel

    folded = folded.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with _Progress(spark):
            stage = time.monotonic()
            result.keys = folded.count()
            result.timings["fold_s"] = time.monotonic() - stage
            log.info("events folded", keys=result.keys, events=total, **_rate(total, stage))
            if output is not None:
                stage = time.monotonic()
                folded.select(
                    "key_text", "partition", "state", "last_offset", "events", "key", "value"
                ).write.mode("overwrite").parquet(str(output))
                result.output = str(output)
                result.timings["output_s"] = time.monotonic() - stage
                log.info("state written as parquet", path=str(output), keys=result.keys)
            result.cut = _cut(folded, bound.commands_topic, ranges)
            if writer is not None:
                stage = time.monotonic()
                result.snapshot = _write_snapshot(folded, writer, len(ranges), result.cut)
                result.timings["snapshot_s"] = time.monotonic() - stage
                log.info(
                    "snapshot written",
                    path=str(snapshot),
                    rows=result.snapshot.rows,
                    cut=result.cut.offsets,
                )
            if emit_events is not None:
                stage = time.monotonic()
                result.emitted = _emit(
                    spark,
                    target,
                    bootstrap,
                    ranges,
                    emit_events,
                    method,
                    window,
                    tasks,
                    bound.events_topic,
                )
                result.timings["emit_s"] = time.monotonic() - stage
                log.info("corrected events written", topic=emit_events, events=result.emitted)
    finally:
        folded.unpersist()
    result.seconds = time.monotonic() - started
    log.info("backfill done", seconds=round(result.seconds, 1), keys=result.keys, events=total)
    return result


def _emit(
    spark: Any,
    target: str,
    bootstrap: str,
    ranges: list[OffsetRange],
    topic: str,
    method: str,
    window: int,
    tasks: int | None,
    events_topic: str,
) -> int:
    from enhydra.spark.fold import corrected_events
    from enhydra.spark.sink import ensure_topic, write_events

    if topic == events_topic:
        raise BackfillError(f"--emit-events {topic}: write the corrected events to another topic")
    ensure_topic(bootstrap, topic, len(ranges))
    events = read_events(spark, events_topic, bootstrap, method=method, ranges=ranges)
    corrected = corrected_events(events, target, dedup_window=window, tasks=tasks)
    return write_events(spark, corrected, topic, bootstrap, method=method)


def _rate(count: int, since: float) -> dict[str, Any]:
    seconds = max(time.monotonic() - since, 1e-9)
    return {"seconds": round(seconds, 2), "events_per_s": int(count / seconds)}


def _cut(folded: Any, commands_topic: str, ranges: list[OffsetRange]) -> Cut:
    """Per commands partition: after the last command applied (0 where no event was read)."""
    from pyspark.sql import functions as F

    rows = folded.groupBy("partition").agg(F.max("last_offset").alias("last")).collect()
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
        .mapInArrow(_SnapshotPartitions(directory, writer.store), _FILE_DDL)
        .collect()
    )
    for row in files:
        writer.add_partition(PartitionFile(**row.asDict()))
    return writer.finish(cut, partitions=partitions)


# --------------------------------------------------------------------------- command line


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


def build_parser(target: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="enhydra backfill" if target is None else "backfill.py",
        description="Rebuild state from the events topic with the service's own apply.",
    )
    if target is None:
        parser.add_argument("target", help="MODULE:ATTR of the Service (or Aggregate)")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the service's)")
    parser.add_argument("--app-id", help="application id (default: the service's)")
    until = parser.add_mutually_exclusive_group()
    until.add_argument("--until-time", help="stop before the first event at or after this time")
    until.add_argument("--until-offsets", help="exclusive end offsets, e.g. 0=1200,1=980")
    parser.add_argument("--output", help="write the state as Parquet here (analytics)")
    parser.add_argument("--snapshot", help="write a snapshot (manifest + Parquet) here")
    parser.add_argument("--emit-events", metavar="TOPIC", help="write the corrected events here")
    parser.add_argument("--method", choices=METHODS, default="auto", help="Kafka reader/writer")
    parser.add_argument("--master", help="Spark master when not under spark-submit (local[*])")
    parser.add_argument("--tasks", type=int, help="fold tasks (default: shuffle partitions)")
    return parser


def _session(master: str | None, pythonpath: Sequence[str]) -> Any:
    if "PYSPARK_GATEWAY_PORT" in os.environ and master is None:  # under spark-submit
        from pyspark.sql import SparkSession

        return SparkSession.builder.appName("enhydra-backfill").getOrCreate()
    from enhydra.spark.session import local_session

    return local_session("enhydra-backfill", master=master or "local[*]", pythonpath=pythonpath)


def main(
    target: str | None = None,
    argv: Sequence[str] | None = None,
    *,
    pythonpath: Sequence[str] = (),
) -> BackfillResult:
    """Command line of `jobs/backfill.py` (target fixed) and `enhydra backfill` (target given)."""
    args = build_parser(target).parse_args(argv)
    spec = target or args.target
    configure_logging(fmt=os.environ.get("ENHYDRA_LOG_FORMAT") or "auto")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    paths = [*pythonpath, os.getcwd()]
    for path in reversed(paths):  # the driver imports the target like the workers do
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        until_offsets = parse_until_offsets(args.until_offsets) if args.until_offsets else None
        until_time = parse_until_time(args.until_time) if args.until_time else None
        spark = _session(args.master, paths)
        result = run_backfill(
            spark,
            spec,
            bootstrap=args.bootstrap,
            app_id=args.app_id,
            until_offsets=until_offsets,
            until_time=until_time,
            output=args.output,
            snapshot=args.snapshot,
            method=args.method,
            tasks=args.tasks,
            emit_events=args.emit_events,
        )
    except (BackfillError, SourceError, SnapshotError) as exc:
        sys.exit(f"backfill: {exc}")
    print(summary(result))
    return result


def summary(result: BackfillResult) -> str:
    """What a person wants to read at the end of a run."""
    lines = [
        f"backfill: {result.keys} keys from {result.events} events of {result.events_topic} "
        f"in {result.seconds:.1f}s"
    ]
    if result.output:
        lines.append(f"  state (parquet): {result.output}")
    if result.snapshot is not None and result.cut is not None:
        lines.append(f"  snapshot: {result.snapshot.rows} rows, cut {result.cut.to_json()}")
    if result.emitted is not None:
        lines.append(f"  corrected events written: {result.emitted}")
    return "\n".join(lines)
