"""The backfill job on a small real topic: Spark's rebuild equals what the service holds.

Needs a Kafka broker (like test_integration.py), PySpark (`pip install "enhydra[spark]"`) and
Java 17. The job runs as a user would run it: `python jobs/backfill.py ...`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from enhydra.snapshots import open_snapshot
from enhydra.testing import Driver
from enhydra.testing.processes import produce_json, wait_for_committed
from samples import command

from {{ cookiecutter.package_name }}.domain import (
    COMMAND_TYPES,
    KEY_FIELD,
    {{ cookiecutter.aggregate }},
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def commands() -> list[tuple[str, dict[str, Any]]]:
    """12 keys, each created and then sent every command type four times, plus one duplicate;
    each built from its declared type (tests/samples.py)."""
    create, *others = COMMAND_TYPES
    out: list[tuple[str, dict[str, Any]]] = []
    for n in range(12):
        key = f"{KEY_FIELD}-{n}"
        out.append((key, command(create, key, f"{key}-c", name=f"n{n}")))
        for round_ in range(4):
            for kind in others:
                out.append((key, command(kind, key, f"{key}-{kind}-{round_}", note=f"r{round_}")))
        out.append((key, command(create, key, f"{key}-c")))
    return out


def test_backfill_rebuilds_the_service_state(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    instance = service_factory("{{ cookiecutter.package_name }}.service:service", cwd=PROJECT_ROOT)
    instance.wait_ready()
    sent = commands()

    async def produce_and_wait() -> None:
        await produce_json(kafka_bootstrap, f"{app_id}-commands", sent)
        await wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands")

    asyncio.run(produce_and_wait())

    job = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "jobs" / "backfill.py"),
            "--bootstrap",
            kafka_bootstrap,
            "--app",
            app_id,
            "--master",
            "local[2]",
            "--snapshot",
            str(tmp_path / "snapshot"),
            "--output",
            str(tmp_path / "state.parquet"),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "ENHYDRA_LOG_FORMAT": "json"},
        check=False,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]
    assert "backfill: 12 keys" in job.stdout

    model = Driver({{ cookiecutter.aggregate }})
    model.send_many(sent)
    snapshot = open_snapshot(tmp_path / "snapshot")
    rebuilt = {}
    for partition in snapshot.partitions:
        for key, entry in snapshot.entries(partition):
            rebuilt[key.decode()] = entry.state
            assert entry.command_ids == model.entries[key.decode()].command_ids
    assert rebuilt == {key: msgspec.to_builtins(model.state(key)) for key in model.stored_keys()}
    for key, state in rebuilt.items():
        assert instance.get(f"/v1/stores/{{ cookiecutter.aggregate }}/keys/{key}") == (200, state)
    assert snapshot.cut.topic == f"{app_id}-commands"
    assert json.loads((tmp_path / "snapshot" / "manifest.json").read_text())["app_id"] == app_id
