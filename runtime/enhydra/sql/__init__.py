"""Read models in PostgreSQL: a projection whose `project` returns rows for tables it owns.

The pure parts (model.py, rows.py) import nothing of psycopg; the database side (writer.py,
commit.py, engine.py) needs the `enhydra[postgres]` extra.
"""

from enhydra.sql.model import Delete, SqlProjection, Table, Upsert

__all__ = ["Delete", "SqlProjection", "Table", "Upsert"]
