"""The fault tests' harness: two ledger instances under a steady command stream, one fault,
then the invariant checker and "every instance still runs, every partition resumes".

A scenario is: start both instances (each on its own Toxiproxy lane), stream commands at a
fixed rate, apply the fault after a warm-up, heal it, watch the commands group's committed
offsets (each partition must resume within RESUME_WITHIN s), stop the stream a little later,
wait for the group to drain, then check the changelog and the events against the model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import TopicPartition

from enhydra.kafka.clients import as_connection, open_consumer, open_producer
from enhydra.kafka.reading import partitions_of
from enhydra.testing.faults import ProxiedKafka
from enhydra.testing.invariants import (
    Progress,
    StateDiff,
    Verdict,
    check_service,
    compare_state,
    watch_progress,
)
from enhydra.testing.processes import ServiceProcess, service_env, wait_for_committed
from ledger.workload import generate, model
from tests.integration.ledger_support import read_accounts

TARGET = "ledger.service:service"
STORE = "accounts"
RESUME_WITHIN = 10.0  # s after the fault heals: every partition commits again
DRAIN_WITHIN = 30.0  # s after the stream stops: the group has committed everything
RATE = 100  # commands per second: steady load two shared cores keep up with
TICK = 0.1


@dataclass
class Scenario:
    kafka: ProxiedKafka
    app_id: str
    tmp_path: Path
    guarantee: str = "at_least_once"
    extra_env: dict[str, str] = field(default_factory=dict)
    instances: list[ServiceProcess] = field(default_factory=list)
    sent: int = 0
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # the fault did not take effect

    def instance_env(self, lane: str) -> dict[str, str]:
        """The settings an instance on `lane` runs with beyond service_env's; a subclass
        changes what differs (tests/cluster leaves the replication to the brokers)."""
        return {
            "ENHYDRA_PROCESSING_GUARANTEE": self.guarantee,
            "ENHYDRA_REPLICATION_FACTOR": str(min(3, len(self.kafka.cluster.nodes()))),
            **self.extra_env,
        }

    def start_instances(self, lanes: tuple[str, ...] = ("i1", "i2")) -> list[ServiceProcess]:
        for lane in lanes:
            env = service_env(
                app_id=self.app_id,
                bootstrap=self.kafka.lane_bootstrap(lane),
                instance_id=lane,
                state_dir=self.tmp_path / f"state-{lane}",
                extra=self.instance_env(lane),
            )
            proc = ServiceProcess(TARGET, env, self.tmp_path / f"{lane}.log").start()
            self.instances.append(proc)
        for proc in self.instances:
            proc.wait_ready(timeout=90)
        return self.instances

    def stop_instances(self) -> None:
        for proc in self.instances:
            suspend(proc, False)  # a test that failed mid-fault must not leave one stopped
            try:
                proc.stop(timeout=20)
            except TimeoutError:
                proc.kill()

    def instance(self, lane: str) -> ServiceProcess:
        return next(p for p in self.instances if p.instance_id == lane)


def roles(proc: ServiceProcess) -> dict[str, list[int]]:
    """role -> partitions of the instance's tasks, from its /v1/stats ({} if it cannot say)."""
    try:
        status, stats = proc.get("/v1/stats")
    except OSError:
        return {}
    found: dict[str, list[int]] = {}
    for partition, task in (stats.get("tasks", {}) if status == 200 else {}).items():
        found.setdefault(task["role"], []).append(int(partition))
    return {role: sorted(ps) for role, ps in sorted(found.items())}


def suspend(proc: ServiceProcess, stopped: bool) -> None:
    """SIGSTOP / SIGCONT the instance's whole process group (it was started in its own)."""
    if proc.alive():
        assert proc.process is not None
        os.killpg(proc.process.pid, signal.SIGSTOP if stopped else signal.SIGCONT)


