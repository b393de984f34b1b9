"""The service template: generate projects the way users do and run what they would run.

A generated project is only worth something if its own tests pass right after generation, on a
real broker, so the whole generated suite runs here in a subprocess (reusing this session's
broker through ENHYDRA_TEST_BOOTSTRAP).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.template

REPO = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).parent / "ruff"

EXPECTED_FILES = {
    ".dockerignore",
    ".github/workflows/ci.yml",
    ".gitignore",
    ".hadolint.yaml",
    "Dockerfile",
    "README.md",
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
    "jobs/backfill.py",
    "jobs/README.md",
    "topology.json",
    "wheelhouse/README.md",
}


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment for child processes: no outer pytest options, cookiecutter kept in tmp."""
    config = tmp / "cookiecutter-config.yaml"
    config.write_text(f"cookiecutters_dir: {tmp / 'cookiecutters'}\nreplay_dir: {tmp / 'replay'}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    return {**env, "COOKIECUTTER_CONFIG": str(config), **extra}


def enhydra_new(output: Path, *context: str) -> subprocess.CompletedProcess[str]:
    output.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "enhydra.cli.main",
            "new",
            "--no-input",
            "--output-dir",
            str(output),
            *context,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(output),
        check=False,
    )


def run_pytest(
    project: Path, report: Path, *args: str, bootstrap: str | None = None
) -> subprocess.CompletedProcess[str]:
    extra = {"PYTHONPATH": str(project)}
    if bootstrap is not None:
        extra["ENHYDRA_TEST_BOOTSTRAP"] = bootstrap
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            *args,
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(report.parent, **extra),
        check=False,
    )


def outcomes(report: Path) -> dict[str, str]:
    """`file::test` -> passed / failed / error / skipped, from a JUnit XML report."""
    results: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        results[name] = kinds[0] if kinds else "passed"
    return results


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project generated with defaults except the name, as a user would after `enhydra new`."""
    out = tmp_path_factory.mktemp("generated")
    result = enhydra_new(out, "project_name=Stock Keeper")
    assert result.returncode == 0, result.stdout + result.stderr
    project = out / "stock-keeper"
    assert f"created {project}" in result.stdout
    return project


def generated_files(project: Path) -> list[Path]:
    """The project's own files (not caches that running its tests leaves behind)."""
    caches = {"__pycache__", ".pytest_cache", ".ruff_cache"}
    return [p for p in project.rglob("*") if p.is_file() and not caches & set(p.parts)]


def test_generates_the_expected_files(project: Path) -> None:
    files = {p.relative_to(project).as_posix() for p in generated_files(project)}
    assert files == EXPECTED_FILES


def test_no_template_syntax_is_left(project: Path) -> None:
    leftovers = [
        f"{path.relative_to(project)}: {marker}"
        for path in generated_files(project)
        for marker in ("{{", "{%", "cookiecutter")
        if marker in path.read_text()
    ]
    assert leftovers == []


def test_names_are_derived_from_the_project_name(project: Path) -> None:
    service = (project / "stock_keeper" / "service.py").read_text()
    assert 'Service(\n    "stock-keeper",' in service
    assert "from stock_keeper.domain import items" in service
    assert 'name = "stock-keeper"' in (project / "pyproject.toml").read_text()


def test_generated_code_is_ruff_clean(project: Path) -> None:
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run(
            [str(RUFF), *args], cwd=project, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_generated_test_suite_passes_on_a_real_broker(
    project: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    report = tmp_path / "report.xml"
    result = run_pytest(project, report, bootstrap=kafka_bootstrap)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    results = outcomes(report)
    assert results["tests.test_integration::test_final_state_matches_the_model"] == "passed"
    assert all(outcome == "passed" for outcome in results.values()), results
    assert len(results) >= 25


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
    )
    assert result.returncode == 0, result.stdout + result.stderr
    project = tmp_path / "out" / "parts-depot"
    assert 'Service(\n    "acme.depot",' in (project / "depot" / "service.py").read_text()
    assert "partitions=8" in (project / "depot" / "service.py").read_text()
    assert "ARG BASE=python:3.12-slim" in (project / "Dockerfile").read_text()
    compose = (project / "docker-compose.yml").read_text()
    assert '"7070:7070"' in compose and '"7071:7070"' in compose
    report = tmp_path / "report.xml"
    checks = run_pytest(project, report, "-m", "not integration")
    assert checks.returncode == 0, checks.stdout[-6000:] + checks.stderr[-3000:]
    assert set(outcomes(report).values()) == {"passed"}


@pytest.mark.parametrize(
    ("value", "variable"),
    [
        ("package_name=class", "package_name"),
        ("package_name=1abc", "package_name"),
        ("package_name=my-pkg", "package_name"),
        ("app_id=Bad_ID", "app_id"),
        ("partitions=0", "partitions"),
        ("partitions=four", "partitions"),
    ],
)
def test_hook_rejects_bad_input(tmp_path: Path, value: str, variable: str) -> None:
    result = enhydra_new(tmp_path / "out", value)
    assert result.returncode != 0
    assert "cannot generate the project" in result.stderr
    assert f"{variable}={value.partition('=')[2]!r}" in result.stderr
    assert not (tmp_path / "out" / "inventory").exists()


def test_plain_cookiecutter_on_the_repo_root(tmp_path: Path) -> None:
    """The repo root is a cookiecutter repo with nested templates; --no-input takes the first."""
    result = subprocess.run(
        [sys.executable, "-m", "cookiecutter", str(REPO), "--no-input", "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(tmp_path),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    project = tmp_path / "inventory"
    assert 'Service(\n    "inventory",' in (project / "inventory" / "service.py").read_text()
    assert (project / "tests" / "test_integration.py").is_file()
