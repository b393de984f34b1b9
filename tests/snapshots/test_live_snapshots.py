"""Live snapshots, clones and time travel against a real broker and real instances."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
import threading
import time

import orjson
import pytest

from enhydra.contracts.codec import decode_entry
from enhydra.snapshots.format import open_snapshot
from enhydra.testing.processes import produce_json, read_topic, wait_for_committed
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, read_accounts
from tests.snapshots.support import cli, create_snapshot

pytestmark = pytest.mark.integration

TARGET = "ledger.service:service"


def states(snapshot) -> dict[str, dict]:
    out = {}
    for partition in snapshot.partitions:
        for key, value in snapshot.iter_partition(partition):
            out[key.decode()] = decode_entry(value).state
    return out


def commands_before(bootstrap: str, topic: str, cut: dict[int, int]) -> list[tuple[str, dict]]:
    """The commands the snapshot must contain: per partition, those before the cut."""
    records = asyncio.run(read_topic(bootstrap, topic))
    records.sort(key=lambda r: (r.partition, r.offset))
    return [(r.key.decode(), orjson.loads(r.value)) for r in records if r.offset < cut[r.partition]]


def test_snapshot_under_load_equals_a_replay_of_the_commands_before_the_cut(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    storage = tmp_path / "snapshots"
    env = {"ENHYDRA_SNAPSHOT_STORAGE": str(storage)}
    instances = [service_factory(TARGET, n, extra_env=env) for n in ("a", "b")]
    for inst in instances:
        inst.wait_ready()
    pool = generate(600, 40000, seed=81)
    feed(kafka_bootstrap, app_id, pool[:4000])

    stop = threading.Event()
    sent = [4000]

    def keep_sending() -> None:
        """Commands keep arriving until the snapshot is done, however long it takes."""
        for start in range(4000, len(pool), 500):
            if stop.is_set():
                return
            asyncio.run(
                produce_json(kafka_bootstrap, f"{app_id}-commands", pool[start : start + 500])
            )
            sent[0] = start + 500
            time.sleep(0.1)

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        time.sleep(0.5)
        info = create_snapshot(app_id, kafka_bootstrap, str(storage))
    finally:
        stop.set()
        sender.join()
    commands = pool[: sent[0]]
    snap = open_snapshot(storage / info["id"])
    cut = snap.manifest.cut.offsets
    total = sum(cut.values())
    print(
        f"snapshot {info['id']}: {info['rows']} rows, cut {cut} ({total} commands) "
        f"in {info['seconds']}s"
    )
    assert 4000 <= total < len(commands), "the cut fell while commands were flowing"
    before = commands_before(kafka_bootstrap, f"{app_id}-commands", cut)
    assert states(snap) == model(before)

    # The service kept running and ends with every command.
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=120))
    expected = model(commands)
    assert read_accounts(instances, sorted(expected)) == expected


def test_a_clone_follows_its_source_on_the_same_input_and_diverges_on_its_own(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    storage = tmp_path / "snapshots"
    source = service_factory(TARGET, "src", extra_env={"ENHYDRA_SNAPSHOT_STORAGE": str(storage)})
    source.wait_ready()
    first = generate(300, 3000, seed=91)
    feed(kafka_bootstrap, app_id, first)
    info = create_snapshot(app_id, kafka_bootstrap, str(storage))
    location = str(storage / info["id"])

    # Clone 1 reads the source's commands from the cut: it must end where the source ends.
    twin = f"{app_id}-twin"
    out = cli(
        "snapshot",
        "clone",
        location,
        TARGET,
        "--to-app",
        twin,
        "--bootstrap",
        kafka_bootstrap,
    )
    assert "cloned" in out.stdout
    later = generate(300, 2000, seed=92)
    feed(kafka_bootstrap, app_id, later)
    clone = service_factory(
        TARGET,
        "twin",
        extra_env={"ENHYDRA_APP_ID": twin, "ENHYDRA_COMMANDS_TOPIC": f"{app_id}-commands"},
    )
    clone.wait_ready()
    asyncio.run(wait_for_committed(kafka_bootstrap, twin, f"{app_id}-commands", timeout=120))
    expected = model(first + later)
    assert read_accounts([clone], sorted(expected)) == expected
    _, stats = clone.get("/v1/stats")
    assert stats["processed"] == 2000, "the clone processed only what came after the cut"

    # Clone 2 gets its own input and different commands: it diverges, the source does not move.
    other = f"{app_id}-other"
    cli(
        "snapshot",
        "clone",
        location,
        "--to-app",
        other,
        "--commands-topic",
        f"{other}-commands",
        "--bootstrap",
        kafka_bootstrap,
    )
    diverging = service_factory(
        TARGET,
        "other",
        extra_env={"ENHYDRA_APP_ID": other, "ENHYDRA_COMMANDS_TOPIC": f"{other}-commands"},
    )
    diverging.wait_ready()
    account = sorted(expected)[0]
    before = source.get(f"/v1/stores/accounts/keys/{account}")[1]
    asyncio.run(
        produce_json(
            kafka_bootstrap,
            f"{other}-commands",
            [
                (
                    account,
                    {
                        "command_id": "diverge-1",
                        "type": "deposit",
                        "account": account,
                        "amount": 1000,
                    },
                )
            ],
        )
    )
    asyncio.run(wait_for_committed(kafka_bootstrap, other, f"{other}-commands", timeout=60))
    snap_state = states(open_snapshot(location))[account]
    assert diverging.get(f"/v1/stores/accounts/keys/{account}")[1]["balance"] == (
        snap_state["balance"] + 1000
    )
    assert source.get(f"/v1/stores/accounts/keys/{account}")[1] == before


def test_broken_snapshots_are_refused_with_a_clear_message(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    storage = tmp_path / "snapshots"
    one = service_factory(TARGET, "s", extra_env={"ENHYDRA_SNAPSHOT_STORAGE": str(storage)})
    one.wait_ready()
    feed(kafka_bootstrap, app_id, generate(50, 300, seed=3))
    info = create_snapshot(app_id, kafka_bootstrap, str(storage))
    good = storage / info["id"]
    assert "ok:" in cli("snapshot", "verify", str(good), TARGET).stdout

    same = cli("snapshot", "verify", str(good), TARGET, check=False).stderr
    assert same == ""  # same topology: accepted
    # The old spelling of TARGET still works, and says what to use instead.
    old = cli("snapshot", "verify", str(good), "--service", TARGET)
    assert "ok:" in old.stdout
    assert "--service is deprecated: pass MODULE:ATTR as the TARGET argument" in old.stderr
    import os

    env8 = {**os.environ, "ENHYDRA_PARTITIONS": "8"}
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "enhydra.cli.main",
            "snapshot",
            "verify",
            str(good),
            TARGET,
        ],
        env=env8,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "different topology" in refused.stderr

    data = next(good.glob("store=accounts/partition=0.parquet"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    corrupt = cli("snapshot", "verify", str(good), check=False)
    assert corrupt.returncode != 0 and "sha256 mismatch" in corrupt.stderr

    (good / "manifest.json").unlink()
    missing = cli("snapshot", "verify", str(good), check=False)
    assert missing.returncode != 0 and "no manifest.json" in missing.stderr


def test_time_travel_equals_the_model_of_the_events_up_to_that_time(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    one = service_factory(TARGET, "tt")
    one.wait_ready()
    early = generate(200, 2000, seed=101)
    feed(kafka_bootstrap, app_id, early)
    time.sleep(1.0)
    moment = dt.datetime.now(dt.UTC)
    time.sleep(1.0)
    late = generate(200, 1500, seed=102)
    feed(kafka_bootstrap, app_id, late)

    out = tmp_path / "asof"
    result = cli(
        "snapshot",
        "at",
        TARGET,
        "--app",
        app_id,
        "--time",
        moment.isoformat(),
        "--output",
        str(out),
        "--bootstrap",
        kafka_bootstrap,
    )
    assert "snapshot as of" in result.stdout
    snap = open_snapshot(out)
    assert states(snap) == model(early)
    account = sorted(model(early))[0]
    shown = cli("snapshot", "query", str(out), "accounts", account).stdout
    assert json.loads(shown) == model(early)[account]


def test_restore_brings_an_app_back_to_a_snapshot_and_reprocesses_after_the_cut(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    storage = tmp_path / "snapshots"
    env = {"ENHYDRA_SNAPSHOT_STORAGE": str(storage)}
    one = service_factory(TARGET, "r1", state_dir=tmp_path / "r1", extra_env=env)
    one.wait_ready()
    first = generate(150, 1500, seed=121)
    feed(kafka_bootstrap, app_id, first)
    info = create_snapshot(app_id, kafka_bootstrap, str(storage))
    later = generate(150, 1000, seed=122)
    feed(kafka_bootstrap, app_id, later)

    refused = cli(
        "snapshot",
        "restore",
        str(storage / info["id"]),
        "--app",
        app_id,
        "--yes",
        "--bootstrap",
        kafka_bootstrap,
        check=False,
    )
    assert refused.returncode != 0 and "has running instances" in refused.stderr
    assert one.stop() == 0
    done = cli(
        "snapshot",
        "restore",
        str(storage / info["id"]),
        "--app",
        app_id,
        "--yes",
        "--bootstrap",
        kafka_bootstrap,
        TARGET,
    )
    assert "restored" in done.stdout

    # Disaster recovery: a new instance with an empty state dir starts from the snapshot and
    # reprocesses exactly the commands after the cut.
    again = service_factory(TARGET, "r2", state_dir=tmp_path / "r2", extra_env=env)
    again.wait_ready()
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=60))
    _, stats = again.get("/v1/stats")
    assert stats["processed"] == len(later)
    expected = model(first + later)
    assert read_accounts([again], sorted(expected)) == expected
