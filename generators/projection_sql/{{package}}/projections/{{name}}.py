"""A read model of the service in PostgreSQL:

    {{ name }}

Added by `enhydra generate projection --sql`.

`project(key, event)` says which rows of the projection's own tables one event changes
(Upsert, Delete); the runtime writes each batch's rows together with the events positions they
cover in one transaction, so the table is exactly-once with respect to the events topic.
The tables are plain SQL DDL: change the DDL, raise `version`, and swap the new tables in with
`enhydra projection rebuild <target> {{ name }}` (docs/projections.md in the Enhydra repository).
It needs ENHYDRA_DATABASE_URL (and ENHYDRA_DATABASE_PASSWORD_FILE) and `enhydra[postgres]`.
`project` must be pure.
"""

from __future__ import annotations

from typing import Any

from enhydra.sql import SqlProjection, Table, Upsert

TABLE = Table(
    "{{ name }}",
    ("id",),
    """CREATE TABLE {table} (
        id text PRIMARY KEY,
        events bigint NOT NULL CHECK (events >= 0),
        last_type text NOT NULL
    )""",
)


def project(key: str, event: dict[str, Any]) -> list[Upsert]:
    """Count the key's events and remember the type of the last one."""
    row = {"id": key, "events": 1, "last_type": str(event.get("type"))}
    return [Upsert("{{ name }}", row, add=("events",))]


projection = SqlProjection(
    "{{ name }}", project, (TABLE,), version=1, description="Events per key, and the last type."
)
