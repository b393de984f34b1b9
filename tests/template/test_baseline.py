"""The topology baseline in a generated project's workflow: it follows the code until the first
deploy, and after `enhydra topology lock --deployed` an incompatible change fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.template.support import enhydra, enhydra_new, outcomes, run_pytest

pytestmark = pytest.mark.template

TARGET = "tally.service:service"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    result = enhydra_new(tmp_path / "out", "project_name=Tally")
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "out" / "tally"


def rename_store(project: Path, old: str, new: str) -> None:
    domain = project / "tally" / "domain.py"
    text = domain.read_text()
    assert f'name="{old}"' in text
    domain.write_text(text.replace(f'name="{old}"', f'name="{new}"'))


def baseline(project: Path) -> dict:
    return json.loads((project / "topology.json").read_text())


def topology_tests(project: Path, report: Path) -> dict[str, str]:
    run_pytest(project, report, "tests/test_topology.py")
    return outcomes(report)


def test_before_the_first_deploy_the_baseline_follows_the_code(
    project: Path, tmp_path: Path
) -> None:
    rename_store(project, "items", "stock")
    check = enhydra(project, "topology", "check", "--against", "topology.json", TARGET)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "INCOMPATIBLE" in check.stdout
    assert "topology.json is not deployed yet" in check.stdout

    results = topology_tests(project, tmp_path / "report.xml")
    assert set(results.values()) == {"passed"}, results
    locked = baseline(project)
    assert locked["deployed"] is False
    assert [s["name"] for s in locked["stores"]] == ["stock"]


def test_after_lock_deployed_an_incompatible_change_fails(project: Path, tmp_path: Path) -> None:
    done = enhydra(project, "topology", "lock", "--deployed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{project / 'topology.json'}: locked at sha256:")
    assert "(deployed)" in done.stdout
    assert baseline(project)["deployed"] is True

    rename_store(project, "items", "stock")
    check = enhydra(project, "topology", "check", "--against", "topology.json", TARGET)
    assert check.returncode == 1
    assert "offline reset" in check.stdout
    results = topology_tests(project, tmp_path / "report.xml")
    failed = "tests.test_topology::test_changes_since_the_baseline_are_compatible"
    assert results[failed] == "failure", results
    assert [s["name"] for s in baseline(project)["stores"]] == ["items"]  # left as deployed

    refused = enhydra(project, "topology", "lock")
    assert refused.returncode == 1
    (line,) = refused.stderr.splitlines()
    assert line.endswith("run `enhydra topology lock --deployed` then")
    assert [s["name"] for s in baseline(project)["stores"]] == ["items"]

    # Deployed with an offline reset: the new layout becomes the baseline.
    assert enhydra(project, "topology", "lock", "--deployed").returncode == 0
    assert [s["name"] for s in baseline(project)["stores"]] == ["stock"]
    again = enhydra(project, "topology", "lock", "--deployed")
    assert again.returncode == 0 and ": unchanged (sha256:" in again.stdout
    assert (
        enhydra(project, "topology", "check", "--against", "topology.json", TARGET).returncode == 0
    )


def test_lock_without_a_service_says_so_in_one_line(tmp_path: Path) -> None:
    result = enhydra(tmp_path, "topology", "lock")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line == (
        f"Error: no pyproject.toml in {tmp_path} or above: run inside a service project; "
        "or name the service: enhydra topology lock MODULE:ATTR"
    )
    assert not (tmp_path / "topology.json").exists()


def test_lock_with_a_broken_baseline_names_the_file(project: Path) -> None:
    (project / "topology.json").write_text("{not json")
    result = enhydra(project, "topology", "lock")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: {project / 'topology.json'}: not valid JSON")