async def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> node id of its leader, from fresh metadata."""
    async with open_consumer(as_connection(bootstrap)) as consumer:
        await consumer._client.force_metadata_update()
        found = await partitions_of(consumer, topic)
        cluster = consumer._client.cluster
        return {p: cluster.leader_for_partition(TopicPartition(topic, p)) for p in found}


def restore_in_a_fresh_instance(
    s: Scenario, expected: dict, *, caught_up: bool = False
) -> StateDiff:
    """Stop every instance, start one with an empty state dir, read every account through it.

    `caught_up`: first wait until its group has committed the whole commands topic (after a
    snapshot restore, the commands after the cut are processed again once it is ready)."""
    s.stop_instances()
    env = service_env(
        app_id=s.app_id,
        bootstrap=s.kafka.bootstrap,
        instance_id="fresh",
        state_dir=s.tmp_path / "state-fresh",
        extra=s.instance_env("fresh"),
    )
    fresh = ServiceProcess(TARGET, env, s.tmp_path / "fresh.log").start()
    s.instances.append(fresh)
    fresh.wait_ready(timeout=90)
    if caught_up:
        commands = f"{s.app_id}-commands"
        asyncio.run(wait_for_committed(s.kafka.bootstrap, s.app_id, commands, timeout=90))
    return compare_state(read_accounts([fresh], sorted(expected)), expected)


Fault = Callable[[Scenario], Awaitable[None]]


async def _stream(s: Scenario, commands: list, stop: asyncio.Event) -> None:
    """Produce `commands` at RATE per second until `stop` is set (or they run out)."""
    per_tick = max(1, int(RATE * TICK))
    topic = f"{s.app_id}-commands"
    conn = as_connection(s.kafka.bootstrap)
    async with open_producer(conn, linger_ms=5, acks="all", enable_idempotence=True) as producer:
        while not stop.is_set() and s.sent < len(commands):
            started = time.monotonic()
            chunk = commands[s.sent : s.sent + per_tick]
            futures = [
                await producer.send(topic, _json(value), key=key.encode()) for key, value in chunk
            ]
            await asyncio.gather(*futures)
            s.sent += len(chunk)
            await asyncio.sleep(max(0.0, TICK - (time.monotonic() - started)))


def _json(value: object) -> bytes:
    import json

    return json.dumps(value).encode()


def run(
    s: Scenario,
    fault: Fault,
    *,
    fault_s: float,
    warmup_s: float = 3.0,
    after_s: float = 2.0,
    accounts: int = 300,
    fresh_instance: bool = False,
) -> Verdict:
    """Run one scenario; the verdict of every invariant (the caller asserts on it).

    `fresh_instance`: also stop both instances and start a new one with an empty state dir,
    which restores everything from the changelog; what it serves must equal the model too.
    """
    budget = warmup_s + fault_s + after_s + DRAIN_WITHIN
    commands = generate(accounts, int(RATE * budget) + accounts, seed=5)
    group, topic = s.app_id, f"{s.app_id}-commands"

    async def main() -> Progress:
        stop = asyncio.Event()
        stream = asyncio.create_task(_stream(s, commands, stop))
        try:
            await asyncio.sleep(warmup_s)
            await fault(s)
            healed = time.monotonic()

            progress = Progress()

            async def stop_later() -> None:
                """Load keeps coming until every partition resumed (or the bound passed)."""
                await asyncio.sleep(after_s)
                while not progress.all_resumed() and time.monotonic() - healed < RESUME_WITHIN:
                    await asyncio.sleep(0.25)
                stop.set()

            stopper = asyncio.create_task(stop_later())
            await watch_progress(
                s.kafka.bootstrap, group, topic,
                resume_within=RESUME_WITHIN, drain_within=DRAIN_WITHIN + RESUME_WITHIN,
                stream_done=stop.is_set, progress=progress,
            )  # fmt: skip
            await stopper
            s.notes.append(f"healed at +{healed - started:.1f}s, sent {s.sent} commands")
            return progress
        finally:
            stop.set()
            await stream

    started = time.monotonic()
    progress = asyncio.run(main())
    produced = commands[: s.sent]
    expected = model(produced)
    dead = [p.instance_id for p in s.instances if not p.alive()]
    answering = []
    for proc in s.instances:
        if proc.alive():
            try:
                status, _ = proc.get("/v1/stats")
            except OSError:
                status = None
            if status == 200:
                answering.append(proc.instance_id)
    verdict = asyncio.run(
        check_service(
            s.kafka.bootstrap, s.app_id, STORE, expected,
            guarantee=s.guarantee,
            expected_events=sum(state["version"] for state in expected.values()),
            progress=progress, resume_within=RESUME_WITHIN,
        )
    )  # fmt: skip
    verdict.notes.extend(s.notes)
    verdict.notes.extend(f"{p.instance_id} tasks at the end: {roles(p)}" for p in s.instances)
    if dead:
        verdict.failures.append(f"instances exited: {dead}")
    missing = sorted({p.instance_id for p in s.instances} - set(answering) - set(dead))
    if missing:
        verdict.failures.append(f"instances alive but not answering /v1/stats: {missing}")
    for proc in s.instances:
        if proc.instance_id in dead or proc.instance_id in missing:
            tail = "\n  ".join(line[:300] for line in proc.log_tail(12).splitlines())
            verdict.failures.append(f"{proc.instance_id}'s log ends with:\n  {tail}")
    if fresh_instance:
        diff = restore_in_a_fresh_instance(s, expected)
        verdict.notes.append(f"fresh instance: {diff.matching}/{diff.expected} accounts match")
        if not diff.ok:
            verdict.failures.append(
                f"a fresh instance restored {diff.matching}/{diff.expected} accounts of the "
                f"model, e.g. {diff.differing[:3]} missing {diff.missing[:3]}"
            )
    verdict.failures.extend(s.failures)
    print(f"\n--- {s.app_id} ({s.guarantee})\n{verdict.summary()}")
    return verdict
