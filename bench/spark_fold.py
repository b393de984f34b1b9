"""Events folded per second: the Spark fold vs one Python process replaying the same events.

    .venv/bin/python bench/spark_fold.py         # 2M ledger events, 100k accounts, 3 rounds
    .venv/bin/python bench/spark_fold.py --events 500000 --rounds 3 --profile

The events are generated into a Parquet dataset with the schema `read_events` returns (key,
value, topic, partition, offset, timestamp, headers with the engine's command id, offset and
event version; deposits in the ledger's current shape, v2), one file per Kafka partition in
offset order, the way the job reads a topic: one Spark partition per Kafka partition. Both
sides run the ledger's own `apply` on orjson-decoded events and keep the same bookkeeping
(last command offset, command-id window); the fold also reads each event's version (the
ledger declares versions), the replay does not. Every time includes the read.

- python: one process reads the dataset, then one loop over the events in log order with a
  dict of states (one process sees every key, so it needs no sort).
- spark in place, hash, local[1] and local[2]: what the backfill runs
  (`fold_events(shuffle=False)`: each task folds its partitions' rows in log order into a
  dict of keys, no sort), forced to completion with the `noop` sink.
- spark in place, sort, local[1] and local[2]: the fold before the hash fold, still there as
  `--fold sort` (sort each partition by key, then the streaming fold, one key at a time).
- spark shuffled, local[2]: a repartition by key and a sort first (what the job does when a
  topic has fewer partitions than cores), to show what the shuffle costs.

Runs are interleaved (python, then each Spark run; then again) and every figure is the median
of the rounds. The target ratios are printed last, for the hash fold and for the sort fold:
spark local[2] / python (>= 1.5) and local[2] / local[1] (>= 1.8). --profile adds where the
time goes: CPU seconds of
the JVM and of the Python workers per run, Spark's stage timings, and the Python workers' hot
frames (py-spy). --pin runs local[N] on N CPUs (taskset-like), so local[1] is one core.
--source kafka reads a fresh broker instead of the Parquet files: Spark's Kafka connector
against one Python process reading with aiokafka.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "ledger"))

from bench.common import (  # noqa: E402
    fresh_broker,
    load_average,
    machine,
    median,
    progress,
    table,
)
from bench.throughput.profile import py_spy  # noqa: E402
from enhydra.spark.source import ARROW_SCHEMA  # noqa: E402
from ledger.domain import accounts, apply  # noqa: E402

PARTITIONS = 8
WINDOW = 100


def generate(directory: Path, events: int, n_accounts: int, seed: int) -> None:
    """Ledger events: each account opens first, then deposits and withdrawals (valid apply)."""
    rng = np.random.default_rng(seed)
    account = rng.integers(0, n_accounts, size=events)
    _, first = np.unique(account, return_index=True)
    kind = rng.integers(1, 1000, size=events)  # 1..499 deposit amount, 500..999 withdrawal
    kind[first] = 0  # opened
    partition = (account % PARTITIONS).astype(np.int32)
    offset = np.empty(events, dtype=np.int64)
    for p in range(PARTITIONS):  # log order inside each partition
        mask = partition == p
        offset[mask] = np.arange(int(mask.sum()))
    distinct = [orjson.dumps({"type": "opened"})]
    deposit = {"type": "deposited", "currency": "EUR"}  # deposited v2, the ledger's current
    distinct += [orjson.dumps({**deposit, "amount": a}) for a in range(1, 500)]
    distinct += [orjson.dumps({"type": "withdrawn", "amount": a - 499}) for a in range(500, 1000)]
    values = pa.array(distinct, pa.binary()).take(pa.array(kind))
    names = pa.array([f"acct-{i:07d}".encode() for i in range(n_accounts)], pa.binary())
    keys = names.take(pa.array(account))
    ids = pa.array([f"c{n}".encode() for n in range(events)], pa.binary())
    offsets_text = pa.array([str(o).encode() for o in offset.tolist()], pa.binary())
    versions = pa.array([b"1", b"2"], pa.binary()).take(
        pa.array(((kind >= 1) & (kind < 500)).astype(np.int64))
    )
    names_ = ["enhydra.command_id", "enhydra.command_offset", "enhydra.event_version"]
    header_keys = pa.array(names_ * events, pa.string())
    at = np.arange(events)
    header_values = pa.concat_arrays([ids, offsets_text, versions]).take(
        pa.array(np.stack([at, at + events, at + 2 * events], axis=1).ravel())
    )
    headers = pa.ListArray.from_arrays(
        pa.array(np.arange(0, 3 * events + 1, 3, dtype=np.int32)),
        pa.StructArray.from_arrays([header_keys, header_values], names=["key", "value"]),
    )
    table_ = pa.Table.from_arrays(
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
    for p in range(PARTITIONS):  # one file per Kafka partition, in offset order
        part = table_.filter(pc.equal(table_.column("partition"), p))
        part = part.sort_by([("offset", "ascending")])
        pq.write_table(part, directory / f"partition-{p:03d}.parquet", row_group_size=50_000)


# --------------------------------------------------------------------------- python


def python_replay(directory: Path) -> tuple[float, float, int]:
    """(read seconds, fold seconds, keys): one process, a dict of entries, log order."""
    started = time.perf_counter()
    table_ = pq.read_table(directory, columns=["key", "value", "partition", "offset", "headers"])
    table_ = table_.sort_by([("partition", "ascending"), ("offset", "ascending")])
    keys = table_.column("key").to_pylist()
    values = table_.column("value").to_pylist()
    headers = table_.column("headers").to_pylist()
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


def kafka_load(directory: Path, bootstrap: str, topic: str) -> int:
    """Produce the dataset's events to `topic` (keyed, with their headers), in log order."""
    from bench.common import create_topics, produce_fast
    from enhydra.kafka.topics import TopicSpec

    table_ = pq.read_table(directory).sort_by([("partition", "ascending"), ("offset", "ascending")])
    keys, values = table_.column("key").to_pylist(), table_.column("value").to_pylist()
    headers = table_.column("headers").to_pylist()
    records = (
        (k, v, [(h["key"], h["value"]) for h in hs])
        for k, v, hs in zip(keys, values, headers, strict=True)
    )

    async def load() -> int:
        await create_topics(bootstrap, [TopicSpec(topic, PARTITIONS, history=True)])
        return await produce_fast(bootstrap, topic, records, PARTITIONS)

    return asyncio.run(load())


