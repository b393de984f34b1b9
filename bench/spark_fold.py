"""Events folded per second: the Spark fold vs a single-process Python replay, same events, one run.

    .venv/bin/python bench/spark_fold.py                       # 5M ledger events, 200k accounts
    .venv/bin/python bench/spark_fold.py --events 1000000 --cores 1,2

The events are generated straight into a Parquet dataset with the schema `read_events` returns
(key, value, topic, partition, offset, timestamp, headers with the engine's command id and
offset), so the benchmark measures the fold, not Kafka. Both sides run the ledger's own `apply`
on orjson-decoded events and keep the same bookkeeping (last command offset, command-id window).

- Python: read the dataset once, then one loop over the events in log order with a dict of
  states (no shuffle needed: one process sees every key).
- Spark: `fold_events` (repartition by key, sortWithinPartitions, mapInArrow) forced to run
  completely with the `noop` sink, once per `--cores` value (local[N]), so the output shows how
  the rate grows with executor cores on this machine.

Each is run --repeat times (at least 3), interleaved, and the medians are compared.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "ledger")]

from bench.common import machine, progress  # noqa: E402
from enhydra.spark.source import ARROW_SCHEMA  # noqa: E402
from ledger.domain import apply  # noqa: E402

TARGET = "ledger.domain:accounts"
PARTITIONS = 8
WINDOW = 100


def generate(directory: Path, events: int, accounts: int, seed: int, files: int) -> None:
    """Ledger events: each account opens first, then deposits and withdrawals (valid apply)."""
    rng = np.random.default_rng(seed)
    account = rng.integers(0, accounts, size=events)
    _, first = np.unique(account, return_index=True)
    kind = rng.integers(1, 1000, size=events)  # 1..499 deposit amount, 500..999 withdrawal
    kind[first] = 0  # opened
    partition = (account % PARTITIONS).astype(np.int32)
    offset = np.empty(events, dtype=np.int64)
    for p in range(PARTITIONS):  # log order inside each partition
        mask = partition == p
        offset[mask] = np.arange(int(mask.sum()))
    distinct = [orjson.dumps({"type": "opened"})]
    distinct += [orjson.dumps({"type": "deposited", "amount": a}) for a in range(1, 500)]
    distinct += [orjson.dumps({"type": "withdrawn", "amount": a - 499}) for a in range(500, 1000)]
    values = pa.array(distinct, pa.binary()).take(pa.array(kind))
    names = pa.array([f"acct-{i:07d}".encode() for i in range(accounts)], pa.binary())
    keys = names.take(pa.array(account))
    ids = pa.array([f"c{n}".encode() for n in range(events)], pa.binary())
    offsets_text = pa.array([str(o).encode() for o in offset.tolist()], pa.binary())
    header_keys = pa.array(["enhydra.command_id", "enhydra.command_offset"] * events, pa.string())
    header_values = pa.concat_arrays([ids, offsets_text]).take(
        pa.array(np.stack([np.arange(events), np.arange(events) + events], axis=1).ravel())
    )
    headers = pa.ListArray.from_arrays(
        pa.array(np.arange(0, 2 * events + 1, 2, dtype=np.int32)),
        pa.StructArray.from_arrays([header_keys, header_values], names=["key", "value"]),
    )
    table = pa.Table.from_arrays(
        [
            keys,
            values,
            pa.array(["ledger-events"] * events, pa.string()),
            pa.array(partition),
            pa.array(offset),
            pa.array(np.full(events, 1_700_000_000_000_000, dtype=np.int64)).cast(
                pa.timestamp("us", tz="UTC")
            ),
            headers,
        ],
        schema=ARROW_SCHEMA,
    )
    directory.mkdir(parents=True, exist_ok=True)
    step = -(-events // files)
    for n, start in enumerate(range(0, events, step)):
        pq.write_table(table.slice(start, step), directory / f"part-{n:03d}.parquet")


def python_replay(directory: Path) -> tuple[float, float, int]:
    """(read seconds, fold seconds, keys): one process, a dict of entries, log order."""
    started = time.perf_counter()
    table = pq.read_table(directory, columns=["key", "value", "partition", "offset", "headers"])
    table = table.sort_by([("partition", "ascending"), ("offset", "ascending")])
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    headers = table.column("headers").to_pylist()
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    states: dict[bytes, list] = {}
    loads = orjson.loads
    for key, value, hdrs in zip(keys, values, headers, strict=True):
        entry = states.get(key)
        if entry is None:
            entry = states[key] = [None, -1, []]
        command_offset = int(hdrs[1]["value"])
        if command_offset <= entry[1]:
            continue
        entry[0] = apply(entry[0], loads(value))
        entry[1] = command_offset
        ids = entry[2]
        ids.append(hdrs[0]["value"].decode())
        if len(ids) > WINDOW:
            del ids[0]
    for entry in states.values():
        orjson.dumps((entry[1], entry[2], entry[0]))  # the envelope, as the fold builds it
    return read_s, time.perf_counter() - started, len(states)


def spark_fold(directory: Path, cores: int, tasks: int) -> float:
    """Seconds for read + shuffle + sort + fold of every event on local[cores]."""
    from pyspark.sql import SparkSession

    from enhydra.spark.fold import fold_events
    from enhydra.spark.session import local_session

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    spark = local_session(
        "enhydra-bench",
        master=f"local[{cores}]",
        kafka=False,
        pythonpath=[ROOT / "examples" / "ledger"],
        conf={"spark.driver.memory": "6g", "spark.sql.shuffle.partitions": str(tasks)},
    )
    try:
        events = spark.read.parquet(str(directory))
        started = time.perf_counter()
        fold_events(events, TARGET, tasks=tasks).write.format("noop").mode("overwrite").save()
        return time.perf_counter() - started
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--accounts", type=int, default=200_000)
    parser.add_argument("--cores", default="1,2", help="local[N] runs, e.g. 1,2")
    parser.add_argument("--tasks", type=int, default=8, help="fold tasks (shuffle partitions)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (at least 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", type=Path, help="keep the dataset here (default: a temp dir)")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3: every ratio is a median of 3 or more runs")
    os.environ.setdefault("ENHYDRA_LOG_FORMAT", "console")
    directory = args.dir or Path(tempfile.mkdtemp(prefix="enhydra-bench-")) / "events"
    cores = [int(c) for c in args.cores.split(",")]
    try:
        started = time.perf_counter()
        if not directory.exists():
            generate(directory, args.events, args.accounts, args.seed, files=16)
        size_mb = sum(p.stat().st_size for p in directory.glob("*.parquet")) / 1e6
        print(f"machine: {machine()}")
        print(
            f"dataset: {args.events:,} ledger events, {args.accounts:,} accounts, "
            f"{size_mb:.0f} MB Parquet ({time.perf_counter() - started:.1f}s to generate)"
        )
        # Interleaved (python, local[1], local[2], then rotated) so load drift hits all.
        read_s: list[float] = []
        fold_s: list[float] = []
        spark_s: dict[int, list[float]] = {c: [] for c in cores}
        keys = 0
        for run in range(args.repeat):
            order: list[int | None] = [None, *cores]
            order = order[run % len(order) :] + order[: run % len(order)]
            for item in order:
                if item is None:
                    read, fold, keys = python_replay(directory)
                    read_s.append(read)
                    fold_s.append(fold)
                    progress(f"run {run + 1} python: {fold:.1f}s fold + {read:.1f}s read")
                else:
                    spark_s[item].append(spark_fold(directory, item, args.tasks))
                    progress(f"run {run + 1} local[{item}]: {spark_s[item][-1]:.1f}s")
        median = statistics.median
        python_rate = args.events / median(fold_s)
        with_read = args.events / median(r + f for r, f in zip(read_s, fold_s, strict=True))
        print(
            f"python replay (1 process, median of {args.repeat}): {python_rate:,.0f} events/s "
            f"fold ({median(fold_s):.1f}s, +{median(read_s):.1f}s reading into lists), "
            f"{keys:,} keys; {with_read:,.0f} events/s including the read"
        )
        rates = {}
        for c in cores:
            seconds = median(spark_s[c])
            rates[c] = args.events / seconds
            print(
                f"spark fold local[{c}] (median of {args.repeat}): {rates[c]:,.0f} events/s "
                f"({seconds:.1f}s: read + shuffle + sort + mapInArrow fold, {args.tasks} tasks)"
            )
        best = max(rates, key=lambda c: rates[c])
        print(
            f"ratio spark local[{best}] / python replay: {rates[best] / python_rate:.2f}x "
            f"(vs python including its read: {rates[best] / with_read:.2f}x)"
        )
        if len(rates) > 1:
            low, high = min(rates), max(rates)
            per_core = rates[low] / low
            print(
                f"scaling: local[{low}] -> local[{high}] gave {rates[high] / rates[low]:.2f}x "
                f"on {os.cpu_count()} cores; at ~{per_core:,.0f} events/s per core, executors "
                f"add throughput until the shuffle (network, disk) is the limit, so N cores "
                f"should fold about N x {per_core:,.0f} events/s"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(directory.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
