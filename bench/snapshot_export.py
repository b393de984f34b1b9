"""Snapshot export, load and clone, each against its ceiling, measured side by side in one run.

    .venv/bin/python bench/snapshot_export.py [--keys 1000000] [--repeat 3] [--no-kafka]
                                              [--json out.json] [--profile]

One RocksDB store partition of --keys ledger entries (~100-byte envelopes, 3 command ids). A
reference snapshot of it is written first, and every measure runs once untimed (imports, page
cache, the broker's JIT); then every run measures, in an order rotated between runs so drift in
machine load does not favour one of them:

  raw iteration  iterate every key and value of the partition with rocksdict's own iterator
                 and the read options a snapshot uses (around the block cache, with
                 readahead), nothing else: the ceiling of export and load;
  export         SnapshotWriter.write_partition from the store (Parquet with every column,
                 zstd, sha256, fsync), what a live snapshot does per partition;
  load           load_into_stores of the reference snapshot into a fresh RocksDB partition,
                 what a local restore does;
  raw produce    the same records the clone sends, produced to a fresh compacted topic on the
                 same broker with a plain aiokafka producer (the clone's settings: acks=all,
                 idempotent, linger 20 ms, 512 KiB batches) filling record batches directly,
                 topic creation included: the ceiling of clone;
  clone          `enhydra snapshot clone` of the reference snapshot into a new app with its own
                 commands topic (so the entries' input offsets are reset), on the same broker.

Prints keys/s per measure (median of --repeat runs, at least 3), the ratios export / raw
iteration, load / raw iteration and clone / raw produce with their targets, the CPU model and
the load average. --profile samples one more run of each measure with py-spy (all threads,
only while active) and prints where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaProducer  # noqa: E402

from bench.common import create_topics, load_average, machine, progress, table  # noqa: E402
from enhydra.contracts.codec import Entry, encode_entry  # noqa: E402
from enhydra.devtools.broker import LocalBroker  # noqa: E402
from enhydra.kafka.topics import TopicSpec  # noqa: E402
from enhydra.logs import configure_logging  # noqa: E402
from enhydra.snapshots.format import (  # noqa: E402
    Cut,
    Snapshot,
    SnapshotWriter,
    load_into_stores,
    open_snapshot,
    reset_input_offsets,
)
from enhydra.snapshots.offline import clone  # noqa: E402
from enhydra.stores.partition import PartitionStore  # noqa: E402

# measure -> (its ceiling, the target for measure / ceiling)
RATIOS = {"export": ("raw iteration", 0.5), "load": ("raw iteration", 0.6)}
RATIOS_KAFKA = {"clone": ("raw produce", 0.5)}
# The clone's producer settings (runtime/enhydra/snapshots/offline.py), for the raw ceiling.
PRODUCER = {"acks": "all", "enable_idempotence": True, "linger_ms": 20, "max_batch_size": 512 << 10}


def build_store(path: Path, keys: int) -> PartitionStore:
    store = PartitionStore(path)
    batch = []
    for i in range(keys):
        entry = Entry(
            {"balance": i % 5000, "status": "open", "version": 1 + i % 40},
            i,
            [f"c{i}-{j}" for j in range(3)],
        )
        batch.append((f"acct-{i:08d}".encode(), encode_entry(entry)))
        if len(batch) == 50_000:
            store.write(batch)
            batch = []
    store.write(batch, changelog_offset=keys - 1)
    return store


def write_snapshot(directory: Path, store: PartitionStore, keys: int) -> None:
    writer = SnapshotWriter(
        directory, app_id="bench", store="accounts", fingerprint="bench", source="bench"
    )
    writer.write_partition(0, store.items())
    writer.finish(Cut("bench-commands", {0: keys}))


def clone_records(snapshot: Snapshot) -> list[tuple[bytes, bytes]]:
    """What the clone produces: every (key, value), input offsets reset like a sandbox clone."""
    records: list[tuple[bytes, bytes]] = []
    for batch in snapshot.iter_batches(0, ["key", "value"]):
        values = reset_input_offsets(batch.column(1))
        records.extend(zip(batch.column(0).to_pylist(), values.to_pylist(), strict=True))
    return records


async def raw_produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """A fresh compacted topic, then every record through plain aiokafka record batches."""
    await create_topics(bootstrap, [TopicSpec(topic, 1, compacted=True)])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **PRODUCER)
    await producer.start()
    try:
        acks = []
        batch = producer.create_batch()
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None, headers=[]) is None:
                acks.append(await producer.send_batch(batch, topic, partition=0))
                batch = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None, headers=[])
        acks.append(await producer.send_batch(batch, topic, partition=0))
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


class Bench:
    """The store, the reference snapshot and one callable per measure (a fresh target each)."""

    def __init__(self, work: Path, keys: int, bootstrap: str | None) -> None:
        self.work = work
        self.keys = keys
        self.bootstrap = bootstrap
        self.runs = 0
        self.outputs: list[Path] = []
        progress(f"building a store partition with {keys:,} keys")
        self.store = build_store(work / "store", keys)
        progress("writing the reference snapshot (untimed)")
        write_snapshot(work / "reference", self.store, keys)
        self.snapshot = open_snapshot(work / "reference")
        self.records = clone_records(self.snapshot) if bootstrap else []
        self.measures: dict[str, Callable[[], None]] = {
            "raw iteration": self.iterate,
            "export": self.export,
            "load": self.load,
        }
        if bootstrap:
            self.measures.update({"raw produce": self.produce, "clone": self.clone})

    def fresh(self, name: str) -> Path:
        """A new path for a measure's output; removed after it is timed."""
        self.runs += 1
        self.outputs.append(self.work / f"{name}-{self.runs}")
        return self.outputs[-1]

    def clean(self) -> None:
        while self.outputs:
            shutil.rmtree(self.outputs.pop(), ignore_errors=True)

    def iterate(self) -> None:
        count = sum(1 for _ in self.store.items(bulk=True))
        assert count == self.keys, count

    def export(self) -> None:
        target = self.fresh("export")
        SnapshotWriter(
            target, app_id="bench", store="accounts", fingerprint="bench", source="bench"
        ).write_partition(0, self.store.items(bulk=True))

    def load(self) -> None:
        target = self.fresh("load")
        loaded = load_into_stores(self.snapshot, target)
        assert loaded == {0: self.keys}, loaded

    def produce(self) -> None:
        assert self.bootstrap is not None
        asyncio.run(raw_produce(self.bootstrap, f"raw-{self.fresh('raw').name}", self.records))

    def clone(self) -> None:
        assert self.bootstrap is not None
        app = f"bench-clone-{self.fresh('clone').name}"
        result = asyncio.run(
            clone(self.snapshot, conn=self.bootstrap, to_app=app, commands_topic=f"{app}-in")
        )
        assert result.rows == self.keys, result

    def close(self) -> None:
        self.store.close()


