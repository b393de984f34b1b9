"""Changelog restore rate: Enhydra's ChangelogReader vs a raw consume of the same changelog.

    .venv/bin/python bench/state_restore.py                    # 1M keys, 3 repeats
    .venv/bin/python bench/state_restore.py --keys 200000 --repeat 3 --profile

Restore speed is what decides how long a task is unavailable after losing its instance without
a standby, so it is measured against the floor that matters: reading the same bytes from the
same broker with a raw aiokafka consumer that discards them. A third row, raw consume plus a
plain rocksdict WriteBatch per fetch, shows how much of the gap is RocksDB and how much is the
reader's own bookkeeping.

The changelog is produced directly (no service run): N keys `acct-NNNNNN` on a compacted
`<app>-accounts-changelog` topic with 4 partitions, each value an `encode_entry` of an opened
ledger account (~60 bytes), partitioned by key like the engine does. All three readers use the
consumer settings of the ChangelogReader (read_committed, 8 MiB per partition per fetch), read
every partition from the beginning to the end offsets taken at start, and run one after the
other in the same process against the same broker; runs are interleaved and medians reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from common import (
    create_topics,
    fresh_broker,
    load_average,
    machine,
    median,
    peak_rss_mb,
    produce_fast,
    progress,
    reset_peak_rss,
    rss_mb,
    table,
)
from rocksdict import Options, Rdict, WriteBatch

from enhydra.contracts.codec import Entry, encode_entry
from enhydra.kafka.topics import TopicSpec
from enhydra.logs import configure_logging
from enhydra.runner.changelog_reader import ChangelogReader
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore

APP = "bench"
PARTITIONS = 4
TOPIC = f"{APP}-accounts-changelog"
CONSUMER_OPTIONS = {  # the ChangelogReader's own settings, so only the work differs
    "enable_auto_commit": False,
    "isolation_level": "read_committed",
    "max_partition_fetch_bytes": 8 * 1024 * 1024,
    "fetch_max_bytes": 64 * 1024 * 1024,
    "fetch_max_wait_ms": 50,
}


@dataclass
class Copy:
    """What the reader needs of a task: its partition, its store and a restore-progress slot."""

    partition: int
    store: PartitionStore
    restore: dict[str, float] = field(default_factory=dict)


@dataclass
class Run:
    name: str
    records: int
    seconds: float
    rss_mb: float | None  # peak during the run
    rss_base_mb: float | None  # at the start of the run

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def changelog_records(keys: int):
    """Entries of freshly opened accounts, as the ledger writes them after an `open`."""
    state = {"balance": 0, "status": "open", "version": 1}
    for i in range(keys):
        value = encode_entry(Entry(state, offset=i // PARTITIONS, command_ids=[f"c7-{i + 1}"]))
        yield f"acct-{i:06d}".encode(), value, []


async def build_changelog(bootstrap: str, keys: int) -> dict[int, int]:
    await create_topics(bootstrap, [TopicSpec(TOPIC, PARTITIONS, compacted=True)])
    started = time.monotonic()
    count = await produce_fast(bootstrap, TOPIC, changelog_records(keys), PARTITIONS)
    progress(f"produced {count:,} changelog records in {time.monotonic() - started:.1f}s")
    return await end_offsets(bootstrap)


async def end_offsets(bootstrap: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **CONSUMER_OPTIONS)
    await consumer.start()
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        return {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def wait_restored(done: asyncio.Event, reader: ChangelogReader) -> None:
    """Wait for every copy to be restored; a failed reader raises instead of hanging."""
    while not done.is_set():
        if reader.failure is not None:
            raise reader.failure
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 1.0)


async def enhydra_restore(bootstrap: str, workdir: Path) -> Run:
    """ChangelogReader restoring all partitions into fresh PartitionStores, as after a loss."""
    settings = Settings.from_env(
        {}, app_id=APP, bootstrap_servers=bootstrap, state_dir=workdir, instance_id="bench"
    )
    copies = {p: Copy(p, PartitionStore(workdir / "accounts" / str(p))) for p in range(PARTITIONS)}
    done = asyncio.Event()
    finished: list[Copy] = []

    def on_restored(copy: Copy) -> None:
        finished.append(copy)
        if len(finished) == len(copies):
            done.set()

    reader = ChangelogReader(settings, TOPIC, on_restored)
    await reader.start()  # connects and fetches end offsets: not part of the restore
    try:
        reset_peak_rss()
        base = rss_mb()
        started = time.monotonic()
        reader.set_copies(restoring=copies, following={})
        await wait_restored(done, reader)
        seconds = time.monotonic() - started
        rss = peak_rss_mb()
        records = sum(int(c.restore["restored"]) for c in copies.values())
    finally:
        await reader.stop()
        for copy in copies.values():
            copy.store.close()
    return Run("enhydra ChangelogReader -> RocksDB", records, seconds, rss, base)


async def raw_consume(bootstrap: str, workdir: Path, *, store: bool) -> Run:
    """The floor: getmany to the end offsets, then discard (or put in a plain WriteBatch)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **CONSUMER_OPTIONS)
    await consumer.start()
    dbs: dict[int, Rdict] = {}
    if store:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        dbs = {p: Rdict(str(workdir / f"raw-{p}"), options=options) for p in range(PARTITIONS)}
    try:
        reset_peak_rss()
        base = rss_mb()
        started = time.monotonic()
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        records = 0
        while remaining:
            batch = await consumer.getmany(timeout_ms=200, max_records=20_000)
            for tp, recs in batch.items():
                if not recs:
                    continue
                records += len(recs)
                if store:
                    wb = WriteBatch(raw_mode=True)
                    for r in recs:
                        wb.put(r.key, r.value)
                    dbs[tp.partition].write(wb)
                if recs[-1].offset + 1 >= ends[tp]:
                    remaining.discard(tp)
        seconds = time.monotonic() - started
        rss = peak_rss_mb()
    finally:
        await consumer.stop()
        for db in dbs.values():
            db.close()
    name = "raw aiokafka + rocksdict WriteBatch" if store else "raw aiokafka consume, discard"
    return Run(name, records, seconds, rss, base)


