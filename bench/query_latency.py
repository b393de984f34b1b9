"""Key query latency: answered locally vs forwarded to the owning instance, side by side.

    .venv/bin/python bench/query_latency.py                     # 1000 req/s, 3 x 10 s per kind
    .venv/bin/python bench/query_latency.py --rate 500 --seconds 5 --rounds 3

Two ledger instances (real processes, 4 partitions, no standbys) on a fresh broker hold
`--accounts` accounts. An open-loop load generator on loopback (aiohttp, keep-alive) sends
`--rate` GET /v1/stores/accounts/keys/<key> per second to instance A: "local" asks for keys
whose partition A runs, "forwarded" for keys that B runs, so A forwards each request once.
Latency is measured from the moment a request was due, not when it was sent, so a generator
or server falling behind shows up in the numbers instead of hiding (coordinated omission).
The kinds alternate in rounds so drift on a shared machine hits both, and each ratio is the
median of the per-round ratios (at least 3 rounds); every request is bounded by a 5 s timeout
and the run by rounds x seconds. The CPU time each instance spent
per request (from /proc) is printed too: unlike the tail latencies, it does not depend on
what else the machine is running.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from common import fresh_broker, load_average, machine, progress, table

from enhydra.testing.processes import ServiceProcess, produce_json, service_env, wait_for_committed

TARGET = "ledger.service:service"
PARTITIONS = 4


def cpu_seconds(instance: ServiceProcess) -> float:
    """User + system CPU time of an instance process so far (Linux /proc)."""
    assert instance.process is not None
    fields = Path(f"/proc/{instance.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def open_loop(
    session: aiohttp.ClientSession, url: str, keys: list[str], rate: int, seconds: float
) -> tuple[list[float], int, float]:
    """Send rate x seconds requests on schedule; (latencies in ms, errors, achieved rate)."""
    count = int(rate * seconds)
    rng = random.Random(count)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = 0

    async def one(due: float, key: str) -> None:
        nonlocal errors
        try:
            async with session.get(f"{url}/v1/stores/accounts/keys/{key}") as response:
                await response.read()
                if response.status != 200:
                    errors += 1
                    return
        except (aiohttp.ClientError, TimeoutError):
            errors += 1
            return
        latencies.append((loop.time() - due) * 1000)

    start = loop.time() + 0.05
    tasks = []
    for i in range(count):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due, rng.choice(keys))))
    await asyncio.gather(*tasks)
    return latencies, errors, count / (loop.time() - start)


async def measure(args: argparse.Namespace, a: ServiceProcess, b: ServiceProcess, keys):
    connector = aiohttp.TCPConnector(limit=200)
    timeout = aiohttp.ClientTimeout(total=5)
    results: dict[str, dict] = {
        k: {"lat": [], "rounds": [], "errors": 0, "rates": [], "cpu_a": 0.0, "cpu_b": 0.0}
        for k in keys
    }
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        progress("warming up (2 s, both kinds)")
        await open_loop(session, a.url, keys["local"] + keys["forwarded"], args.rate, 2)
        for round_ in range(args.rounds):
            for kind in ("local", "forwarded") if round_ % 2 == 0 else ("forwarded", "local"):
                before = cpu_seconds(a), cpu_seconds(b)
                latencies, errors, achieved = await open_loop(
                    session, a.url, keys[kind], args.rate, args.seconds
                )
                results[kind]["cpu_a"] += cpu_seconds(a) - before[0]
                results[kind]["cpu_b"] += cpu_seconds(b) - before[1]
                results[kind]["lat"] += latencies
                results[kind]["rounds"].append(latencies)
                results[kind]["errors"] += errors
                results[kind]["rates"].append(achieved)
                progress(
                    f"round {round_ + 1} {kind}: {len(latencies)} ok, {errors} errors, "
                    f"{achieved:.0f} req/s, p50 {percentile(latencies, 0.5):.2f} ms"
                )
    return results


def pick_keys(a: ServiceProcess, accounts: list[str]) -> dict[str, list[str]]:
    from enhydra.contracts.partitioner import partition_for
    from enhydra.testing.processes import http_get

    status, meta = http_get(a.url + "/v1/metadata")
    assert status == 200, meta
    mine = next(i for i in meta["instances"] if i["id"] == a.instance_id)
    local = set(mine["stores"]["accounts"]["active"])
    assert 0 < len(local) < PARTITIONS, f"A should run some but not all partitions: {local}"
    keys: dict[str, list[str]] = {"local": [], "forwarded": []}
    for account in accounts:
        kind = "local" if partition_for(account.encode(), PARTITIONS) in local else "forwarded"
        keys[kind].append(account)
    return keys


def run(args: argparse.Namespace, bootstrap: str, root: Path) -> None:
    app_id = f"bench-query-{uuid.uuid4().hex[:6]}"
    instances = []
    for name in ("a", "b"):
        env = service_env(
            app_id=app_id,
            bootstrap=bootstrap,
            instance_id=name,
            state_dir=root / f"state-{name}",
            partitions=PARTITIONS,
            extra={"ENHYDRA_LOG_LEVEL": "warning"},
        )
        instances.append(ServiceProcess(TARGET, env, root / f"{name}.log").start())
    try:
        for inst in instances:
            inst.wait_ready(120)
        accounts = [f"acct-{i:06d}" for i in range(args.accounts)]
        opens = [(k, {"command_id": f"open-{k}", "type": "open", "account": k}) for k in accounts]
        progress(f"opening {len(accounts)} accounts")
        asyncio.run(produce_json(bootstrap, f"{app_id}-commands", opens))
        asyncio.run(wait_for_committed(bootstrap, app_id, f"{app_id}-commands", timeout=120))
        deadline = time.monotonic() + 60
        while True:  # both instances ready, group settled: no rebalance during the run
            try:
                keys = pick_keys(instances[0], accounts)
                if all(inst.get("/health/ready")[0] == 200 for inst in instances):
                    break
            except (AssertionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the two instances did not settle")
            time.sleep(0.5)
        progress(f"{len(keys['local'])} local and {len(keys['forwarded'])} forwarded keys on A")
        results = asyncio.run(measure(args, instances[0], instances[1], keys))
    finally:
        for inst in instances:
            inst.stop()
    rows = []
    for kind in ("local", "forwarded"):
        lat, res = results[kind]["lat"], results[kind]
        rows.append(
            [
                kind,
                len(lat),
                res["errors"],
                f"{statistics.mean(res['rates']):.0f}",
                f"{percentile(lat, 0.5):.2f}",
                f"{percentile(lat, 0.9):.2f}",
                f"{percentile(lat, 0.99):.2f}",
                f"{percentile(lat, 0.999):.2f}",
                f"{max(lat):.2f}",
                f"{res['cpu_a'] * 1000 / max(1, len(lat)):.3f}",
                f"{res['cpu_b'] * 1000 / max(1, len(lat)):.3f}",
            ]
        )
    print()
    print(f"key queries at {args.rate} req/s, {args.rounds} x {args.seconds} s per kind")
    print(f"machine: {machine()}; load average {load_average()}")
    headers = ["kind", "ok", "errors", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"]
    headers += ["A cpu ms/req", "B cpu ms/req"]
    print(table(headers, rows))
    per_round = list(zip(results["forwarded"]["rounds"], results["local"]["rounds"], strict=True))

    def ratio(q: float) -> float:
        return statistics.median(percentile(f, q) / percentile(l_, q) for f, l_ in per_round)

    print(
        f"forwarded / local (median of {len(per_round)} per-round ratios): "
        f"p50 x{ratio(0.5):.2f}, p99 x{ratio(0.99):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="requests per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="per kind and round")
    parser.add_argument("--rounds", type=int, default=3, help="per kind (at least 3)")
    parser.add_argument("--accounts", type=int, default=2000)
    parser.add_argument("--bootstrap", help="use this broker instead of starting a fresh one")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: every ratio is a median of 3 or more rounds")
    if args.bootstrap:
        with tempfile.TemporaryDirectory(prefix="enhydra-bench-") as tmp:
            run(args, args.bootstrap, Path(tmp))
        return
    with fresh_broker() as (bootstrap, root):
        run(args, bootstrap, root)


if __name__ == "__main__":
    main()
