"""The service template: generate projects the way users do and check what they would see.

The broker-free part of generated suites runs here; the whole suite, on a real broker, runs in
test_clone.py, from a clone that cannot see this repository, as `make test`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from enhydra.scaffold import runtime_wheel, wheel_digest
from tests.template.support import (
    REPO,
    RUFF,
    clean_env,
    enhydra_new,
    generated_files,
    outcomes,
    ruff_clean,
    run_pytest,
)

__all__ = ["RUFF", "clean_env", "enhydra_new", "outcomes", "run_pytest"]  # tests/upgrades use them

pytestmark = pytest.mark.template

RUNTIME_WHEEL = f"enhydra-{importlib.metadata.version('enhydra')}-py3-none-any.whl"
EXPECTED_FILES = {
    ".dockerignore",
    ".github/workflows/ci.yml",
    ".gitignore",
    ".hadolint.yaml",
    "Dockerfile",
    "Makefile",
    "README.md",
    "demo/commands.jsonl",
    "demo/wait_ready.py",
    "docker-compose.yml",
    "k8s/kustomization.yaml",
    "k8s/pdb.yaml",
    "k8s/service-headless.yaml",
    "k8s/service.yaml",
    "k8s/statefulset.yaml",
    "pyproject.toml",
    "stock_keeper/__init__.py",
    "stock_keeper/__main__.py",
    "stock_keeper/domain.py",
    "stock_keeper/service.py",
    "tests/test_deploy_files.py",
    "tests/test_domain.py",
    "tests/test_integration.py",
    "tests/test_topology.py",
    "tests/test_backfill.py",
    "tests/samples.py",
    "jobs/backfill.py",
    "jobs/README.md",
    "topology.json",
    "asyncapi.json",
    "tests/test_asyncapi.py",
    "vendor/README.md",
    f"vendor/{RUNTIME_WHEEL}",
    "wheelhouse/README.md",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project generated with defaults except the name, as a user would after `enhydra new`."""
    out = tmp_path_factory.mktemp("generated")
    result = enhydra_new(out, "project_name=Stock Keeper")
    assert result.returncode == 0, result.stdout + result.stderr
    project = out / "stock-keeper"
    assert f"created {project}" in result.stdout
    assert f"next: cd {project} && make test" in result.stdout
    return project


