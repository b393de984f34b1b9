"""Parity: the ledger run by the real service, then rebuilt by Spark from its events topic.

Two real instances process 20,000 commands over 2,000 accounts; Spark must arrive at the same
state key by key through both Kafka readers, and its snapshot must hold the very Entry envelopes
(state, offset, command ids) the live stores hold, as their changelog records them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from enhydra.contracts.codec import Entry, decode_entry
from enhydra.contracts.fingerprint import store_fingerprint
from enhydra.snapshots import load_into_stores, open_snapshot
from enhydra.spark.fold import fold_events
from enhydra.spark.job import run_backfill
from enhydra.spark.source import read_events
from enhydra.stores.partition import PartitionStore
from enhydra.testing.processes import (
    ServiceProcess,
    end_offsets,
    produce_json,
    read_topic,
    service_env,
    wait_for_committed,
)
from ledger.workload import generate, model

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(420)]

TARGET = "ledger.service:service"
PARTITIONS = 4


@dataclass
class LedgerRun:
    app_id: str
    bootstrap: str
    commands: list[tuple[str, dict[str, Any]]]
    served: dict[str, dict[str, Any]]  # what the instances answer over HTTP
    changelog: dict[bytes, Entry]  # the live stores' entries, latest per key


def read_hosted(instances: list[ServiceProcess], accounts: list[str]) -> dict[str, dict]:
    """Each account from the instance that hosts it (forward=false: 421 means another one)."""
    found: dict[str, dict] = {}
    for account in accounts:
        path = f"/v1/stores/accounts/keys/{account}?forward=false"
        answers = [instance.get(path) for instance in instances]
        hits = [body for status, body in answers if status == 200]
        assert len(hits) <= 1, f"{account} hosted by more than one instance: {answers}"
        if hits:
            found[account] = hits[0]
        else:
            assert all(status in (404, 421) for status, _ in answers), answers
    return found


@pytest.fixture(scope="module")
def ledger_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """2 ledger instances, 20,000 commands; state read back from whichever instance hosts it."""
    import uuid

    app_id = f"t-spark-parity-{uuid.uuid4().hex[:8]}"
    tmp = tmp_path_factory.mktemp("parity")
    instances = []
    for name in ("i1", "i2"):
        env = service_env(
            app_id=app_id,
            bootstrap=kafka_bootstrap,
            instance_id=name,
            state_dir=tmp / f"state-{name}",
            partitions=PARTITIONS,
        )
        instances.append(ServiceProcess(TARGET, env, tmp / f"{name}.log").start())
    try:
        for instance in instances:
            instance.wait_ready()
        commands = generate(2000, 20_000, seed=23)
        asyncio.run(produce_json(kafka_bootstrap, f"{app_id}-commands", commands))
        asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=120))
        served = read_hosted(instances, sorted({key for key, _ in commands}))
        records = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-accounts-changelog"))
        changelog = {r.key: decode_entry(r.value) for r in records}
        yield LedgerRun(app_id, kafka_bootstrap, commands, served, changelog)
    finally:
        for instance in instances:
            try:
                instance.stop(timeout=30)
            except TimeoutError:
                instance.kill()


def as_tuple(entry: Entry) -> tuple[Any, int, list[str]]:
    return (entry.state, entry.offset, entry.command_ids)


@pytest.mark.parametrize("method", ["kafka", "python"])
@pytest.mark.parametrize("layout", ["in place, hash", "in place, sort", "split read, shuffled"])
def test_spark_state_equals_the_service_state(
    spark, ledger_run: LedgerRun, method: str, layout: str
) -> None:
    """Both readers, folded in place (one Spark partition per Kafka partition, no shuffle:
    in log order with no sort, or sorted by key) or read in pieces and shuffled by key: the
    same entries as the live stores."""
    in_place = layout.startswith("in place")
    events = read_events(
        spark,
        f"{ledger_run.app_id}-events",
        ledger_run.bootstrap,
        method=method,
        split_records=None if in_place else 1500,
    )
    pieces = events.rdd.getNumPartitions()
    assert pieces == PARTITIONS if in_place else pieces > PARTITIONS
    assert events.count() == sum(s["version"] for s in ledger_run.served.values())
    fold = layout.rpartition(", ")[2] if in_place else None
    folded = fold_events(events, TARGET, shuffle=not in_place, fold=fold)
    rows = folded.select("key_text", "state", "value", "partition", "task").collect()
    rebuilt = {row.key_text: orjson.loads(row.state) for row in rows}
    assert len(rebuilt) == len(rows) == len(ledger_run.served) > 1800
    assert rebuilt == ledger_run.served
    assert rebuilt == model(ledger_run.commands)
    envelopes = {row.key_text.encode(): as_tuple(decode_entry(row.value)) for row in rows}
    assert envelopes == {k: as_tuple(e) for k, e in ledger_run.changelog.items()}
    plan = folded._jdf.queryExecution().executedPlan().toString()
    if in_place:  # each Kafka partition was folded by one task, and no exchange was planned
        assert len({(row.partition, row.task) for row in rows}) == PARTITIONS
        assert "Exchange" not in plan
    assert ("Sort [" in plan) is (fold != "hash"), plan  # the hash fold sorts nothing


def test_snapshot_holds_the_live_entries_and_loads_into_stores(
    spark, ledger_run: LedgerRun, tmp_path: Path
) -> None:
    app_id = ledger_run.app_id
    result = run_backfill(
        spark,
        TARGET,
        connection=ledger_run.bootstrap,
        app_id=app_id,
        snapshot=tmp_path / "snap",
        output=str(tmp_path / "state.parquet"),
    )
    fingerprint = store_fingerprint(
        app_id=app_id,
        store="accounts",
        partitions=PARTITIONS,
        commands_topic=f"{app_id}-commands",
        changelog_topic=f"{app_id}-accounts-changelog",
    )
    snap = open_snapshot(tmp_path / "snap", fingerprint)
    assert snap.manifest.source == "spark-backfill"
    assert sorted(snap.partitions) == list(range(PARTITIONS))
    entries = {}
    for p in snap.partitions:
        keys = [k for k, _ in snap.iter_partition(p)]
        assert keys == sorted(keys)
        entries.update((k, as_tuple(e)) for k, e in snap.entries(p))
    assert entries == {k: as_tuple(e) for k, e in ledger_run.changelog.items()}

    # The cut: right after the last accepted command of each commands partition.
    last: dict[int, int] = {}
    for p in snap.partitions:
        for _, entry in snap.entries(p):
            last[p] = max(last.get(p, -1), entry.offset)
    assert snap.cut.topic == f"{app_id}-commands"
    assert snap.cut.offsets == {p: last[p] + 1 for p in range(PARTITIONS)}
    ends = asyncio.run(end_offsets(ledger_run.bootstrap, f"{app_id}-commands"))
    assert all(snap.cut.offsets[p] <= ends[p] for p in ends)
    assert result.cut == snap.cut and result.keys == len(entries)

    # Loaded into fresh stores, the entries and the input checkpoint are the snapshot's.
    loaded = load_into_stores(snap, tmp_path / "state" / "clone" / "accounts")
    assert sum(loaded.values()) == len(entries)
    for p, cut in snap.cut.offsets.items():
        store = PartitionStore(tmp_path / "state" / "clone" / "accounts" / str(p))
        try:
            assert store.input_offset == cut - 1
            assert dict(store.items()) == dict(snap.iter_partition(p))
        finally:
            store.close()

    # The analytics copy holds the same states.
    parquet = spark.read.parquet(str(tmp_path / "state.parquet")).collect()
    assert {r.key_text: orjson.loads(r.state) for r in parquet} == ledger_run.served


def test_the_command_runs_the_job_quietly_and_shows_its_progress(
    ledger_run: LedgerRun, tmp_path: Path
) -> None:
    """`enhydra backfill` as a user runs it: steps on stderr, Spark's own log in a file.

    (Before the clone test, which sends more commands to the instances.)"""
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "enhydra.cli.main",
            "backfill",
            TARGET,
            "--master",
            "local[2]",
            "--bootstrap",
            ledger_run.bootstrap,
            "--app",
            ledger_run.app_id,
            "--snapshot",
            str(tmp_path / "snap"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ENHYDRA_LOG_FORMAT": "json"},
        check=False,
    )
    assert job.returncode == 0, job.stderr[-4000:]
    lines = [json.loads(line) for line in job.stderr.splitlines() if line.startswith("{")]
    steps = [line["step"] for line in lines if line.get("event") == "backfill step"]
    assert steps == ["fold", "cut", "write snapshot"]
    started = next(line for line in lines if line.get("event") == "backfill started")
    assert started["fold"] == "in place"  # 4 partitions, 2 cores: no shuffle
    assert "log4j" not in job.stderr and "WARN" not in job.stderr  # Spark's log went to a file
    assert job.stdout.startswith(f"backfill: {len(ledger_run.changelog)} keys from ")
    snap = open_snapshot(tmp_path / "snap")
    entries = {k: as_tuple(e) for p in snap.partitions for k, e in snap.entries(p)}
    assert entries == {k: as_tuple(e) for k, e in ledger_run.changelog.items()}


def test_until_offsets_rebuilds_an_earlier_state(
    spark, ledger_run: LedgerRun, tmp_path: Path
) -> None:
    """Half of each events partition folds to what the events up to there say."""
    topic = f"{ledger_run.app_id}-events"
    ends = asyncio.run(end_offsets(ledger_run.bootstrap, topic))
    half = {p: end // 2 for p, end in ends.items()}
    records = asyncio.run(read_topic(ledger_run.bootstrap, topic))
    from ledger.domain import apply

    expected: dict[str, Any] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.offset < half[r.partition]:
            key = r.key.decode()
            expected[key] = apply(expected.get(key), orjson.loads(r.value))
    for method in ("kafka", "python"):
        events = read_events(spark, topic, ledger_run.bootstrap, until_offsets=half, method=method)
        rows = fold_events(events, "ledger.domain:accounts").collect()
        assert {r.key_text: orjson.loads(r.state) for r in rows} == expected, method


@pytest.mark.parametrize("method", ["kafka", "python"])
def test_corrected_events_are_re_emitted_in_key_order(
    spark, ledger_run: LedgerRun, method: str
) -> None:
    source = f"{ledger_run.app_id}-events"
    target = f"{ledger_run.app_id}-events-corrected-{method}"
    result = run_backfill(
        spark,
        TARGET,
        connection=ledger_run.bootstrap,
        app_id=ledger_run.app_id,
        emit_events=target,
        method=method,
    )

    def per_key(topic: str) -> dict[bytes, list[tuple[int, bytes, list]]]:
        out: dict[bytes, list[tuple[int, bytes, list]]] = {}
        for r in asyncio.run(read_topic(ledger_run.bootstrap, topic)):
            out.setdefault(r.key, []).append((r.partition, r.value, list(r.headers)))
        return out

    original = per_key(source)
    assert result.emitted == sum(len(v) for v in original.values())
    assert per_key(target) == original  # nothing was duplicated in this run: the same history


def test_a_new_version_cloned_from_the_spark_snapshot_continues_from_the_cut(
    spark, ledger_run: LedgerRun, tmp_path: Path
) -> None:
    from enhydra.snapshots.offline import clone

    app_id = ledger_run.app_id
    run_backfill(
        spark, TARGET, connection=ledger_run.bootstrap, app_id=app_id, snapshot=tmp_path / "snap"
    )
    snap = open_snapshot(tmp_path / "snap")
    v2 = f"{app_id}-v2"
    result = asyncio.run(clone(snap, conn=ledger_run.bootstrap, to_app=v2))
    assert result.resumes_at_cut and result.offsets == snap.cut.offsets

    later = generate(2000, 3000, seed=24)[1900:]  # deposits/withdrawals on existing accounts
    asyncio.run(produce_json(ledger_run.bootstrap, f"{app_id}-commands", later))
    env = service_env(
        app_id=v2,
        bootstrap=ledger_run.bootstrap,
        instance_id="v2",
        state_dir=tmp_path / "v2",
        partitions=PARTITIONS,
        extra={"ENHYDRA_COMMANDS_TOPIC": f"{app_id}-commands"},
    )
    instance = ServiceProcess(TARGET, env, tmp_path / "v2.log").start()
    try:
        instance.wait_ready()
        asyncio.run(wait_for_committed(ledger_run.bootstrap, v2, f"{app_id}-commands", timeout=120))
        expected = model(ledger_run.commands + later)
        got = read_hosted([instance], sorted(expected))
        assert got == expected
    finally:
        instance.stop(timeout=30)
