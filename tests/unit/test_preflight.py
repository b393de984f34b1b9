"""A second instance on the same state folder or web port stops at once with one line naming the
setting and the fix, exit 3, before Kafka is asked: the claim (preflight.py) and the worker's
own start (`enhydra run`, which `python -m <package>` shares through Service.run)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from enhydra.errors.uncaught import EXIT_CANNOT_START
from enhydra.preflight import StartupConflict, check_web_port, claim_state_dir
from enhydra.testing.processes import free_port


def test_a_state_folder_is_claimed_by_one_instance_at_a_time(tmp_path: Path) -> None:
    first = claim_state_dir(tmp_path / "ledger", "i1")
    with pytest.raises(StartupConflict) as conflict:
        claim_state_dir(tmp_path / "ledger", "i2")
    assert conflict.value.setting == "ENHYDRA_STATE_DIR"
    assert f"is in use by instance i1 (pid {os.getpid()})" in conflict.value.line()
    first.release()
    claim_state_dir(tmp_path / "ledger", "i2").release()  # free again once released


def test_a_state_folder_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(StartupConflict, match="is not writable \\(Not a directory\\)"):
        claim_state_dir(blocker / "ledger", "i1")


def test_a_web_port_in_use_is_named() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupConflict) as conflict:
            check_web_port("0.0.0.0", port)
    assert conflict.value.setting == "ENHYDRA_WEB_PORT"
    assert f"web port {port} is in use" in conflict.value.line()
    check_web_port("0.0.0.0", port)  # closed: free


def run(state_dir: Path, web_port: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENHYDRA_")}
    env.update(
        ENHYDRA_STATE_DIR=str(state_dir),
        ENHYDRA_WEB_PORT=str(web_port),
        ENHYDRA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",  # never reached
        ENHYDRA_LOG_FORMAT="console",
    )
    return subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", "run", "ledger.service:service"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    return [line for line in output.splitlines() if "error" in line.lower()]


def test_a_second_instance_on_the_same_state_folder_stops_with_one_line(tmp_path: Path) -> None:
    held = claim_state_dir(tmp_path / "state" / "ledger", "i1")  # the first instance's claim
    try:
        done = run(tmp_path / "state", free_port())
    finally:
        held.release()
    assert done.returncode == EXIT_CANNOT_START
    (line,) = error_lines(done)
    assert "is in use by instance i1" in line and "ENHYDRA_STATE_DIR" in line, line


def test_a_second_instance_on_the_same_web_port_stops_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        done = run(tmp_path / "state", taken.getsockname()[1])
    assert done.returncode == EXIT_CANNOT_START
    (line,) = error_lines(done)
    assert "is in use" in line and "ENHYDRA_WEB_PORT" in line, line
