"""The backfill job on a small real topic: Spark's rebuild equals what the service holds.

Needs a Kafka broker (like test_integration.py), PySpark (`pip install "enhydra[spark]"`) and
Java 17. The job runs as a user would run it: `python jobs/backfill.py ...`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from enhydra.snapshots import open_snapshot
from enhydra.testing.processes import produce_json, wait_for_committed

from ledger.workload import generate, model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_backfill_rebuilds_the_balances(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    instance = service_factory("ledger.service:service", cwd=PROJECT_ROOT)
    instance.wait_ready()
    commands = generate(60, 600, seed=5)

    async def produce_and_wait() -> None:
        await produce_json(kafka_bootstrap, f"{app_id}-commands", commands)
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
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "ENHYDRA_LOG_FORMAT": "json"},
        check=False,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]

    expected = model(commands)
    snapshot = open_snapshot(tmp_path / "snapshot")
    rebuilt = {
        key.decode(): entry.state
        for partition in snapshot.partitions
        for key, entry in snapshot.entries(partition)
    }
    assert rebuilt == expected
    for account in list(expected)[:20]:
        assert instance.get(f"/v1/stores/accounts/keys/{account}") == (200, expected[account])
    # The cut is on the commands topic: a clone resumes after the last accepted command.
    last = {p: max((e.offset for _, e in snapshot.entries(p)), default=-1) for p in range(4)}
    assert snapshot.cut.offsets == {p: last[p] + 1 for p in range(4)}
