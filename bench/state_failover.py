"""Failover after kill -9 and rolling restarts of the ledger, before and after static membership.

    .venv/bin/python bench/state_failover.py                      # everything, 3 repeats
    .venv/bin/python bench/state_failover.py --keys 100000 --repeat 1 --variants dynamic,static+fd
    .venv/bin/python bench/state_failover.py --parts roll --roll-instances 3

Every instance is a real ledger process (4 partitions) with the production settings, not the
short test timeouts of `service_env`: session 30 s, heartbeat 0.5 s, static membership, failure
detection with a 5 s probe window, and SIGTERM keeps the membership. The variants change only:

    dynamic     ENHYDRA_STATIC_MEMBERSHIP=false, ENHYDRA_FAILURE_DETECTION=false, session 10 s,
                heartbeat 3 s: the defaults before issue 16 ("before")
    static      static membership, ENHYDRA_FAILURE_DETECTION=false: only the 30 s session timeout
                notices a dead instance
    static+fd   the production defaults ("after")

(a) kill -9. Two instances, one standby. Load N accounts through the service (N `open`
commands), wait until they are committed and every standby has lag 0, then at T0 SIGKILL the
instance `two` and at once send one deposit to an account of each of its active partitions.
"first event" is the create time of the first event on the events topic for those deposits
(found by their `enhydra.command_id` header) minus T0; "all partitions" the last one. The
survivor's log splits the first into detector (until it logs `removing dead peer`: static+fd
only), detect (until `partitions revoked`: it heard of the rebalance), rebalance (until `tasks
assigned` with the lost tasks), assigned->running (until that partition runs: its `restore
finished`, or `all active tasks running` for a promoted standby) and the probe itself.

(b) Rolling restart. N instances (default 2), one standby, deposits flowing at `--rate`. Each
instance in turn gets SIGTERM and is started again with the same instance id, volume and port;
the next one waits until it is ready. Per restart: the restart time (SIGTERM until the new
process answers /health/ready), the rebalances the other instances went through (their
/v1/stats `rebalances` and `tasks assigned` log lines), the records the new process restored,
and per partition the longest gap between two consecutive events on the events topic around
the restart. At the end every deposit must have exactly one event.

Variants run interleaved (one of each, then again), on one fresh broker, so their ratios are
measured under the same load. Targets (issue 16): kill -9 -> first event <= 2 s; a rolling
restart with 0 rebalances and a gap per partition <= the restart time + 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
from aiokafka import TopicPartition
from common import fresh_broker, load_average, machine, median, produce_fast, progress, table

from enhydra.contracts.headers import COMMAND_ID_HEADER, header
from enhydra.contracts.partitioner import partition_for
from enhydra.kafka.clients import open_consumer, open_producer
from enhydra.testing.processes import (
    ServiceProcess,
    http_get,
    read_topic,
    service_env,
    wait_for_committed,
)

TARGET = "ledger.service:service"
PARTITIONS = 4
# service_env's short test timeouts, removed so the production defaults (settings.py) apply.
TEST_OVERRIDES = (
    "ENHYDRA_SESSION_TIMEOUT_MS",
    "ENHYDRA_HEARTBEAT_INTERVAL_MS",
    "ENHYDRA_REBALANCE_TIMEOUT_MS",
    "ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN",
)
FIRST_EVENT_TARGET_S = 2.0
GAP_MARGIN_S = 1.0


@dataclass(frozen=True)
class Variant:
    name: str
    env: dict[str, str]
    session_s: float
    heartbeat_s: float
    detector: bool


VARIANTS = {
    v.name: v
    for v in (
        Variant(
            "dynamic",
            {
                "ENHYDRA_STATIC_MEMBERSHIP": "false",
                "ENHYDRA_FAILURE_DETECTION": "false",
                "ENHYDRA_SESSION_TIMEOUT_MS": "10000",
                "ENHYDRA_HEARTBEAT_INTERVAL_MS": "3000",
            },
            10,
            3,
            False,
        ),
        Variant("static", {"ENHYDRA_FAILURE_DETECTION": "false"}, 30, 0.5, False),
        Variant("static+fd", {}, 30, 0.5, True),
    )
}


def production_env(
    app: str, bootstrap: str, name: str, root: Path, variant: Variant, standbys: int
) -> dict[str, str]:
    env = service_env(
        app_id=app,
        bootstrap=bootstrap,
        instance_id=name,
        state_dir=root / app / name,
        partitions=PARTITIONS,
        extra={"ENHYDRA_NUM_STANDBY_REPLICAS": str(standbys)},
    )
    for variable in TEST_OVERRIDES:
        env.pop(variable)
    return {**env, **variant.env}


def start_instances(
    bootstrap: str, root: Path, app: str, names: list[str], variant: Variant, standbys: int
) -> list[ServiceProcess]:
    instances = []
    for name in names:
        env = production_env(app, bootstrap, name, root, variant, standbys)
        instances.append(ServiceProcess(TARGET, env, root / app / f"{name}.log").start())
    return instances


# --- what the instances say --------------------------------------------------------------------


def stats(instance: ServiceProcess) -> dict[str, Any]:
    status, body = instance.get("/v1/stats")
    if status != 200:
        raise RuntimeError(f"{instance.instance_id} /v1/stats answered {status}: {body}")
    return body


def roles(instance: ServiceProcess) -> dict[int, str]:
    return {int(p): t["role"] for p, t in stats(instance)["tasks"].items()}


def actives(instance: ServiceProcess) -> list[int]:
    return sorted(p for p, r in roles(instance).items() if r == "active")


def wait_until(predicate, timeout: float, what: str, step: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)


def wait_ready(instance: ServiceProcess, timeout: float = 120) -> float:
    """Poll /health/ready every 50 ms; the wall-clock time it first answered 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not instance.alive():
            raise RuntimeError(f"{instance.instance_id} exited:\n{instance.log_tail()}")
        with contextlib.suppress(OSError):
            if http_get(instance.url + "/health/ready", timeout=2)[0] == 200:
                return time.time()
        time.sleep(0.05)
    raise TimeoutError(f"{instance.instance_id} not ready after {timeout:.0f}s")


