"""The runtime's layers: each part imports only what its layer may, so the shape cannot drift.

Read top to bottom; a part imports from its own layer and the ones below it. The table is the
architecture: changing it is a design decision, made here on purpose, not in passing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
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
    # format, the snapshot format and storage, projections' fold and reactions' pure part, the
    # SQL projection's declaration, plugins, the declaration
    # toolcache: the Maven cache and the host's Java, shared by spark.jars and devtools.broker
    (
        "stores",
        "errors",
        "projections.model",
        "snapshots.format",
        "snapshots.storage",
        "sql.model",
        "sql.rows",
        "sql.config",
        "toolcache",
        "reactions.model",
        "sagas.model",
        "tracing",  # trace context in headers; the OpenTelemetry SDK behind it, only when on
    ),
    ("plugins",),
    ("spec", "topology"),
    # the Kafka access layer: the only place aiokafka clients are built
    ("kafka", "preflight"),
    # the task runner and what it drives; the assignor's glue to aiokafka's group protocol;
    # failure detection (probes peers, removes dead members through kafka.membership)
    ("runner", "control", "assignment.protocol", "failover"),
    ("processing", "projections", "reactions", "sagas", "snapshots", "spark", "admin", "sql"),
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


# What only development needs: behind the `dev-tools` extra (pyproject.toml), never imported by
# a running service, so a production image installs neither cookiecutter nor the broker's CA
# tooling. The test kit may start the session broker; nothing else may reach in.
DEV_TOOLS = ("devtools", "cli.kafka", "cli.postgres", "cli.image", "cli.new")
MAY_USE_DEV_TOOLS = (*DEV_TOOLS, "testing")
# cli.generate also holds find_project, which every command inside a project uses (cli/project.py):
# the module imports without the extra, its command needs it.
NEED_THE_EXTRA = (*DEV_TOOLS, "cli.generate")
EXTRA_PACKAGES = ("cookiecutter", "cryptography", "jinja2")
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def module_name(path: Path) -> str:
    name = ".".join(["enhydra", *path.relative_to(ROOT).with_suffix("").parts])
    return name.removesuffix(".__init__")


def within(module: str, parts: tuple[str, ...]) -> bool:
    name = module.removeprefix("enhydra.")
    return any(name == p or name.startswith(p + ".") for p in parts)


def all_imports(path: Path, *, top_level_only: bool = False) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every import, or only the module-level ones."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: list[tuple[str, list[str]]] = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_private_names_of_another_part(path: Path) -> None:
    mine = part_of(module_name(path))
    for imported, names in all_imports(path):
        if not imported.startswith("enhydra.") or part_of(imported) == mine:
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{module_name(path)} imports {private} from {imported}: make it public"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runtime_needs_no_dev_tools(path: Path) -> None:
    module = module_name(path)
    for imported, _ in all_imports(path):
        top = imported.split(".")[0]
        if within(imported, DEV_TOOLS) and imported.startswith("enhydra."):
            assert within(module, MAY_USE_DEV_TOOLS), f"{module} imports {imported}, a dev tool"
        if top in EXTRA_PACKAGES:
            assert within(module, NEED_THE_EXTRA), f"{module} imports {imported}, in dev-tools"
    # `enhydra --help` lists every command in an image without the extra: import it when used.
    for imported, _ in all_imports(path, top_level_only=True):
        assert imported.split(".")[0] not in EXTRA_PACKAGES, f"{module}: import {imported} lazily"


def test_the_base_dependencies_leave_dev_tools_to_the_extra() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {r.split(">")[0].split("<")[0].split("=")[0].split("[")[0] for r in requirements}

    assert not names(project["dependencies"]) & {"cookiecutter", "cryptography"}
    assert {"cookiecutter", "cryptography"} <= names(extras["dev-tools"])
    assert "enhydra[dev-tools]" in extras["dev"]  # `make setup` installs .[dev]: tests need it


def run_without_the_extra(*argv: str) -> subprocess.CompletedProcess[str]:
    """`enhydra ARGV` in a Python where the extra's packages cannot be imported."""
    code = (
        "import sys\n"
        f"for name in {EXTRA_PACKAGES!r}: sys.modules[name] = None\n"
        "from enhydra.cli.main import main\n"
        f"main({list(argv)!r})\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_help_lists_the_dev_commands_without_the_extra() -> None:
    done = run_without_the_extra("--help")
    assert done.returncode == 0, done.stderr
    for command in ("generate", "image", "kafka", "new", "run"):
        assert f"  {command} " in done.stdout


@pytest.mark.parametrize("argv", [("kafka", "status"), ("new", "--no-input"), ("image", "env")])
def test_a_dev_command_without_the_extra_names_it_in_one_line(argv: tuple[str, ...]) -> None:
    done = run_without_the_extra(*argv)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"Error: `enhydra {argv[0]}` is development tooling: pip install 'enhydra[dev-tools]' "
        "(missing here: cookiecutter, cryptography, jinja2)"
    ]
