"""Toxiproxy, the TCP proxy that fault tests put between a service and its brokers.

It is built from source with `go install` (the Go module proxy, pinned version) into the
per-user cache once, so CI on a fresh machine gets it from the project's own files
(`make setup`) and later runs skip the build. The server runs as a child of the test session;
testing/toxiproxy.py talks to its HTTP API.

    python -m enhydra.devtools.toxiproxy      # build it if missing, print `toxiproxy=PATH`
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from enhydra.devtools.broker import HOST, _file_lock, cache_root
from enhydra.devtools.ports import free_port
from enhydra.devtools.process import run_streaming

TOXIPROXY_VERSION = "v2.12.0"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
BUILD_TIMEOUT_S = 900


class ToxiproxyError(RuntimeError):
    """Toxiproxy could not be built or started; the message says why."""


def toxiproxy_path(cache_dir: Path | None = None) -> Path:
    """Where the pinned toxiproxy server binary lives in the cache."""
    return (cache_dir or cache_root()) / f"toxiproxy-{TOXIPROXY_VERSION}" / "toxiproxy-server"


def ensure_toxiproxy(cache_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """The toxiproxy server binary, built with `go install` the first time (~1.5 min)."""
    binary = toxiproxy_path(cache_dir)
    if binary.is_file():
        return binary
    with _file_lock(binary.parent / ".lock"):
        if binary.is_file():
            return binary
        go = shutil.which("go")
        if go is None:
            raise ToxiproxyError(
                "`go` was not found on PATH; it builds Toxiproxy for the fault tests once "
                "(install Go 1.22+, e.g. apt-get install golang-go)"
            )
        scratch = binary.parent / "build"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        if not quiet:
            print(f"enhydra: building Toxiproxy {TOXIPROXY_VERSION} with go (once, ~2 min)...",
                  file=sys.stderr, flush=True)  # fmt: skip
        env = {**os.environ, "GOBIN": str(scratch), "CGO_ENABLED": "0"}
        done = run_streaming(
            [go, "install", f"{MODULE}@{TOXIPROXY_VERSION}"],
            timeout=BUILD_TIMEOUT_S, env=env, cwd=scratch,
        )  # fmt: skip
        built = scratch / "server"
        if not done.ok or not built.is_file():
            reason = "timed out" if done.timed_out else f"exit code {done.returncode}"
            raise ToxiproxyError(
                f"building Toxiproxy {TOXIPROXY_VERSION} failed ({reason}):\n{done.last_lines(15)}"
            )
        os.replace(built, binary)
        shutil.rmtree(scratch, ignore_errors=True)
    return binary


class ToxiproxyServer:
    """One toxiproxy-server process on a free port of 127.0.0.1, stopped by `stop()`."""

    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.log_path = log_path
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 20.0) -> ToxiproxyServer:
        binary = ensure_toxiproxy()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(binary), "-host", HOST, "-port", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ToxiproxyError(f"toxiproxy-server exited at start; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.api_url + "/version", timeout=1):
                    return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)
        self.stop()
        raise ToxiproxyError(f"toxiproxy-server did not answer within {timeout:.0f}s")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def main() -> int:
    try:
        path = ensure_toxiproxy()
    except ToxiproxyError as exc:
        print(f"enhydra: {exc}", file=sys.stderr)
        return 1
    print(f"toxiproxy={path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