def settled(instances: list[ServiceProcess], standbys: int) -> bool:
    """Every partition active once, each instance some, every standby placed, all ready."""
    found = [list(roles(inst).values()) for inst in instances]
    if sum(r.count("active") for r in found) != PARTITIONS or not all("active" in r for r in found):
        return False
    if sum(r.count("standby") for r in found) != standbys * PARTITIONS:
        return False
    return all(stats(inst)["ready"] for inst in instances)


def standbys_current(instances: list[ServiceProcess]) -> bool:
    for inst in instances:
        for task in stats(inst)["tasks"].values():
            if task["role"] != "active" and (task["lag"] is None or task["lag"] > 0):
                return False
    return True


def log_events(path: Path, since: float) -> list[tuple[float, dict[str, Any]]]:
    """JSON log lines of an instance written at or after `since` (epoch seconds)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = orjson.loads(line)
            ts = datetime.fromisoformat(event["timestamp"]).timestamp()
        except (orjson.JSONDecodeError, KeyError, ValueError):
            continue
        if ts >= since:
            out.append((ts, event))
    return out


def watched(observer: ServiceProcess, peer: ServiceProcess) -> bool:
    """Whether the observer's failure detector last saw the peer alive (its log says so)."""
    verdicts = [
        e.get("verdict")
        for _, e in log_events(observer.log_path, 0)
        if e.get("event") == "peer liveness changed" and e.get("peer") == peer.instance_id
    ]
    return bool(verdicts) and verdicts[-1] == "alive"


def account(i: int) -> str:
    return f"acct-{i:06d}"


def opens(keys: int):
    """N `open` commands: the state of N accounts, one changelog record each."""
    for i in range(keys):
        body = {"command_id": f"open-{i}", "type": "open", "account": account(i)}
        yield account(i).encode(), orjson.dumps(body), []


def load(
    bootstrap: str, app: str, instances: list[ServiceProcess], keys: int, standbys: int, args
) -> tuple[float, list[int]]:
    """Load N accounts through the service; (seconds, rebalances each instance took meanwhile)."""
    before = [stats(inst)["rebalances"] for inst in instances]
    started = time.monotonic()
    asyncio.run(produce_fast(bootstrap, f"{app}-commands", opens(keys), PARTITIONS))
    asyncio.run(wait_for_committed(bootstrap, app, f"{app}-commands", timeout=args.load_timeout))
    load_s = time.monotonic() - started
    progress(f"  {keys:,} opens processed and committed in {load_s:.1f}s")
    if standbys:
        wait_until(lambda: standbys_current(instances), args.load_timeout, "standby lag 0")
    moved = [stats(inst)["rebalances"] - n for inst, n in zip(instances, before, strict=True)]
    return load_s, moved


