"""The ledger and the tools against secured listeners of a real broker, and plain failures.

The session broker has a SASL_SSL listener (SCRAM users made at format time, a CA and a server
certificate made at start), a mutual-TLS listener and an authorizer. Nothing here talks to its
PLAINTEXT port unless the test says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from enhydra.cli.main import main as cli
from enhydra.testing.processes import free_port, http_get, service_env
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, read_accounts

pytestmark = [pytest.mark.integration, pytest.mark.timing]

TARGET = "ledger.service:service"


def run_cli(env: dict[str, str], *args: str):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_the_ledger_runs_end_to_end_over_sasl_ssl(
    service_factory, secured_kafka, app_id, tmp_path
) -> None:
    conn = secured_kafka.sasl_ssl
    storage = tmp_path / "snapshots"
    env = {**conn.env(), **CONTROL, "ENHYDRA_SNAPSHOT_STORAGE": str(storage)}
    one = service_factory(TARGET, "i1", extra_env=env)
    two = service_factory(TARGET, "i2", extra_env=env)
    one.wait_ready()
    two.wait_ready()
    commands = generate(300, 3000, seed=21)
    feed(conn, app_id, commands)
    poison = [("acct-000001", b"{not json")]
    feed(conn, app_id, poison)

    expected = model(commands)
    assert read_accounts([one, two], sorted(expected)) == expected
    for instance in (one, two):
        _, stats = instance.get("/v1/stats")
        assert stats["processed"] > 0, stats

    # The tools reach the same listener with the same variables.
    listed = run_cli(env, "dlq", "list", "--app", app_id)
    assert listed.exit_code == 0, listed.output
    assert "1 dead letter(s)" in listed.output
    created = run_cli(env, "snapshot", "create", "--app", app_id, "--storage", str(storage))
    assert created.exit_code == 0, created.output
    snapshot = run_cli(env, "snapshot", "list", "--storage", str(storage))
    assert app_id in snapshot.output

    # The password is nowhere a user or an operator could see it.
    secret = secured_kafka.password
    pages = [one.get("/v1/metadata"), one.get("/v1/stats"), http_get_text(one.url + "/")]
    assert all(secret not in json.dumps(body) for _, body in pages)
    assert "SASL_SSL" in json.dumps(pages[0][1]) or "sasl" not in json.dumps(pages[0][1])
    assert one.stop() == 0 and two.stop() == 0
    for instance in (one, two):
        text = instance.log_path.read_text()
        assert secret not in text
        assert "Traceback" not in text
    manifests = list(storage.rglob("manifest.json"))
    assert manifests and all(secret not in m.read_text() for m in manifests)

    dry = run_cli(env, "reset", "--app", app_id, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: nothing changed" in dry.output


def http_get_text(url: str) -> tuple[int, str]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def test_the_ledger_runs_over_mutual_tls(service_factory, secured_kafka, app_id) -> None:
    conn = secured_kafka.mtls
    one = service_factory(TARGET, "i1", extra_env={**conn.env(), **CONTROL})
    one.wait_ready()
    commands = generate(100, 800, seed=22)
    feed(conn, app_id, commands)
    assert read_accounts([one], sorted(model(commands))) == model(commands)
    listed = run_cli(conn.env(), "dlq", "list", "--app", app_id)
    assert listed.exit_code == 0, listed.output
    assert "0 dead letter(s)" in listed.output


# ------------------------------------------------------------------------------ failures


@dataclasses.dataclass
class Outcome:
    code: int
    seconds: float
    output: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.strip()]

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.lines]


def start_instance(env: dict[str, str], tmp_path: Path, *argv: str) -> Outcome:
    """Run a worker until it exits on its own (the failures below must end it)."""
    command = list(argv) or [sys.executable, "-m", "enhydra.cli.main", "run", TARGET]
    started = time.monotonic()
    done = subprocess.run(
        command,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    return Outcome(done.returncode, time.monotonic() - started, done.stdout + done.stderr)


# An authenticated protocol requires the control topic's secret (control/signing.py).
CONTROL = {"ENHYDRA_CONTROL_SECRET": "test-control-secret"}


def base_env(app_id: str, tmp_path: Path) -> dict[str, str]:
    env = service_env(
        app_id=app_id,
        bootstrap="127.0.0.1:9",
        instance_id="failing",
        state_dir=tmp_path / "state",
        extra=CONTROL,
    )
    return env


def assert_plain_failure(outcome: Outcome, expected: str, secret: str | None = None) -> dict:
    assert outcome.code == 3, outcome.output
    assert outcome.seconds < 20, outcome.seconds
    assert "Traceback" not in outcome.output
    assert len(outcome.lines) <= 4, outcome.output
    errors = [e for e in outcome.events() if e.get("level") == "error"]
    assert len(errors) == 1, outcome.output
    assert expected in errors[0]["event"], errors[0]
    assert errors[0].get("setting", "").startswith("ENHYDRA_"), errors[0]
    if secret is not None:
        assert secret not in outcome.output
    return errors[0]


def test_a_wrong_password_ends_the_worker_with_one_line(secured_kafka, app_id, tmp_path) -> None:
    conn = dataclasses.replace(
        secured_kafka.sasl_ssl, sasl_password="not-the-password", sasl_password_file=None
    )
    env = {**base_env(app_id, tmp_path), **conn.env()}
    outcome = start_instance(env, tmp_path)
    error = assert_plain_failure(outcome, "authentication failed for user 'admin'", secret=None)
    assert "not-the-password" not in outcome.output
    assert "ENHYDRA_SASL_PASSWORD" in error["setting"]
    # The same through `python -m ledger` and through a tool.
    by_module = start_instance(env, tmp_path, sys.executable, "-m", "ledger")
    assert_plain_failure(by_module, "authentication failed")
    tool = run_cli(env, "dlq", "list", "--app", app_id)
    assert tool.exit_code == 3
    assert tool.output.splitlines()[0].startswith("Error: authentication failed for user")
    assert "Traceback" not in tool.output and len(tool.output.splitlines()) == 2


def test_an_unreachable_broker_ends_the_worker_and_names_a_mistyped_setting(
    app_id, tmp_path
) -> None:
    env = base_env(app_id, tmp_path)
    env["ENHYDRA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{free_port()}"
    env["ENHYDRA_BOOTSTRAP_SERVER"] = "kafka.example.com:9092"  # a typo: ignored, but said
    outcome = start_instance(env, tmp_path)
    assert_plain_failure(outcome, "connection refused")
    typo = [e for e in outcome.events() if e["event"] == "unknown setting ignored"]
    assert typo and typo[0]["did_you_mean"] == "ENHYDRA_BOOTSTRAP_SERVERS", outcome.output


def test_a_listener_of_another_protocol_is_named(secured_kafka, app_id, tmp_path) -> None:
    env = base_env(app_id, tmp_path)
    env["ENHYDRA_BOOTSTRAP_SERVERS"] = secured_kafka.sasl_ssl.bootstrap_servers  # no TLS/SASL
    error = assert_plain_failure(start_instance(env, tmp_path), "closed the connection")
    assert error["setting"] == "ENHYDRA_SECURITY_PROTOCOL"


def test_a_user_without_acls_gets_an_authorization_error(secured_kafka, app_id, tmp_path) -> None:
    env = {**base_env(app_id, tmp_path), **secured_kafka.limited.env()}
    outcome = start_instance(env, tmp_path)
    assert_plain_failure(outcome, "user 'limited' is not authorized")


def test_tools_say_plainly_what_is_missing(secured_kafka, kafka_bootstrap) -> None:
    missing = run_cli(
        {"ENHYDRA_BOOTSTRAP_SERVERS": kafka_bootstrap}, "dlq", "list", "--app", "nope"
    )
    assert missing.exit_code == 1
    assert "no topic 'nope-dlq'" in missing.output and "Traceback" not in missing.output
    refused = run_cli(
        {"ENHYDRA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"},
        "reset", "--app", "nope", "--dry-run",
    )  # fmt: skip
    assert refused.exit_code == 3, refused.output
    assert "connection refused" in refused.output
    assert "hint: check ENHYDRA_BOOTSTRAP_SERVERS" in refused.output


@pytest.mark.slow
def test_a_broker_outage_is_logged_a_few_lines_a_minute(app_id, tmp_path) -> None:
    """While the broker is down the worker retries; its log says so without flooding."""
    from enhydra.devtools.broker import LocalBroker

    broker = LocalBroker(tmp_path / "kafka", port=0)
    info = broker.start()
    env = service_env(
        app_id=app_id, bootstrap=info.bootstrap, instance_id="i1", state_dir=tmp_path / "s"
    )
    log_path = tmp_path / "i1.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "enhydra.cli.main", "run", TARGET],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{env['ENHYDRA_WEB_PORT']}"
        wait_ready(url, worker, log_path)
        before = len(log_path.read_text().splitlines())
        broker.stop()
        time.sleep(45)
        during = log_path.read_text().splitlines()[before:]
        assert worker.poll() is None, "the worker must keep retrying"
        print(f"outage: {len(during)} log lines in 45 s")
        assert len(during) <= 30, "\n".join(during[-40:])
        broker.start()
        commands = generate(20, 100, seed=23)
        feed(info.bootstrap, app_id, commands)
        assert_balances(url, commands)
    finally:
        worker.terminate()
        worker.wait(30)
        broker.stop()


def wait_ready(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log_path.read_text()[-3000:]
        try:
            if http_get(url + "/health/ready", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(log_path.read_text()[-3000:])


def assert_balances(url: str, commands: list) -> None:
    expected = model(commands)
    for account, state in expected.items():
        status, body = http_get(f"{url}/v1/stores/accounts/keys/{account}")
        assert status == 200 and body == state, (account, status, body)


def test_kafka_start_prints_settings_that_connect(_local_broker, secured_kafka) -> None:
    """`enhydra kafka start --security ...` output, fed back as ENHYDRA_* variables, works."""
    from enhydra.cli.kafka import client_settings
    from enhydra.kafka.clients import check_access
    from enhydra.settings import Connection

    for security in ("sasl_ssl", "ssl"):
        printed = client_settings(_local_broker, security)
        env = {
            "ENHYDRA_" + ("bootstrap_servers" if k == "bootstrap" else k).upper(): v
            for k, v in printed.items()
        }
        conn = Connection.from_env(env)
        assert conn.security_protocol == security.upper()
        assert asyncio.run(check_access(conn)) == 1
        assert secured_kafka.password not in printed.values()  # a file path, not the secret
