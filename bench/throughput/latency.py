"""Enhydra's latency under load: command produced -> event produced, at a fixed input rate.

A throughput figure hides queueing; the issue asks for the p99 at half the maximum rate, where
a service should be far from saturated. Commands are produced at a steady rate (CreateTime set
by the producer when it takes each record), the service runs as a real process, and each event
is matched to its command through the `enhydra.command_offset` header (events go to the same
partition number as their command). Latency = event CreateTime - command CreateTime, so it
includes both producers' linger and the broker round trips, as a client would see it.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench.common import ROOT, create_topics, progress
from bench.throughput import harness
from bench.throughput.workload import PARTITIONS, command_records
from enhydra.contracts.headers import COMMAND_OFFSET_HEADER
from enhydra.contracts.partitioner import partition_for
from enhydra.kafka.topics import TopicSpec
from enhydra.testing.processes import ServiceProcess, read_topic


@dataclass
class Latency:
    target_rate: float
    achieved_rate: float
    commands: int
    events: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    warmup_s: float
    steady_p50_ms: float  # the same, for commands produced after the first warmup_s
    steady_p99_ms: float

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def produce_at_rate(
    bootstrap: str, topic: str, records: list, rate: float, tick_s: float = 0.005
) -> tuple[int, float]:
    """Send `records` at `rate`/s, paced on the wall clock; returns (count, seconds).

    Every `tick_s` the records now due go out as one batch per partition, each stamped with the
    time it was appended: the same grouping a 5 ms linger gives, at a fraction of the CPU of a
    `send` per record, because on 2 cores the generator competes with the system it measures.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=1024 * 1024
    )
    await producer.start()
    await producer.partitions_for(topic)  # the producer's own cold start is not the service's
    futures = []
    partitions = [partition_for(key, PARTITIONS) for key, _, _ in records]
    try:
        start = time.monotonic()
        sent = 0
        while sent < len(records):
            due = min(len(records), int((time.monotonic() - start) * rate) + 1)
            batches: dict[int, object] = {}
            while sent < due:
                key, value, _ = records[sent]
                p = partitions[sent]
                batch = batches.get(p)
                if batch is None:
                    batch = batches[p] = producer.create_batch()
                now_ms = int(time.time() * 1000)
                if batch.append(key=key, value=value, timestamp=now_ms, headers=[]) is None:
                    futures.append(await producer.send_batch(batch, topic, partition=p))
                    batch = batches[p] = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=now_ms, headers=[])
                sent += 1
            for p, batch in batches.items():
                futures.append(await producer.send_batch(batch, topic, partition=p))
            await asyncio.sleep(tick_s)
        seconds = time.monotonic() - start
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return sent, seconds


async def measure_latency(
    bootstrap: str,
    root: Path,
    *,
    rate: float,
    seconds: float,
    system: str = "enhydra",
    keys: int = 10_000,
    seed: int = 11,
    warmup_s: float = 5.0,
) -> Latency:
    """`system` is "enhydra" or "raw-rocksdb" (the hand-written loop, as a reference)."""
    app = f"lat-{system}"
    topic = f"{app}-input-commands"
    run_dir = root / app
    run_dir.mkdir(parents=True, exist_ok=True)
    specs = [TopicSpec(topic, PARTITIONS, 1)]
    if system != "enhydra":  # Enhydra creates its own topics
        specs += [TopicSpec(f"{app}-{t}", PARTITIONS, 1) for t in ("events", "rejections")]
        specs.append(TopicSpec(f"{app}-accounts-changelog", PARTITIONS, 1, compacted=True))
    await create_topics(bootstrap, specs)
    records = command_records(keys, max(int(rate * seconds), keys), seed=seed)
    worker = await _start(system, app, bootstrap, topic, run_dir)
    try:
        progress(f"latency ({system}): producing {len(records):,} commands at {rate:,.0f}/s")
        sent, took = await produce_at_rate(bootstrap, topic, records, rate)
        async with harness.Topics(bootstrap) as topics:
            deadline = time.monotonic() + 120
            outputs = [f"{app}-events", f"{app}-rejections"]
            while sum((await topics.ends(outputs)).values()) < sent:
                if time.monotonic() > deadline or worker.poll() is not None:
                    log = (run_dir / "log.txt").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"latency run did not finish:\n{log}")
                await asyncio.sleep(0.2)
    finally:
        await asyncio.to_thread(harness.stop_process, worker)
    commands = {(r.partition, r.offset): r.timestamp for r in await read_topic(bootstrap, topic)}
    pairs = []  # (command produced at, latency)
    for event in await read_topic(bootstrap, f"{app}-events", timeout=120):
        offset = dict(event.headers or ()).get(COMMAND_OFFSET_HEADER)
        produced = commands.get((event.partition, int(offset))) if offset else None
        if produced is not None:
            pairs.append((produced, float(event.timestamp - produced)))
    if not pairs:
        raise RuntimeError("no event could be matched to its command")
    latencies = [lat for _, lat in pairs]
    start = min(commands.values())
    steady = [lat for at, lat in pairs if at - start >= warmup_s * 1000] or latencies
    return Latency(
        target_rate=round(rate, 1),
        achieved_rate=round(sent / took, 1),
        commands=sent,
        events=len(latencies),
        p50_ms=percentile(latencies, 0.50),
        p90_ms=percentile(latencies, 0.90),
        p99_ms=percentile(latencies, 0.99),
        max_ms=max(latencies),
        warmup_s=warmup_s,
        steady_p50_ms=percentile(steady, 0.50),
        steady_p99_ms=percentile(steady, 0.99),
    )


async def _start(
    system: str, app: str, bootstrap: str, topic: str, run_dir: Path
) -> subprocess.Popen[bytes]:
    """Start the worker and wait until it consumes, so the clock starts with it running."""
    if system == "enhydra":
        env = harness.enhydra_env(app, bootstrap, topic, run_dir)
        service = ServiceProcess(harness.ENHYDRA_TARGET, env, run_dir / "log.txt", cwd=ROOT)
        service.start()
        assert service.process is not None
        try:
            await asyncio.to_thread(service.wait_ready, 120)
        except BaseException:
            harness.stop_process(service.process)
            raise
        return service.process
    ready = run_dir / "ready"
    launch = harness.raw(app, bootstrap, topic, run_dir, system.removeprefix("raw-"))
    argv = [*launch.argv, "--offset-header", "--ready-file", str(ready)]
    process = harness.start_process(argv, launch.env, run_dir / "log.txt")
    deadline = time.monotonic() + 120
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            harness.stop_process(process)
            raise RuntimeError(f"{system} did not start: see {run_dir / 'log.txt'}")
        await asyncio.sleep(0.2)
    return process
