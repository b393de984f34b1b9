"""The topology baseline (topology.json) against this code.

Until the first deploy the baseline is marked `"deployed": false` and follows the code: this
test rewrites it with `enhydra topology lock` (commit the change with your code). Right after
the first deploy, run `enhydra topology lock --deployed`: from then on every change must be
compatible with what runs, and a change that a rolling bounce cannot deploy (partition count,
store name, key type...) fails here, with its upgrade path. After deploying such a change (with
a reset or a repartition), run `enhydra topology lock --deployed` again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from enhydra.topology import compare, fingerprint, is_deployed, topology_of, validate

from stock.service import service

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = ROOT / "topology.json"


def read_baseline() -> dict[str, Any]:
    return validate(json.loads(TOPOLOGY.read_text()), str(TOPOLOGY))


@pytest.fixture(scope="module")
def baseline() -> dict[str, Any]:
    """The baseline; one that is not deployed yet is locked to the code first."""
    if not is_deployed(read_baseline()):
        lock = [sys.executable, "-m", "enhydra.cli.main", "topology", "lock"]
        done = subprocess.run(lock, cwd=ROOT, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    return read_baseline()


def test_topology_json_is_a_valid_topology(baseline: dict[str, Any]) -> None:
    assert baseline["app_id"] == service.settings.app_id
    assert baseline["fingerprint"] == fingerprint(baseline)


def test_changes_since_the_baseline_are_compatible(baseline: dict[str, Any]) -> None:
    incompatible = [c for c in compare(baseline, topology_of(service)) if not c.compatible]
    assert incompatible == [], "\n".join(f"{c.subject}: {c.detail}" for c in incompatible)
