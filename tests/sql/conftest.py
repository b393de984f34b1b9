"""The SQL projection tests' PostgreSQL: the runtime's own fixtures (enhydra.testing.sql)."""

from enhydra.testing.sql import database, postgres

__all__ = ["database", "postgres"]
