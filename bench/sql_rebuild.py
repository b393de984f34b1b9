"""A rebuild of a SQL projection ends with the live projection's tables (issue #29's target:
"a rebuild of 1M events ends with tables equal to the live projection's").

    .venv/bin/python -m bench.sql_rebuild [--events 1000000] [--batch 2000]

Starts its own broker and PostgreSQL (devtools/postgres.py, as the tests do). Produces --events
events (bench.sql_engine's accounts: half open an account, half add to one) on 4 partitions,
lets the live SqlProjectionEngine fold them all, takes the live tables' row count and a
checksum of every row (md5 over the rows in key order) and their positions, then runs
`enhydra projection rebuild`'s Rebuild into new tables and swaps them in, and takes the same
again. Prints both, whether they are equal, and the times and rates of each.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.common import (
    create_topics,
    fresh_broker,
    load_average,
    machine,
    produce_fast,
    progress,
)
from bench.sql_engine import PARTITIONS, PROJECTION, events, fresh_database
from enhydra.devtools.postgres import temporary_server
from enhydra.kafka.topics import TopicSpec
from enhydra.settings import Settings
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.engine import SqlProjectionEngine
from enhydra.sql.rebuild import Rebuild


@dataclass(frozen=True)
class Tables:
    """What the projection's tables hold: rows, a checksum of every row, the positions."""

    rows: int
    checksum: str
    positions: dict[int, int]


@dataclass(frozen=True)
class Outcome:
    events: int
    live: Tables
    rebuilt: Tables
    live_s: float
    rebuild_s: float

    @property
    def equal(self) -> bool:
        return self.live == self.rebuilt


async def read_tables(db: DatabaseSettings) -> Tables:
    import psycopg

    async with await psycopg.AsyncConnection.connect(db.conninfo()) as conn:
        cur = await conn.execute(
            "SELECT count(*), coalesce(md5(string_agg(t::text, E'\\n' ORDER BY t.id)), '') "
            "FROM accounts t"
        )
        rows, checksum = await cur.fetchone()  # type: ignore[misc]
        cur = await conn.execute(
            "SELECT partition, next_offset FROM enhydra_sql_positions WHERE projection = %s",
            (PROJECTION.positions_key,),
        )
        return Tables(rows, checksum, dict(await cur.fetchall()))


async def compare(
    bootstrap: str, db: DatabaseSettings, state: Path, count: int, batch: int = 2000
) -> Outcome:
    """Produce `count` events, fold them live, rebuild, and read the tables after each."""
    app_id = f"bench-rebuild-{uuid.uuid4().hex[:8]}"
    topic = f"{app_id}-events"
    await create_topics(bootstrap, [TopicSpec(topic, PARTITIONS, history=True)])
    history = events(count)
    records = [(k.encode(), orjson.dumps(e), []) for k, e in history]
    await produce_fast(bootstrap, topic, records, PARTITIONS)
    progress(f"produced {count:,} events")
    settings = Settings.from_env(
        {},
        app_id=app_id,
        bootstrap_servers=bootstrap,
        partitions=PARTITIONS,
        state_dir=state,
        max_batch_records=batch,
    )
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=db)
    began = time.perf_counter()
    await engine.start()
    try:
        while True:  # until every event's rows and position are committed
            if engine.failure is not None:
                raise engine.failure
            done = engine.stats["processed"]
            if done >= count:
                live = await read_tables(db)
                if sum(live.positions.values()) >= count:
                    break
            await asyncio.sleep(0.2)
        live_s = time.perf_counter() - began
    finally:
        await engine.stop()
    progress(f"live projection: {count:,} events in {live_s:.1f}s")
    live = await read_tables(db)
    began = time.perf_counter()
    await Rebuild(settings, db, PROJECTION, topic, batch_records=batch).run()
    rebuild_s = time.perf_counter() - began
    progress(f"rebuild: {count:,} events in {rebuild_s:.1f}s")
    return Outcome(count, live, await read_tables(db), live_s, rebuild_s)


def report(outcome: Outcome) -> str:
    rows = outcome.live.rows
    lines = [
        f"{'':10} {'rows':>10} {'checksum':>34} {'seconds':>9} {'events/s':>10} {'rows/s':>10}",
    ]
    for name, tables, seconds in (
        ("live", outcome.live, outcome.live_s),
        ("rebuilt", outcome.rebuilt, outcome.rebuild_s),
    ):
        lines.append(
            f"{name:10} {tables.rows:>10,} {tables.checksum:>34} {seconds:>9.1f} "
            f"{outcome.events / seconds:>10,.0f} {rows / seconds:>10,.0f}"
        )
    same = "EQUAL" if outcome.equal else "DIFFERENT"
    lines.append(f"tables and positions: {same} ({outcome.rebuilt.positions})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args()
    print(machine(), "| load", load_average())
    with temporary_server("enhydra-bench-pg-") as server, fresh_broker() as (bootstrap, root):

        async def run() -> Outcome:
            db = await fresh_database(server)
            return await compare(bootstrap, db, root / "state", args.events, args.batch)

        outcome = asyncio.run(run())
    print(report(outcome))
    print("load", load_average())
    if not outcome.equal:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
