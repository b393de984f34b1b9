"""A SQL projection end to end (Kafka -> project -> PostgreSQL) against a raw COPY of the same
rows, in one run, on one database (issue #29's target: >= 0.5x raw COPY).

    .venv/bin/python -m bench.sql_engine [--events 200000] [--batch 2000] [--repeat 3]

Starts its own broker and PostgreSQL (Debian's server, as the tests do: enhydra.sql.testing).
Per round, interleaved, each into a fresh database:

- engine: SqlProjectionEngine folds the events topic (4 partitions, one account row per event:
  half open an account, half add to one) with ENHYDRA_MAX_BATCH_RECORDS=--batch; timed from
  its first landed batch to its last, so the group join is left out;
- raw copy: COPY the rows the engine was handed (one per event, full columns) into an
  unindexed table, --batch rows per transaction: the ceiling for writing those rows.

Prints events/s of each (medians of --repeat) and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import orjson

from bench.common import (
    create_topics,
    fresh_broker,
    load_average,
    machine,
    median,
    produce_fast,
    progress,
)
from enhydra.kafka.topics import TopicSpec
from enhydra.settings import Settings
from enhydra.sql import SqlProjection, Table, Upsert
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.engine import SqlProjectionEngine
from enhydra.sql.testing import Postgres, find_server_bin

PARTITIONS = 4
DDL = "CREATE TABLE {table} (id text PRIMARY KEY, owner text NOT NULL, balance bigint NOT NULL)"


def project(key: str, event: dict) -> list[Upsert]:
    if event["type"] == "opened":
        return [Upsert("accounts", {"id": key, "owner": event["owner"], "balance": 0})]
    return [Upsert("accounts", {"id": key, "balance": event["amount"]}, add=("balance",))]


PROJECTION = SqlProjection("bench", project, (Table("accounts", ("id",), DDL),))


def events(count: int, seed: int = 7) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    out: list[tuple[str, dict]] = []
    opened = 0
    for _ in range(count):
        if opened == 0 or rng.random() < 0.5:
            out.append((f"a{opened}", {"type": "opened", "owner": f"o{opened}"}))
            opened += 1
        else:
            out.append((f"a{rng.randrange(opened)}", {"type": "added", "amount": 5}))
    return out


async def fresh_database(server: Postgres) -> DatabaseSettings:
    import psycopg

    name = f"b_{uuid.uuid4().hex[:10]}"
    admin = DatabaseSettings(server.url(), server.password_file)
    async with await psycopg.AsyncConnection.connect(admin.conninfo(), autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    return DatabaseSettings(server.url(name), server.password_file)


async def engine_round(
    bootstrap: str, topic: str, db: DatabaseSettings, state: Path, count: int, batch: int
) -> float:
    settings = Settings.from_env(
        {},
        app_id=f"bench-{uuid.uuid4().hex[:8]}",
        bootstrap_servers=bootstrap,
        partitions=PARTITIONS,
        state_dir=state,
        max_batch_records=batch,
    )
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=db)
    await engine.start()
    try:
        first: tuple[float, int] | None = None
        while engine.stats["processed"] < count:
            if engine.failure is not None:
                raise engine.failure
            done = engine.stats["processed"]
            if first is None and done:
                first = (time.perf_counter(), done)
            await asyncio.sleep(0.005)
        assert first is not None
        return (count - first[1]) / (time.perf_counter() - first[0])
    finally:
        await engine.stop()


async def copy_round(db: DatabaseSettings, rows: list[tuple], batch: int) -> float:
    import psycopg

    async with await psycopg.AsyncConnection.connect(db.conninfo(), autocommit=True) as conn:
        await conn.execute(DDL.replace("{table}", "accounts_pk"))
        await conn.execute("CREATE TABLE raw_accounts (LIKE accounts_pk)")
        began = time.perf_counter()
        for start in range(0, len(rows), batch):
            async with (
                conn.transaction(),
                conn.cursor().copy("COPY raw_accounts (id, owner, balance) FROM STDIN") as copy,
            ):
                for row in rows[start : start + batch]:
                    await copy.write_row(row)
        return len(rows) / (time.perf_counter() - began)


async def run(bootstrap: str, server: Postgres, root: Path, args: argparse.Namespace) -> dict:
    history = events(args.events)
    topic = "bench-sql-events"
    await create_topics(bootstrap, [TopicSpec(topic, PARTITIONS, history=True)])
    records = [(k.encode(), orjson.dumps(e), []) for k, e in history]
    await produce_fast(bootstrap, topic, records, PARTITIONS)
    owners = {k: e["owner"] for k, e in history if e["type"] == "opened"}
    rows = [(k, owners[k], e.get("amount", 0)) for k, e in history]
    results: dict[str, list[float]] = {"raw copy": [], "engine": []}
    for round_ in range(args.repeat):
        for variant in results:
            db = await fresh_database(server)
            if variant == "engine":
                state = root / f"state-{round_}"
                rate = await engine_round(bootstrap, topic, db, state, len(history), args.batch)
            else:
                rate = await copy_round(db, rows, args.batch)
            results[variant].append(rate)
            progress(f"round {round_ + 1}: {variant}: {rate:,.0f} events/s")
    return {name: median(values) for name, values in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(machine(), "| load", load_average())
    pg_root = Path(tempfile.mkdtemp(prefix="enhydra-bench-pg-"))
    pg_root.chmod(0o755)
    server = Postgres(find_server_bin(), pg_root)
    server.init()
    server.start()
    try:
        with fresh_broker() as (bootstrap, root):
            medians = asyncio.run(run(bootstrap, server, root, args))
    finally:
        server.stop("immediate")
        shutil.rmtree(pg_root, ignore_errors=True)
    raw = medians["raw copy"]
    print(f"{'raw copy':12} {raw:>12,.0f} rows/s")
    engine = medians["engine"]
    print(f"{'engine':12} {engine:>12,.0f} events/s   {engine / raw:.2f}x raw copy")
    print("load", load_average())


if __name__ == "__main__":
    main()