def python_replay_kafka(bootstrap: str, topic: str) -> tuple[float, float, int]:
    """(0, seconds, keys): one process reads the topic with aiokafka and folds as it reads."""
    from enhydra.kafka.clients import open_consumer
    from enhydra.kafka.reading import read_to_end

    async def replay() -> int:
        states: dict[bytes, list] = {}
        loads = orjson.loads
        async with open_consumer(
            bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
        ) as consumer:
            async for _, records in read_to_end(consumer, topic):
                for r in records:
                    entry = states.get(r.key)
                    if entry is None:
                        entry = states[r.key] = [None, -1, []]
                    hdrs = dict(r.headers)
                    command_offset = int(hdrs["enhydra.command_offset"])
                    if command_offset <= entry[1]:
                        continue
                    entry[0] = apply(entry[0], loads(r.value))
                    entry[1] = command_offset
                    ids = entry[2]
                    ids.append(hdrs["enhydra.command_id"].decode())
                    if len(ids) > WINDOW:
                        del ids[0]
        for entry in states.values():
            orjson.dumps((entry[1], entry[2], entry[0]))
        return len(states)

    started = time.perf_counter()
    keys = asyncio.run(replay())
    return 0.0, time.perf_counter() - started, keys


# --------------------------------------------------------------------------- spark


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(own CPU seconds, reaped children's CPU seconds) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = []
        try:  # every thread's children: the JVM starts Python workers from its own threads
            for task in Path(f"/proc/{parent}/task").iterdir():
                children += (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def cpu_split() -> dict[str, float]:
    """CPU seconds so far of this process's JVM and of the Python workers under it."""
    out = {"jvm": 0.0, "python workers": 0.0}
    for pid in _descendants(os.getpid()):
        line = _cmdline(pid)
        try:
            own, children = _proc_cpu(pid)
        except OSError:
            continue
        if "java" in line.split(" ")[0]:
            out["jvm"] += own
        elif "pyspark" in line or "python" in line.split(" ")[0]:
            out["python workers"] += own + children
    return out


class WorkerProfile:
    """py-spy on Spark's Python daemon and the workers it forks, while one job runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: subprocess.Popen | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._attach, daemon=True)

    def __enter__(self) -> WorkerProfile:
        self.thread.start()
        return self

    def _attach(self) -> None:
        spy = py_spy()
        assert spy is not None, "checked at start"
        while not self.stop.wait(0.05):
            daemon = next(
                (p for p in _descendants(os.getpid()) if "pyspark.daemon" in _cmdline(p)), None
            )
            if daemon is not None:
                self.proc = subprocess.Popen(
                    [
                        spy,
                        "record",
                        "--pid",
                        str(daemon),
                        "--subprocesses",
                        "--nonblocking",
                        "-r",
                        "100",
                        "-f",
                        "raw",
                        "-o",
                        str(self.path),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                return

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        if self.proc is not None:
            self.proc.send_signal(2)
            self.proc.wait(timeout=60)


def hot_frames(path: Path, top: int = 12) -> list[tuple[str, float]]:
    """Share of samples per innermost frame, in the workers' fold (mapInArrow) stacks."""
    counts: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        if not any("worker.py" in f or "fold" in f for f in frames):
            continue  # the daemon waiting for work
        total += int(n)
        counts[frames[-1].split(" (")[0] + " (" + frames[-1].rsplit("/", 1)[-1]] += int(n)
    return [(frame, 100 * n / total) for frame, n in counts.most_common(top)] if total else []


def stage_timings(spark) -> list[list[object]]:
    """Spark's own numbers per stage of the last job: wall time, task time, records, shuffle."""
    store = spark.sparkContext._jsc.sc().statusStore()
    tracker = spark.sparkContext.statusTracker()
    ids = sorted(
        {s for job in tracker.getJobIdsForGroup() for s in tracker.getJobInfo(job).stageIds}
    )
    rows = []
    for stage_id in ids:
        try:
            s = store.lastStageAttempt(stage_id)
        except Exception:  # a stage that was skipped never ran
            continue
        first = s.firstTaskLaunchedTime()
        done = s.completionTime()
        wall = (done.get().getTime() - first.get().getTime()) / 1000 if done.isDefined() else 0
        rows.append(
            [
                s.stageId(),
                str(s.name()).split(" at ")[0],
                s.numTasks(),
                f"{wall:.1f}",
                f"{s.executorRunTime() / 1000:.1f}",
                f"{s.executorCpuTime() / 1e9:.1f}",
                f"{s.inputRecords():,}",
                f"{s.shuffleWriteBytes() / 1e6:.0f}",
            ]
        )
    return sorted(rows)


def spark_fold(
    source: Path | tuple[str, str],
    cores: int,
    *,
    shuffle: bool,
    fold: str | None = None,
    profile: Path | None = None,
    pin: bool = False,
) -> dict[str, object]:
    """Seconds for read + (shuffle +) (sort +) fold of every event on local[cores].

    `source` is the Parquet dataset, or (bootstrap, topic) to read with Spark's Kafka source.
    `pin` runs the JVM and its Python workers on `cores` CPUs only (local[1] otherwise also
    uses the second core for the JVM's Arrow writer, GC and JIT threads).
    """
    everywhere = os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, set(sorted(everywhere)[:cores]))  # the JVM inherits it
    try:
        return _spark_fold(source, cores, shuffle=shuffle, fold=fold, profile=profile)
    finally:
        os.sched_setaffinity(0, everywhere)


def _spark_fold(
    source: Path | tuple[str, str],
    cores: int,
    *,
    shuffle: bool,
    fold: str | None,
    profile: Path | None,
) -> dict[str, object]:
    from pyspark.sql import SparkSession

    from enhydra.spark.fold import fold_events
    from enhydra.spark.session import local_session
    from enhydra.spark.source import read_events

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    spark = local_session(
        "enhydra-bench",
        master=f"local[{cores}]",
        kafka=isinstance(source, tuple),
        pythonpath=[ROOT / "examples" / "ledger"],
        conf={
            "spark.driver.memory": "4g",
            "spark.sql.shuffle.partitions": str(PARTITIONS),
            # one task per file, as the Kafka source gives one task per topic partition
            "spark.sql.files.maxPartitionBytes": str(1 << 40),
            "spark.sql.files.openCostInBytes": str(1 << 40),
        },
        jvm_log=Path(tempfile.gettempdir()) / "enhydra-bench-spark.log",
    )
    try:
        if isinstance(source, tuple):  # what the backfill reads: one task per Kafka partition
            bootstrap, topic = source
            split = 100_000 if shuffle else None  # the job's split read when it shuffles
            events = read_events(spark, topic, bootstrap, method="kafka", split_records=split)
        else:
            events = spark.read.parquet(str(source))
        folded = fold_events(events, accounts, shuffle=shuffle, fold=fold)
        before = cpu_split()
        started = time.perf_counter()
        if profile is not None:
            with WorkerProfile(profile):
                folded.write.format("noop").mode("overwrite").save()
        else:
            folded.write.format("noop").mode("overwrite").save()
        seconds = time.perf_counter() - started
        after = cpu_split()
        return {
            "seconds": seconds,
            "cpu": {k: after[k] - before[k] for k in after},
            "stages": stage_timings(spark) if profile is not None else [],
            "tasks": events.rdd.getNumPartitions(),
        }
    finally:
        spark.stop()


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="CPU split, stages, py-spy")
    parser.add_argument("--dir", type=Path, help="keep the dataset here (default: a temp dir)")
    parser.add_argument(
        "--pin", action="store_true", help="pin each local[N] run (JVM + workers) to N CPUs"
    )
    parser.add_argument(
        "--source",
        choices=("parquet", "kafka"),
        default="parquet",
        help="read the events from the Parquet dataset, or from a fresh local Kafka broker "
        "(Spark's Kafka connector vs aiokafka in the Python process)",
    )
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: every ratio is a median of 3 or more runs")
    if args.profile and py_spy() is None:
        raise SystemExit("--profile needs py-spy: pip install -e '.[bench]' (or make bench)")
    os.environ.setdefault("ENHYDRA_LOG_FORMAT", "console")
    tmp = Path(tempfile.mkdtemp(prefix="enhydra-bench-"))
    directory = args.dir or tmp / "events"
    n = args.events
    broker = contextlib.ExitStack()  # the Kafka broker of --source kafka, stopped at the end
    try:
        started = time.perf_counter()
        if not directory.exists():
            generate(directory, n, args.accounts, args.seed)
        size_mb = sum(p.stat().st_size for p in directory.glob("*.parquet")) / 1e6
        print(f"machine: {machine()}; load average at start {load_average()}")
        print(
            f"dataset: {n:,} ledger events, {args.accounts:,} accounts, {PARTITIONS} partitions, "
            f"{size_mb:.0f} MB Parquet ({time.perf_counter() - started:.1f}s to generate)"
        )
        source: Path | tuple[str, str] = directory
        replay = lambda: python_replay(directory)  # noqa: E731
        if args.source == "kafka":
            bootstrap, _ = broker.enter_context(fresh_broker())
            loaded = kafka_load(directory, bootstrap, "ledger-events")
            print(f"source: a fresh Kafka broker, {loaded:,} events in {PARTITIONS} partitions")
            source = (bootstrap, "ledger-events")
            replay = lambda: python_replay_kafka(bootstrap, "ledger-events")  # noqa: E731
        else:
            print("source: the Parquet dataset (one file per Kafka partition)")
        runs = {  # name: (cores, shuffle, fold)
            "spark local[1], in place, hash": (1, False, "hash"),
            "spark local[2], in place, hash": (2, False, "hash"),
            "spark local[1], in place, sort": (1, False, "sort"),
            "spark local[2], in place, sort": (2, False, "sort"),
            "spark local[2], shuffled": (2, True, None),
        }
        seconds: dict[str, list[float]] = {"python, 1 process": []}
        seconds.update({name: [] for name in runs})
        python_fold: list[float] = []
        details: dict[str, dict] = {}
        for r in range(args.rounds):
            read_s, fold_s, keys = replay()
            seconds["python, 1 process"].append(read_s + fold_s)
            python_fold.append(fold_s)
            progress(f"round {r + 1}: python {read_s:.1f}s read + {fold_s:.1f}s fold (+ read)")
            for name, (cores, shuffle, fold) in runs.items():
                run = spark_fold(source, cores, shuffle=shuffle, fold=fold, pin=args.pin)
                seconds[name].append(run["seconds"])
                details[name] = run
                progress(f"round {r + 1}: {name} {run['seconds']:.1f}s ({run['tasks']} tasks)")
        if args.profile:  # one more run each, not timed: py-spy takes CPU from the 2 cores
            for name, (cores, shuffle, fold) in runs.items():
                profile = tmp / f"pyspy-{cores}-{shuffle}-{fold}.txt"
                details[name] = spark_fold(
                    source, cores, shuffle=shuffle, fold=fold, profile=profile
                )
                progress(f"profiled {name}")
        rate = {name: n / median(s) for name, s in seconds.items()}
        pinned = "; spark runs pinned to N CPUs" if args.pin else ""
        print(
            f"load average at end {load_average()}; medians of {args.rounds} interleaved "
            f"rounds{pinned}"
        )
        rows = [
            [name, f"{rate[name]:,.0f}", f"{median(s):.2f}", " ".join(f"{x:.1f}" for x in s)]
            for name, s in seconds.items()
        ]
        print(table(["run (read included)", "events/s", "median s", "runs s"], rows))
        if args.source == "parquet":
            fold_rate = n / median(python_fold)
            print(f"python fold alone (no read): {fold_rate:,.0f} events/s; keys: {keys:,}")
        base = rate["python, 1 process"]
        shuffled = rate["spark local[2], shuffled"]
        for fold in ("hash", "sort"):
            two = rate[f"spark local[2], in place, {fold}"]
            one = rate[f"spark local[1], in place, {fold}"]
            print(
                f"ratio spark local[2] in place, {fold} / python 1 process: {two / base:.2f}x "
                "(target >= 1.5)"
            )
            print(f"ratio spark local[2] / local[1] ({fold}): {two / one:.2f}x (target >= 1.8)")
            print(f"ratio in place, {fold} / shuffled (local[2]): {two / shuffled:.2f}x")
        hash_, sort = (rate[f"spark local[2], in place, {f}"] for f in ("hash", "sort"))
        print(f"ratio hash / sort (local[2], in place): {hash_ / sort:.2f}x")
        if args.profile:
            print("\nwhere the time goes (profiled runs): CPU seconds per side of each Spark run")
            print(
                table(
                    ["run", "wall s", "jvm cpu s", "python workers cpu s"],
                    [
                        [
                            name,
                            f"{d['seconds']:.1f}",
                            f"{d['cpu']['jvm']:.1f}",
                            f"{d['cpu']['python workers']:.1f}",
                        ]
                        for name, d in details.items()
                    ],
                )
            )
            for name, (cores, shuffle, fold) in runs.items():
                print(f"\n{name}: Spark stages")
                print(
                    table(
                        [
                            "stage",
                            "name",
                            "tasks",
                            "wall s",
                            "task s",
                            "jvm cpu s",
                            "records",
                            "shuffle MB",
                        ],
                        details[name]["stages"],
                    )
                )
                frames = hot_frames(tmp / f"pyspy-{cores}-{shuffle}-{fold}.txt")
                if frames:
                    print(f"{name}: Python workers, share of samples in the fold (py-spy)")
                    print(table(["frame", "%"], [[f, f"{p:.1f}"] for f, p in frames]))
    finally:
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
