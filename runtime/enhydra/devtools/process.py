"""Run a long host command (Maven, pip, podman, debootstrap) and pass its output on as it comes.

Provisioning steps take minutes; a user watching a silent terminal cannot tell a slow download
from a hung one. Each output line goes to `on_line` the moment it is written (and to a log
file), and the last lines are kept for the error message when the command fails.
"""

from __future__ import annotations

import collections
import contextlib
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TAIL_LINES = 40


@dataclass(frozen=True)
class Finished:
    """How a command ended: its exit code, whether it ran out of time, its last lines."""

    returncode: int
    timed_out: bool
    tail: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def last_lines(self, count: int = TAIL_LINES) -> str:
        return "\n".join(self.tail[-count:])


def run_streaming(
    cmd: Sequence[str],
    *,
    timeout: float,
    on_line: Callable[[str], None] | None = None,
    log: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Finished:
    """Run `cmd` with stdout and stderr merged; each line (without its newline) to `on_line`.

    The command is killed after `timeout` seconds (`timed_out` is then set). `log`, when given,
    receives the whole output as it is written, so `tail -f` works on it too.
    """
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    opened = log.open("w", encoding="utf-8") if log is not None else contextlib.nullcontext()
    with opened as sink:
        process = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            cwd=cwd,
            env=dict(env) if env is not None else None,
        )
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            process.kill()

        timer = threading.Timer(timeout, kill)
        timer.daemon = True
        timer.start()
        try:
            assert process.stdout is not None
            for raw in process.stdout:
                line = raw.rstrip("\n")
                tail.append(line)
                if sink is not None:
                    sink.write(raw)
                    sink.flush()
                if on_line is not None:
                    on_line(line)
            returncode = process.wait()
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            timer.cancel()
    return Finished(returncode, expired.is_set(), tuple(tail))
