"""bench/sql_rebuild.py at 20k events: a rebuild ends with the live projection's tables (row
count, a checksum of every row, positions). Real broker, real PostgreSQL; the 1M run is the
bench's own."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from bench.sql_rebuild import compare, report
from enhydra.sql.config import DatabaseSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


async def test_a_rebuild_of_20k_events_ends_with_the_live_tables(
    kafka_bootstrap: str, tmp_path: Path, database: DatabaseSettings
) -> None:
    outcome = await compare(kafka_bootstrap, database, tmp_path / "state", 20_000)
    assert outcome.live.rows > 9_000 and sum(outcome.live.positions.values()) == 20_000
    assert outcome.equal, report(outcome)
    assert "EQUAL" in report(outcome)
