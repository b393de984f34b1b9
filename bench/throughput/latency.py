"""Enhydra's latency under load: command produced -> event produced, at a fixed input rate.

    .venv/bin/python -m bench.throughput.latency                 # 25 % and 50 % of max, 3 runs
    .venv/bin/python -m bench.throughput.latency --quick         # 1 run, 8 s per run
    .venv/bin/python -m bench.throughput.latency --baseline-python /tmp/base/.venv/bin/python

A throughput figure hides queueing; the issue asks for the p99 at half (and a quarter of) the
maximum rate, where a service should be far from saturated. One run, one fresh broker:

1. the layout: on 2+ cores the load generator (this process) gets the last CPU to itself and
   the broker and the system under test share the others (taskset), so the generator's own
   work neither steals from the service nor hides its gains in noise (`--pin none` turns it
   off);
2. the maximum rate, in that same layout: each Enhydra drains a preloaded topic (harness.py),
   median of `--repeat` runs;
3. latency runs at each load (a fraction of the candidate's maximum), the systems interleaved
   in an order rotated per repeat: commands are produced at a steady rate, CreateTime set by
   the generator when it takes each record, and each event is matched to its command through
   the `enhydra.command_offset` header (events go to the same partition number as their
   command). Latency = event time - command CreateTime. The events topic is created with
   LogAppendTime, so "event time" is when the broker stored the event: the moment a consumer
   can see it, after the service's publish round trip (`--event-time create` measures to
   the service's own stamp instead, as earlier rounds did).

Reported per system and load: medians over the runs of p50/p90/p99/max, the p99 range, and the
ratio of the p99 to its target (50 ms at 50 %, 20 ms at 25 %). `raw-rocksdb` is the hand-written
aiokafka + rocksdict + changelog loop (raw_aiokafka.py) at the same load: what this machine and
broker allow a plain Python loop. `--baseline-python` adds an earlier Enhydra (another
virtualenv) as `enhydra-baseline`, run at the same rates, for a before/after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench.common import create_topics, fresh_broker, load_average, machine, progress
from bench.throughput import harness, profile
from bench.throughput.workload import PARTITIONS, command_records
from enhydra.contracts.headers import COMMAND_OFFSET_HEADER
from enhydra.contracts.partitioner import partition_for
from enhydra.kafka.topics import TopicSpec
from enhydra.logs import configure_logging
from enhydra.testing.processes import ServiceProcess, read_topic

TARGETS_MS = {0.25: 20.0, 0.5: 50.0}  # the p99 targets by load
LABELS = {
    "enhydra": "Enhydra",
    "enhydra-baseline": "Enhydra, baseline",
    "raw-rocksdb": "raw aiokafka + rocksdict + changelog",
}


@dataclass
class Latency:
    system: str
    load: float  # fraction of the maximum rate
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
    complete: bool = True  # every command got its output before the wait ran out
    service_p99_ms: float | None = None  # the service's own histogram (/metrics), if it has one

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Layout:
    """Which CPUs the load generator, the broker and the service run on (empty: any).

    `split`: the generator alone on the last CPU, the broker and the service sharing the
    others. `service`: the service alone on the first CPU, the broker and the generator on the
    others (closest to production, where the broker runs elsewhere). `none`: no pinning.
    """

    name: str = "none"
    generator: set[int] = field(default_factory=set)
    broker: set[int] = field(default_factory=set)
    service: set[int] = field(default_factory=set)

    @classmethod
    def choose(cls, pin: str) -> Layout:
        cpus = sorted(os.sched_getaffinity(0))
        if pin == "none" or len(cpus) < 2:
            return cls()
        first, rest, last, others = {cpus[0]}, set(cpus[1:]), {cpus[-1]}, set(cpus[:-1])
        if pin == "service":
            return cls(pin, generator=rest, broker=rest, service=first)
        return cls(pin, generator=last, broker=others, service=others)

    @property
    def pinned(self) -> bool:
        return bool(self.generator)

    def describe(self) -> str:
        if not self.pinned:
            return "no pinning: generator, broker and service share every CPU"

        def cpus(which: set[int]) -> str:
            return "CPU " + ",".join(map(str, sorted(which)))

        return (
            f"{self.name}: load generator on {cpus(self.generator)}, broker on "
            f"{cpus(self.broker)}, service on {cpus(self.service)} (taskset)"
        )

    def wrap(self, argv: list[str]) -> list[str]:
        """A command that starts on the service's CPUs (threads inherit the affinity)."""
        if not self.pinned:
            return argv
        return ["taskset", "-c", ",".join(map(str, sorted(self.service))), *argv]

    def pin_self(self) -> None:
        if self.pinned:
            pin_threads(os.getpid(), self.generator)

    def unpin_self(self) -> None:
        """Back to every CPU: whatever this process starts next must not inherit the pin."""
        if self.pinned:
            pin_threads(os.getpid(), self.generator | self.broker | self.service)

    def pin_broker(self, root: Path) -> None:
        """The fresh broker (a JVM started for `root`) moves to its CPUs, every thread."""
        if not self.pinned:
            return
        for pid in _pids_with(str(root)):
            pin_threads(pid, self.broker)


