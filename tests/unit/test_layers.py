"""The runtime's layers: each part imports only what its layer may, so the shape cannot drift.

Read top to bottom; a part imports from its own layer and the ones below it. The table is the
architecture: changing it is a design decision, made here on purpose, not in passing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import enhydra

ROOT = Path(enhydra.__file__).parent

# part -> the layer it is in (0 = the bottom). A part is a package folder or a top-level module.
LAYERS: list[tuple[str, ...]] = [
    # pure: no I/O, importable on a Spark executor alone
    (
        "contracts",
        "aggregate",
        "evolution",
        "messages",
        "assignment",
        "settings",
        "windows",
        "logs",
    ),
    # concerns over local resources or plain data: RocksDB stores, error policies and the DLQ
    # format, the snapshot format and storage, projections' fold and reactions' pure part, plugins,
    # the declaration
    (
        "stores",
        "errors",
        "projections.model",
        "reactions.model",
        "snapshots.format",
        "snapshots.storage",
    ),
    ("plugins",),
    ("spec", "topology"),
    # the Kafka access layer: the only place aiokafka clients are built
    ("kafka", "preflight"),
    # the task runner and what it drives; the assignor's glue to aiokafka's group protocol;
    # failure detection (probes peers, removes dead members through kafka.membership)
    ("runner", "control", "assignment.protocol", "failover"),
    ("processing", "projections", "reactions", "snapshots", "spark", "admin"),
    # the runtime container, and the shells around everything: the CLI, the test kit, the
    # scaffold, and development provisioning (the local broker, the podman image recipe),
    # which no running service imports.
    ("runtime", "service", "query"),
    ("cli", "testing", "devtools", "scaffold"),
]
# Imports that go up a layer on purpose, each with its reason.
ALLOWED_UPWARD = {
    # A backfill reads the service the user names, like `enhydra run`.
    ("spark", "service"): "the Service a backfill job is pointed at",
    ("topology", "service"): "annotations only: topology_of accepts a Service",
    # A local Spark session fetches the Kafka connector's jars the way `make setup` does.
    ("spark", "devtools"): "the Maven download of the connector jars",
}


def part_of(module: str) -> str | None:
    """The part a dotted `enhydra.x.y` module belongs to (longest match in LAYERS)."""
    name = module.removeprefix("enhydra.")
    candidates = [p for layer in LAYERS for p in layer if name == p or name.startswith(p + ".")]
    return max(candidates, key=len) if candidates else None


def layer_of(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "enhydra" or m.startswith("enhydra.")}


MODULES = sorted(p for p in ROOT.rglob("*.py") if "_scaffold" not in p.parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_only_its_layer_and_below(path: Path) -> None:
    module = ".".join(["enhydra", *path.relative_to(ROOT).with_suffix("").parts])
    module = module.removesuffix(".__init__")
    if module == "enhydra":
        return  # the package root re-exports lazily (see __init__.py)
    mine = part_of(module)
    assert mine is not None, f"{module} is in no layer: add it to LAYERS"
    for imported in imports(path):
        theirs = part_of(imported)
        if theirs is None or theirs == mine:
            continue
        if layer_of(theirs) > layer_of(mine):
            assert (mine, theirs) in ALLOWED_UPWARD, (
                f"{module} imports {imported}: {theirs} is above {mine}"
            )


def test_every_part_of_the_table_exists() -> None:
    for layer in LAYERS:
        for part in layer:
            path = ROOT.joinpath(*part.split("."))
            assert path.is_dir() or path.with_suffix(".py").is_file(), part
