"""The SQL projection the tests run, its independent model, and the events they produce."""

from __future__ import annotations

import random

import orjson

from enhydra import Aggregate, Service
from enhydra.sql import Delete, SqlProjection, Table, Upsert

ACCOUNTS = Table(
    "accounts",
    ("id",),
    """CREATE TABLE {table} (
        id text PRIMARY KEY,
        owner text NOT NULL CHECK (length(owner) <= 12),
        balance bigint NOT NULL,
        events bigint NOT NULL
    )""",
)


def project(key: str, event: dict) -> list:
    kind = event["type"]
    if kind == "closed":
        return [Delete("accounts", {"id": key})]
    if kind == "opened":
        row = {"id": key, "owner": event["owner"], "balance": 0, "events": 1}
        return [Upsert("accounts", row, add=("events",))]
    amount = event["amount"] if kind == "deposited" else -event["amount"]
    row = {"id": key, "balance": amount, "events": 1}
    return [Upsert("accounts", row, add=("balance", "events"))]


PROJECTION = SqlProjection("accounts", project, (ACCOUNTS,))


def model(events: list[tuple[str, dict]]) -> dict[str, tuple[str, int, int]]:
    """Every account's row as the tables must hold it; an owner over 12 characters is refused."""
    rows: dict[str, tuple[str, int, int]] = {}
    for key, event in events:
        kind = event["type"]
        if kind == "opened":
            if len(event["owner"]) <= 12:
                rows[key] = (event["owner"], 0, 1)
        elif kind == "closed":
            rows.pop(key, None)
        elif key in rows:
            owner, balance, count = rows[key]
            amount = event["amount"] if kind == "deposited" else -event["amount"]
            rows[key] = (owner, balance + amount, count + 1)
    return rows


def history(accounts: int, per_account: int, seed: int, bad: int = 0) -> list[tuple[str, dict]]:
    """Events of `accounts` accounts interleaved (each account's in order); `bad` more accounts
    are opened with an owner the table refuses, and see nothing else."""
    rng = random.Random(seed)
    streams = []
    for i in range(accounts):
        key = f"acct-{seed}-{i}"
        events = [{"type": "opened", "owner": f"o{i}"}]
        for _ in range(per_account):
            kind = rng.choice(["deposited", "deposited", "withdrawn"])
            events.append({"type": kind, "amount": rng.randint(1, 100)})
        if rng.random() < 0.1:
            events.append({"type": "closed"})
        streams.append([(key, e) for e in events])
    for i in range(bad):
        streams.append([(f"bad-{seed}-{i}", {"type": "opened", "owner": "x" * 40})])
    out: list[tuple[str, dict]] = []
    while streams:
        stream = rng.choice(streams)
        out.append(stream.pop(0))
        if not stream:
            streams.remove(stream)
    return out


async def produce(
    bootstrap: str, topic: str, events: list[tuple[str, dict]], transactions: int = 0
) -> None:
    """Send `events` in order; with `transactions`, in transactions of that many events (as a
    service under exactly_once writes its events topic: a commit marker after each)."""
    from aiokafka import AIOKafkaProducer

    if not transactions:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            sent = [await producer.send(topic, orjson.dumps(e), key=k.encode()) for k, e in events]
            for future in sent:
                await future
        finally:
            await producer.stop()
        return
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{topic}-test-producer", linger_ms=5
    )
    await producer.start()
    try:
        for i in range(0, len(events), transactions):
            async with producer.transaction():
                for k, e in events[i : i + transactions]:
                    await producer.send(topic, orjson.dumps(e), key=k.encode())
    finally:
        await producer.stop()


def _decide(state: object, command: dict) -> list[dict]:
    return [command]


def _apply(state: object, event: dict) -> object:
    return state


# A service with the accounts SQL projection, for `enhydra projection rebuild
# tests.sql.accounts:SERVICE accounts` (its app id and Kafka from ENHYDRA_*).
SERVICE = Service("sql-accounts", Aggregate("ledger", _decide, _apply), projections=[PROJECTION])