def pin_threads(pid: int, cpus: set[int]) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def _pids_with(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if text in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry))
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def produce_at_rate(
    bootstrap: str, topic: str, records: list, rate: float, tick_s: float = 0.005
) -> tuple[int, float]:
    """Send `records` at `rate`/s, paced on the wall clock; returns (count, seconds).

    Every `tick_s` the records now due go out as one batch per partition, each stamped with the
    time it was appended: the same grouping a 5 ms linger gives, at a fraction of the CPU of a
    `send` per record.
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


def enhydra_launch(
    system: str, app: str, bootstrap: str, topic: str, run_dir: Path, python: str | None
) -> harness.Launch:
    """Enhydra's ledger as harness.py runs it, with another interpreter for the baseline."""
    launch = harness.enhydra(app, bootstrap, topic, run_dir)
    if python is not None:
        launch.argv[0] = python
    launch.system = system
    return launch


def launch_for(
    system: str, app: str, bootstrap: str, topic: str, run_dir: Path, pythons: dict[str, str]
) -> harness.Launch:
    if system.startswith("enhydra"):
        return enhydra_launch(system, app, bootstrap, topic, run_dir, pythons.get(system))
    return harness.raw(app, bootstrap, topic, run_dir, system.removeprefix("raw-"))


async def measure_latency(
    bootstrap: str,
    root: Path,
    *,
    rate: float,
    seconds: float,
    system: str = "enhydra",
    load: float = 0.5,
    layout: Layout | None = None,
    pythons: dict[str, str] | None = None,
    event_time: str = "append",
    keys: int = 10_000,
    seed: int = 11,
    warmup_s: float = 5.0,
    name: str = "",
    finish_s: float = 60.0,
    profile_to: Path | None = None,
) -> Latency:
    """One latency run of `system` at `rate` commands/s for `seconds`, on its own topics."""
    layout = layout or Layout()
    app = f"lat-{name or system}"
    topic = f"{app}-input-commands"
    run_dir = root / app
    run_dir.mkdir(parents=True, exist_ok=True)
    stamp = {"message.timestamp.type": "LogAppendTime"} if event_time == "append" else {}
    specs = [
        TopicSpec(topic, PARTITIONS),
        TopicSpec(f"{app}-events", PARTITIONS, config=dict(stamp), history=True),
    ]
    if not system.startswith("enhydra"):  # Enhydra creates the rest itself
        specs.append(TopicSpec(f"{app}-rejections", PARTITIONS))
        specs.append(TopicSpec(f"{app}-accounts-changelog", PARTITIONS, compacted=True))
    await create_topics(bootstrap, specs)
    records = command_records(keys, max(int(rate * seconds), keys), seed=seed)
    launch = launch_for(system, app, bootstrap, topic, run_dir, pythons or {})
    worker, url = await _start(launch, layout, run_dir)
    complete = True
    service_p99 = None
    recorder = profile.start(worker.pid, profile_to) if profile_to is not None else None
    try:
        progress(f"latency ({system}): producing {len(records):,} commands at {rate:,.0f}/s")
        sent, took = await produce_at_rate(bootstrap, topic, records, rate)
        if recorder is not None:
            await asyncio.to_thread(profile.stop, recorder)
        async with harness.Topics(bootstrap) as topics:
            deadline = time.monotonic() + finish_s
            outputs = [f"{app}-events", f"{app}-rejections"]
            while sum((await topics.ends(outputs)).values()) < sent:
                if worker.poll() is not None:
                    log = (run_dir / "log.txt").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"latency run: {system} exited:\n{log}")
                if time.monotonic() > deadline:
                    progress(f"latency ({system}): outputs still behind after {finish_s:.0f}s")
                    complete = False
                    break
                await asyncio.sleep(0.2)
        if url is not None:
            service_p99 = await asyncio.to_thread(service_latency_p99, url)
    finally:
        if recorder is not None and recorder.poll() is None:
            recorder.kill()
        await asyncio.to_thread(harness.stop_process, worker)
    commands = {(r.partition, r.offset): r.timestamp for r in await read_topic(bootstrap, topic)}
    pairs = []  # (command produced at, latency)
    for event in await read_topic(bootstrap, f"{app}-events"):
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
        system=system,
        load=load,
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
        complete=complete,
        service_p99_ms=service_p99,
    )


