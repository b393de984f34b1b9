"""What `enhydra new` and `enhydra generate` write, and the example built like them, use the
CLI's current flags: a user copies from their own project first."""

from __future__ import annotations

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