def stop_all(instances: list[ServiceProcess]) -> None:
    for inst in instances:
        with contextlib.suppress(TimeoutError):
            inst.stop(timeout=30)


# --- (a) kill -9 ---------------------------------------------------------------------------------


@dataclass
class KillResult:
    keys: int
    standbys: int
    variant: str
    load_s: float
    first_s: float
    all_s: float
    detector_s: float | None
    detect_s: float | None
    rebalance_s: float | None
    restore_s: float | None
    process_s: float | None
    restored: int
    query_s: float | None
    notes: list[str] = field(default_factory=list)


async def kill_and_probe(
    bootstrap: str, app: str, victim: ServiceProcess, probes: dict[int, str], timeout: float
) -> tuple[float, dict[int, float]]:
    """SIGKILL the victim, send one deposit per probed partition: (T0, partition -> T1)."""
    events = [TopicPartition(f"{app}-events", p) for p in probes]
    ids = {f"probe-{p}-{uuid.uuid4().hex[:8]}".encode(): p for p in probes}
    async with (
        open_consumer(bootstrap, fetch_max_wait_ms=50) as tail,
        open_producer(bootstrap, acks="all", linger_ms=0) as producer,
    ):
        tail.assign(events)
        for tp in events:
            await tail.seek_to_end(tp)
            await tail.position(tp)
        await producer.partitions_for(f"{app}-commands")  # metadata ready before T0
        t0 = time.time()
        victim.kill()
        sends = []
        for command_id, p in ids.items():
            body = {"command_id": command_id.decode(), "type": "deposit", "account": probes[p]}
            sends.append(
                await producer.send(
                    f"{app}-commands",
                    orjson.dumps({**body, "amount": 1}),
                    key=probes[p].encode(),
                    partition=p,
                )
            )
        await asyncio.gather(*sends)
        seen: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < len(ids) and time.monotonic() < deadline:
            for records in (await tail.getmany(*events, timeout_ms=200)).values():
                for record in records:
                    p = ids.get(header(record.headers, COMMAND_ID_HEADER) or b"")
                    if p is not None:
                        seen.setdefault(p, record.timestamp / 1000)
        if len(seen) < len(ids):
            missing = sorted(set(probes) - set(seen))
            raise TimeoutError(f"no event for partitions {missing} {timeout:.0f}s after the kill")
        return t0, seen


