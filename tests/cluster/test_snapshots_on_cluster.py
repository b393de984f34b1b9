"""Snapshots on a 3-node cluster with no replication setting (issue #26, item 4).

`snapshot create` asks the running instances over the control topic; `restore` and `clone`
recreate changelogs and command topics offline. On the brokers' defaults (RF 3, min ISR 2)
every topic they leave must be as durable as the cluster's, and the state restored must be
the snapshot's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from enhydra.contracts.codec import decode_entry
from enhydra.snapshots.format import open_snapshot
from enhydra.testing.invariants import restored_state
from enhydra.testing.processes import read_topic, wait_for_committed
from ledger.workload import generate, model
from tests.cluster.support import DURABLE, durability
from tests.faults.support import restore_in_a_fresh_instance
from tests.integration.ledger_support import feed
from tests.snapshots.support import cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def states(snapshot) -> dict[str, dict]:
    return {
        key.decode(): decode_entry(value).state
        for partition in snapshot.partitions
        for key, value in snapshot.iter_partition(partition)
    }


def test_snapshot_create_restore_and_clone_leave_durable_topics(cluster, app_id, tmp_path):
    bootstrap = cluster.kafka.bootstrap
    kafka = ("--bootstrap", bootstrap)
    storage = tmp_path / "snapshots"
    cluster.extra_env["ENHYDRA_SNAPSHOT_STORAGE"] = str(storage)
    cluster.start_instances(("i1",))
    commands = generate(20, 200, seed=7)
    feed(bootstrap, app_id, commands)
    asyncio.run(wait_for_committed(bootstrap, app_id, f"{app_id}-commands", timeout=90))

    # The request goes out while no instance reads the control topic (as while the group
    # rebalances after a start, which takes seconds on a cluster): only the command's own
    # request comes back, and it must ask again until an instance answers.
    cluster.stop_instances()
    cluster.instances.clear()
    create = ["snapshot", "create", "--app", app_id, "--storage", str(storage), *kafka]
    asking = subprocess.Popen(
        [sys.executable, "-m", "enhydra.cli.main", *create, "--timeout", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        cluster.start_instances(("i1",))
        out, err = asking.communicate(timeout=120)
    finally:
        asking.kill()
    assert asking.returncode == 0, err[-2000:] + cluster.instance("i1").log_tail(20)
    location = str(storage / json.loads(out.strip().splitlines()[-1])["id"])
    snapshot = states(open_snapshot(location))
    assert snapshot == model(commands)
    # Commands after the snapshot: the restore takes the changelog back to the snapshot's
    # state (a restore that did nothing would leave this one), then they are processed again.
    later = generate(20, 100, seed=8)
    assert model(commands + later) != snapshot
    feed(bootstrap, app_id, later)
    cluster.stop_instances()

    restored = cli("snapshot", "restore", location, "--app", app_id, "--yes", *kafka)
    assert "restored" in restored.stdout
    twin = f"{app_id}-twin"
    cloned = cli("snapshot", "clone", location, "--to-app", twin, *kafka)
    assert "cloned" in cloned.stdout

    changelog = asyncio.run(read_topic(bootstrap, f"{app_id}-accounts-changelog"))
    assert restored_state(changelog) == snapshot

    after = asyncio.run(durability(bootstrap, f"{app_id}-"))
    assert f"{twin}-accounts-changelog" in after, after
    assert {name: d for name, d in after.items() if d != DURABLE} == {}
    twin_state = restored_state(asyncio.run(read_topic(bootstrap, f"{twin}-accounts-changelog")))
    assert twin_state == snapshot
    # the commands after the cut are processed again, once each
    diff = restore_in_a_fresh_instance(cluster, model(commands + later), caught_up=True)
    assert diff.ok, diff