async def measure(bootstrap: str, root: Path, repeat: int, expected: int) -> list[list[Run]]:
    """Interleave the three readers `repeat` times; each run gets its own empty directory."""
    kinds = ("raw", "raw+rocksdb", "enhydra")
    runs: list[list[Run]] = [[] for _ in kinds]
    # One untimed read first: the broker's page cache and connections start warm for everyone.
    warm = await raw_consume(bootstrap, root, store=False)
    progress(f"warm-up read: {warm.records:,} in {warm.seconds:.2f}s")
    for i in range(repeat):
        for k, kind in enumerate(kinds):
            workdir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))
            if kind == "enhydra":
                run = await enhydra_restore(bootstrap, workdir)
            else:
                run = await raw_consume(bootstrap, workdir, store=kind == "raw+rocksdb")
            shutil.rmtree(workdir, ignore_errors=True)
            if run.records != expected:
                raise RuntimeError(f"{run.name} read {run.records:,} records, not {expected:,}")
            progress(
                f"run {i + 1}/{repeat} {run.name}: {run.records:,} in {run.seconds:.2f}s "
                f"= {run.rate:,.0f} rec/s"
            )
            runs[k].append(run)
    return runs


async def promotion_latency(bootstrap: str, workdir: Path, times: int) -> list[float]:
    """Seconds from `set_copies(restoring=...)` to `on_restored` for copies already current.

    This is what a caught-up standby pays when it becomes active: nothing to read, so any
    time here is fixed overhead of the reader, paid on every failover.
    """
    settings = Settings.from_env(
        {}, app_id=APP, bootstrap_servers=bootstrap, state_dir=workdir, instance_id="bench"
    )
    copies = {p: Copy(p, PartitionStore(workdir / "accounts" / str(p))) for p in range(PARTITIONS)}
    finished: set[int] = set()
    done = asyncio.Event()

    def on_restored(copy: Copy) -> None:
        finished.add(copy.partition)
        if len(finished) == len(copies):
            done.set()

    reader = ChangelogReader(settings, TOPIC, on_restored)
    await reader.start()
    latencies = []
    try:
        for i in range(times + 1):  # the first pass is the full restore
            finished.clear()
            done.clear()
            started = time.monotonic()
            reader.set_copies(restoring=copies, following={})
            await wait_restored(done, reader)
            if i:
                latencies.append(time.monotonic() - started)
            reader.set_copies(restoring={}, following=copies)  # back to standby, following
            await asyncio.sleep(1.0)
    finally:
        await reader.stop()
        for copy in copies.values():
            copy.store.close()
    return latencies


