"""examples/ledger is the template rendered with the ledger's answers, plus its own domain.

The files every generated service shares (build, deploy, CI, Makefile, the deploy and topology
tests) must stay exactly what the template renders, so a change to the template reaches the
reference service in the same commit. The domain (domain.py and its typed twin typed.py, its
tests, workload.py, the README, demo commands, topology.json) is the ledger's own.
jobs/backfill.py is left out while the Spark work changes both copies; it is shared too.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from tests.template.support import REPO, enhydra_new

pytestmark = pytest.mark.template

LEDGER = REPO / "examples" / "ledger"
ANSWERS = (
    "project_name=Ledger",
    "description=Ledger: accounts with deposits and withdrawals, the reference Enhydra service.",
    "aggregate=accounts",
    "key_field=account",
    "command_types=open, deposit, withdraw, close",
    # In this repository the ledger runs on the checkout's Enhydra (the root `make setup`).
    "enhydra_source=index",
)
OWN = {
    "README.md",
    "demo/commands.jsonl",
    "jobs/backfill.py",
    "ledger/__init__.py",
    "ledger/domain.py",
    "ledger/workload.py",
    "tests/test_backfill.py",
    "tests/test_domain.py",
    "tests/test_integration.py",
    "topology.json",
}


def files(root: Path) -> set[str]:
    caches = {"__pycache__", ".pytest_cache", ".ruff_cache"}
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not caches & set(p.relative_to(root).parts)
    }


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ledger-rendered")
    result = enhydra_new(out, *ANSWERS)
    assert result.returncode == 0, result.stdout + result.stderr
    return out / "ledger"


def test_the_ledger_has_every_file_the_template_makes(rendered: Path) -> None:
    assert files(rendered) - files(LEDGER) == set()
    assert files(LEDGER) - files(rendered) == {"ledger/workload.py", "ledger/typed.py"}


def test_shared_files_equal_the_rendered_template(rendered: Path) -> None:
    shared = sorted(files(rendered) - OWN)
    assert len(shared) >= 20, shared
    drift = []
    for name in shared:
        ours, theirs = (LEDGER / name).read_text(), (rendered / name).read_text()
        if ours != theirs:
            diff = difflib.unified_diff(
                theirs.splitlines(),
                ours.splitlines(),
                "template",
                f"examples/ledger/{name}",
                lineterm="",
            )
            drift.append("\n".join(diff))
    assert drift == [], (
        "examples/ledger drifted from the template; render it with the answers in this test and "
        "copy the shared files over (or change the template):\n" + "\n\n".join(drift)
    )
