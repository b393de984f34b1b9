"""State that survives: standby takeover, tag-aware standbys, warm-up on scale-out, exactly-once.

Real broker, real processes, kill -9 where a crash is meant. The ledger model decides what
correct means; `version` counts applied events, so any double apply shows.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time

import pytest

from enhydra.testing.processes import (
    ServiceProcess,
    end_offsets,
    produce_json,
    read_topic,
    wait_for_committed,
)
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, produce_in_chunks, read_accounts

pytestmark = pytest.mark.integration

TARGET = "ledger.service:service"


def stats(instance: ServiceProcess) -> dict:
    status, body = instance.get("/v1/stats")
    assert status == 200, body
    return body


def wait_until(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except OSError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.25)


def roles(instance: ServiceProcess) -> dict[int, str]:
    return {int(p): t["role"] for p, t in stats(instance)["tasks"].items()}


def standbys_current(instances: list[ServiceProcess]) -> bool:
    for inst in instances:
        for task in stats(inst)["tasks"].values():
            if task["role"] != "active" and (task["lag"] is None or task["lag"] > 0):
                return False
    return True


@pytest.mark.parametrize("standbys", [1, 0], ids=["with-standby", "without-standby"])
def test_kill_dash_nine_fails_over_and_the_state_stays_exact(
    standbys, service_factory, kafka_bootstrap, app_id
):
    env = {"ENHYDRA_NUM_STANDBY_REPLICAS": str(standbys)}
    one = service_factory(TARGET, "one", extra_env=env)
    two = service_factory(TARGET, "two", extra_env=env)
    one.wait_ready()
    two.wait_ready()
    commands = generate(1500, 12000, seed=31)
    feed(kafka_bootstrap, app_id, commands[:8000])
    wait_until(lambda: standbys_current([one, two]), what="standbys to catch up")
    lost = [p for p, role in roles(two).items() if role == "active"]
    assert lost, "the instance to kill runs no active task"
    if standbys:
        assert all(roles(one)[p] == "standby" for p in lost)

    changelog = asyncio.run(end_offsets(kafka_bootstrap, f"{app_id}-accounts-changelog"))
    two.kill()
    started = time.monotonic()
    feed(kafka_bootstrap, app_id, commands[8000:])
    took = time.monotonic() - started

    tasks = stats(one)["tasks"]
    restored = {p: tasks[str(p)]["restore"].get("restored", 0) for p in lost}
    print(
        f"standbys={standbys}: takeover restored {restored} of {changelog}; "
        f"the rest processed {took:.1f}s after the kill"
    )
    for p in lost:
        assert tasks[str(p)]["role"] == "active"
        if standbys:
            assert restored[p] == 0, "a caught-up standby takes over without a restore"
        else:
            assert restored[p] == changelog[p], "no standby: the whole changelog is restored"
    expected = model(commands)
    assert read_accounts([one], sorted(expected)) == expected


def test_four_instances_in_two_zones_put_every_standby_in_the_other_zone(service_factory):
    zones = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    instances = [
        service_factory(
            TARGET,
            name,
            partitions=8,
            extra_env={
                "ENHYDRA_CLIENT_TAGS": f"zone={zone}",
                "ENHYDRA_RACK_AWARE_ASSIGNMENT_TAGS": "zone",
                "ENHYDRA_NUM_STANDBY_REPLICAS": "1",
            },
        )
        for name, zone in zones.items()
    ]

    for inst in instances:
        inst.wait_ready()

    def settled() -> bool:
        seen = [roles(i) for i in instances if stats(i)["ready"]]
        actives = sorted(p for r in seen for p, role in r.items() if role == "active")
        standbys = sorted(p for r in seen for p, role in r.items() if role == "standby")
        return len(seen) == 4 and actives == list(range(8)) and standbys == list(range(8))

    wait_until(settled, timeout=90, what="4 instances with 8 actives and 8 standbys")
    placement: dict[int, dict[str, str]] = {}
    for inst in instances:
        for partition, role in roles(inst).items():
            placement.setdefault(partition, {})[role] = zones[inst.instance_id]
    print("zone of active/standby per partition:", placement)
    for partition, where in placement.items():
        assert where["active"] != where["standby"], f"partition {partition}: {where}"
    counts = [sum(1 for r in roles(i).values() if r == "active") for i in instances]
    assert max(counts) - min(counts) <= 1, counts


@pytest.mark.slow
def test_scale_out_warms_up_first_and_moves_only_caught_up_tasks(
    service_factory, kafka_bootstrap, app_id
):
    acceptable = 2000
    env = {
        "ENHYDRA_NUM_STANDBY_REPLICAS": "0",
        "ENHYDRA_ACCEPTABLE_RECOVERY_LAG": str(acceptable),
        "ENHYDRA_PROBING_REBALANCE_INTERVAL_MS": "5000",
    }
    first = service_factory(TARGET, "first", extra_env=env)
    first.wait_ready()
    keys = 100_000
    opens = generate(keys, keys, seed=41, prefix="k")  # the first 95% are opens
    feed(kafka_bootstrap, app_id, opens)
    changelog_before = asyncio.run(end_offsets(kafka_bootstrap, f"{app_id}-accounts-changelog"))

    # Commands keep flowing during the scale-out: ~800/s of deposits on random accounts.
    rng = random.Random(5)
    flowing: list[tuple[str, dict]] = []
    stop = threading.Event()

    def keep_sending() -> None:
        n = 0
        while not stop.is_set():
            chunk = []
            for _ in range(80):
                n += 1
                account = f"k-{rng.randrange(keys * 95 // 100):06d}"
                chunk.append(
                    (
                        account,
                        {
                            "command_id": f"flow-{n}",
                            "type": "deposit",
                            "account": account,
                            "amount": 1,
                        },
                    )
                )
            asyncio.run(produce_json(kafka_bootstrap, f"{app_id}-commands", chunk))
            flowing.extend(chunk)
            time.sleep(0.1)

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        time.sleep(2)
        window_start = time.time()
        second = service_factory(TARGET, "second", extra_env=env)
        wait_until(
            lambda: second.alive() and second.get("/health/ready")[0] == 200,
            timeout=60,
            what="second instance to join",
        )
        first_view = roles(second)
        wait_until(
            lambda: "active" in roles(second).values(),
            timeout=120,
            what="a task to move to the new instance",
        )
        time.sleep(3)
    finally:
        stop.set()
        sender.join()
    window_end = time.time()
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=120))

    # The newcomer first got warm-ups only; tasks moved after, restoring only a short tail.
    assert "active" not in first_view.values() and "warmup" in first_view.values(), first_view
    moved = {int(p): t for p, t in stats(second)["tasks"].items() if t["role"] == "active"}
    for partition, task in moved.items():
        restored = task["restore"].get("restored", 0)
        print(
            f"partition {partition}: restored {restored} on takeover "
            f"(changelog {changelog_before[partition]} before the scale-out)"
        )
        assert restored <= acceptable + 3000 < changelog_before[partition]

    # Longest gap between consecutive events of a partition while commands were flowing.
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    stamps: dict[int, list[float]] = {}
    for record in events:
        ts = record.timestamp / 1000
        if window_start <= ts <= window_end:
            stamps.setdefault(record.partition, []).append(ts)
    gaps = {p: max(b - a for a, b in itertools.pairwise(ts)) for p, ts in stamps.items()}
    longest = max(gaps.values())
    print(f"longest gap in processing during scale-out: {longest:.2f}s (per partition {gaps})")
    assert longest < 12, "processing stopped for longer than a rebalance"

    everything = opens + flowing
    expected = model(everything)
    sample = random.Random(1).sample(sorted(expected), 2000)
    assert read_accounts([first, second], sample) == {k: expected[k] for k in sample}
    assert len(events) == sum(state["version"] for state in expected.values())


@pytest.mark.slow
def test_exactly_once_outputs_survive_kill_dash_nine(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    env = {"ENHYDRA_PROCESSING_GUARANTEE": "exactly_once"}
    commands = generate(500, 10000, seed=51)
    one = service_factory(TARGET, "eos", state_dir=tmp_path / "eos", extra_env=env)
    one.wait_ready()

    def produce_slowly():
        return produce_in_chunks(kafka_bootstrap, f"{app_id}-commands", commands, pause=0.2)

    async def kill_midway() -> None:
        await asyncio.sleep(1.0)
        one.kill()

    async def both() -> None:
        await asyncio.gather(produce_slowly(), kill_midway())

    asyncio.run(both())
    again = service_factory(TARGET, "eos-again", state_dir=tmp_path / "eos", extra_env=env)
    again.wait_ready()
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=120))

    expected = model(commands)
    assert read_accounts([again], sorted(expected)) == expected
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    rejections = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-rejections"))
    # read_committed readers see every output exactly once, crash or not.
    assert len(events) == sum(state["version"] for state in expected.values())
    assert len(events) + len(rejections) == len(commands)
