"""Helpers shared by the snapshot tests: the `enhydra` CLI as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=check,
    )


def create_snapshot(app_id: str, bootstrap: str, storage: str) -> dict:
    """`enhydra snapshot create` against the running app; its summary line, decoded."""
    done = cli(
        "snapshot", "create", "--app", app_id, "--bootstrap", bootstrap, "--storage", storage
    )
    return json.loads(done.stdout.strip().splitlines()[-1])
