"""A SQL projection's write path against a raw COPY of the same rows (issue #29).

    [ENHYDRA_DATABASE_URL=postgresql://... [ENHYDRA_DATABASE_PASSWORD_FILE=...]] \\
        .venv/bin/python -m bench.sql_projection [--events 100000] [--batch 2000] [--repeat 3]
        [--updates 0.5]

Without ENHYDRA_DATABASE_URL it starts a PostgreSQL of its own (Debian's programs).

Per batch of events, one transaction each, interleaved, on the same database:

- raw copy: COPY the batch's final rows, made before the clock starts, into a plain table (no
  key, no merge, no positions): the issue's ceiling;
- raw copy, keyed (with --updates 0 only: every row a new key): the same into a table with
  the projection's primary key, so the database maintains the same index;
- projection/copy: what SqlCommit does, on the clock: rows.plan, COPY into the stage, the
  merge, the positions moved in the same transaction;
- projection/executemany: the same with the stage filled by psycopg's pipelined executemany.

A share --updates of the events add to an account opened earlier (an UPDATE), the others
open a new one (an INSERT). Kafka is left out: this measures the database side of the commit
unit (bench/sql_engine.py runs the whole engine). Prints rows/s and the ratio to raw copy
(medians of --repeat interleaved runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time

from bench.common import load_average, machine, median, progress
from enhydra.devtools.postgres import temporary_server
from enhydra.sql import SqlProjection, Table, Upsert
from enhydra.sql.config import URL_VAR, DatabaseConfigError, DatabaseSettings
from enhydra.sql.rows import plan
from enhydra.sql.writer import (
    DirectCopy,
    ensure_schema,
    load_positions,
    move_positions,
    prepare_stages,
    table_columns,
    write_plan,
)

DDL = "CREATE TABLE {table} (id text PRIMARY KEY, owner text NOT NULL, balance bigint NOT NULL)"


def events(count: int, seed: int = 7, updates: float = 0.5) -> list[Upsert]:
    rng = random.Random(seed)
    ops: list[Upsert] = []
    opened = 0
    for _ in range(count):
        if opened == 0 or rng.random() >= updates:
            row = {"id": f"a{opened}", "owner": f"o{opened}", "balance": 0}
            ops.append(Upsert("accounts", row))
            opened += 1
        else:
            key = f"a{rng.randrange(opened)}"
            ops.append(Upsert("accounts", {"id": key, "balance": 5}, add=("balance",)))
    return ops


def _full_rows(the_plan) -> list[tuple]:
    """A plan's rows as whole `raw_accounts` rows (the raw COPY's input)."""
    out = []
    for (_, columns, _), values in the_plan.upserts.items():
        for row in values:
            full = dict(zip(columns, row, strict=True))
            out.append((full["id"], full.get("owner", ""), full["balance"]))
    return out


RAW = {"raw copy": "raw_accounts", "raw copy, keyed": "raw_keyed"}


async def run(
    db: DatabaseSettings, ops: list[Upsert], batch: int, repeat: int, keyed: bool
) -> dict:
    import psycopg

    projection = SqlProjection("bench", lambda k, e: [], (Table("accounts", ("id",), DDL),))
    tables = projection.by_name
    batches = [ops[i : i + batch] for i in range(0, len(ops), batch)]
    variants = ["raw copy", *(["raw copy, keyed"] if keyed else []), "copy", "executemany"]
    results: dict[str, list[float]] = {name: [] for name in variants}
    connect = psycopg.AsyncConnection.connect(db.conninfo(), autocommit=True)  # as the pool's
    async with await connect as conn:
        await ensure_schema(conn, projection)
        await conn.execute("DROP TABLE IF EXISTS raw_accounts, raw_keyed")
        await conn.execute("CREATE TABLE raw_accounts (LIKE accounts)")
        await conn.execute("CREATE TABLE raw_keyed (LIKE accounts INCLUDING INDEXES)")
        stored = await table_columns(conn, projection.tables)  # as the engine reads them
        for round_ in range(repeat):
            for variant in results:
                await conn.execute("TRUNCATE accounts, raw_accounts, raw_keyed")
                await conn.execute("DELETE FROM enhydra_sql_positions")
                start = await load_positions(conn, "bench", "events", [0])
                rows = 0
                # The ceiling copies rows made before its clock starts; the projection plans
                # its rows on the clock, as its commit unit does.
                ready = [_full_rows(plan(chunk, tables)) for chunk in batches]
                direct = DirectCopy()  # as a commit unit's, from its start
                began = time.perf_counter()
                for n, chunk in enumerate(batches):
                    if variant in RAW:
                        async with (
                            conn.transaction(),
                            conn.cursor().copy(
                                f"COPY {RAW[variant]} (id, owner, balance) FROM STDIN"
                            ) as copy,
                        ):
                            for row in ready[n]:
                                await copy.write_row(row)
                        rows += len(ready[n])
                        continue
                    the_plan = plan(chunk, tables)
                    await prepare_stages(conn, the_plan)
                    async with conn.transaction():
                        await write_plan(
                            conn,
                            the_plan,
                            tables,
                            variant,
                            prepared=True,
                            stored=stored,
                            direct=direct,
                        )
                        await move_positions(
                            conn, "bench", "events", {0: (start[0] + n, start[0] + n + 1)}
                        )
                    rows += the_plan.rows
                elapsed = time.perf_counter() - began
                results[variant].append(rows / elapsed)
                progress(f"round {round_ + 1}: {variant}: {rows / elapsed:,.0f} rows/s")
    return {name: median(values) for name, values in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--updates", type=float, default=0.5, help="share of events that update")
    args = parser.parse_args()
    print(machine(), "| load", load_average())
    ops = events(args.events, updates=args.updates)
    if os.environ.get(URL_VAR):
        try:
            db = DatabaseSettings.from_env()
        except DatabaseConfigError as exc:
            sys.exit(f"{exc} (the benchmark writes into that database's public schema)")
        medians = asyncio.run(run(db, ops, args.batch, args.repeat, keyed=args.updates == 0))
    else:  # a server of its own
        with temporary_server("enhydra-bench-pg-") as server:
            db = DatabaseSettings(server.url(), server.password_file)
            medians = asyncio.run(run(db, ops, args.batch, args.repeat, keyed=args.updates == 0))
    raw = medians["raw copy"]
    for name, value in medians.items():
        label = name if name in RAW else f"projection/{name}"
        print(f"{label:26} {value:>12,.0f} rows/s   {value / raw:.2f}x raw copy")


if __name__ == "__main__":
    main()