def query_visible(instance: ServiceProcess, key: str, timeout: float = 10.0) -> float | None:
    """When the survivor's HTTP API first shows the probe's deposit (version 2), else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = instance.get(f"/v1/stores/accounts/keys/{key}")
        if status == 200 and body.get("version") == 2:
            return time.time()
        time.sleep(0.01)
    return None


def breakdown(
    log_path: Path, t0: float, t1: float, lost: list[int], probed: int
) -> tuple[float | None, ...]:
    """(detector, detect, rebalance, assigned->running, probe) seconds from the survivor's log.

    "running" is the probed partition's `restore finished`, or for a copy with nothing to
    restore (a caught-up standby) the `all active tasks running` line.
    """
    removing = revoked = assigned = finished = all_running = None
    for ts, event in log_events(log_path, t0):
        name = event.get("event")
        if name == "removing dead peer" and removing is None:
            removing = ts
        elif name == "partitions revoked" and revoked is None:
            revoked = ts
        elif name == "tasks assigned" and set(lost) <= set(event.get("active", ())):
            assigned = assigned or ts
        elif assigned is None:
            continue
        elif name == "restore finished" and event.get("partition") == probed:
            finished = finished or ts
        elif name == "all active tasks running":
            all_running = all_running or ts
    running = finished or all_running
    return (
        removing - t0 if removing else None,
        revoked - t0 if revoked else None,
        assigned - revoked if assigned and revoked else None,
        running - assigned if running and assigned else None,
        t1 - running if running else None,
    )


def kill_run(
    bootstrap: str, root: Path, keys: int, standbys: int, variant: Variant, args
) -> KillResult:
    app = f"fo-{keys}-s{standbys}-{variant.name.replace('+', '')}-{uuid.uuid4().hex[:6]}"
    instances = start_instances(bootstrap, root, app, ["one", "two"], variant, standbys)
    survivor, victim = instances
    label = f"[kill -9, {keys:,} keys, standbys={standbys}, {variant.name}]"
    try:
        for inst in instances:
            wait_ready(inst)
        wait_until(lambda: settled(instances, standbys), 90, "every task placed")
        progress(f"{label} loading")
        load_s, moved = load(bootstrap, app, instances, keys, standbys, args)
        lost = actives(victim)
        if standbys and not all(roles(survivor).get(p) == "standby" for p in lost):
            raise RuntimeError(f"survivor holds no standby of {lost}: {roles(survivor)}")
        probes = {}
        for i in range(keys):
            p = partition_for(account(i).encode(), PARTITIONS)
            if p in lost:
                probes.setdefault(p, account(i))
            if len(probes) == len(lost):
                break
        if variant.detector:
            wait_until(lambda: watched(survivor, victim), 30, "the survivor's detector to watch")
        t0, t1s = asyncio.run(kill_and_probe(bootstrap, app, victim, probes, args.probe_timeout))
        probed = min(t1s, key=t1s.__getitem__)
        t_query = query_visible(survivor, probes[probed])
        wait_until(
            lambda: all(stats(survivor)["tasks"][str(p)]["status"] == "running" for p in lost),
            args.probe_timeout,
            "every lost task running on the survivor",
        )
        parts = breakdown(survivor.log_path, t0, t1s[probed], lost, probed)
        tasks = stats(survivor)["tasks"]
        restored = sum(int(tasks[str(p)]["restore"].get("restored", 0)) for p in lost)
        result = KillResult(
            keys,
            standbys,
            variant.name,
            load_s,
            t1s[probed] - t0,
            max(t1s.values()) - t0,
            *parts,
            restored=restored,
            query_s=t_query - t1s[probed] if t_query else None,
        )
        if t_query is None:
            result.notes.append("probe account not at version 2 over HTTP 10 s after its event")
        if any(moved):
            result.notes.append(f"rebalances while loading (one, two): {moved}")
        if parts[3] is None:
            result.notes.append(f"no readiness in the survivor's log: {survivor.log_path}")
        progress(
            f"{label} first event +{result.first_s:.2f}s, all partitions +{result.all_s:.2f}s; "
            f"detector {_s(result.detector_s)}, detect {_s(result.detect_s)}, rebalance "
            f"{_s(result.rebalance_s)}, assigned->running {_s(result.restore_s)} "
            f"({restored:,} restored), probe {_s(result.process_s)}"
        )
        return result
    finally:
        stop_all(instances)


# --- (b) rolling restart -------------------------------------------------------------------------


class Sender:
    """Deposits at a steady rate from a thread (one producer), as clients keep sending."""

    def __init__(self, bootstrap: str, app: str, keys: int, rate: float) -> None:
        self.bootstrap, self.topic, self.keys, self.rate = bootstrap, f"{app}-commands", keys, rate
        self.prefix = f"roll-{uuid.uuid4().hex[:6]}-"
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    async def _run(self) -> None:
        rng = random.Random(7)
        tick = 0.05
        async with open_producer(self.bootstrap, acks="all", linger_ms=5) as producer:
            started = time.monotonic()
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self.rate)
                futures = []
                for seq in range(self.sent, due):
                    key = account(rng.randrange(self.keys))
                    body = {"command_id": f"{self.prefix}{seq}", "type": "deposit"}
                    body |= {"account": key, "amount": 1}
                    partition = partition_for(key.encode(), PARTITIONS)
                    futures.append(
                        await producer.send(
                            self.topic, orjson.dumps(body), key=key.encode(), partition=partition
                        )
                    )
                self.sent = max(self.sent, due)
                if futures:
                    await asyncio.gather(*futures)
                await asyncio.sleep(tick)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=60)
        if self.error is not None:
            raise RuntimeError(f"the command sender failed: {self.error!r}")
        return self.sent


@dataclass
class Restart:
    instance: str
    owned: list[int]
    sigterm: float
    exited: float
    ready: float
    rebalances: int  # the other instances' /v1/stats "rebalances", summed
    assigned_lines: int  # their "tasks assigned" log lines meanwhile
    restored: int  # records the new process restored
    gaps: dict[int, float] = field(default_factory=dict)  # partition -> longest gap

    @property
    def restart_s(self) -> float:
        return self.ready - self.sigterm

    def own_gaps(self) -> list[float]:
        return [self.gaps[p] for p in self.owned if p in self.gaps]

    def other_gaps(self) -> list[float]:
        return [g for p, g in self.gaps.items() if p not in self.owned]


@dataclass
class RollResult:
    variant: str
    keys: int
    restarts: list[Restart]
    sent: int
    lost: int
    duplicated: int
    notes: list[str] = field(default_factory=list)


def longest_gaps(times: dict[int, list[float]], start: float, end: float) -> dict[int, float]:
    """Per partition, the longest time between two consecutive events around [start, end]."""
    out = {}
    for p, ts in times.items():
        pairs = [(a, b) for a, b in pairwise(ts) if a <= end and b >= start]
        if pairs:
            out[p] = max(b - a for a, b in pairs)
    return out


def roll_run(bootstrap: str, root: Path, variant: Variant, args) -> RollResult:
    keys, standbys = args.roll_keys, 1
    app = f"roll-{variant.name.replace('+', '')}-{uuid.uuid4().hex[:6]}"
    names = [f"r{i}" for i in range(args.roll_instances)]
    instances = start_instances(bootstrap, root, app, names, variant, standbys)
    label = f"[rolling restart, {len(names)} instances, {variant.name}]"
    sender = None
    restarts: list[Restart] = []
    notes: list[str] = []
    # Long enough for a rebalance to reach every instance (their next heartbeat) and settle.
    settle_s = max(2.0, 2 * variant.heartbeat_s + 1)
    try:
        for inst in instances:
            wait_ready(inst)
        wait_until(lambda: settled(instances, standbys), 90, "every task placed")
        progress(f"{label} loading {keys:,} accounts")
        _, moved = load(bootstrap, app, instances, keys, standbys, args)
        if any(moved):
            notes.append(f"rebalances while loading: {moved}")
        sender = Sender(bootstrap, app, keys, args.rate)
        time.sleep(3.0)  # steady flow before the first restart
        for i, inst in enumerate(list(instances)):
            others = [x for j, x in enumerate(instances) if j != i]
            before = [stats(o)["rebalances"] for o in others]
            owned = actives(inst)
            sigterm = time.time()
            if inst.stop(timeout=60) != 0:
                notes.append(f"{inst.instance_id} exited with {inst.process.returncode}")
            exited = time.time()
            again = ServiceProcess(TARGET, inst.env, inst.log_path).start()
            ready = wait_ready(again)
            instances[i] = again
            wait_until(lambda: settled(instances, standbys), 90, "every task placed again")
            time.sleep(settle_s)
            after = [stats(o)["rebalances"] for o in others]
            lines = sum(
                1
                for o in others
                for _, e in log_events(o.log_path, sigterm)
                if e.get("event") == "tasks assigned"
            )
            tasks = stats(again)["tasks"].values()
            restored = sum(int(t["restore"].get("restored", 0)) for t in tasks)
            step = Restart(
                inst.instance_id,
                owned,
                sigterm,
                exited,
                ready,
                sum(after) - sum(before),
                lines,
                restored,
            )
            restarts.append(step)
            progress(
                f"{label} {step.instance}: SIGTERM -> ready {step.restart_s:.2f}s (stop "
                f"{exited - sigterm:.2f}s), others rebalanced {step.rebalances}x, "
                f"restored {restored:,}"
            )
        sent, prefix = sender.stop(), sender.prefix.encode()
        sender = None
        asyncio.run(wait_for_committed(bootstrap, app, f"{app}-commands", timeout=120))
        events = asyncio.run(read_topic(bootstrap, f"{app}-events"))
    finally:
        if sender is not None:
            with contextlib.suppress(RuntimeError):
                sender.stop()
        stop_all(instances)
    counts: Counter[bytes] = Counter()
    times: dict[int, list[float]] = defaultdict(list)
    for record in events:
        command_id = header(record.headers, COMMAND_ID_HEADER) or b""
        if command_id.startswith(prefix):
            counts[command_id] += 1
            times[record.partition].append(record.timestamp / 1000)
    for ts in times.values():
        ts.sort()
    for step in restarts:
        step.gaps = longest_gaps(times, step.sigterm, step.ready)
        progress(
            f"{label} {step.instance} (active {step.owned}): longest gap per partition "
            + ", ".join(f"p{p} {g:.2f}s" for p, g in sorted(step.gaps.items()))
        )
    lost = sent - len(counts)
    duplicated = sum(counts.values()) - len(counts)
    return RollResult(variant.name, keys, restarts, sent, lost, duplicated, notes)


# --- report --------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}s"


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def med(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def kill_report(results: dict[tuple[int, int, str], list[KillResult]], repeat: int) -> None:
    print(
        f"\n(a) kill -9 of an instance with active tasks: seconds until the first event of its "
        f"partitions; 2 instances, {PARTITIONS} partitions; median of {repeat} kill(s) per row"
    )
    rows = []
    for (keys, standbys, name), runs in results.items():
        v = VARIANTS[name]
        first = med([r.first_s for r in runs])
        base = med([r.first_s for r in results.get((keys, standbys, "dynamic"), [])])
        rows.append(
            [
                f"{keys:,}",
                standbys,
                name,
                f"{v.session_s:g}/{v.heartbeat_s:g}",
                _f(first),
                f"{base / first:.1f}x" if base and first else "n/a",
                f"{min(r.first_s for r in runs):.2f}-{max(r.first_s for r in runs):.2f}",
                _f(med([r.all_s for r in runs])),
                _f(med([r.detector_s for r in runs])),
                _f(med([r.detect_s for r in runs])),
                _f(med([r.rebalance_s for r in runs])),
                _f(med([r.restore_s for r in runs])),
                _f(med([r.process_s for r in runs])),
                f"{int(med([r.restored for r in runs]) or 0):,}",
                f"{med([r.load_s for r in runs]):.0f}",
            ]
        )
    headers = [
        "keys",
        "standbys",
        "variant",
        "session/heartbeat s",
        "first event s",
        "vs dynamic",
        "range s",
        "all partitions s",
        "detector s",
        "detect s",
        "rebalance s",
        "assigned->running s",
        "probe s",
        "restored",
        "load s",
    ]
    print(table(headers, rows))
    lag = [r.query_s for runs in results.values() for r in runs if r.query_s is not None]
    if lag:
        print(
            f"event -> key readable over HTTP on the survivor: median {median(lag):.3f} s, "
            f"max {max(lag):.3f} s"
        )
    for (keys, standbys, name), runs in results.items():
        if name == "static+fd":
            first = med([r.first_s for r in runs])
            worst = max(r.first_s for r in runs)
            verdict = "met" if first is not None and first <= FIRST_EVENT_TARGET_S else "NOT met"
            print(
                f"target kill -9 -> first event <= {FIRST_EVENT_TARGET_S:g} s "
                f"({keys:,} keys, standbys={standbys}): median {_f(first)} s, worst "
                f"{worst:.2f} s: {verdict}"
            )


def roll_report(results: dict[str, list[RollResult]], args) -> None:
    print(
        f"\n(b) rolling restart: each of {args.roll_instances} instances in turn gets SIGTERM and "
        f"restarts with the same id and volume; {args.roll_keys:,} keys, 1 standby, "
        f"{args.rate:g} deposits/s; {args.repeat} run(s) per variant"
    )
    rows = []
    for name, runs in results.items():
        steps = [s for r in runs for s in r.restarts]
        own = [g for s in steps for g in s.own_gaps()]
        over = [g - s.restart_s for s in steps for g in s.own_gaps()]
        other = [g for s in steps for g in s.other_gaps()]
        rows.append(
            [
                name,
                len(steps),
                ",".join(str(s.rebalances) for s in steps),
                ",".join(str(s.assigned_lines) for s in steps),
                f"{median([s.restart_s for s in steps]):.2f}",
                f"{median([s.exited - s.sigterm for s in steps]):.2f}",
                f"{median(own):.2f} / {max(own):.2f}" if own else "n/a",
                f"{max(over):+.2f}" if over else "n/a",
                f"{max(other):.2f}" if other else "n/a",
                f"{int(median([s.restored for s in steps])):,}",
                f"{sum(r.lost for r in runs)} / {sum(r.duplicated for r in runs)}",
            ]
        )
    headers = [
        "variant",
        "restarts",
        "rebalances (others, per restart)",
        "'tasks assigned' lines (others)",
        "restart s (SIGTERM->ready, median)",
        "of which stop s",
        "gap s own partitions (median / max)",
        "gap - restart s (max)",
        "gap s other partitions (max)",
        "restored (median)",
        "lost / duplicated",
    ]
    print(table(headers, rows))
    if "static" in results:
        steps = [s for r in results["static"] for s in r.restarts]
        rebalances = sum(s.rebalances for s in steps)
        over = max((g - s.restart_s for s in steps for g in s.own_gaps()), default=None)
        ok = rebalances == 0 and over is not None and over <= GAP_MARGIN_S
        print(
            f"target rolling restart (static): 0 rebalances -> {rebalances}; gap per partition "
            f"<= restart + {GAP_MARGIN_S:g} s -> worst restart {_f(over)} s: "
            f"{'met' if ok else 'NOT met'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="kill,roll", help="kill and/or roll")
    parser.add_argument(
        "--keys", default="100000,1000000", help="comma-separated state sizes for kill -9"
    )
    parser.add_argument("--standbys", default="1", help="comma-separated, for kill -9")
    parser.add_argument(
        "--variants", default="dynamic,static,static+fd", help="for kill -9: " + ",".join(VARIANTS)
    )
    parser.add_argument("--roll-variants", default="dynamic,static", help="for the rolling restart")
    parser.add_argument("--roll-keys", type=int, default=100_000, help="state size, rolling")
    parser.add_argument("--roll-instances", type=int, default=2, help="instances restarted")
    parser.add_argument("--rate", type=float, default=200, help="deposits/s during the restarts")
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting; medians shown")
    parser.add_argument("--load-timeout", type=float, default=600, help="seconds to load N keys")
    parser.add_argument("--probe-timeout", type=float, default=180, help="seconds to wait for T1")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    sizes = [int(k) for k in args.keys.split(",")]
    standby_settings = [int(s) for s in args.standbys.split(",")]
    kill_variants = [VARIANTS[n] for n in args.variants.split(",") if n] if "kill" in parts else []
    roll_variants = [VARIANTS[n] for n in args.roll_variants.split(",") if n]
    roll_variants = roll_variants if "roll" in parts else []

    kills: dict[tuple[int, int, str], list[KillResult]] = {
        (k, s, v.name): [] for k in sizes for s in standby_settings for v in kill_variants
    }
    rolls: dict[str, list[RollResult]] = {v.name: [] for v in roll_variants}
    load_before = load_average()
    started = time.monotonic()
    with fresh_broker(keep=args.keep) as (bootstrap, root):
        for _ in range(args.repeat):  # interleaved: one of each, then again
            for keys in sizes:
                for standbys in standby_settings:
                    for variant in kill_variants:
                        kills[keys, standbys, variant.name].append(
                            kill_run(bootstrap, root, keys, standbys, variant, args)
                        )
            for variant in roll_variants:
                rolls[variant.name].append(roll_run(bootstrap, root, variant, args))
        load_after = load_average()
    print(
        f"failover and rolling restarts of the ledger, real processes, production settings "
        f"except where a variant says; {machine()}"
    )
    if kills:
        kill_report(kills, args.repeat)
    if rolls:
        roll_report(rolls, args)
    print(
        f"\n1-min load average: {load_before} before, {load_after} after; "
        f"{(time.monotonic() - started) / 60:.1f} min in total"
    )
    for runs in kills.values():
        for r in runs:
            for note in r.notes:
                print(f"note (kill, {r.keys:,} keys, {r.variant}): {note}")
    for runs in rolls.values():
        for r in runs:
            for note in r.notes:
                print(f"note (rolling restart, {r.variant}): {note}")


if __name__ == "__main__":
    main()
