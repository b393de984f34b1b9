"""`enhydra generate handler` writes the handler that fits the service's aggregate: one declaring
its command as a msgspec Struct for a typed aggregate (the template's), one of plain dicts for an
untyped one (examples/ledger's domain.py); either way its tests and the service's pass."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.template.support import REPO, enhydra, enhydra_new, outcomes, run_pytest

pytestmark = pytest.mark.template


def generate_and_test(project: Path, package: str, report: Path) -> str:
    """Generate handler `restock`, run its tests and the domain's; the handler's source."""
    result = enhydra(project, "generate", "handler", "restock")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrote tests/test_handler_restock.py" in result.stdout
    tests = run_pytest(project, report, "tests/test_handler_restock.py", "tests/test_domain.py")
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    results = outcomes(report)
    assert set(results.values()) == {"passed"}, results
    assert any("test_handler_restock" in name for name in results), results
    return (project / package / "handlers" / "restock.py").read_text()


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
def test_a_typed_service_gets_a_handler_declaring_its_command(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """... and still backfills: domain.py now imports enhydra.plugins, which the job ships."""
    made = enhydra_new(tmp_path / "out", "project_name=Returns")
    assert made.returncode == 0, made.stdout + made.stderr
    project = tmp_path / "out" / "returns"
    source = generate_and_test(project, "returns", tmp_path / "report.xml")
    assert "class Restock(msgspec.Struct, tag=COMMAND):" in source
    # the template's naming (past tense) and typing (a Struct per event, the state's class)
    assert 'EVENT = "restocked"' in source
    assert "class Restocked(msgspec.Struct, tag=EVENT):" in source
    assert "def decide(state: Item | None, command: Restock) -> list[Restocked]:" in source
    assert "    command_type=Restock,\n    event_types={EVENT: Restocked},\n)" in source
    report = tmp_path / "backfill.xml"
    backfill = run_pytest(project, report, "tests/test_backfill.py", bootstrap=kafka_bootstrap)
    assert backfill.returncode == 0, backfill.stdout[-6000:] + backfill.stderr[-3000:]
    assert set(outcomes(report).values()) == {"passed"}, outcomes(report)


def test_an_untyped_service_gets_a_handler_of_dicts(tmp_path: Path) -> None:
    project = tmp_path / "ledger"
    caches = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".ruff_cache", ".venv", "state")
    shutil.copytree(REPO / "examples" / "ledger", project, ignore=caches)
    source = generate_and_test(project, "ledger", tmp_path / "report.xml")
    assert "msgspec" not in source and 'note = command.get("note", "")' in source
    assert 'EVENT = "restocked"' in source
