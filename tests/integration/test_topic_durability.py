"""Every path that creates topics applies the configured durability, on the real broker.

The session broker has one node, so the replication factor cannot be anything but 1 there;
ENHYDRA_MIN_INSYNC_REPLICAS=1 is written on each topic the path creates as a topic-level
config (a topic made without kafka/topics.py would only inherit the broker's), which shows
the path went through the one place. More replicas than brokers is a one-line refusal.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from enhydra.errors.uncaught import EXIT_CANNOT_START
from enhydra.kafka.clients import open_admin
from enhydra.kafka.topics import TopicError, TopicSpec, ensure_topics, recreate_topics
from enhydra.settings import Connection
from enhydra.testing.processes import wait_for_committed
from ledger.workload import generate
from tests.integration.ledger_support import feed
from tests.snapshots.support import create_snapshot

TARGET = "ledger.service:service"
TOPIC_CONFIG = 1  # DescribeConfigs config_source: DYNAMIC_TOPIC_CONFIG, set on the topic itself


async def durability(bootstrap: str, prefix: str) -> dict[str, tuple[int, str | None]]:
    """(replicas, min.insync.replicas set on the topic itself) of each topic named prefix*."""
    async with open_admin(Connection.plain(bootstrap)) as admin:
        names = sorted(t for t in await admin.list_topics() if t.startswith(prefix))
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        found: dict[str, tuple[int, str | None]] = {}
        described = {t["topic"]: t for t in await admin.describe_topics(names)}
        wanted = {"min.insync.replicas": None}
        resources = [ConfigResource(ConfigResourceType.TOPIC, n, wanted) for n in names]
        for response in await admin.describe_configs(resources):
            for _code, _msg, _type, name, entries in response.resources:
                [entry] = entries
                own = entry[1] if entry[3] == TOPIC_CONFIG else None
                replicas = min(len(p["replicas"]) for p in described[name]["partitions"])
                found[name] = (replicas, own)
        return found


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
@pytest.mark.slow
def test_start_reset_restore_and_clone_all_create_topics_the_one_way(
    service_factory, kafka_bootstrap, app_id, tmp_path
) -> None:
    durable = {"ENHYDRA_MIN_INSYNC_REPLICAS": "1", "ENHYDRA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    storage = tmp_path / "snaps"
    one = service_factory(
        TARGET, "d1", extra_env={**durable, "ENHYDRA_SNAPSHOT_STORAGE": str(storage)}
    )
    one.wait_ready()
    started = asyncio.run(durability(kafka_bootstrap, f"{app_id}-"))
    assert set(started) >= {f"{app_id}-{t}" for t in ("commands", "events", "control")}
    assert set(started.values()) == {(1, "1")}, started

    feed(kafka_bootstrap, app_id, generate(20, 100, seed=3))
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands"))
    info = create_snapshot(app_id, kafka_bootstrap, str(storage))
    one.stop()

    # reset recreates the changelogs (the other topics were made at start, checked below)
    reset = cli(durable, "reset", "--app", app_id, "--yes")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    # restore recreates the changelog; clone creates a new app's changelog
    snapshot = str(storage / info["id"])
    restored = cli(durable, "snapshot", "restore", snapshot, "--app", app_id, "--yes")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    twin = f"{app_id}-twin"
    cloned = cli(durable, "snapshot", "clone", snapshot, "--to-app", twin)
    assert cloned.returncode == 0, cloned.stdout + cloned.stderr

    after = asyncio.run(durability(kafka_bootstrap, f"{app_id}-"))
    assert f"{twin}-accounts-changelog" in after
    assert {name: d for name, d in after.items() if d != (1, "1")} == {}

    # A replication factor the cluster cannot meet: one line from each command, nothing
    # deleted or created.
    three = {**durable, "ENHYDRA_REPLICATION_FACTOR": "3"}
    for args in (
        ("reset", "--app", app_id, "--yes"),
        ("snapshot", "restore", snapshot, "--app", app_id, "--yes"),
        ("snapshot", "clone", snapshot, "--to-app", f"{app_id}-triplet"),
    ):
        refused = cli(three, *args)
        assert refused.returncode != 0, args
        assert "Traceback" not in refused.stderr, refused.stderr
        assert "ENHYDRA_REPLICATION_FACTOR=3 asks for more replicas than the cluster has" in (
            refused.stderr
        ), args
    assert asyncio.run(durability(kafka_bootstrap, f"{app_id}-")) == after


@pytest.mark.integration
def test_more_replicas_than_brokers_is_one_plain_line(service_factory, kafka_bootstrap, app_id):
    instance = service_factory(TARGET, "rf3", extra_env={"ENHYDRA_REPLICATION_FACTOR": "3"})
    assert instance.process is not None
    assert instance.process.wait(60) == EXIT_CANNOT_START
    errors = [
        record
        for line in instance.log_tail(200).splitlines()
        if line.startswith("{") and (record := json.loads(line)).get("level") == "error"
    ]
    assert [e["event"] for e in errors] == [
        "ENHYDRA_REPLICATION_FACTOR=3 asks for more replicas than the cluster has brokers up "
        "(1) to create a topic on: set ENHYDRA_REPLICATION_FACTOR to at most 1, or start the "
        "brokers that are down"
    ]
    assert "Traceback" not in instance.log_tail(200)
    # nothing was created with a value the cluster cannot meet, and a recreate deletes nothing
    assert asyncio.run(durability(kafka_bootstrap, f"{app_id}-")) == {}
    three = Connection(bootstrap_servers=kafka_bootstrap, replication_factor=3)
    kept = f"{app_id}-kept"
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(kept, 1)]))
    with pytest.raises(TopicError, match="ENHYDRA_REPLICATION_FACTOR=3"):
        asyncio.run(recreate_topics(three, [TopicSpec(kept, 1)]))
    assert kept in asyncio.run(durability(kafka_bootstrap, kept))


@pytest.mark.integration
@pytest.mark.slow
def test_topology_check_live_names_each_wrong_topic_and_its_fix(kafka_bootstrap, app_id) -> None:
    env = {"ENHYDRA_APP_ID": app_id, "ENHYDRA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    check = ("topology", "check", TARGET, "--live")
    missing = cli(env, *check)
    assert missing.returncode == 1
    assert f"topic {app_id}-commands: missing" in missing.stdout
    # Made elsewhere with the broker's defaults: no compaction, a 7-day retention.
    roles = ("commands", "events", "rejections", "accounts-changelog", "dlq", "control")
    names = [f"{app_id}-{role}" for role in roles]
    partitions = {f"{app_id}-control": 1}
    plain = [TopicSpec(n, partitions.get(n, 4)) for n in names]
    asyncio.run(ensure_topics(kafka_bootstrap, plain))

    wrong = cli(env, *check)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    lines = wrong.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        f"topic {app_id}-events",
        f"topic {app_id}-accounts-changelog",
        f"topic {app_id}-dlq",
    ], lines
    assert lines[1] == (
        f"topic {app_id}-accounts-changelog: cleanup.policy=delete, expected "
        "cleanup.policy=compact (a changelog); fix: kafka-configs.sh --bootstrap-server "
        f"<broker> --alter --entity-type topics --entity-name {app_id}-accounts-changelog "
        "--add-config cleanup.policy=compact"
    )

    async def apply_the_fixes() -> None:
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        keep = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
        fixes = {
            f"{app_id}-events": keep,
            f"{app_id}-dlq": keep,
            f"{app_id}-accounts-changelog": {"cleanup.policy": "compact"},
        }
        async with open_admin(Connection.plain(kafka_bootstrap)) as admin:
            await admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, n, c) for n, c in fixes.items()]
            )

    asyncio.run(apply_the_fixes())
    right = cli(env, *check)
    assert right.returncode == 0, right.stdout + right.stderr
    assert right.stdout == "6 topics checked: every layout is right\n"
