"""What a worker claims on this machine before it starts: its state folder and its web port.

Two instances on one folder or one port fail late and loud otherwise: RocksDB's "IO error: While
lock file: .../LOCK: Resource temporarily unavailable" once a partition is assigned, or
faust's traceback ending in "address already in use". Checked first, each conflict is one line
that names the setting and the fix, and the worker exits with EXIT_CANNOT_START (3) before it
joins the group.

The state folder is claimed with an advisory lock on `<state_dir>/<app_id>/.instance.lock`,
held as long as the process lives (the kernel drops it when the process dies, even by kill -9),
so a crashed instance never leaves a stale claim behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LOCK_FILE = ".instance.lock"


class StartupConflict(RuntimeError):
    """This instance cannot start here; `what` is the line, `setting` and `fix` the way out."""

    def __init__(self, what: str, *, setting: str, fix: str) -> None:
        super().__init__(f"{what}: {fix}")
        self.what = what
        self.setting = setting
        self.fix = fix

    def line(self) -> str:
        return f"{self.what}: {self.fix}"


@dataclass
class Claim:
    """The held lock on the state folder (keep a reference: closing it releases the lock)."""

    path: Path
    handle: IO[str]

    def release(self) -> None:
        self.handle.close()


def claim_state_dir(store_dir: Path, instance_id: str) -> Claim:
    """Create `store_dir` and lock it for this process, or raise StartupConflict."""
    setting = "ENHYDRA_STATE_DIR"
    try:
        store_dir.mkdir(parents=True, exist_ok=True)
        handle = open(store_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the process's life
    except OSError as exc:
        raise StartupConflict(
            f"state folder {store_dir} is not writable ({exc.strerror or exc})",
            setting=setting,
            fix="set ENHYDRA_STATE_DIR (--state-dir) to a folder this user can write",
        ) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise StartupConflict(
            f"state folder {store_dir} is in use by {holder}",
            setting=setting,
            fix="give each instance on this machine its own ENHYDRA_STATE_DIR (--state-dir), "
            "or stop the other one",
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"instance {instance_id} (pid {os.getpid()})\n")
    handle.flush()
    return Claim(store_dir / LOCK_FILE, handle)


def check_web_port(host: str, port: int) -> None:
    """The web server's address is free (bound as aiohttp binds it), or StartupConflict."""
    if port == 0:  # any free port
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise StartupConflict(
                    f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                    setting="ENHYDRA_WEB_HOST",
                    fix="set ENHYDRA_WEB_HOST to an address of this machine (0.0.0.0: all)",
                ) from None
            raise StartupConflict(
                f"web port {port} is in use (another instance, or another program)",
                setting="ENHYDRA_WEB_PORT",
                fix="set ENHYDRA_WEB_PORT (--web-port) to a free port, or stop the other one",
            ) from None
