"""Long provisioning commands pass their output on while they run, not when they are done."""

from __future__ import annotations

import sys
from pathlib import Path

from enhydra.devtools.process import run_streaming

# Prints a line, then waits for the reader to react to it before printing the next: only a
# reader that gets each line while the command still runs lets it finish with "go".
HANDSHAKE = """
import pathlib, sys, time
flag = pathlib.Path(sys.argv[1])
print("waiting", flush=True)
deadline = time.monotonic() + 20
while not flag.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
print("go" if flag.exists() else "nobody read my first line", flush=True)
print("to stderr", file=sys.stderr, flush=True)
sys.exit(3)
"""


def test_each_line_arrives_while_the_command_still_runs(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    seen: list[str] = []

    def on_line(line: str) -> None:
        seen.append(line)
        if line == "waiting":
            flag.touch()

    log = tmp_path / "logs" / "step.log"
    done = run_streaming(
        [sys.executable, "-c", HANDSHAKE, str(flag)], timeout=60, on_line=on_line, log=log
    )
    assert seen == ["waiting", "go", "to stderr"]
    assert (done.returncode, done.timed_out, done.ok) == (3, False, False)
    assert done.last_lines(2) == "go\nto stderr"
    assert log.read_text() == "waiting\ngo\nto stderr\n"


def test_a_command_that_runs_too_long_is_killed(tmp_path: Path) -> None:
    code = "import time; print('started', flush=True); time.sleep(60)"
    done = run_streaming([sys.executable, "-c", code], timeout=0.5)
    assert done.timed_out and not done.ok
    assert done.tail == ("started",)
