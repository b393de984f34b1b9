"""`enhydra generate` on a freshly generated service: the new code's tests pass, and so do the
service's own tests that passed before; the code stays ruff clean and the topology compatible."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.template.test_generate import RUFF, clean_env, enhydra_new, outcomes, run_pytest

pytestmark = pytest.mark.template


def enhydra(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(project.parent),
        check=False,
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("generators")
    result = enhydra_new(out, "project_name=Tool Shed")
    assert result.returncode == 0, result.stdout + result.stderr
    # As deployed: the baseline stays put, and the check below compares the grown code with it.
    locked = enhydra(out / "tool-shed", "topology", "lock", "--deployed")
    assert locked.returncode == 0, locked.stdout + locked.stderr
    return out / "tool-shed"


def test_generated_pieces_pass_their_tests_and_keep_the_service_green(
    project: Path, tmp_path: Path
) -> None:
    before = outcomes_of(project, tmp_path / "before.xml")
    for args in (
        ("handler", "restock"),
        ("handler", "audit_note"),
        ("projection", "tool_activity"),
        ("reaction", "supplier_sync", "--from", "suppliers"),
        ("saga", "overdue_tools", "--from", "suppliers"),
        ("job", "weekly_report"),
    ):
        result = enhydra(project, "generate", *args)
        assert result.returncode == 0, result.stdout + result.stderr
    assert (project / "tool_shed" / "handlers" / "restock.py").is_file()
    assert "items = extend(items, *HANDLERS)" in (project / "tool_shed" / "domain.py").read_text()
    assert (
        "service.projections.extend(PROJECTIONS)"
        in (project / "tool_shed" / "service.py").read_text()
    )

    after = outcomes_of(project, tmp_path / "after.xml")
    kept = {name: after.get(name) for name, outcome in before.items() if outcome == "passed"}
    assert set(kept.values()) == {"passed"}, kept
    new = {name: outcome for name, outcome in after.items() if name not in before}
    assert len(new) >= 14 and set(new.values()) == {"passed"}, new
    for prefix in (
        "test_handler_restock",
        "test_projection_tool_activity",
        "test_reaction_supplier_sync",
        "test_saga_overdue_tools",
        "test_job_weekly",
    ):
        assert any(prefix in name for name in new), (prefix, sorted(new))

    for args in (["check", "."], ["format", "--check", "."]):
        lint = subprocess.run(
            [str(RUFF), *args], cwd=project, capture_output=True, text=True, timeout=60, check=False
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr

    check = enhydra(
        project, "topology", "check", "--against", "topology.json", "tool_shed.service:service"
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "projection tool_activity: projection added" in check.stdout
    assert "reaction supplier_sync: reaction added" in check.stdout
    assert "saga overdue_tools: saga added" in check.stdout
    assert "no contract of tool-shed" not in check.stdout  # the saga reads its own events too
    assert "no contract of suppliers is here" in check.stdout
    shown = json.loads(enhydra(project, "topology", "show", "tool_shed.service:service").stdout)
    assert shown["handlers"][0]["decide"]["restock"] == "tool_shed.handlers.restock:decide"
    # the handlers' types are part of the contract: topology, and asyncapi.json (its test
    # rewrote it while the baseline is not deployed)
    assert shown["messages"]["commands"]["restock"]["schema"]["title"] == "Restock"
    # named and typed as the template's: past tense, declared as Structs
    events = shown["messages"]["events"]
    assert {"restocked", "audited_note"} <= set(events)
    assert events["restocked"]["schemas"]["1"]["title"] == "Restocked"
    channels = json.loads((project / "asyncapi.json").read_text())["channels"].values()
    assert any("restock" in channel["messages"] for channel in channels)


def outcomes_of(project: Path, report: Path) -> dict[str, str]:
    run_pytest(project, report, "-m", "not integration")
    return outcomes(report)


def test_refuses_a_bad_name_an_existing_piece_and_a_foreign_folder(
    project: Path, tmp_path: Path
) -> None:
    bad = enhydra(project, "generate", "handler", "Bad-Name")
    assert bad.returncode == 1 and "name 'Bad-Name': use lowercase letters" in bad.stderr
    taken = enhydra(project, "generate", "handler", "ship")  # a command type of domain.py
    assert taken.returncode == 1
    assert taken.stderr.strip() == (
        "Error: domain.py already declares the type 'ship': a handler's command type must be "
        "new; choose another name"
    )
    assert enhydra(project, "generate", "job", "nightly").returncode == 0
    again = enhydra(project, "generate", "job", "nightly")
    assert again.returncode == 1 and "nightly.py already exists" in again.stderr
    unsourced = enhydra(project, "generate", "reaction", "sync")
    assert unsourced.returncode == 1 and "--from APP" in unsourced.stderr
    foreign = enhydra(project, "generate", "job", "late", "--from", "suppliers")
    assert foreign.returncode == 1 and "--from is for reactions and sagas only" in foreign.stderr
    elsewhere = enhydra(tmp_path, "generate", "job", "x")
    assert elsewhere.returncode == 1 and "no pyproject.toml" in elsewhere.stderr
