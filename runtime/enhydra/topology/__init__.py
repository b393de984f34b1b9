"""A service's topology: a pure model, its fingerprint, a compatibility check, a diagram.

`topology_of(service)["fingerprint"]` (contracts/fingerprint.py) is the one definition of
"same layout" that snapshots, upgrades and tooling agree on.
"""

from enhydra.contracts.fingerprint import canonical_json, compatibility_view, fingerprint
from enhydra.topology.baseline import BaselineError, is_deployed, locked
from enhydra.topology.compat import ADVICE, Change, Path, compare, render, verdict
from enhydra.topology.mermaid import to_mermaid
from enhydra.topology.model import (
    FORMAT,
    TopologyError,
    build_topology,
    qualified_name,
    topology_of,
    validate,
)

__all__ = [
    "ADVICE",
    "FORMAT",
    "BaselineError",
    "Change",
    "Path",
    "TopologyError",
    "build_topology",
    "canonical_json",
    "compare",
    "compatibility_view",
    "fingerprint",
    "is_deployed",
    "locked",
    "qualified_name",
    "render",
    "to_mermaid",
    "topology_of",
    "validate",
    "verdict",
]
