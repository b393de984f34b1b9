"""Run one system as its own process against a preloaded topic and measure it from outside.

Records/s comes from the output records themselves: (outputs) / (timestamp of the last output -
timestamp of the first), so start-up, group join and shutdown are excluded the same way for
every system, and nothing depends on a system's own counters. The harness creates the output
topics with LogAppendTime: the broker stamps each record when it stores it, because a system
may legitimately copy the input's timestamp to its output (Quix Streams does). CPU % is the
process's CPU time (utime+stime from /proc, threads included) over the same window; peak RSS
is its VmHWM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.common import ROOT, create_topics, progress
from bench.throughput import profile
from bench.throughput.workload import PARTITIONS
from enhydra.kafka.topics import TopicSpec
from enhydra.testing.processes import service_env

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Launch:
    """How to start one system: command, environment, the topics its outputs land in."""

    system: str
    app: str
    argv: list[str]
    outputs: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    extra_topics: list[str] = field(default_factory=list)  # compacted, e.g. a changelog

    def process_exited(self, process: subprocess.Popen[bytes]) -> bool:
        return process.returncode not in (None, 0, -signal.SIGTERM, -signal.SIGKILL)

    def log_tail(self, lines: int = 12) -> list[str]:
        if self.log_path is None or not self.log_path.exists():
            return []
        return self.log_path.read_text(errors="replace").splitlines()[-lines:]

    def topic_specs(self) -> list[TopicSpec]:
        stamped = {"message.timestamp.type": "LogAppendTime"}
        return [
            *(TopicSpec(t, PARTITIONS, config=dict(stamped)) for t in self.outputs),
            *(TopicSpec(t, PARTITIONS, compacted=True) for t in self.extra_topics),
        ]


@dataclass
class Result:
    system: str
    keys: int
    inputs: int
    outputs: int
    events: int
    rejections: int
    seconds: float
    rate: float
    cpu_percent: float
    peak_rss_mb: float
    complete: bool
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _tree(pid: int) -> list[int]:
    """The process and its descendants (a system may fork helpers)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                children = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                todo.extend(int(c) for c in children)
    return pids


def cpu_seconds(pid: int) -> float:
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLOCK_TICKS


def peak_rss_mb(pid: int) -> float:
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total / 1024


def _interpolate(samples: list[tuple[float, float]], at: float) -> float:
    """CPU seconds at wall time `at`, linear between the two samples around it."""
    before = [s for s in samples if s[0] <= at]
    after = [s for s in samples if s[0] >= at]
    if not before:
        return samples[0][1]
    if not after:
        return samples[-1][1]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (at - t0) / (t1 - t0)