def load_filters():
    spec = importlib.util.spec_from_file_location("filters", REPO / "template/enhydra_filters.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_clean_and_green(project: Path, report: Path) -> None:
    """ruff finds nothing, and every test that needs no broker passes."""
    assert ruff_clean(project) == ""
    checks = run_pytest(project, report, "-m", "not integration")
    assert checks.returncode == 0, checks.stdout[-6000:] + checks.stderr[-3000:]
    assert set(outcomes(report).values()) == {"passed"}


def test_generates_the_expected_files(project: Path) -> None:
    files = {p.relative_to(project).as_posix() for p in generated_files(project)}
    assert files == EXPECTED_FILES


def test_no_template_syntax_is_left(project: Path) -> None:
    leftovers = [
        f"{path.relative_to(project)}: {marker}"
        for path in generated_files(project)
        if path.suffix != ".whl"
        for marker in ("{{", "{%", "cookiecutter")
        if marker in path.read_text()
    ]
    assert leftovers == []


def test_names_are_derived_from_the_project_name(project: Path) -> None:
    service = (project / "stock_keeper" / "service.py").read_text()
    assert 'Service(\n    "stock-keeper",' in service
    assert "from stock_keeper.domain import items" in service
    assert 'name = "stock-keeper"' in (project / "pyproject.toml").read_text()


def test_the_domain_follows_the_default_answers(project: Path) -> None:
    domain = (project / "stock_keeper" / "domain.py").read_text()
    assert 'KEY_FIELD = "item"' in domain
    events = {"register": "registered", "receive": "received", "ship": "shipped"}
    for command, event in events.items():
        assert f'    "{command}": "{event}",' in domain
    assert 'class Receive(msgspec.Struct, tag="receive"):\n    item: ItemId' in domain
    assert 'class Shipped(msgspec.Struct, tag="shipped"):' in domain
    assert "        case Receive(note=note):" in domain and "class Item(msgspec.Struct):" in domain
    assert 'EVENT_VERSIONS = {"registered": 2}' in domain
    assert 'upcasters={("registered", 1): registered_v1_to_v2},' in domain
    assert 'items = Aggregate(\n    name="items",' in domain
    readme = (project / "README.md").read_text()
    assert "| `ship` | `shipped` | needs the item to exist |" in readme
    assert "enhydra send stock-keeper-commands --key-field item demo/commands.jsonl" in readme
    assert "## Changing an event's shape\n" in readme and "`EVENT_VERSIONS`" in readme
    demo = [json.loads(line) for line in (project / "demo/commands.jsonl").read_text().splitlines()]
    assert [c["type"] for c in demo[:3]] == ["register", "receive", "ship"]
    assert {c["item"] for c in demo} == {"item-1", "item-2", "item-3"}


def test_generated_code_is_ruff_clean(project: Path) -> None:
    assert ruff_clean(project) == ""


def test_the_running_runtime_is_vendored(project: Path, tmp_path: Path) -> None:
    vendored = project / "vendor" / RUNTIME_WHEEL
    assert wheel_digest(vendored) == wheel_digest(runtime_wheel(tmp_path))
    pyproject = (project / "pyproject.toml").read_text()
    assert f'dependencies = ["enhydra @ {{root:uri}}/vendor/{RUNTIME_WHEEL}"]' in pyproject
    assert "allow-direct-references = true" in pyproject
    # the tracing extra, off until asked (docs/tracing.md), from the same wheel
    extras = tomllib.loads(pyproject)["project"]["optional-dependencies"]
    assert extras["tracing"] == ["enhydra[tracing]"]
    assert "!vendor/*.whl" in (project / ".gitignore").read_text()


def test_the_topology_baseline_is_not_deployed_yet(project: Path) -> None:
    baseline = json.loads((project / "topology.json").read_text())
    assert baseline["deployed"] is False
    assert baseline["stores"][0]["name"] == "items"


def test_other_values_render_valid_files(tmp_path: Path) -> None:
    """Non-default values reach every file, and the broker-free checks still pass."""
    result = enhydra_new(
        tmp_path / "out",
        "project_name=Parts Depot",
        "package_name=depot",
        "app_id=acme.depot",
        "partitions=8",
        "web_port=7070",
        "python_version=3.12",
        "aggregate=replacement_part_orders",
        "key_field=replacement_part_order",
        "command_types=place_replacement_order, buy, apply, cancel_replacement_order",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    project = tmp_path / "out" / "parts-depot"
    service = (project / "depot" / "service.py").read_text()
    assert 'Service(\n    "acme.depot",' in service
    assert "partitions=8" in service
    assert "from depot.domain import replacement_part_orders" in service
    domain = (project / "depot" / "domain.py").read_text()
    assert '"place_replacement_order": "placed_replacement_order",' in domain
    assert '"buy": "bought",' in domain and '"apply": "applied",' in domain
    assert "ARG BASE=python:3.12-slim" in (project / "Dockerfile").read_text()
    assert "PYTHON    ?= $(shell command -v python3.12" in (project / "Makefile").read_text()
    compose = (project / "docker-compose.yml").read_text()
    assert '"7070:7070"' in compose and '"7071:7070"' in compose
    assert_clean_and_green(project, tmp_path / "report.xml")


def test_one_command_type_from_an_index(tmp_path: Path) -> None:
    """The smallest domain, with Enhydra from the team's index: no vendor/, index build args."""
    result = enhydra_new(
        tmp_path / "out",
        "project_name=Notes",
        "aggregate=notes",
        "key_field=page",
        "command_types=write",
        "enhydra_source=index",
        "enhydra_requirement=enhydra>=0.1,<0.3",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    project = tmp_path / "out" / "notes"
    assert not (project / "vendor").exists()
    assert 'dependencies = ["enhydra>=0.1,<0.3"]' in (project / "pyproject.toml").read_text()
    dockerfile = (project / "Dockerfile").read_text()
    assert "COPY vendor/" not in dockerfile and "ARG PIP_INDEX_URL" in dockerfile
    workflow = (project / ".github/workflows/ci.yml").read_text()
    assert "PIP_INDEX_URL: ${{ vars.PIP_INDEX_URL }}" in workflow
    assert_clean_and_green(project, tmp_path / "report.xml")


@pytest.mark.parametrize(
    ("value", "variable"),
    [
        ("package_name=class", "package_name"),
        ("package_name=1abc", "package_name"),
        ("package_name=my-pkg", "package_name"),
        ("app_id=Bad_ID", "app_id"),
        ("partitions=0", "partitions"),
        ("partitions=four", "partitions"),
        ("aggregate=Accounts", "aggregate"),
        ("aggregate=service", "aggregate"),
        ("key_field=command_id", "key_field"),
        ("key_field=note", "key_field"),
        ("key_field=class", "key_field"),
        ("command_types=register, item", "command_types"),
        ("command_types=open, aggregate", "command_types"),
        ("command_types=open, Close", "command_types"),
        ("command_types=open, open", "command_types"),
        ("command_types= , ", "command_types"),
    ],
)
def test_hook_rejects_bad_input(tmp_path: Path, value: str, variable: str) -> None:
    result = enhydra_new(tmp_path / "out", value)
    assert result.returncode == 1
    assert "cannot generate the project" in result.stderr
    assert f"{variable}={value.partition('=')[2]!r}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "inventory").exists()


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (
            ["projectname=Foo"],
            2,
            "the template has no question 'projectname': did you mean project_name? it asks "
            "for project_name, project_slug,",
        ),
        (["enhydra_source=pypi"], 2, "enhydra_source='pypi': choose one of vendor, index"),
        (["project_name"], 2, "'project_name': expected KEY=VALUE"),
        (
            ["project_name=!!!"],
            1,
            "project_name '!!!' gives no folder name (project_slug ''): use letters or digits",
        ),
    ],
)
def test_new_refuses_what_it_cannot_use_in_one_line(
    tmp_path: Path, args: list[str], code: int, says: str
) -> None:
    result = enhydra_new(tmp_path / "out", *args)
    assert (result.returncode, result.stdout) == (code, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: {says}"), line
    assert [p for p in (tmp_path / "out").iterdir() if p.is_dir()] == []  # nothing generated


@pytest.mark.parametrize(
    ("source", "requirement"), [("", None), ("2", "enhydra>=0.1,<0.3")], ids=["vendor", "index"]
)
def test_interactive_new_asks_for_the_requirement_only_with_an_index(
    tmp_path: Path, source: str, requirement: str | None
) -> None:
    """12 questions in cookiecutter.json's order (docs/new-service.md lists them), and the 13th,
    enhydra_requirement, only when enhydra_source=index makes it matter."""
    questions = list(json.loads((REPO / "template/cookiecutter.json").read_text()))
    asked = [k for k in questions if not k.startswith("_") and k != "enhydra_requirement"]
    answers = [""] * (len(asked) - 1) + [source] + ([requirement] if requirement else [])
    (tmp_path / "out").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", "new", "--output-dir", str(tmp_path / "out")],
        input="\n".join(answers) + "\n",
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(tmp_path),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    said = " ".join(result.stdout.split())  # prompts wrap at the terminal width
    for n in range(1, len(asked) + 1):
        assert f"[{n}/{len(asked)}]" in said
    assert ("Requirement for the Enhydra runtime" in said) == (requirement is not None)
    pyproject = (tmp_path / "out" / "inventory" / "pyproject.toml").read_text()
    if requirement is None:
        assert "{root:uri}/vendor/enhydra-" in pyproject
    else:
        assert f'dependencies = ["{requirement}"]' in pyproject
        assert '"enhydra[dev-tools]>=0.1,<0.3"' in pyproject
        assert 'tracing = ["enhydra[tracing]>=0.1,<0.3"]' in pyproject


def test_new_refuses_an_existing_folder(project: Path) -> None:
    before = (project / "README.md").read_text()
    result = enhydra_new(project.parent, "project_name=Stock Keeper")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"Error: {project} already exists: choose another project_name or --output-dir, "
        "or pass --overwrite to write the template over it"
    )
    assert (project / "README.md").read_text() == before


@pytest.mark.parametrize(
    ("command", "event"),
    [
        ("register", "registered"),
        ("receive", "received"),
        ("ship", "shipped"),
        ("open", "opened"),
        ("deposit", "deposited"),
        ("withdraw", "withdrawn"),
        ("close", "closed"),
        ("apply", "applied"),
        ("play", "played"),
        ("book", "booked"),
        ("fix", "fixed"),
        ("pay", "paid"),
        ("open_account", "opened_account"),
    ],
)
def test_event_types_are_past_tense(command: str, event: str) -> None:
    assert load_filters().past_tense(command) == event


@pytest.mark.parametrize(
    ("name", "cls"),
    [("open", "Open"), ("opened_account", "OpenedAccount"), ("item2_x", "Item2X")],
)
def test_class_names_are_camel_case(name: str, cls: str) -> None:
    assert load_filters().class_name(name) == cls


def test_command_types_are_read_from_a_comma_list() -> None:
    assert load_filters().command_list(" open,deposit , ,close ") == ["open", "deposit", "close"]


def test_plain_cookiecutter_on_the_repo_root(tmp_path: Path) -> None:
    """The repo root is a cookiecutter repo with nested templates; --no-input takes the first."""
    result = subprocess.run(
        [sys.executable, "-m", "cookiecutter", str(REPO), "--no-input", "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(tmp_path),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    project = tmp_path / "inventory"
    assert 'Service(\n    "inventory",' in (project / "inventory" / "service.py").read_text()
    assert (project / "tests" / "test_integration.py").is_file()
    assert (project / "vendor" / RUNTIME_WHEEL).is_file()