async def profile_restore(bootstrap: str, root: Path) -> None:
    """One more Enhydra restore under pyinstrument; the call tree goes to stderr."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        raise SystemExit(
            "--profile needs pyinstrument: pip install -e '.[bench]' (make bench does)"
        ) from None
    workdir = Path(tempfile.mkdtemp(prefix="profile-", dir=root))
    profiler = Profiler(interval=0.001, async_mode="disabled")
    profiler.start()
    await enhydra_restore(bootstrap, workdir)
    profiler.stop()
    print(profiler.output_text(unicode=False, color=False, show_all=False), file=sys.stderr)


async def main_async(args: argparse.Namespace) -> None:
    with fresh_broker(keep=args.keep) as (bootstrap, root):
        progress(f"building a changelog of {args.keys:,} keys on {PARTITIONS} partitions")
        ends = await build_changelog(bootstrap, args.keys)
        expected = sum(ends.values())
        load_before = load_average()
        runs = await measure(bootstrap, root, args.repeat, expected)
        progress("promoting already-current copies (what a caught-up standby pays)")
        promote = await promotion_latency(bootstrap, root / "promote", 5)
        load_after = load_average()
        if args.profile:
            await profile_restore(bootstrap, root)
    raw_rate = median([r.rate for r in runs[0]])
    rows = []
    for kind_runs in runs:
        rate = median([r.rate for r in kind_runs])
        rss = [(r.rss_mb, r.rss_base_mb) for r in kind_runs if r.rss_mb and r.rss_base_mb]
        peak = max(rss, default=None)
        rows.append(
            [
                kind_runs[0].name,
                f"{expected:,}",
                f"{median([r.seconds for r in kind_runs]):.2f}",
                f"{rate:,.0f}",
                f"{rate / raw_rate:.2f}",
                f"{peak[0]:.0f} (+{peak[0] - peak[1]:.0f})" if peak else "n/a",
            ]
        )
    print(f"changelog restore, {args.keys:,} keys, {PARTITIONS} partitions; {machine()}")
    print(f"median of {args.repeat} runs each; ratio = rate / raw consume rate")
    print(table(["reader", "records", "wall s", "records/s", "ratio", "peak RSS MiB (+run)"], rows))
    print(
        f"promoting {PARTITIONS} already-current copies to active (0 records to read): "
        f"median {median(promote):.3f} s, min {min(promote):.3f} s, max {max(promote):.3f} s "
        f"over {len(promote)}"
    )
    print(f"1-min load average: {load_before} before, {load_after} after the measurements")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="changelog keys (records)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader; medians shown")
    parser.add_argument("--profile", action="store_true", help="profile one extra restore")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (broker, stores)")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3: every ratio is a median of 3 or more runs")
    if args.profile:
        try:
            import pyinstrument  # noqa: F401
        except ImportError:
            parser.error("--profile needs pyinstrument: pip install -e '.[bench]'")
    configure_logging(fmt="console", level="warning")  # the reader's progress logs off
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
