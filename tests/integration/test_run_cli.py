"""`enhydra run` on a real broker: its flags win over ENHYDRA_*, and a restart shows its restore."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from enhydra.testing.processes import (
    ServiceProcess,
    free_port,
    http_get,
    produce_json,
    service_env,
    wait_for_committed,
)
from ledger.workload import generate, model

pytestmark = pytest.mark.integration

TARGET = "ledger.service:service"


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_run_flags_win_over_the_environment_and_a_restart_logs_its_restore(
    kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    # Everything the flags name is set differently in the environment, and wrongly.
    env = service_env(
        app_id=f"{app_id}-from-env",
        bootstrap="127.0.0.1:1",
        instance_id="from-env",
        state_dir=tmp_path / "env-state",
        extra={"ENHYDRA_LOG_LEVEL": "error"},
    )
    port = free_port()
    state = tmp_path / "state"
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable, "-m", "enhydra.cli.main", "run", TARGET,
        "--app", app_id, "--bootstrap", kafka_bootstrap, "--instance-id", "flagged",
        "--web-port", str(port), "--state-dir", str(state), "--log-level", "info",
    ]  # fmt: skip

    first_log = tmp_path / "first.log"
    first = start(argv, env, first_log)
    try:
        ServiceProcess.wait_until_ready(first, url, first_log)
        _, stats = http_get(url + "/v1/stats")
        assert stats["instance"] == "flagged"
        commands = generate(300, 3000, seed=5)
        asyncio.run(produce_json(kafka_bootstrap, f"{app_id}-commands", commands))
        asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=90))
    finally:
        assert stop(first) == 0, first_log.read_text()[-3000:]
    assert (state / app_id).is_dir() and not (tmp_path / "env-state").exists()
    assert any(e["event"] == "starting" for e in events(first_log)), "--log-level info"

    # A new machine: no local state, so the stores come back from their changelog.
    shutil.rmtree(state)
    second_log = tmp_path / "second.log"
    second = start(argv, env, second_log)
    try:
        ServiceProcess.wait_until_ready(second, url, second_log)
        expected = model(commands)
        account = sorted(expected)[0]
        _, state_of = http_get(f"{url}/v1/stores/accounts/keys/{account}")
        assert state_of == expected[account]
    finally:
        assert stop(second) == 0, second_log.read_text()[-3000:]
    changelog = f"{app_id}-accounts-changelog"
    lines = events(second_log)
    started = [e for e in lines if e["event"] == "restore started"]
    finished = [e for e in lines if e["event"] == "restore finished"]
    assert started and {e["changelog"] for e in started + finished} == {changelog}
    assert sorted(e["partition"] for e in finished) == sorted(e["partition"] for e in started)
    assert sum(e["restored"] for e in finished) == sum(e["records"] for e in started) > 0