def cpu_seconds() -> float:
    """CPU time of this process so far, all threads (not the broker's)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run_measure(bench: Bench, name: str, cpu: list[float] | None = None) -> float:
    """Seconds of one run of a measure (its CPU seconds appended to `cpu`); what it wrote is
    removed afterwards, untimed."""
    before = cpu_seconds()
    try:
        return timed(bench.measures[name])
    finally:
        if cpu is not None:
            cpu.append(cpu_seconds() - before)
        bench.clean()


def measure(bench: Bench, repeat: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall seconds, CPU seconds) per measure and run; the order rotates every run."""
    names = list(bench.measures)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for name in names:
        progress(f"warm-up {name}: {bench.keys / run_measure(bench, name):,.0f} keys/s")
    # The fixtures (store handle, records for raw produce) stay out of every garbage
    # collection from here on: PartitionStore.close collects, and a full collection over a
    # million fixture tuples would be charged to the load.
    gc.freeze()
    for run in range(repeat):
        order = names[run % len(names) :] + names[: run % len(names)]
        for name in order:
            took = run_measure(bench, name, cpu[name])
            seconds[name].append(took)
            progress(f"run {run + 1}/{repeat} {name}: {bench.keys / took:,.0f} keys/s")
    return seconds, cpu


def profile_measures(bench: Bench) -> dict[str, dict]:
    """One more run of each measure under py-spy (all threads, active samples only)."""
    from bench.throughput import profile

    if profile.py_spy() is None:
        raise SystemExit("--profile needs py-spy: pip install -e '.[bench]'")
    found = {}
    for name, fn in bench.measures.items():
        raw = bench.work / f"profile-{name.replace(' ', '-')}.txt"
        recorder = profile.start(os.getpid(), raw, rate=200)
        assert recorder is not None
        time.sleep(0.5)  # py-spy attached
        took = timed(fn)
        profile.stop(recorder)
        bench.clean()
        if not raw.exists():
            raise SystemExit("py-spy wrote no profile (is ptrace permitted?)")
        found[name] = {"seconds": took, **profile.summarize(raw, top=12)}
    return found


