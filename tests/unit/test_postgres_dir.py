"""Where `enhydra postgres start` keeps the dev server's data."""

from __future__ import annotations

from pathlib import Path

import pytest

from enhydra.devtools import postgres


def test_the_setting_wins_then_root_gets_a_folder_the_postgres_user_may_enter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ENHYDRA_POSTGRES_DIR", str(tmp_path / "pg"))
    assert postgres.default_data_dir() == tmp_path / "pg"
    monkeypatch.delenv("ENHYDRA_POSTGRES_DIR")
    monkeypatch.setattr(postgres.os, "geteuid", lambda: 0)
    assert postgres.default_data_dir() == Path("/var/tmp/enhydra-postgres")
    monkeypatch.setattr(postgres.os, "geteuid", lambda: 1000)
    assert postgres.default_data_dir().parts[-1] == "postgres"
    assert postgres.default_data_dir() != Path("/var/tmp/enhydra-postgres")
