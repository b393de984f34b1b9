"""A SQL projection: tables declared as plain DDL, and `project(key, event) -> rows`.

    project(key, event) -> list[Upsert | Delete]

`project` is pure: it sees one event (upcast to its current version) and says which rows of
its own tables change. An `Upsert` names some columns of a row (its key columns included);
columns listed in `add` are added to the stored value instead of replacing it, so counters and
balances need no read of the table. The runtime writes the rows of a batch and the events
positions they cover in one transaction (commit.py): each event changes the tables once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from enhydra.projections.model import ReadModel

__all__ = ["Delete", "Op", "SqlProjection", "Table", "Upsert"]

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_CHECKED_COLUMNS: set[str] = set()  # column names `check` found valid (it runs per event)
_SHAPES_KEPT = 10_000  # op shapes `check` remembers as valid per projection (bounded)


def check_name(kind: str, name: str) -> str:
    """Identifiers are plain lower-case names: they are quoted into SQL, never escaped."""
    if not _NAME.match(name) or len(name) > 50:
        raise ValueError(f"{kind} name {name!r}: use lower-case letters, digits and '_' (<= 50)")
    return name


@dataclass(frozen=True)
class Table:
    """A table the projection owns: its name, its key columns and the DDL that creates it.

    `ddl` is plain SQL with `{table}` where the table's name goes, so the same DDL can create
    the table under another name (a rebuild's new tables).
    """

    name: str
    key: tuple[str, ...]
    ddl: str

    def __post_init__(self) -> None:
        check_name("table", self.name)
        if not self.key:
            raise ValueError(f"table {self.name!r}: name its key columns (the primary key)")
        for column in self.key:
            check_name("column", column)
        if "{table}" not in self.ddl:
            raise ValueError(f"table {self.name!r}: the DDL must say CREATE TABLE {{table}} ...")

    def create(self, physical: str) -> str:
        return self.ddl.replace("{table}", f'"{physical}"')


@dataclass(frozen=True, slots=True)
class Upsert:
    """Insert the row, or update the named columns of the stored one (`add`: add to them)."""

    table: str
    row: Mapping[str, Any]
    add: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the row with this key (no row: nothing to do)."""

    table: str
    key: Mapping[str, Any]


Op = Upsert | Delete
Project = Callable[[str, dict], Iterable[Op]]


@dataclass(frozen=True)
class SqlProjection(ReadModel):  # its task store's changelog stays empty
    """A read model in PostgreSQL: `project` folds events into rows of `tables`.

    `version` is the schema's version: the tables are created for it, and a database that
    holds another version is refused until the projection is rebuilt.
    """

    name: str
    project: Project
    tables: tuple[Table, ...]
    version: int = 1
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        self._check_name_and_project()
        if not self.tables:
            raise ValueError(f"projection {self.name!r}: declare the tables it writes")
        if self.version < 1:
            raise ValueError(f"projection {self.name!r}: version starts at 1")
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tables})
        # Shapes of ops found valid: (table, columns, add) of an Upsert, (table, columns) of a
        # Delete. `check` runs per event; a known shape is then one dictionary lookup.
        object.__setattr__(self, "_valid", set())

    @property
    def by_name(self) -> dict[str, Table]:
        """The tables by name (made once: `check` runs per event)."""
        return self._by_name  # type: ignore[attr-defined]

    @property
    def ddl_digest(self) -> str:
        """The tables' DDL in a few characters (whitespace runs count as one space): stored
        with the version, so DDL changed without a new version is noticed at start."""
        text = "\n".join(
            f"{t.name}({','.join(t.key)}):{' '.join(t.ddl.split())}" for t in self.tables
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def positions_key(self) -> str:
        """Whose positions these are in the positions table: the name at this version, so a
        rebuild to a new version fences the writers of the old one (their rows disappear)."""
        return f"{self.name}@v{self.version}"

    def check(self, ops: Iterable[Op]) -> list[Op]:
        """The ops of one event, refused when they touch a table or key this projection lacks."""
        checked = ops if type(ops) is list else list(ops)
        valid = self._valid  # type: ignore[attr-defined]
        for op in checked:
            if type(op) is Upsert:
                add = op.add if type(op.add) is tuple else tuple(op.add)
                shape: tuple = (op.table, tuple(op.row), add)
            elif type(op) is Delete:
                shape = (op.table, tuple(op.key))
            else:
                shape = ()  # a subclass, or not an op: checked in full every time
            if shape not in valid:
                self._check_op(op)
                if shape and len(valid) < _SHAPES_KEPT:
                    valid.add(shape)
        return checked

    def _check_op(self, op: Op) -> None:
        table = self.by_name.get(op.table)
        if table is None:
            raise ValueError(
                f"projection {self.name!r} wrote to table {op.table!r}, which it does not "
                f"declare (its tables: {', '.join(sorted(self.by_name))})"
            )
        given = op.row if isinstance(op, Upsert) else op.key
        missing = [c for c in table.key if c not in given]
        if missing:
            raise ValueError(
                f"projection {self.name!r}: a row of {op.table!r} lacks its key column(s) "
                f"{', '.join(missing)}"
            )
        if isinstance(op, Upsert):
            for column in op.row:
                if column not in _CHECKED_COLUMNS:
                    _CHECKED_COLUMNS.add(check_name("column", column))
            wrong = [c for c in op.add if c not in op.row or c in table.key]
            if wrong:
                raise ValueError(
                    f"projection {self.name!r}: add= names {', '.join(wrong)}, which the "
                    f"row of {op.table!r} does not set or which are key columns"
                )
