"""Sessions one after another in one process share one JVM.

A process that runs several jobs (a benchmark, a notebook, a test run) stops one session and
starts the next; pyspark keeps the first gateway JVM for every later context, so launching
another would leave it running idle (~200 MB each). A fresh interpreter, so the JVMs counted
are only those of the sessions it starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SESSIONS = """
import os, sys
from pathlib import Path

import pytest
from enhydra.spark.session import local_session

def java_children():
    me, found = str(os.getpid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        found += stat.rsplit(")", 1)[1].split()[1] == me and b"java" in cmdline
    return found

for _ in range(3):
    spark = local_session("t", master="local[1]", kafka=False, jvm_log=Path(sys.argv[1]))
    assert spark.range(10).count() == 10
    spark.stop()
print(java_children())
"""


@pytest.mark.spark
def test_sessions_started_one_after_another_run_on_one_jvm(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SESSIONS, str(tmp_path / "spark.log")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "1"
