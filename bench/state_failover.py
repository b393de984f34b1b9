"""Failover time after kill -9: a caught-up standby vs a restore from the changelog, one run.

    .venv/bin/python bench/state_failover.py                      # 100k and 1M keys, 3 kills each
    .venv/bin/python bench/state_failover.py --keys 100000 --standbys 1,0 --repeat 1

For each size, standby setting and repeat, on a fresh app id: two ledger instances (real
processes, 4 partitions, the short test timeouts of `service_env`: session 6 s, heartbeat 1 s)
load N accounts through the service (N `open` commands); once committed, and once every
standby has lag 0, one instance is killed with SIGKILL at T0 and a deposit is sent at once to
an account on a partition that instance was running. T1 is the create time of the survivor's
event for that command (found by its `enhydra.command_id` header on the events topic);
"key updated" is when the survivor's HTTP API first shows the deposit. The survivor's log
splits T1 - T0 into detection (until it is told to rebalance: the session timeout), rebalance
(until it is assigned the lost tasks), assigned->running (until the probed partition runs: its
restore, or a standby's promotion) and the probe itself. "restore s" and "restore rec/s" are
its /v1/stats restore numbers for all lost partitions, read once they all run.

Both settings run on the same broker, machine and load, so the ratio is the standby's gain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from common import fresh_broker, load_average, machine, median, produce_fast, progress, table

from enhydra.contracts.partitioner import partition_for
from enhydra.testing.processes import ServiceProcess, service_env, wait_for_committed

TARGET = "ledger.service:service"
PARTITIONS = 4
# The timeouts service_env gives every instance; they bound the detection time, so they are
# printed next to the results.
_ENV = service_env(app_id="x", bootstrap="x:1", instance_id="x", state_dir=Path("."), web_port=1)
SESSION_TIMEOUT_S = int(_ENV["ENHYDRA_SESSION_TIMEOUT_MS"]) / 1000
HEARTBEAT_S = int(_ENV["ENHYDRA_HEARTBEAT_INTERVAL_MS"]) / 1000


@dataclass
class Result:
    keys: int
    standbys: int
    load_s: float
    outage_s: float
    detect_s: float | None
    rebalance_s: float | None
    restore_s: float | None
    process_s: float | None
    restored: int
    restore_rate: float
    restore_stats_s: float
    probe_version: int | None
    query_s: float
    notes: list[str] = field(default_factory=list)
    after_detect_s: float | None = None


def opens(keys: int):
    """N `open` commands: the state of N accounts, one changelog record each."""
    for i in range(keys):
        account = f"acct-{i:06d}"
        body = {"command_id": f"open-{i}", "type": "open", "account": account}
        yield account.encode(), orjson.dumps(body), []


def stats(instance: ServiceProcess) -> dict[str, Any]:
    status, body = instance.get("/v1/stats")
    if status != 200:
        raise RuntimeError(f"{instance.instance_id} /v1/stats answered {status}: {body}")
    return body


def roles(instance: ServiceProcess) -> dict[int, str]:
    return {int(p): t["role"] for p, t in stats(instance)["tasks"].items()}


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)


def settled(instances: list[ServiceProcess], standbys: int) -> bool:
    """Two actives each, and (with standbys) every other task followed as a standby."""
    for inst in instances:
        r = list(roles(inst).values())
        if r.count("active") != PARTITIONS // 2 or r.count("standby") != standbys * 2:
            return False
        if not stats(inst)["ready"]:
            return False
    return True


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


async def kill_and_probe(
    bootstrap: str, app: str, victim: ServiceProcess, probe_key: str, timeout: float
) -> tuple[float, float, str]:
    """SIGKILL the victim, send one deposit, return (T0, T1, command id): epoch seconds."""
    partition = partition_for(probe_key.encode(), PARTITIONS)
    events = TopicPartition(f"{app}-events", partition)
    tail = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await tail.start()
    await producer.start()
    try:
        tail.assign([events])
        await tail.seek_to_end(events)
        await tail.position(events)
        await producer.partitions_for(f"{app}-commands")  # metadata ready before T0
        command_id = f"probe-{uuid.uuid4().hex[:8]}"
        body = {"command_id": command_id, "type": "deposit", "account": probe_key, "amount": 1}
        t0 = time.time()
        victim.kill()
        await producer.send_and_wait(
            f"{app}-commands", orjson.dumps(body), key=probe_key.encode(), partition=partition
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = await tail.getmany(events, timeout_ms=200)
            for record in batch.get(events, []):
                headers = dict(record.headers or ())
                if headers.get("enhydra.command_id") == command_id.encode():
                    return t0, record.timestamp / 1000, command_id
        raise TimeoutError(f"probe {command_id} not processed {timeout:.0f}s after the kill")
    finally:
        await producer.stop()
        await tail.stop()


def query_visible(instance: ServiceProcess, key: str, timeout: float = 10.0) -> tuple[Any, float]:
    """Poll the survivor until the key shows the probe's deposit (version 2): (version, when).

    The engine publishes events, then the changelog, then writes RocksDB, so the event can be
    on the topic a moment before the key answers with its new version.
    """
    deadline = time.monotonic() + timeout
    version = None
    while time.monotonic() < deadline:
        status, body = instance.get(f"/v1/stores/accounts/keys/{key}")
        version = body.get("version") if status == 200 else None
        if version == 2:
            break
        time.sleep(0.01)
    return version, time.time()


def breakdown(
    log_path: Path, t0: float, t1: float, lost: list[int], probed: int
) -> tuple[float | None, float | None, float | None, float | None]:
    """(detect, rebalance, restore, process) seconds from the survivor's log after T0.

    "restore" ends when the probed partition runs: its `restore finished`, or for a copy with
    nothing to restore (a caught-up standby) the `all active tasks running` line. The other
    lost partition may still be restoring when the probe is processed.
    """
    revoked = assigned = finished = all_running = None
    for ts, event in log_events(log_path, t0):
        name = event.get("event")
        if name == "partitions revoked" and revoked is None:
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
    detect = revoked - t0 if revoked else None
    rebalance = assigned - revoked if assigned and revoked else None
    restore = running - assigned if running and assigned else None
    process = t1 - running if running else None
    return detect, rebalance, restore, process


def scenario(
    bootstrap: str, root: Path, keys: int, standbys: int, args: argparse.Namespace
) -> Result:
    app = f"fo-{keys}-s{standbys}-{uuid.uuid4().hex[:6]}"
    extra = {"ENHYDRA_NUM_STANDBY_REPLICAS": str(standbys)}
    instances = []
    for name in ("one", "two"):
        env = service_env(
            app_id=app,
            bootstrap=bootstrap,
            instance_id=name,
            state_dir=root / app / name,
            partitions=PARTITIONS,
            extra=extra,
        )
        instances.append(ServiceProcess(TARGET, env, root / app / f"{name}.log").start())
    survivor, victim = instances
    try:
        for inst in instances:
            inst.wait_ready(timeout=90)
        wait_until(lambda: settled(instances, standbys), 90, "2 + 2 actives (and standbys)")
        rebalances = [stats(inst)["rebalances"] for inst in instances]
        progress(f"[{keys:,} keys, standbys={standbys}] loading {keys:,} opens via the service")
        started = time.monotonic()
        asyncio.run(produce_fast(bootstrap, f"{app}-commands", opens(keys), PARTITIONS))
        produced = time.monotonic() - started
        asyncio.run(
            wait_for_committed(bootstrap, app, f"{app}-commands", timeout=args.load_timeout)
        )
        load_s = time.monotonic() - started
        progress(
            f"  produced in {produced:.1f}s, processed and committed in {load_s:.1f}s "
            f"= {keys / load_s:,.0f} commands/s through 2 instances"
        )
        if standbys:
            wait_until(lambda: standbys_current(instances), args.load_timeout, "standby lag 0")
            progress(f"  standbys caught up {time.monotonic() - started:.1f}s after the start")
        pairs = zip(instances, rebalances, strict=True)
        moved = [stats(inst)["rebalances"] - n for inst, n in pairs]
        lost = sorted(p for p, r in roles(victim).items() if r == "active")
        if standbys and not all(roles(survivor).get(p) == "standby" for p in lost):
            raise RuntimeError(f"survivor holds no standby of {lost}: {roles(survivor)}")
        probe_key = next(
            f"acct-{i:06d}"
            for i in range(keys)
            if partition_for(f"acct-{i:06d}".encode(), PARTITIONS) in lost
        )
        progress(f"  kill -9 {victim.instance_id} (active {lost}); probe {probe_key}")
        t0, t1, _ = asyncio.run(
            kill_and_probe(bootstrap, app, victim, probe_key, args.probe_timeout)
        )
        outage = t1 - t0
        version, t_query = query_visible(survivor, probe_key)
        # The probe's partition can run before the other lost one has finished restoring:
        # wait for all of them, so the log and the restore numbers below are complete.
        wait_until(
            lambda: all(stats(survivor)["tasks"][str(p)]["status"] == "running" for p in lost),
            args.probe_timeout,
            "every lost task running on the survivor",
        )
        probed = partition_for(probe_key.encode(), PARTITIONS)
        detect, rebalance, restore, process = breakdown(survivor.log_path, t0, t1, lost, probed)
        tasks = stats(survivor)["tasks"]
        restored = sum(int(tasks[str(p)]["restore"].get("restored", 0)) for p in lost)
        restore_rs = [tasks[str(p)]["restore"] for p in lost]
        # per-partition restores run together: the aggregate rate is the sum of their rates
        rate = sum(float(r.get("rate", 0.0)) for r in restore_rs)
        restore_stats = max(
            (r["restored"] / r["rate"] for r in restore_rs if r.get("rate")), default=0.0
        )
        result = Result(
            keys,
            standbys,
            load_s,
            outage,
            detect,
            rebalance,
            restore,
            process,
            restored,
            rate,
            restore_stats,
            version,
            t_query - t0,
        )
        if version != 2:
            result.notes.append(f"probe account still at version {version} 10 s after T1")
        if any(moved):
            # Tasks may have moved while loading (e.g. a missed heartbeat on a busy machine):
            # the survivor may then hold an old local copy and restore only its tail.
            result.notes.append(f"rebalances while loading (one, two): {moved}")
        if restore is None:
            result.notes.append(f"no readiness in the survivor's log: {survivor.log_path}")
        progress(
            f"  T1-T0 = {outage:.2f}s, key updated at +{t_query - t0:.2f}s; detect {_s(detect)}, "
            f"rebalance {_s(rebalance)}, assigned->running {_s(restore)} "
            f"({restored:,} records restored in {restore_stats:.2f}s), probe {_s(process)}"
        )
        return result
    finally:
        for inst in instances:
            with contextlib.suppress(TimeoutError):
                inst.stop(timeout=30)


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keys", default="100000,1000000", help="comma-separated state sizes (accounts)"
    )
    parser.add_argument(
        "--standbys", default="1,0", help="comma-separated ENHYDRA_NUM_STANDBY_REPLICAS values"
    )
    parser.add_argument("--repeat", type=int, default=3, help="kills per setting; medians shown")
    parser.add_argument("--load-timeout", type=float, default=600, help="seconds to load N keys")
    parser.add_argument("--probe-timeout", type=float, default=180, help="seconds to wait for T1")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores)")
    args = parser.parse_args()
    sizes = [int(k) for k in args.keys.split(",")]
    settings = [int(s) for s in args.standbys.split(",")]

    # Interleaved (with, without, with, ...) so a change in machine load hits both settings.
    by_setting: dict[tuple[int, int], list[Result]] = {(k, s): [] for k in sizes for s in settings}
    load_before = load_average()
    with fresh_broker(keep=args.keep) as (bootstrap, root):
        for keys in sizes:
            for _ in range(args.repeat):
                for standbys in settings:
                    by_setting[keys, standbys].append(
                        scenario(bootstrap, root, keys, standbys, args)
                    )
        load_after = load_average()
    results = list(by_setting.values())

    def med(runs: list[Result], attr: str) -> float | None:
        values = [getattr(r, attr) for r in runs if getattr(r, attr) is not None]
        return median(values) if values else None

    # After detection: what the survivor does once it knows (rebalance, restore, probe). The
    # detection itself is the session timeout and does not depend on standbys.
    for runs in results:
        for r in runs:
            r.after_detect_s = r.outage_s - r.detect_s if r.detect_s is not None else None
    base = {r[0].keys: r for r in results if r[0].standbys == 0}
    rows = []
    for runs in results:
        first, outage, after = runs[0], med(runs, "outage_s"), med(runs, "after_detect_s")
        ref = base.get(first.keys)
        ref_outage = med(ref, "outage_s") if ref else None
        ref_after = med(ref, "after_detect_s") if ref else None
        rows.append(
            [
                f"{first.keys:,}",
                first.standbys,
                f"{outage:.2f}",
                f"{outage / ref_outage:.2f}" if ref_outage else "n/a",
                _f(med(runs, "detect_s")),
                _f(after),
                f"{after / ref_after:.2f}" if after and ref_after else "n/a",
                _f(med(runs, "rebalance_s")),
                _f(med(runs, "restore_s")),
                f"{int(med(runs, 'restored') or 0):,}",
                _f(med(runs, "restore_stats_s")),
                f"{med(runs, 'restore_rate') or 0:,.0f}",
                f"{med(runs, 'load_s'):.0f} ({first.keys / med(runs, 'load_s'):,.0f}/s)",
            ]
        )
    print(
        f"failover after kill -9, 2 instances, {PARTITIONS} partitions, session timeout "
        f"{SESSION_TIMEOUT_S:g} s, heartbeat {HEARTBEAT_S:g} s; {machine()}"
    )
    print(
        f"median of {args.repeat} kill(s) per row; ratios are with / without standby "
        "(1.00 = the no-standby row itself)"
    )
    headers = [
        "keys",
        "standbys",
        "T1-T0 s",
        "ratio",
        "detect s",
        "after detect s",
        "ratio",
        "rebalance s",
        "assigned->running s",
        "restored",
        "restore s",
        "restore rec/s",
        "load s (rate)",
    ]
    print(table(headers, rows))
    lag = [r.query_s - r.outage_s for runs in results for r in runs]
    probe = [r.process_s for runs in results for r in runs if r.process_s is not None]
    print(
        f"running -> probe event: max {max(probe, default=0):.2f} s; event -> key readable "
        f"over HTTP: median {median(lag):.3f} s, max {max(lag):.3f} s"
    )
    print(f"1-min load average: {load_before} before, {load_after} after the measurements")
    for runs in results:
        for r in runs:
            for note in r.notes:
                print(f"note ({r.keys:,} keys, standbys={r.standbys}): {note}")


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
