"""The ledger as containers, for real: its image built with podman, two containers on Kafka.

Everything a deployment relies on is exercised, not just written down: the image builds from the
example's own Dockerfile with no network inside the build, its HEALTHCHECK passes, `podman stop`
ends an instance cleanly within the grace period (SIGTERM reaches Python through tini), and a
new container on the same state volume restores only the changelog tail. The model decides what
the balances must be. podman is installed here when missing (CI is a fresh Debian machine).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path

import pytest

from enhydra.devtools import image
from enhydra.testing.processes import (
    end_offsets,
    free_port,
    http_get,
    produce_json,
    wait_for_committed,
)
from ledger.workload import generate, model

pytestmark = [pytest.mark.slow, pytest.mark.containers]

LEDGER = Path(__file__).resolve().parents[2] / "examples" / "ledger"
GRACE_S = 30
# Short group timeouts, as in the process tests, so rebalances take seconds, not half a minute.
FAST_GROUP = {
    "ENHYDRA_PARTITIONS": "4",
    "ENHYDRA_SESSION_TIMEOUT_MS": "6000",
    "ENHYDRA_HEARTBEAT_INTERVAL_MS": "1000",
    "ENHYDRA_REBALANCE_TIMEOUT_MS": "10000",
    # No standby copies: every partition has one local copy, so "restored" is exact to compute.
    "ENHYDRA_NUM_STANDBY_REPLICAS": "0",
}


@pytest.fixture(scope="module")
def ledger_image() -> image.Built:
    """Prepare podman and the base image (once per machine), then build the ledger's image."""
    prepared = image.prepare()
    print(
        f"\nprepare: {prepared.seconds:.1f}s (installed: {' '.join(prepared.installed) or '-'}, "
        f"base image from {prepared.base_from})"
    )
    output: list[str] = []
    built = image.build(LEDGER, tag="localhost/ledger:containers-test", output=output.append)
    # `enhydra image build` streams this as it comes: the steps, pip's and podman's own lines.
    steps = [i for i, line in enumerate(output) if line.startswith("enhydra: ")]
    assert [output[i].split(":")[1] for i in steps] == [
        " making the wheelhouse",
        " building localhost/ledger",
    ], output
    assert steps[1] - steps[0] > 1, "pip said nothing"
    podman_steps = [line for line in output[steps[1] :] if re.search(r"STEP \d+/\d+: ", line)]
    assert podman_steps and "STEP 1/" in podman_steps[0], output[-20:]
    print(
        f"image {built.tag}: {built.size_mb:.0f} MB, built in {built.seconds:.1f}s "
        f"(wheelhouse {built.wheelhouse_seconds:.1f}s, podman build {built.image_seconds:.1f}s)"
    )
    return built


def feed(bootstrap: str, app_id: str, commands: list) -> None:
    asyncio.run(produce_json(bootstrap, f"{app_id}-commands", commands))
    asyncio.run(wait_for_committed(bootstrap, app_id, f"{app_id}-commands", timeout=120))


def read_balances(
    containers: list[image.Container], accounts: list[str], timeout: float = 60.0
) -> dict[str, dict]:
    """Every account through the containers' HTTP ports: one hosts it, the others answer 421."""
    found: dict[str, dict] = {}
    pending = list(accounts)
    deadline = time.monotonic() + timeout
    while pending:
        retry = []
        for account in pending:
            path = f"/v1/stores/accounts/keys/{account}?forward=false"  # no forwarding: one host
            answers = [http_get(c.url + path) for c in containers]
            if any(status == 503 for status, _ in answers):
                retry.append(account)  # a partition is moving right now: ask again
                continue
            owners = [(status, body) for status, body in answers if status != 421]
            assert len(owners) == 1, f"{account}: expected one host, got {answers}"
            status, body = owners[0]
            assert status in (200, 404), f"{account}: {answers}"
            if status == 200:
                found[account] = body
        pending = retry
        if pending and time.monotonic() > deadline:
            raise AssertionError(f"still 503 after {timeout}s for {pending[:5]}...")
        if pending:
            time.sleep(0.5)
    return found


def stats(container: image.Container) -> dict:
    status, body = http_get(container.url + "/v1/stats")
    assert status == 200, body
    return body


def active_partitions(body: dict) -> set[int]:
    """Partitions this instance processes (standby and warm-up copies have other roles)."""
    return {int(p) for p, t in body["tasks"].items() if t.get("role", "active") == "active"}


def log_records(name: str) -> list[dict]:
    """The container's log as JSON records; every line must be one (ENHYDRA_LOG_FORMAT=json)."""
    records = []
    for line in image.logs(name).splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"{name} logged a line that is not JSON: {line!r}") from None
    return records