class Topics:
    """A long-lived consumer for end offsets and first/last record timestamps."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Topics:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50
        )
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.consumer is not None
        await self.consumer.stop()

    async def partitions(self, topic: str) -> list[TopicPartition]:
        assert self.consumer is not None
        parts = self.consumer.partitions_for_topic(topic)
        if not parts:
            await self.consumer._client.force_metadata_update()
            parts = self.consumer.partitions_for_topic(topic) or set()
        return [TopicPartition(topic, p) for p in sorted(parts)]

    async def ends(self, topics: list[str]) -> dict[TopicPartition, int]:
        assert self.consumer is not None
        tps = [tp for t in topics for tp in await self.partitions(t)]
        return await self.consumer.end_offsets(tps) if tps else {}

    async def timestamp(self, tp: TopicPartition, offset: int) -> int:
        assert self.consumer is not None
        self.consumer.assign([tp])
        self.consumer.seek(tp, offset)
        record = await asyncio.wait_for(self.consumer.getone(tp), 30)
        return record.timestamp

    async def span(self, topics: list[str]) -> tuple[int, int] | None:
        """(first, last) record timestamp in ms over every record of `topics`."""
        firsts, lasts = [], []
        for tp, end in (await self.ends(topics)).items():
            if end > 0:
                firsts.append(await self.timestamp(tp, 0))
                lasts.append(await self.timestamp(tp, end - 1))
        return (min(firsts), max(lasts)) if firsts else None


def start_process(
    argv: list[str], env: dict[str, str], log_path: Path | None
) -> subprocess.Popen[bytes]:
    """A system's process, in its own session, output to its log, bench/ importable."""
    log_path = log_path or Path(os.devnull)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_process(process: subprocess.Popen[bytes], timeout: float = 40.0) -> None:
    """SIGTERM (graceful: flush, commit), then SIGKILL if it does not exit in `timeout`."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


async def measure(
    bootstrap: str,
    launch: Launch,
    *,
    inputs: int,
    keys: int,
    cap_s: float,
    startup_s: float = 90.0,
    profile_to: Path | None = None,
) -> Result:
    """Start `launch`, wait until it has produced `inputs` outputs (or `cap_s` of processing).

    With `profile_to`, py-spy samples the process from its first output to the last.
    """
    await create_topics(bootstrap, launch.topic_specs())
    process = start_process(launch.argv, launch.env, launch.log_path)
    samples: list[tuple[float, float]] = []
    note = ""
    started = time.monotonic()
    first_output_at: float | None = None
    recorder = None
    try:
        async with Topics(bootstrap) as topics:
            while True:
                samples.append((time.time(), cpu_seconds(process.pid)))
                done = sum((await topics.ends(launch.outputs)).values())
                now = time.monotonic()
                if done and first_output_at is None:
                    first_output_at = now
                    if profile_to is not None:
                        recorder = profile.start(process.pid, profile_to)
                if done >= inputs:
                    break
                if process.poll() is not None:
                    note = f"exited with code {process.returncode} after {done} outputs"
                    break
                if first_output_at is None and now - started > startup_s:
                    note = f"no output after {startup_s:.0f}s"
                    break
                if first_output_at is not None and now - first_output_at > cap_s:
                    note = f"capped at {cap_s:.0f}s of processing"
                    break
                await asyncio.sleep(0.2)
            samples.append((time.time(), cpu_seconds(process.pid)))
            rss = peak_rss_mb(process.pid)
            if recorder is not None:
                await asyncio.to_thread(profile.stop, recorder)
            await asyncio.to_thread(stop_process, process)
            ends = await topics.ends(launch.outputs)
            events = sum(n for tp, n in ends.items() if tp.topic.endswith("-events"))
            outputs = sum(ends.values())
            span = await topics.span(launch.outputs)
    finally:
        if recorder is not None and recorder.poll() is None:
            recorder.kill()
        if process.poll() is None:
            process.kill()
            process.wait(10)
    seconds = (span[1] - span[0]) / 1000 if span else 0.0
    rate = outputs / seconds if seconds > 0 else 0.0
    cpu = 0.0
    if span and seconds > 0:
        used = _interpolate(samples, span[1] / 1000) - _interpolate(samples, span[0] / 1000)
        cpu = 100 * used / seconds
    if note:
        progress(f"{launch.system}: {note} (log: {launch.log_path})")
        if launch.process_exited(process):  # its log goes with the run's temp dir: show it now
            for line in launch.log_tail():
                progress(f"  | {line}")
    return Result(
        system=launch.system,
        keys=keys,
        inputs=inputs,
        outputs=outputs,
        events=events,
        rejections=outputs - events,
        seconds=round(seconds, 3),
        rate=round(rate, 1),
        cpu_percent=round(cpu, 1),
        peak_rss_mb=round(rss, 1),
        complete=outputs >= inputs,
        note=note,
    )


# the systems -------------------------------------------------------------------------------
def raw(app: str, bootstrap: str, topic: str, run_dir: Path, state: str) -> Launch:
    argv = [
        sys.executable,
        "-m",
        "bench.throughput.raw_aiokafka",
        "--bootstrap",
        bootstrap,
        "--app",
        app,
        "--topic",
        topic,
        "--state",
        state,
        "--state-dir",
        str(run_dir / "db"),
    ]
    changelog = [f"{app}-accounts-changelog"] if state == "rocksdb" else []
    return Launch(
        f"raw-{state}",
        app,
        argv,
        [f"{app}-events", f"{app}-rejections"],
        log_path=run_dir / "log.txt",
        extra_topics=changelog,
    )


def enhydra_env(app: str, bootstrap: str, topic: str, run_dir: Path) -> dict[str, str]:
    """A single instance, no standbys, at-least-once: the fair single-core configuration."""
    return service_env(
        app_id=app,
        bootstrap=bootstrap,
        instance_id=f"{app}-1",
        state_dir=run_dir / "state",
        partitions=4,
        extra={
            "ENHYDRA_COMMANDS_TOPIC": topic,
            "ENHYDRA_NUM_STANDBY_REPLICAS": "0",
            "ENHYDRA_PROCESSING_GUARANTEE": "at_least_once",
            "ENHYDRA_PRODUCER_LINGER_MS": "5",
        },
    )


ENHYDRA_TARGET = "ledger.service:service"
TYPED_TARGET = "ledger.typed:service"  # the same ledger declared with msgspec Structs


def enhydra(app: str, bootstrap: str, topic: str, run_dir: Path, *, typed: bool = False) -> Launch:
    run = ["-m", "enhydra.cli.main", "run", TYPED_TARGET if typed else ENHYDRA_TARGET]
    return Launch(
        "enhydra-typed" if typed else "enhydra",
        app,
        [sys.executable, *run],
        [f"{app}-events", f"{app}-rejections"],
        env=enhydra_env(app, bootstrap, topic, run_dir),
        log_path=run_dir / "log.txt",
    )


def faust(app: str, bootstrap: str, topic: str, run_dir: Path) -> Launch:
    # faust's worker command starts its web server (port 6066) whatever the app's
    # web_enabled says; --without-web keeps it off, so no port is shared with other services.
    argv = [sys.executable, "-m", "bench.throughput.faust_app", "worker", "-l", "warn"]
    argv.append("--without-web")
    env = {
        "BENCH_APP": app,
        "BENCH_BOOTSTRAP": bootstrap,
        "BENCH_TOPIC": topic,
        "BENCH_STATE_DIR": str(run_dir / "state"),
    }
    return Launch(
        "faust",
        app,
        argv,
        [f"{app}-events", f"{app}-rejections"],
        env=env,
        log_path=run_dir / "log.txt",
    )


def quix(app: str, bootstrap: str, topic: str, run_dir: Path, python: str) -> Launch:
    argv = [
        python,
        "-m",
        "bench.throughput.quix_app",
        "--bootstrap",
        bootstrap,
        "--app",
        app,
        "--topic",
        topic,
        "--state-dir",
        str(run_dir / "state"),
    ]
    return Launch(
        "quix", app, argv, [f"{app}-events", f"{app}-rejections"], log_path=run_dir / "log.txt"
    )
