"""A SQL projection's write path against a raw COPY of the same rows (issue #29).

    ENHYDRA_DATABASE_URL=postgresql://... [ENHYDRA_DATABASE_PASSWORD_FILE=...] \\
        .venv/bin/python -m bench.sql_projection [--events 100000] [--batch 2000] [--repeat 3]

Per batch of events, one transaction each, interleaved, on the same database:

- raw copy: COPY the batch's final rows into a plain table (no index, no merge, no
  positions): the ceiling;
- projection/copy: what SqlCommit does: rows.plan, COPY into the stage, UPDATE + INSERT merge,
  the positions moved in the same transaction;
- projection/executemany: the same with the stage filled by psycopg's pipelined executemany.

Half the events open a new account, half add to one opened earlier (updates). Kafka is left
out: this measures the database side of the commit unit. Prints rows/s and the ratio to raw
copy (medians of --repeat interleaved runs).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time

from bench.common import load_average, machine, median, progress
from enhydra.sql import SqlProjection, Table, Upsert
from enhydra.sql.config import DatabaseConfigError, DatabaseSettings
from enhydra.sql.rows import plan
from enhydra.sql.writer import (
    ensure_schema,
    load_positions,
    move_positions,
    prepare_stages,
    write_plan,
)

DDL = "CREATE TABLE {table} (id text PRIMARY KEY, owner text NOT NULL, balance bigint NOT NULL)"


def events(count: int, seed: int = 7) -> list[Upsert]:
    rng = random.Random(seed)
    ops: list[Upsert] = []
    opened = 0
    for _ in range(count):
        if opened == 0 or rng.random() < 0.5:
            row = {"id": f"a{opened}", "owner": f"o{opened}", "balance": 0}
            ops.append(Upsert("accounts", row))
            opened += 1
        else:
            key = f"a{rng.randrange(opened)}"
            ops.append(Upsert("accounts", {"id": key, "balance": 5}, add=("balance",)))
    return ops


async def run(db: DatabaseSettings, ops: list[Upsert], batch: int, repeat: int) -> dict:
    import psycopg

    projection = SqlProjection("bench", lambda k, e: [], (Table("accounts", ("id",), DDL),))
    tables = projection.by_name
    batches = [ops[i : i + batch] for i in range(0, len(ops), batch)]
    results: dict[str, list[float]] = {"raw copy": [], "copy": [], "executemany": []}
    connect = psycopg.AsyncConnection.connect(db.conninfo(), autocommit=True)  # as the pool's
    async with await connect as conn:
        await ensure_schema(conn, projection)
        await conn.execute("CREATE TABLE IF NOT EXISTS raw_accounts (LIKE accounts)")
        for round_ in range(repeat):
            for variant in results:
                await conn.execute("TRUNCATE accounts, raw_accounts")
                await conn.execute("DELETE FROM enhydra_sql_positions")
                start = await load_positions(conn, "bench", "events", [0])
                rows = 0
                began = time.perf_counter()
                for n, chunk in enumerate(batches):
                    the_plan = plan(chunk, tables)
                    if variant != "raw copy":
                        await prepare_stages(conn, the_plan)
                    async with conn.transaction():
                        if variant == "raw copy":
                            async with conn.cursor().copy(
                                "COPY raw_accounts (id, owner, balance) FROM STDIN"
                            ) as copy:
                                for (_, columns, _), values in the_plan.upserts.items():
                                    for row in values:
                                        full = dict(zip(columns, row, strict=True))
                                        await copy.write_row(
                                            (full["id"], full.get("owner", ""), full["balance"])
                                        )
                        else:
                            await write_plan(conn, the_plan, tables, variant, prepared=True)
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
    args = parser.parse_args()
    try:
        db = DatabaseSettings.from_env()
    except DatabaseConfigError as exc:
        sys.exit(f"{exc} (the benchmark writes into that database's public schema)")
    print(machine(), "| load", load_average())
    medians = asyncio.run(run(db, events(args.events), args.batch, args.repeat))
    raw = medians["raw copy"]
    for name, value in medians.items():
        label = name if name == "raw copy" else f"projection/{name}"
        print(f"{label:26} {value:>12,.0f} rows/s   {value / raw:.2f}x raw copy")


if __name__ == "__main__":
    main()