def report(
    args: argparse.Namespace, seconds: dict[str, list[float]], cpu: dict[str, list[float]], extra
) -> dict:
    rate = {name: args.keys / statistics.median(s) for name, s in seconds.items()}
    ratios = []
    for name, (ceiling, target) in {**RATIOS, **RATIOS_KAFKA}.items():
        if name in rate and ceiling in rate:
            value = rate[name] / rate[ceiling]
            ratios.append(
                {"measure": name, "ceiling": ceiling, "ratio": round(value, 3), "target": target}
            )
    return {
        "benchmark": "snapshot_export",
        "machine": machine(),
        "keys": args.keys,
        "repeat": args.repeat,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "keys_per_s": {name: round(r) for name, r in rate.items()},
        "ratios": ratios,
        **extra,
    }


def print_report(data: dict) -> None:
    rows = []
    by_measure = {r["measure"]: r for r in data["ratios"]}
    for name, rate in data["keys_per_s"].items():
        cpu = f"{statistics.median(data['cpu_seconds'][name]):.2f}"
        r = by_measure.get(name)
        if r is None:
            rows.append([name, f"{rate:,}", cpu, "ceiling", ""])
            continue
        status = "met" if r["ratio"] >= r["target"] else "MISSED"
        ratio = f"{r['ratio']:.3f} of {r['ceiling']}"
        rows.append([name, f"{rate:,}", cpu, ratio, f">= {r['target']} {status}"])
    print(
        f"snapshot export, load and clone: {data['keys']:,} keys in one store partition; "
        f"{data['machine']}"
    )
    print(
        f"medians of {data['repeat']} interleaved runs; 1-min load average "
        f"{data['load_before']} before, {data['load_after']} after"
    )
    print(table(["measure", "keys/s", "CPU s", "ratio", "target"], rows))
    print("(CPU s: this process, all threads; the broker's JVM is not counted)")
    for r in data["ratios"]:
        print(f"ratio {r['measure']} / {r['ceiling']}: {r['ratio']:.3f} (target >= {r['target']})")
    for name, prof in data.get("profile", {}).items():
        print(f"\nwhere the time goes: {name} ({prof['seconds']:.2f} s, py-spy, % of samples)")
        for area, pct in prof["areas"][:6]:
            print(f"  {pct:5.1f}%  {area}")
        for line, pct in prof["self_lines"][:8]:
            print(f"  {pct:5.1f}%  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measure (at least 3)")
    parser.add_argument("--no-kafka", action="store_true", help="skip raw produce and clone")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--profile", action="store_true", help="py-spy one more run of each")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3: every ratio is a median of 3 or more runs")
    configure_logging(fmt="console", level="warning")  # topic creation would drown the results
    work = Path(tempfile.mkdtemp(prefix="enhydra-bench-snap-"))
    broker = None
    try:
        bootstrap = None
        if not args.no_kafka:
            progress("starting a fresh broker")
            broker = LocalBroker(work / "kafka", port=0)
            bootstrap = broker.start().bootstrap
        bench = Bench(work, args.keys, bootstrap)
        try:
            load_before = load_average()
            seconds, cpu = measure(bench, args.repeat)
            load_after = load_average()
            extra = {"load_before": load_before, "load_after": load_after}
            if args.profile:
                extra["profile"] = profile_measures(bench)
        finally:
            bench.close()
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    data = report(args, seconds, cpu, extra)
    print_report(data)
    if args.json:
        args.json.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