def service_latency_p99(url: str) -> float | None:
    """The p99 upper bound from the service's own command->event histogram, in ms."""
    from prometheus_client.parser import text_string_to_metric_families

    with contextlib.suppress(OSError):
        with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name != "enhydra_command_event_latency_seconds":
                continue
            buckets = sorted(
                (float(s.labels["le"]), s.value)
                for s in family.samples
                if s.name.endswith("_bucket")
            )
            total = buckets[-1][1] if buckets else 0
            for bound, count in buckets:
                if total and count >= 0.99 * total:
                    return bound * 1000
    return None


async def _start(
    launch: harness.Launch, layout: Layout, run_dir: Path
) -> tuple[subprocess.Popen[bytes], str | None]:
    """Start the system on the work CPUs; wait until it consumes, so the clock starts with it."""
    if launch.system.startswith("enhydra"):
        process = harness.start_process(layout.wrap(launch.argv), launch.env, launch.log_path)
        url = f"http://127.0.0.1:{launch.env['ENHYDRA_WEB_PORT']}"
        assert launch.log_path is not None
        try:
            await asyncio.to_thread(
                ServiceProcess.wait_until_ready, process, url, launch.log_path, 120
            )
        except BaseException:
            harness.stop_process(process)
            raise
        return process, url
    ready = run_dir / "ready"
    argv = [*launch.argv, "--offset-header", "--ready-file", str(ready)]
    process = harness.start_process(layout.wrap(argv), launch.env, launch.log_path)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            harness.stop_process(process)
            raise RuntimeError(f"{launch.system} did not start: see {run_dir / 'log.txt'}")
        await asyncio.sleep(0.2)
    return process, None


# the whole procedure -----------------------------------------------------------------------
async def max_rates(
    bootstrap: str,
    root: Path,
    systems: list[str],
    *,
    layout: Layout,
    pythons: dict[str, str],
    commands: int,
    keys: int,
    repeat: int,
    seed: int = 7,
) -> dict[str, dict]:
    """Each system's maximum rate in the latency layout: drain a preloaded topic, medians."""
    from bench.throughput.__main__ import preload  # the throughput bench's own loader

    topic = "latency-max-commands"
    await preload(bootstrap, topic, keys, commands, seed)
    rates: dict[str, list[float]] = {s: [] for s in systems}
    for r in range(repeat):
        for system in systems[r % len(systems) :] + systems[: r % len(systems)]:
            app = f"max-{system}-r{r}"
            launch = launch_for(system, app, bootstrap, topic, root / app, pythons)
            launch.argv = layout.wrap(launch.argv)
            progress(f"max rate {r + 1}/{repeat}: {system}")
            result = await harness.measure(bootstrap, launch, inputs=commands, keys=keys, cap_s=120)
            progress(f"  {result.rate:,.0f} rec/s, CPU {result.cpu_percent:.0f}%")
            if result.rate > 0:
                rates[system].append(result.rate)
    return {
        s: {"rate": statistics.median(v), "runs": v} if v else {"rate": None, "runs": []}
        for s, v in rates.items()
    }


