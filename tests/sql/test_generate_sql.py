"""`enhydra generate projection NAME --sql` on a freshly generated service: the projection's
own test runs against a real PostgreSQL and passes, the code stays ruff clean, the project
asks for the postgres extra, and the topology check names the new projection."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from tests.template.support import RUFF, enhydra, enhydra_new, outcomes, run_pytest

pytestmark = [pytest.mark.template, pytest.mark.integration, pytest.mark.slow]


def test_a_generated_sql_projection_passes_its_test_against_a_real_database(tmp_path: Path) -> None:
    made = enhydra_new(tmp_path / "out", "project_name=Tool Shed")
    assert made.returncode == 0, made.stdout + made.stderr
    project = tmp_path / "out" / "tool-shed"
    generated = enhydra(project, "generate", "projection", "tool_counts", "--sql")
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert "wrote tool_shed/projections/tool_counts.py" in generated.stdout
    assert '"enhydra[postgres] @ ' in (project / "pyproject.toml").read_text()
    ddl = (project / "tool_shed" / "projections" / "tool_counts.py").read_text()
    assert "CREATE TABLE {table}" in ddl

    wrong = enhydra(project, "generate", "handler", "restock", "--sql")
    assert wrong.returncode != 0
    assert "--sql is for projections only, not for a handler" in wrong.stderr

    report = tmp_path / "report.xml"
    ran = run_pytest(project, report, "tests/test_projection_tool_counts.py")
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    results = outcomes(report)
    assert len(results) == 3 and set(results.values()) == {"passed"}, results

    for args in (["check", "."], ["format", "--check", "."]):
        lint = subprocess.run(
            [str(RUFF), *args], cwd=project, capture_output=True, text=True, timeout=60, check=False
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
    check = enhydra(
        project, "topology", "check", "--against", "topology.json", "tool_shed.service:service"
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "tool_counts" in check.stdout
