"""Start, stop and crash a real instance: clean exits, clear start-up errors, no double apply."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from enhydra.errors.uncaught import EXIT_CANNOT_START
from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.testing.processes import (
    ServiceProcess,
    service_env,
    wait_for_committed,
)
from ledger.workload import generate, model
from tests.integration.ledger_support import produce_in_chunks, read_accounts

pytestmark = pytest.mark.integration

TARGET = "ledger.service:service"


def test_python_dash_m_runs_a_worker_and_sigterm_stops_it_cleanly(
    kafka_bootstrap, app_id, tmp_path
):
    env = service_env(
        app_id=app_id, bootstrap=kafka_bootstrap, instance_id="m1", state_dir=tmp_path / "state"
    )
    log_path = tmp_path / "m1.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ledger"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        ServiceProcess.wait_until_ready(
            proc, f"http://127.0.0.1:{env['ENHYDRA_WEB_PORT']}", log_path
        )
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = log_path.read_text().splitlines()
    assert proc.returncode == 0, "\n".join(lines[-20:])
    records = [json.loads(line) for line in lines if line.strip()]  # every line is JSON
    assert any(r["event"] == "engine stopped" for r in records)
    assert records[-1]["event"] == "stopped" and records[-1]["exit_code"] == 0
    print(f"graceful stop took {took:.2f}s")


def test_bad_setting_fails_fast_naming_the_variable(tmp_path):
    env = {**os.environ, "ENHYDRA_PARTITIONS": "many", "ENHYDRA_STATE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", "run", TARGET],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ENHYDRA_PARTITIONS='many' is invalid: expected a whole number" in result.stderr


def test_partition_count_mismatch_is_a_startup_error(service_factory, app_id):
    first = service_factory(TARGET, "p4")
    first.wait_ready()
    first.stop()
    wrong = service_factory(TARGET, "p6", extra_env={"ENHYDRA_PARTITIONS": "6"})
    assert wrong.process is not None
    code = wrong.process.wait(60)
    assert code != 0
    assert f"topic '{app_id}-commands' has 4 partitions but the service expects 6" in (
        wrong.log_tail(200)
    )


async def retention_of(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        wanted = {"retention.ms": None, "retention.bytes": None, "cleanup.policy": None}
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, wanted)]
        )
        [(_code, _message, _type, _name, entries)] = response.resources
        return {entry[0]: entry[1] for entry in entries}
    finally:
        await admin.close()


def test_the_events_history_is_kept_and_a_finite_retention_refuses_to_start(
    service_factory, kafka_bootstrap, app_id
):
    # A topic made by the service keeps every event: the broker's 7-day default would delete
    # the history a rebuild replays from offset 0.
    kept = f"{app_id}-kept-events"
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(kept, 2, history=True)]))
    assert asyncio.run(retention_of(kafka_bootstrap, kept)) == {
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "cleanup.policy": "delete",
    }
    # An events topic made elsewhere with the broker's default retention: the service does
    # not start, and says which topic would lose its history, and how to keep it.
    events = f"{app_id}-events"
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(events, 4)]))
    instance = service_factory(TARGET, "r1")
    assert instance.process is not None
    assert instance.process.wait(60) == EXIT_CANNOT_START
    [error] = [
        record
        for line in instance.log_tail(400).splitlines()
        if line.startswith("{") and (record := json.loads(line)).get("level") == "error"
    ]
    assert error["event"].startswith(
        f"topic {events}: retention.ms=604800000, expected retention.ms=-1"
    ), error
    assert f"--entity-name {events} --add-config retention.ms=-1" in error["event"]


def test_kill_dash_nine_under_load_loses_nothing_and_applies_nothing_twice(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    commands = generate(400, 12000, seed=21)
    one = service_factory(TARGET, "k1", state_dir=tmp_path / "k1")
    one.wait_ready()

    def produce_slowly():
        return produce_in_chunks(kafka_bootstrap, f"{app_id}-commands", commands)

    async def kill_midway() -> None:
        await asyncio.sleep(0.8)
        one.kill()

    async def both() -> None:
        await asyncio.gather(produce_slowly(), kill_midway())

    asyncio.run(both())
    again = service_factory(TARGET, "k1-again", state_dir=tmp_path / "k1")
    again.wait_ready()
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=120))
    expected = model(commands)
    assert read_accounts([again], sorted(expected)) == expected
    _, stats = again.get("/v1/stats")
    print("after restart:", {k: stats[k] for k in ("processed", "skipped", "events")})
