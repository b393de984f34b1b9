"""The rows of a batch as the fewest statements: one change per row, grouped by shape.

Pure: the commit unit (commit.py) turns a batch's ops into a Plan and runs it. A row changed
by several events of a batch is written once: later columns replace earlier ones, `add`
columns are summed, a delete followed by an upsert deletes then inserts. Deletes run before
upserts, so the plan has the effect of running the ops one by one, in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from enhydra.sql.model import Delete, Op, Table

Shape = tuple[str, tuple[str, ...], tuple[str, ...]]  # table, columns, add columns


@dataclass(slots=True)
class _Row:
    values: dict[str, Any]
    relative: set[str]  # columns whose value is added to the stored one


@dataclass(slots=True)
class Plan:
    deletes: dict[str, list[tuple]] = field(default_factory=dict)  # table -> key tuples
    upserts: dict[Shape, list[tuple]] = field(default_factory=dict)  # shape -> row tuples

    def __bool__(self) -> bool:
        return bool(self.deletes or self.upserts)

    @property
    def rows(self) -> int:
        return sum(map(len, self.deletes.values())) + sum(map(len, self.upserts.values()))


def plan(ops: Iterable[Op], tables: Mapping[str, Table]) -> Plan:
    """The statements that leave the tables as running `ops` one at a time would."""
    deleted: dict[tuple[str, tuple], bool] = {}  # (table, key) -> deleted in this batch
    rows: dict[tuple[str, tuple], _Row | None] = {}  # None: deleted, no upsert since
    for op in ops:
        table = tables[op.table]
        if isinstance(op, Delete):
            ident = (op.table, tuple(op.key[c] for c in table.key))
            deleted[ident] = True
            rows[ident] = None
            continue
        ident = (op.table, tuple(op.row[c] for c in table.key))
        row = rows.get(ident)
        if row is None:
            rows[ident] = _Row(dict(op.row), set(op.add))
            continue
        for column, value in op.row.items():
            if column in op.add and column in row.values:
                row.values[column] = row.values[column] + value
            else:
                row.values[column] = value
                if column in op.add:
                    row.relative.add(column)
                else:
                    row.relative.discard(column)
    result = Plan()
    for (name, key), was_deleted in deleted.items():
        if was_deleted:
            result.deletes.setdefault(name, []).append(key)
    for (name, _key), row in rows.items():
        if row is None:
            continue
        columns = tuple(sorted(row.values))
        shape = (name, columns, tuple(c for c in columns if c in row.relative))
        result.upserts.setdefault(shape, []).append(tuple(row.values[c] for c in columns))
    return result
