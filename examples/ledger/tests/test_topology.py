"""The deployed topology (topology.json) against this code: every change must be compatible.

CI runs the same check as `enhydra topology check --against topology.json ...`. After deploying
a change that needed a reset or a repartition, rewrite the baseline:

    enhydra topology show ledger.service:service -o topology.json
"""

from __future__ import annotations

import json
from pathlib import Path

from enhydra.topology import compare, fingerprint, topology_of, validate

from ledger.service import service

TOPOLOGY = Path(__file__).resolve().parents[1] / "topology.json"


def test_topology_json_is_a_valid_topology() -> None:
    deployed = validate(json.loads(TOPOLOGY.read_text()), str(TOPOLOGY))
    assert deployed["app_id"] == service.settings.app_id
    assert deployed["fingerprint"] == fingerprint(deployed)


def test_changes_since_the_deployed_topology_are_compatible() -> None:
    deployed = validate(json.loads(TOPOLOGY.read_text()), str(TOPOLOGY))
    current = topology_of(service)
    incompatible = [c for c in compare(deployed, current) if not c.compatible]
    assert incompatible == [], "\n".join(f"{c.subject}: {c.detail}" for c in incompatible)
