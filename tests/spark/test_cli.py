"""`enhydra backfill` refuses bad input with one line, before any JVM starts.

These runs end before Spark would start (no Java process is created), so they take about a
second each; the job itself runs in test_parity.py and test_cluster.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from enhydra.cli.main import main
from enhydra.testing.processes import free_port


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["backfill", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope.module:service", "--output", "o"], "cannot import 'nope.module'"),
        (["ledger.service:nothing", "--output", "o"], "'ledger.service' has no attribute"),
        (["ledger.domain:accounts", "--output", "o"], "is an Aggregate: give the application"),
        (["ledger.service:service"], "nothing to write"),
        (["ledger.service:service", "--output", "o", "--until-offsets", "x"], "PARTITION=OFFSET"),
        (["ledger.service:service", "--output", "o", "--until-time", "soon"], "ISO 8601"),
        (
            [
                "ledger.service:service",
                "--output",
                "o",
                "--until-time",
                "1",
                "--until-offsets",
                "0=1",
            ],
            "not both",
        ),
        (["ledger.service:service", "--output", "o", "--conf", "x"], "expected KEY=VALUE"),
        (["ledger.service:service", "--output", "o", "--method", "jdbc"], "'jdbc' is not one of"),
        (["ledger.service:service", "--output", "o", "--tasks", "2", "--no-shuffle"], "--tasks"),
        (["ledger.service:service", "--output", "o", "--fold", "hash", "--shuffle"], "in place"),
        (["ledger.service:service", "--output", "o", "--fold", "heap"], "'heap' is not one of"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], message: str) -> None:
    code, output = run(*args)
    assert code == 2
    assert message in output
    assert "Traceback" not in output


def test_output_paths_are_checked(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, output = run("ledger.service:service", "--output", str(blocker / "state"))
    assert code == 2 and f"{blocker} is a file" in output
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "manifest.json").write_text("{}")
    code, output = run("ledger.service:service", "--snapshot", str(tmp_path / "snap"))
    assert code == 2 and "already holds a snapshot" in output


def test_an_unreachable_broker_fails_fast_without_spark() -> None:
    started = time.monotonic()
    address = f"127.0.0.1:{free_port()}"
    code, output = run("ledger.service:service", "--output", "o", "--bootstrap", address)
    assert code == 3
    assert output.splitlines()[0] == f"Error: cannot reach Kafka at {address}: connection refused"
    assert "ENHYDRA_BOOTSTRAP_SERVERS" in output and len(output.splitlines()) == 2
    assert time.monotonic() - started < 20


def test_the_bootstrap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("ENHYDRA_BOOTSTRAP_SERVERS", address)
    code, output = run("ledger.service:service", "--output", "o")
    assert code == 3 and f"cannot reach Kafka at {address}" in output


def test_a_bad_security_setting_is_one_line_before_kafka_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENHYDRA_SECURITY_PROTOCOL", "SASL_SSL")
    code, output = run("ledger.service:service", "--output", "o")
    assert code == 2 and "ENHYDRA_SASL_MECHANISM" in output and "Traceback" not in output


def test_help_names_the_environment_variable_and_shows_an_example() -> None:
    code, output = run("--help")
    assert code == 0
    assert "ENHYDRA_BOOTSTRAP_SERVERS" in output
    assert "enhydra backfill ledger.service:service --snapshot" in output
    assert "--app " in output and "--app-id" not in output
