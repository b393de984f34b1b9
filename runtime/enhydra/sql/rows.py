"""The rows of a batch as the fewest statements: one change per row, grouped by shape.

Pure: the commit unit (commit.py) turns a batch's ops into a Plan and runs it. A row changed
by several events of a batch is written once: later columns replace earlier ones, `add`
columns are summed, a delete followed by an upsert deletes then inserts. Deletes run before
upserts, so the plan has the effect of running the ops one by one, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from enhydra.sql.model import Delete, Op, Table, Upsert

Shape = tuple[str, tuple[str, ...], tuple[str, ...]]  # table, columns, add columns


@dataclass(slots=True)
class Plan:
    deletes: dict[str, list[tuple]] = field(default_factory=dict)  # table -> key tuples
    upserts: dict[Shape, list[tuple]] = field(default_factory=dict)  # shape -> row tuples

    def __bool__(self) -> bool:
        return bool(self.deletes or self.upserts)

    @property
    def rows(self) -> int:
        return sum(map(len, self.deletes.values())) + sum(map(len, self.upserts.values()))


def _key_of(table: Table) -> Callable[[Mapping[str, Any]], Any]:
    """The key of a row or a delete as one hashable value (a tuple for several columns)."""
    return itemgetter(*table.key)


def _values_of(columns: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple]:
    """A row's values in `columns` order, always as a tuple."""
    if len(columns) == 1:
        (column,) = columns
        return lambda values: (values[column],)
    return itemgetter(*columns)


def plan(ops: Iterable[Op], tables: Mapping[str, Table]) -> Plan:
    """The statements that leave the tables as running `ops` one at a time would.

    It runs per batch over every op: the key and value getters are made once per table and
    shape, not per row, and a row is a [values, added columns] pair (1.3 µs per op here
    instead of 2.3 with an object per row and a set of added columns per op).
    """
    deleted: dict[tuple[str, Any], None] = {}  # (table, key) deleted in this batch, in order
    # (table, key) -> [values, columns added to the stored value]; None: deleted, no upsert since
    rows: dict[tuple[str, Any], list | None] = {}
    keys: dict[str, Callable[[Mapping[str, Any]], Any]] = {}
    for op in ops:
        name = op.table
        key_of = keys.get(name)
        if key_of is None:
            key_of = keys[name] = _key_of(tables[name])
        if type(op) is not Upsert and isinstance(op, Delete):  # upserts are the usual op
            ident = (name, key_of(op.key))
            deleted[ident] = None
            rows[ident] = None
            continue
        new, add = op.row, op.add  # type: ignore[union-attr]
        ident = (name, key_of(new))
        row = rows.get(ident)
        if row is None:
            rows[ident] = [dict(new), add if type(add) is tuple else tuple(add)]
            continue
        values, relative = row
        if not add and not relative:  # absolute values over absolute values
            values.update(new)
            continue
        relative = set(relative)
        for column, value in new.items():
            if column in add and column in values:
                values[column] = values[column] + value
            else:
                values[column] = value
                if column in add:
                    relative.add(column)
                else:
                    relative.discard(column)
        row[1] = tuple(relative)
    result = Plan()
    for name, key in deleted:
        single = len(tables[name].key) == 1
        result.deletes.setdefault(name, []).append((key,) if single else key)
    # (table, columns as the row has them, relative columns) -> the shape's getter and rows
    shapes: dict[tuple, tuple[Callable[[Mapping[str, Any]], tuple], list[tuple]]] = {}
    for (name, _key), row in rows.items():
        if row is None:
            continue
        values, relative = row
        probe = (name, tuple(values), relative)
        known = shapes.get(probe)
        if known is None:
            columns = tuple(sorted(values))
            shape = (name, columns, tuple(c for c in columns if c in relative))
            known = shapes[probe] = (
                _values_of(columns),
                result.upserts.setdefault(shape, []),
            )
        known[1].append(known[0](values))
    return result
