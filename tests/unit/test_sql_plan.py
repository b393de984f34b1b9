"""A SQL projection's batch plan (sql/rows.py) against running its ops one at a time.

The plan folds a batch's ops into one change per row, grouped by shape; applied the way the
writer applies it (deletes, then per shape: update the stored rows, insert the others), it must
leave every table as the ops applied in order would. Pure: no database. A column a row does
not name takes its default, 0 here (as `add` to a column with DEFAULT 0).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from enhydra.sql.model import Delete, Table, Upsert
from enhydra.sql.rows import Plan, plan

TABLES = {
    "t": Table("t", ("id",), "CREATE TABLE {table} (id text, a int, b int, c int)"),
    "u": Table("u", ("x", "y"), "CREATE TABLE {table} (x text, y text, v int)"),
}
COLUMNS = {"t": ("a", "b", "c"), "u": ("v",)}
State = dict[str, dict[tuple, dict]]


def key_of(table: str, row: dict) -> tuple:
    return tuple(row[c] for c in TABLES[table].key)


def one_at_a_time(state: State, ops: list) -> State:
    out = {name: {k: dict(v) for k, v in rows.items()} for name, rows in state.items()}
    for op in ops:
        rows = out[op.table]
        if isinstance(op, Delete):
            rows.pop(key_of(op.table, op.key), None)
            continue
        key = key_of(op.table, op.row)
        stored = rows.get(key)
        if stored is None:
            rows[key] = {**dict.fromkeys(COLUMNS[op.table], 0), **op.row}
            continue
        for column, value in op.row.items():
            stored[column] = stored[column] + value if column in op.add else value
    return out


def as_the_writer_applies(state: State, the_plan: Plan) -> State:
    out = {name: {k: dict(v) for k, v in rows.items()} for name, rows in state.items()}
    for name, keys in the_plan.deletes.items():
        for key in keys:
            out[name].pop(tuple(key), None)
    for (name, columns, add), values in the_plan.upserts.items():
        for value in values:
            row = dict(zip(columns, value, strict=True))
            key = key_of(name, row)
            stored = out[name].get(key)
            if stored is None:
                out[name][key] = {**dict.fromkeys(COLUMNS[name], 0), **row}
                continue
            for column in columns:
                stored[column] = stored[column] + row[column] if column in add else row[column]
    return out


ints = st.integers(-5, 5)
t_key = st.sampled_from(["k0", "k1", "k2", "k3"])
u_key = st.tuples(st.just("a"), st.sampled_from(["0", "1", "2"]))


@st.composite
def t_upsert(draw) -> Upsert:
    columns = draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True))
    row = {"id": draw(t_key), **{c: draw(ints) for c in columns}}
    add = tuple(c for c in columns if draw(st.booleans()))
    return Upsert("t", row, add=add)


@st.composite
def u_upsert(draw) -> Upsert:
    x, y = draw(u_key)
    return Upsert("u", {"x": x, "y": y, "v": draw(ints)}, add=draw(st.sampled_from([(), ("v",)])))


op = st.one_of(
    t_upsert(),
    u_upsert(),
    t_key.map(lambda k: Delete("t", {"id": k})),
    u_key.map(lambda k: Delete("u", {"x": k[0], "y": k[1]})),
)
stored_t = st.dictionaries(
    t_key.map(lambda k: (k,)), st.fixed_dictionaries({"a": ints, "b": ints, "c": ints})
)
stored_u = st.dictionaries(u_key, st.fixed_dictionaries({"v": ints}))


@settings(max_examples=400, deadline=None)
@given(stored_t, stored_u, st.lists(op, max_size=25))
def test_a_plan_leaves_the_tables_as_its_ops_one_at_a_time(t_rows, u_rows, ops) -> None:
    state: State = {
        "t": {k: {"id": k[0], **v} for k, v in t_rows.items()},
        "u": {k: {"x": k[0], "y": k[1], **v} for k, v in u_rows.items()},
    }
    the_plan = plan(ops, TABLES)
    assert as_the_writer_applies(state, the_plan) == one_at_a_time(state, ops)
    keys = [(name, key_of(name, dict(zip(s, v, strict=True))))
            for (name, s, _), values in the_plan.upserts.items() for v in values]  # fmt: skip
    assert len(keys) == len(set(keys))  # each row once: the writer's stage holds a key once


class Removal(Delete):
    """A user's own kind of delete (model.check takes subclasses of the ops)."""


def test_a_subclass_of_delete_deletes() -> None:
    the_plan = plan([Upsert("t", {"id": "k0", "a": 1}), Removal("t", {"id": "k0"})], TABLES)
    assert (the_plan.deletes, the_plan.upserts) == ({"t": [("k0",)]}, {})
