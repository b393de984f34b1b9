"""Snapshot export and clone load, in keys/s, against a raw RocksDB iteration of the same store.

    python bench/snapshot_export.py [--keys 1000000] [--repeat 3] [--no-kafka]

One run measures, on the same store partition:
  ceiling  iterate every key and value of the RocksDB partition (rocksdict, nothing else);
  export   write it as a snapshot partition file (Parquet, decoded columns, sha256);
  load     load that file into a fresh RocksDB partition (what a local restore does);
  clone    produce it to a fresh compacted changelog on a real local broker (what
           `enhydra snapshot clone` does), unless --no-kafka.
and prints each rate and its ratio to the ceiling (medians of --repeat runs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from enhydra.contracts.codec import Entry, encode_entry
from enhydra.snapshots.format import Cut, SnapshotWriter, load_into_stores, open_snapshot
from enhydra.stores.partition import PartitionStore


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-kafka", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="enhydra-bench-snap-"))
    say(f"building a store partition with {args.keys:,} keys in {work} ...")
    store = build_store(work / "store", args.keys)
    results: dict[str, list[float]] = {"ceiling": [], "export": [], "load": [], "clone": []}
    broker = None
    bootstrap = None
    if not args.no_kafka:
        from enhydra.broker.local import LocalBroker

        broker = LocalBroker(work / "kafka", port=0)
        bootstrap = broker.start().bootstrap
    try:
        for run in range(args.repeat):
            say(f"run {run + 1}/{args.repeat}")
            results["ceiling"].append(timed(lambda: sum(1 for _ in store.items())))
            snap_dir = work / f"snap-{run}"
            writer = SnapshotWriter(
                snap_dir, app_id="bench", store="accounts", fingerprint="bench", source="bench"
            )
            results["export"].append(timed(lambda w=writer: w.write_partition(0, store.items())))
            writer.finish(Cut("bench-commands", {0: args.keys}))
            snapshot = open_snapshot(snap_dir)
            target = work / f"load-{run}"
            results["load"].append(timed(lambda s=snapshot, t=target: load_into_stores(s, t)))
            if bootstrap is not None:
                from enhydra.snapshots.offline import clone

                to_app = f"bench-clone-{run}"
                results["clone"].append(
                    timed(
                        lambda s=snapshot, a=to_app: asyncio.run(
                            clone(s, conn=bootstrap, to_app=a, commands_topic=f"{a}-commands")
                        )
                    )
                )
    finally:
        store.close()
        if broker is not None:
            broker.stop()
    ceiling = args.keys / statistics.median(results["ceiling"])
    print(f"{'measure':<10}{'keys/s':>14}{'vs ceiling':>12}")
    for name, seconds in results.items():
        if not seconds:
            continue
        rate = args.keys / statistics.median(seconds)
        print(f"{name:<10}{rate:>14,.0f}{rate / ceiling:>12.3f}")
    print(f"({args.keys:,} keys, medians of {args.repeat} runs; ceiling = raw RocksDB iteration)")


if __name__ == "__main__":
    main()