def assert_clean_stop(done: image.Stopped) -> None:
    records = log_records(done.name)
    tail = "\n".join(json.dumps(r) for r in records[-8:])
    assert done.exit_code == 0, f"{done.name} exited {done.exit_code}:\n{tail}"
    assert done.seconds < GRACE_S, f"{done.name} took {done.seconds:.1f}s: SIGKILLed?\n{tail}"
    assert any(r.get("event") == "engine stopped" for r in records), tail
    assert records[-1].get("event") == "stopped" and records[-1].get("exit_code") == 0, tail


@pytest.mark.timeout(900)
def test_two_ledger_containers_stop_gracefully_and_restart_from_their_volume(
    ledger_image: image.Built, kafka_bootstrap: str, app_id: str
) -> None:
    group = f"ledger-ct-{uuid.uuid4().hex[:6]}"
    changelog = f"{app_id}-accounts-changelog"

    def container(index: int, zone: str, port: int) -> image.Container:
        name = f"{group}-{index}"
        return image.Container(name, name, zone, port, f"{name}-state", ledger_image.tag)

    def start(c: image.Container) -> None:
        env = image.container_env(
            bootstrap=kafka_bootstrap,
            instance_id=c.instance_id,
            zone=c.zone,
            port=c.port,
            app_id=app_id,
            extra=FAST_GROUP,
        )
        image.start_container(
            c.image, name=c.name, group=group, volume=c.volume, env=env, stop_timeout=GRACE_S
        )

    one, two = container(1, "a", free_port()), container(2, "b", free_port())
    try:
        for c in (one, two):
            start(c)
        for c in (one, two):
            print(f"{c.name} ready in {image.wait_ready(c):.1f}s")

        first = generate(300, 3000, seed=31, prefix="acct")
        feed(kafka_bootstrap, app_id, first)
        everyone = sorted({key for key, _ in first})
        assert read_balances([one, two], everyone) == model(first)
        both_worked = {c.name: stats(c)["processed"] for c in (one, two)}
        assert all(both_worked.values()), both_worked
        held_before = active_partitions(stats(one))
        usage = image.podman(
            "stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}", one.name, two.name
        ).stdout.split("\n")
        print("memory after 3000 commands:", "; ".join(line for line in usage if line))

        # Graceful stop: SIGTERM through tini, flush, commit, leave the group, exit 0.
        stopped = image.stop(one.name, GRACE_S)
        assert_clean_stop(stopped)
        print(f"podman stop {one.name}: {stopped.seconds:.2f}s, exit {stopped.exit_code}")
        at_stop = asyncio.run(end_offsets(kafka_bootstrap, changelog))

        # While it is gone, the other container takes every partition and moves on.
        second = generate(300, 2000, seed=32, prefix="acct")
        feed(kafka_bootstrap, app_id, second)

        # A new container on the same volume: only what was written meanwhile is restored.
        start(one)
        print(f"{one.name} ready again in {image.wait_ready(one):.1f}s")
        now = asyncio.run(end_offsets(kafka_bootstrap, changelog))
        after = stats(one)
        tasks = after["tasks"]
        restored = {p: tasks[str(p)]["restore"]["restored"] for p in active_partitions(after)}
        expected = {p: now[p] - (at_stop[p] if p in held_before else 0) for p in restored}
        full = sum(now[p] for p in restored)
        print(
            f"restore after restart: {sum(restored.values())} records of {full} in its "
            f"partitions {sorted(restored)} (held before the stop: {sorted(held_before)})"
        )
        assert restored == expected, (restored, expected, tasks)
        assert held_before & set(restored), "the restarted instance got none of its partitions"
        assert sum(restored.values()) < full, (restored, full)

        third = generate(300, 1000, seed=33, prefix="acct")
        feed(kafka_bootstrap, app_id, third)
        commands = first + second + third
        accounts = sorted({key for key, _ in commands})
        assert read_balances([one, two], accounts) == model(commands)

        shutdowns = []
        for c in (two, one):
            done = image.stop(c.name, GRACE_S)
            assert_clean_stop(done)
            shutdowns.append(done.seconds)
        print(
            f"image {ledger_image.size_mb:.0f} MB, build {ledger_image.seconds:.1f}s, "
            f"graceful stops {stopped.seconds:.2f}s then "
            + ", ".join(f"{s:.2f}s" for s in shutdowns)
        )
    finally:
        image.remove([one.name, two.name], volumes=[one.volume, two.volume])
