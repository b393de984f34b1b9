"""The `{{ name }}` SQL projection: its rows in a real PostgreSQL, and its place in the service.

The database is a PostgreSQL server started for the test session (Debian's `postgresql`
package; installed with apt-get when the tests run as root), reached with psycopg from the
`enhydra[postgres]` extra that `enhydra generate projection --sql` added to pyproject.toml.
"""

from __future__ import annotations

from enhydra.testing.sql import database, fold_rows, postgres

from {{ package }}.projections.{{ name }} import project, projection
from {{ package }}.service import service

__all__ = ["database", "postgres"]  # the fixtures


async def test_the_rows_in_the_database_count_events_per_key(database) -> None:
    events = [
        ("a", {"type": "x"}),
        ("a", {"type": "y"}),
        ("b", {"type": "x"}),
        ("a", {"type": "x"}),
    ]
    rows = await fold_rows(database, projection, events)
    assert rows["{{ name }}"] == [
        {"id": "a", "events": 3, "last_type": "x"},
        {"id": "b", "events": 1, "last_type": "x"},
    ]


def test_project_returns_rows_of_its_own_table_only() -> None:
    assert projection.check(project("a", {"type": "x"}))  # refuses unknown tables and keys


def test_the_service_runs_it() -> None:
    assert projection in service.projections
