"""The backfill against secured listeners of a real broker: both readers, both writers.

A ledger instance processes its commands over SASL_SSL (SCRAM-SHA-512); then `enhydra backfill`
runs as a user runs it, with the same ENHYDRA_* security variables as the service: through
Spark's Kafka connector and through the Python reader, each also writing the corrected events
back (Spark's Kafka sink, the Python producer); once over mutual TLS; once with OAUTHBEARER
(the JVM cannot call a Python token provider, so the job reads and writes from Python); and
once with a wrong password, which must end before Spark starts with one plain line. Every
rebuilt balance must equal the ledger's model, and the password must appear nowhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from enhydra.devtools.broker_security import ADMIN_USER, unsecured_token
from enhydra.settings import PREFIX, Connection
from enhydra.spark.fold import fold_events
from enhydra.spark.source import read_events
from enhydra.testing.processes import (
    ServiceProcess,
    produce_json,
    read_topic,
    service_env,
    wait_for_committed,
)
from ledger.workload import generate, model
from tests.spark import token_provider

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

TARGET = "ledger.service:service"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SecuredLedger:
    app_id: str
    expected: dict[str, Any]  # the ledger's model: every account's balance
    events: dict[bytes, list[tuple[int, bytes, list]]]  # the events topic, per key


def per_key(conn: Connection, topic: str) -> dict[bytes, list[tuple[int, bytes, list]]]:
    out: dict[bytes, list[tuple[int, bytes, list]]] = {}
    for r in asyncio.run(read_topic(conn, topic)):
        out.setdefault(r.key, []).append((r.partition, r.value, list(r.headers)))
    return out


@pytest.fixture(scope="module")
def ledger(secured_kafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredLedger]:
    """One ledger instance over SASL_SSL has processed 2,000 commands, then stopped."""
    conn = secured_kafka.sasl_ssl
    app_id = f"t-spark-secured-{uuid.uuid4().hex[:8]}"
    tmp = tmp_path_factory.mktemp("secured-ledger")
    env = service_env(
        app_id=app_id,
        bootstrap=conn.bootstrap_servers,
        instance_id="i1",
        state_dir=tmp / "state",
        # Over an authenticated listener the control topic's messages must be signed.
        extra={**conn.env(), "ENHYDRA_CONTROL_SECRET": "test-control-secret"},
    )
    instance = ServiceProcess(TARGET, env, tmp / "i1.log").start()
    try:
        instance.wait_ready()
        commands = generate(200, 2000, seed=51)
        asyncio.run(produce_json(conn, f"{app_id}-commands", commands))
        asyncio.run(wait_for_committed(conn, app_id, f"{app_id}-commands", timeout=120))
    finally:
        try:
            instance.stop(timeout=30)
        except TimeoutError:
            instance.kill()
    yield SecuredLedger(app_id, model(commands), per_key(conn, f"{app_id}-events"))


def backfill(
    conn: Connection, app_id: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`enhydra backfill` with only `conn`'s ENHYDRA_* variables (and JSON logs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)} | (env or {})
    env.update(conn.env(), ENHYDRA_LOG_FORMAT="json")
    command = [sys.executable, "-m", "enhydra.cli.main", "backfill", TARGET]
    return subprocess.run(
        [*command, "--master", "local[2]", "--app", app_id, *args],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        cwd=ROOT,  # the Python workers import the token provider from tests/
        check=False,
    )


def balances(path: Path) -> dict[str, Any]:
    table = pq.read_table(path, columns=["key_text", "state"])
    states = zip(table["key_text"].to_pylist(), table["state"].to_pylist(), strict=True)
    return {key: orjson.loads(state) for key, state in states}


def events_logged(job: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in job.stderr.splitlines() if line.startswith("{")]


def assert_no_secret(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text


def event_log(tmp_path: Path) -> list[str]:
    """--conf flags that keep Spark's event log (what its UI and history server show)."""
    (tmp_path / "events").mkdir()
    confs = ("enabled=true", "compress=false", f"dir={tmp_path}/events")
    return [arg for conf in confs for arg in ("--conf", f"spark.eventLog.{conf}")]


def logged_plans(tmp_path: Path) -> str:
    text = "".join(p.read_text() for p in (tmp_path / "events").rglob("*") if p.is_file())
    assert "SaveIntoDataSourceCommand" in text or "enhydra-kafka" in text  # plans are in it
    return text


