"""Helpers for tests that generate projects and run what their users would run."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).parent / "ruff"


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment for child processes: no outer pytest options, cookiecutter kept in tmp."""
    config = tmp / "cookiecutter-config.yaml"
    config.write_text(f"cookiecutters_dir: {tmp / 'cookiecutters'}\nreplay_dir: {tmp / 'replay'}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    return {**env, "COOKIECUTTER_CONFIG": str(config), **extra}


def enhydra(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`enhydra ARGS` in `cwd`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(cwd.parent if cwd.parent.is_dir() else cwd),
        check=False,
    )


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
        timeout=180,
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


def generated_files(project: Path) -> list[Path]:
    """The project's own files (not caches that running its tests leaves behind)."""
    caches = {"__pycache__", ".pytest_cache", ".ruff_cache"}
    return [p for p in project.rglob("*") if p.is_file() and not caches & set(p.parts)]


def ruff_clean(project: Path) -> str:
    """ruff check and format --check of a project: '' when clean, else what they said."""
    said = []
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run(
            [str(RUFF), *args], cwd=project, capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode != 0:
            said.append(result.stdout + result.stderr)
    return "\n".join(said)
