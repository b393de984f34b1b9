"""The SQL projection tests' PostgreSQL: the runtime's own fixtures (enhydra.sql.testing)."""

from enhydra.sql.testing import database, postgres

__all__ = ["database", "postgres"]