@pytest.mark.parametrize(
    ("method", "reader"),
    [("kafka", "spark's kafka source"), ("python", "the python data source")],
)
def test_both_readers_and_writers_rebuild_every_balance_over_sasl_ssl(
    secured_kafka, ledger: SecuredLedger, tmp_path: Path, method: str, reader: str
) -> None:
    conn = secured_kafka.sasl_ssl
    corrected = f"{ledger.app_id}-corrected-{method}"
    job = backfill(
        conn,
        ledger.app_id,
        "--method",
        method,
        "--output",
        str(tmp_path / "state.parquet"),
        "--emit-events",
        corrected,
        "--spark-logs",  # Spark's own log on stderr too: it must not show the password either
        *event_log(tmp_path),
    )
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-6000:]
    assert balances(tmp_path / "state.parquet") == ledger.expected
    emitted = sum(len(v) for v in ledger.events.values())
    assert f"corrected events written: {emitted}" in job.stdout
    assert per_key(conn, corrected) == ledger.events  # written by Spark's sink / aiokafka
    logged = [e["event"] for e in events_logged(job)]
    assert f"reading events with {reader}" in logged
    started = next(e for e in events_logged(job) if e["event"] == "backfill started")
    assert started["kafka"]["security_protocol"] == "SASL_SSL"
    assert_no_secret(secured_kafka.password, job.stdout, job.stderr, logged_plans(tmp_path))


def test_mutual_tls_reaches_spark_s_connector_with_a_pem_keystore(
    secured_kafka, ledger: SecuredLedger, tmp_path: Path
) -> None:
    """The client key goes inline to Spark's source and sink: redacted in the plans Spark
    logs (its default redaction knows passwords, not `kafka.ssl.keystore.key`)."""
    corrected = f"{ledger.app_id}-corrected-mtls"
    job = backfill(
        secured_kafka.mtls,
        ledger.app_id,
        "--method",
        "kafka",
        "--output",
        str(tmp_path / "state.parquet"),
        "--emit-events",
        corrected,
        *event_log(tmp_path),
    )
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-6000:]
    assert balances(tmp_path / "state.parquet") == ledger.expected
    assert per_key(secured_kafka.mtls, corrected) == ledger.events
    key = secured_kafka.mtls.ssl_keyfile.read_text().splitlines()[1]
    assert_no_secret(key, job.stdout, job.stderr, logged_plans(tmp_path))


def test_oauthbearer_reads_and_writes_from_python(
    secured_kafka, ledger: SecuredLedger, tmp_path: Path
) -> None:
    """The token provider is Python: with --method auto the job falls back to the Python
    reader and producer and says why; with --method kafka it refuses before Spark starts."""
    oauth = Connection(
        bootstrap_servers=secured_kafka.sasl_ssl.bootstrap_servers,
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider="tests.spark.token_provider:token",
        ssl_cafile=secured_kafka.sasl_ssl.ssl_cafile,
    )
    token = {token_provider.VARIABLE: unsecured_token(ADMIN_USER)}
    refused = backfill(
        oauth, ledger.app_id, "--method", "kafka", "--output", str(tmp_path / "x"), env=token
    )
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert refused.stderr.splitlines()[-1] == (
        "Error: Spark's Kafka connector cannot call the Python OAUTHBEARER token provider "
        "(tests.spark.token_provider:token): use --method python (the Python reader "
        "and writer)"
    )
    corrected = f"{ledger.app_id}-corrected-oauth"
    job = backfill(
        oauth,
        ledger.app_id,
        "--output",
        str(tmp_path / "state.parquet"),
        "--emit-events",
        corrected,
        env=token,
    )
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-6000:]
    assert balances(tmp_path / "state.parquet") == ledger.expected
    assert per_key(secured_kafka.sasl_ssl, corrected) == ledger.events
    why = {e["event"]: e.get("why") for e in events_logged(job)}
    assert "token provider" in why["reading kafka from python, not with spark's connector"]
    assert "token provider" in why["writing kafka from python, not with spark's connector"]


def test_a_wrong_password_ends_the_backfill_with_one_plain_line(
    secured_kafka, ledger: SecuredLedger, tmp_path: Path
) -> None:
    wrong = dataclasses.replace(
        secured_kafka.sasl_ssl, sasl_password="not-the-password", sasl_password_file=None
    )
    started = time.monotonic()
    job = backfill(wrong, ledger.app_id, "--output", str(tmp_path / "x"))
    assert job.returncode == 3, job.stderr[-3000:]
    assert time.monotonic() - started < 20
    lines = job.stderr.splitlines()
    assert lines[0] == (
        f"Error: authentication failed for user 'admin' (SCRAM-SHA-512) at "
        f"{wrong.bootstrap_servers}"
    ), job.stderr
    assert len(lines) == 2 and lines[1].startswith("  hint: check ENHYDRA_SASL_USERNAME")
    assert "Traceback" not in job.stderr and job.stdout == ""
    assert_no_secret("not-the-password", job.stdout, job.stderr)


def test_the_python_reader_reads_over_mutual_tls(
    spark, secured_kafka, ledger: SecuredLedger
) -> None:
    """In this test session's Spark: the executors rebuild the mTLS connection and read."""
    events = read_events(spark, f"{ledger.app_id}-events", secured_kafka.mtls, method="python")
    rows = fold_events(events, "ledger.domain:accounts").collect()
    assert {r.key_text: orjson.loads(r.state) for r in rows} == ledger.expected
