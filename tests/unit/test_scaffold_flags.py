"""What `enhydra new` and `enhydra generate` write, and the example built like them, use the
CLI's current flags: a user copies from their own project first."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# flag -> what replaced it (cli/common.py: deprecated_option)
DEPRECATED = {"--app-id": "--app"}
SCAFFOLD = ("template", "generators", "examples/ledger")


def scaffold_files() -> list[Path]:
    skip = {"__pycache__", ".venv", ".pytest_cache", ".ruff_cache", "vendor", "wheelhouse"}
    return sorted(
        p
        for folder in SCAFFOLD
        for p in (REPO / folder).rglob("*")
        if p.is_file() and not skip & set(p.relative_to(REPO).parts) and p.suffix != ".whl"
    )


@pytest.mark.parametrize("flag", sorted(DEPRECATED))
def test_no_deprecated_flag_in_what_users_start_from(flag: str) -> None:
    found = [
        str(p.relative_to(REPO))
        for p in scaffold_files()
        if flag in p.read_text(encoding="utf-8", errors="replace")
    ]
    assert not found, f"{flag} is deprecated (use {DEPRECATED[flag]}): {found}"


def test_the_guide_lists_the_questions_in_the_order_they_are_asked() -> None:
    """docs/new-service.md's table is in the order of template/cookiecutter.json, which is the
    order `enhydra new` asks in (enhydra_requirement last, only with enhydra_source=index)."""
    questions = [
        key
        for key in json.loads((REPO / "template" / "cookiecutter.json").read_text())
        if not key.startswith("_")
    ]
    guide = (REPO / "docs" / "new-service.md").read_text()
    table = guide[guide.index("## The questions") :].split("\n\n## ")[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", table, re.MULTILINE)
    assert [name for _, name in rows] == questions
    assert [int(n) for n, _ in rows] == list(range(1, len(questions) + 1))
    assert questions[-1] == "enhydra_requirement"
