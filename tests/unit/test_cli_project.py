"""Inside a project made by `enhydra new` every command finds the service's app id, web port
and target (cli/project.py); flags and ENHYDRA_* still win. No broker: each command runs as a
user runs it, in its own process, from a folder inside a small project."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from enhydra.testing.processes import free_port

SERVICE = """
from enhydra import Aggregate, Service


def decide(state, command):
    return [{"type": "added"}]


def apply(state, event):
    return {"n": (state or {"n": 0})["n"] + 1}


service = Service("shop-app", Aggregate("items", decide=decide, apply=apply), web_port={port})
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A project as `enhydra new` lays it out (pyproject.toml, PKG/service.py), web port free."""
    root = tmp_path_factory.mktemp("shop")
    port = free_port()
    (root / "pyproject.toml").write_text('[project]\nname = "shop"\nversion = "0.1.0"\n')
    (root / "shop").mkdir()
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "service.py").write_text(textwrap.dedent(SERVICE).replace("{port}", str(port)))
    return root, port


def enhydra(cwd: Path, *args: str, **env: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ENHYDRA_")}
    done = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


def test_query_asks_the_projects_web_port(project: tuple[Path, int]) -> None:
    root, port = project
    code, output = enhydra(root / "shop", "query", "items", "a1", "--retry-for", "0")
    assert code == 3
    assert f"no instance answers at http://127.0.0.1:{port}" in output


def test_the_query_url_from_the_environment_still_wins(project: tuple[Path, int]) -> None:
    root, _ = project
    url = f"http://127.0.0.1:{free_port()}"
    code, output = enhydra(root, "query", "items", "a1", ENHYDRA_QUERY_URL=url)
    assert code == 3 and f"no instance answers at {url}" in output


def test_dlq_takes_the_projects_app_id(project: tuple[Path, int]) -> None:
    root, _ = project
    bootstrap = f"127.0.0.1:{free_port()}"  # nobody: the command got past its options
    code, output = enhydra(root, "dlq", "list", "--bootstrap", bootstrap)
    assert code == 3 and f"cannot reach Kafka at {bootstrap}" in output, output


def test_outside_a_project_the_app_id_is_asked_for(tmp_path: Path) -> None:
    code, output = enhydra(tmp_path, "dlq", "list")
    assert code == 2
    assert "no application id: give --app (or ENHYDRA_APP_ID)" in output


def test_dlq_show_takes_what_dlq_list_prints(tmp_path: Path) -> None:
    code, output = enhydra(tmp_path, "dlq", "show", "0@x", "--app", "a")
    assert code == 2 and "expected PARTITION@OFFSET as `enhydra dlq list` prints it" in output
    bootstrap = f"127.0.0.1:{free_port()}"
    code, output = enhydra(tmp_path, "dlq", "show", "1@17", "--app", "a", "--bootstrap", bootstrap)
    assert code == 3 and "cannot reach Kafka" in output, output


def test_topology_check_finds_the_project_and_its_baseline(project: tuple[Path, int]) -> None:
    root, _ = project
    code, output = enhydra(root, "topology", "lock")
    assert code == 0, output
    code, output = enhydra(root / "shop", "topology", "check")
    assert code == 0, output
    assert "shop-app" in output


def test_snapshot_at_takes_the_projects_service(project: tuple[Path, int], tmp_path: Path) -> None:
    root, _ = project
    bootstrap = f"127.0.0.1:{free_port()}"
    args = ("--time", "2026-01-01T00:00:00Z", "--output", str(tmp_path / "asof"))
    code, output = enhydra(root, "snapshot", "at", *args, "--bootstrap", bootstrap)
    assert code == 3 and f"cannot reach Kafka at {bootstrap}" in output, output
    code, output = enhydra(tmp_path, "snapshot", "at", *args)
    assert code == 2 and "run inside the project made by `enhydra new`" in output
