"""The backfill of service layouts other than the ledger's, on local[2] through the CLI.

One module holds the README's whole service (decide, apply and `Service(...)` side by side)
and extends its aggregate with `enhydra.plugins.extend` like a generated handler does, with a
handler from another top-level module; that module is also an installed plugin (an
`enhydra.handlers` entry point) adding a second command type. Executors unpickle apply, so
they import the runtime modules the service imports (`enhydra.service`, `enhydra.plugins`) and
both of the user's modules. A job that ships a partial `enhydra` in front of the installed one
fails here with "No module named 'enhydra.service'"; one that folds without the installed
plugins fails on the plugin's events.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from enhydra.snapshots import open_snapshot
from enhydra.testing.processes import produce_json, wait_for_committed

pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

PLUGIN = '''
"""Handlers from another top-level package: one imported, one installed as a plugin."""

from enhydra.plugins import Handler, Plugin


def decide(state, command):
    return [{"type": "doubled"}]


def apply(state, event):
    return {"total": state["total"] * 2}


def triple(state, command):
    return [{"type": "tripled"}]


def tripled(state, event):
    return {"total": state["total"] * 3}


handler = Handler("double", decide, {"doubled": apply})
plugin = Plugin("tripler", handlers=[Handler("triple", triple, {"tripled": tripled})])
'''
ENTRY_POINTS = "[enhydra.handlers]\ntripler = counter_plugin:plugin\n"

ONE_MODULE = '''
"""The README's service: its functions and the Service in one module."""

from enhydra import Aggregate, Service
from enhydra.plugins import extend

from counter_plugin import handler


def decide(state, command):
    return [{"type": "added", "n": command["n"]}]


def apply(state, event):
    return {"total": (state or {"total": 0})["total"] + event["n"]}


counters = extend(Aggregate("counters", decide=decide, apply=apply), handler)
service = Service("counter", counters, partitions=2)
'''


def model(commands: list[tuple[str, dict]]) -> dict[str, dict]:
    totals: dict[str, int] = {}
    for key, command in commands:
        total = totals.get(key, 0)
        factor = {"double": 2, "triple": 3}.get(command["type"])
        totals[key] = total * factor if factor else total + command["n"]
    return {key: {"total": total} for key, total in totals.items()}


def test_a_one_module_service_extended_by_handlers_and_a_plugin_backfills(
    service_factory, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "counter_plugin.py").write_text(textwrap.dedent(PLUGIN))
    (project / "counter.py").write_text(textwrap.dedent(ONE_MODULE))
    installed = project / "counter_plugin-0.1.dist-info"  # what pip leaves for an entry point
    installed.mkdir()
    (installed / "METADATA").write_text("Metadata-Version: 2.1\nName: counter-plugin\n")
    (installed / "entry_points.txt").write_text(ENTRY_POINTS)
    service = service_factory("counter:service", cwd=project, partitions=2)
    service.wait_ready()
    commands = []
    for n in range(12):
        key = f"c{n}"
        commands += [
            (key, {"command_id": f"{key}-1", "type": "add", "n": n}),
            (key, {"command_id": f"{key}-2", "type": "double"}),
            (key, {"command_id": f"{key}-3", "type": "add", "n": 1}),
            (key, {"command_id": f"{key}-4", "type": "triple"}),
        ]

    async def produce_and_wait() -> None:
        await produce_json(kafka_bootstrap, f"{app_id}-commands", commands)
        await wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands")

    asyncio.run(produce_and_wait())
    args = (
        f"backfill counter:service --master local[2] --bootstrap {kafka_bootstrap} "
        f"--app {app_id} --snapshot {tmp_path / 'snapshot'}"
    ).split()
    job = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        cwd=project,
        env={**os.environ, "ENHYDRA_LOG_FORMAT": "json"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]
    snapshot = open_snapshot(tmp_path / "snapshot")
    rebuilt = {
        key.decode(): entry.state
        for partition in snapshot.partitions
        for key, entry in snapshot.entries(partition)
    }
    assert rebuilt == model(commands)