def summarize(runs: list[Latency]) -> list[dict]:
    """Medians per (system, load) over the repeats, with the p99 range and its target ratio."""
    rows = []
    for system, load in dict.fromkeys((r.system, r.load) for r in runs):
        mine = [r for r in runs if r.system == system and r.load == load]
        p99 = statistics.median(r.p99_ms for r in mine)
        target = TARGETS_MS.get(load)
        rows.append(
            {
                "system": system,
                "load": load,
                "runs": len(mine),
                "rate": statistics.median(r.achieved_rate for r in mine),
                "p50_ms": statistics.median(r.p50_ms for r in mine),
                "p90_ms": statistics.median(r.p90_ms for r in mine),
                "p99_ms": p99,
                "p99_min_ms": min(r.p99_ms for r in mine),
                "p99_max_ms": max(r.p99_ms for r in mine),
                "max_ms": statistics.median(r.max_ms for r in mine),
                "steady_p99_ms": statistics.median(r.steady_p99_ms for r in mine),
                "service_p99_ms": _median_or_none([r.service_p99_ms for r in mine]),
                "complete": all(r.complete for r in mine),
                "target_ms": target,
                "ratio": round(p99 / target, 2) if target else None,
            }
        )
    return rows


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


async def run(args: argparse.Namespace) -> dict:
    configure_logging(level="warning")
    layout = Layout.choose(args.pin)
    pythons = {"enhydra-baseline": args.baseline_python} if args.baseline_python else {}
    systems = [s for s in args.systems.split(",") if s]
    if args.baseline_python and "enhydra-baseline" not in systems:
        systems.insert(1, "enhydra-baseline")
    loads = [float(x) for x in args.loads.split(",") if x]
    data: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine(),
        "layout": layout.describe(),
        "config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "load_before": load_average(),
    }
    runs: list[Latency] = []
    profiles: dict[str, dict] = {}
    if args.profile and profile.py_spy() is None:
        raise SystemExit("py-spy is missing: pip install py-spy (or leave out --profile)")
    layout.pin_self()
    with contextlib.ExitStack() as stack:
        stack.callback(layout.unpin_self)
        bootstrap, root = stack.enter_context(fresh_broker())
        layout.pin_broker(root)
        engines = [s for s in systems if s.startswith("enhydra")]
        if args.max_rate:
            data["max"] = {"enhydra": {"rate": args.max_rate, "runs": [], "given": True}}
        else:
            data["max"] = await max_rates(
                bootstrap,
                root,
                engines,
                layout=layout,
                pythons=pythons,
                commands=args.commands,
                keys=args.keys,
                repeat=args.repeat,
            )
        maximum = data["max"]["enhydra"]["rate"]
        if not maximum:
            raise RuntimeError("the maximum rate could not be measured: see the logs above")
        for load in loads:
            for r in range(args.repeat):
                order = systems[r % len(systems) :] + systems[: r % len(systems)]
                for system in order:
                    spy = None
                    if args.profile and system.startswith("enhydra") and r == 0:
                        spy = root / f"profile-{system}-{round(100 * load)}.txt"
                    lat = await measure_latency(
                        bootstrap,
                        root,
                        system=system,
                        load=load,
                        rate=maximum * load,
                        seconds=args.seconds,
                        layout=layout,
                        pythons=pythons,
                        event_time=args.event_time,
                        keys=args.keys,
                        warmup_s=min(5.0, args.seconds / 4),
                        name=f"{system}-{round(100 * load)}-r{r}",
                        profile_to=spy,
                    )
                    if spy is not None and spy.exists():
                        profiles[f"{system} at {100 * load:.0f}%"] = profile.summarize(spy)
                    progress(
                        f"  {system} at {100 * load:.0f}%: p50 {lat.p50_ms:.0f} ms, "
                        f"p99 {lat.p99_ms:.0f} ms, max {lat.max_ms:.0f} ms"
                    )
                    runs.append(lat)
        data["load_after"] = load_average()
    data["runs"] = [r.as_dict() for r in runs]
    data["summary"] = summarize(runs)
    data["profiles"] = profiles
    return data


def print_report(data: dict) -> None:
    from bench.common import table

    print(f"\nlatency, ledger workload, {PARTITIONS} partitions; {data['machine']}")
    print(f"layout: {data['layout']}; event time: {data['config']['event_time']}")
    print(f"1-min load average {data['load_before']} before, {data['load_after']} after")
    for system, m in data["max"].items():
        runs = ", ".join(f"{r:,.0f}" for r in m["runs"])
        print(f"maximum rate, {system}: {m['rate']:,.0f} rec/s" + (f" ({runs})" if runs else ""))
    rows = [
        [
            LABELS.get(r["system"], r["system"]),
            f"{100 * r['load']:.0f}%",
            f"{r['rate']:,.0f}",
            r["runs"],
            f"{r['p50_ms']:.0f}",
            f"{r['p90_ms']:.0f}",
            f"{r['p99_ms']:.0f}" + ("" if r["complete"] else " (fell behind)"),
            f"{r['p99_min_ms']:.0f}-{r['p99_max_ms']:.0f}",
            f"{r['max_ms']:.0f}",
            "" if r["service_p99_ms"] is None else f"≤{r['service_p99_ms']:.0f}",
        ]
        for r in data["summary"]
    ]
    print(
        table(
            [
                "system",
                "load",
                "commands/s",
                "runs",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "p99 range",
                "max ms",
                "/metrics p99",
            ],
            rows,
        )
    )
    for name, prof in data.get("profiles", {}).items():
        print(f"\nprofile of {name} (py-spy, % of active samples), by area:")
        for area, pct in prof["areas"][:8]:
            print(f"  {pct:5.1f}%  {area}")
        print("  top lines:")
        for line, pct in prof["self_lines"][:8]:
            print(f"  {pct:5.1f}%  {line}")
    print()
    for r in data["summary"]:
        if r["ratio"] is None:
            continue
        met = "met" if r["ratio"] <= 1.0 else "MISSED"
        print(
            f"ratio {LABELS.get(r['system'], r['system'])} p99 at {100 * r['load']:.0f}% of max "
            f"/ target {r['target_ms']:.0f} ms: {r['p99_ms']:.0f} / {r['target_ms']:.0f} = "
            f"{r['ratio']:.2f} (target <= 1.0: {met})"
        )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 run per point, 8 s per run")
    p.add_argument("--loads", default="0.25,0.5", help="fractions of the maximum rate")
    p.add_argument("--seconds", type=float, help="length of each latency run (default 20)")
    p.add_argument("--repeat", type=int, help="runs per system and load (default 3)")
    p.add_argument("--systems", default="enhydra,raw-rocksdb", help="comma-separated")
    p.add_argument("--baseline-python", help="an earlier Enhydra's interpreter, run alongside")
    p.add_argument("--pin", choices=("split", "service", "none"), default="split")
    p.add_argument("--event-time", choices=("append", "create"), default="append")
    p.add_argument("--max-rate", type=float, help="skip measuring the maximum; use this rate")
    p.add_argument("--commands", type=int, default=200_000, help="preloaded for the maximum")
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--profile", action="store_true", help="py-spy each Enhydra's first runs")
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--docs", action="store_true", help="rewrite the latency section of docs")
    return p


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    if args.seconds is None:
        args.seconds = 8.0 if args.quick else 20.0
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    return args


def main() -> None:
    args = apply_defaults(parser().parse_args())
    data = asyncio.run(run(args))
    print_report(data)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2, default=str))
    if args.docs:
        from bench.throughput import report

        command = "python -m bench.throughput.latency " + " ".join(sys.argv[1:])
        progress(f"wrote {report.write_latency(data, command.replace(' --docs', ''))}")


if __name__ == "__main__":
    main()
