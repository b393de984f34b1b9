"""Peer processes for the failover tests, and a real network stall of one TCP port."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from enhydra.control.channel import control_topic_spec
from enhydra.kafka.topics import TopicSpec, ensure_topics

ROOT = Path(__file__).resolve().parents[2]


class PeerProcess:
    """One `tests.failover.peer` process; its stdout events are collected as they come."""

    def __init__(self, instance: str, *, port: int = 0, **options: Any) -> None:
        self.instance = instance
        self.options = options
        self.requested_port = port
        self.events: list[dict[str, Any]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.start()

    def start(self) -> PeerProcess:
        command = [sys.executable, "-m", "tests.failover.peer", "--instance", self.instance]
        command += ["--port", str(self.port or self.requested_port)]
        for key, value in self.options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                command.append(flag)
            elif value not in (None, False):
                command += [flag, str(value)]
        seen = len(self.events)
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=sys.stderr)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        listening = self.wait_for(lambda e: e["event"] == "listening", 30, after=seen)
        self.port = listening["port"]
        return self

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(orjson.JSONDecodeError):
                event = orjson.loads(line)
                event["seen"] = time.monotonic()
                self.events.append(event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_for(
        self, match: Callable[[dict[str, Any]], bool], timeout: float, after: int = 0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        exited_at = None
        while time.monotonic() < deadline:
            for event in self.events[after:]:
                if match(event):
                    return event
            if exited_at is None and self.proc is not None and self.proc.poll() is not None:
                exited_at = time.monotonic()  # its last lines may still be on their way
            if exited_at is not None and time.monotonic() - exited_at > 1.0:
                break
            time.sleep(0.02)
        raise AssertionError(f"{self.instance}: no matching event in {timeout} s: {self.events}")

    def assignment(self) -> list[int]:
        """The partitions this member holds now, from its assigned/revoked events."""
        held: set[int] = set()
        for event in self.events:
            if event["event"] == "assigned":
                held |= set(event["partitions"])
            elif event["event"] == "revoked":
                held -= set(event["partitions"])
        return sorted(held)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM and wait for the clean stop; blocking: from a test's event loop, use a thread."""
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            steps = [e for e in self.events if e["event"] in ("stopping", "stopped")]
            raise AssertionError(
                f"{self.instance} did not stop within 30 s of SIGTERM; its stop got to: {steps}"
            ) from None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


def wait_until(check: Callable[[], bool], timeout: float, step: float = 0.02) -> float:
    """Seconds until `check()` held; AssertionError after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout} s")


async def make_group_topics(bootstrap: str, group: str, topic: str, partitions: int) -> None:
    await ensure_topics(bootstrap, [TopicSpec(topic, partitions), control_topic_spec(group)])


def _nft() -> str:
    found = shutil.which("nft")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.fail("nft is missing and only root can install it: apt-get install nftables")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nftables"],
        check=True,
        env=env,
        timeout=600,
    )
    found = shutil.which("nft")
    assert found, "apt-get installed nftables but nft is not on PATH"
    return found


@contextlib.contextmanager
def stalled_port(port: int) -> Iterator[None]:
    """Drop every packet to and from TCP `port` (a stalled network path, not a closed port).

    A table of its own (named after this process and port) holds the two rules, so deleting it
    removes exactly them and nothing anyone else set up.
    """
    if os.geteuid() != 0:
        pytest.fail("stalling a port needs root (nftables rules); run the tests as root")
    nft = _nft()
    table = f"enhydra_stall_{os.getpid()}_{port}"
    rules = (
        f"table inet {table} {{\n"
        f"  chain input {{ type filter hook input priority -10; policy accept;\n"
        f"    tcp dport {port} drop\n    tcp sport {port} drop\n  }}\n"
        f"  chain output {{ type filter hook output priority -10; policy accept;\n"
        f"    tcp dport {port} drop\n    tcp sport {port} drop\n  }}\n"
        f"}}\n"
    )
    subprocess.run([nft, "-f", "-"], input=rules.encode(), check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([nft, "delete", "table", "inet", table], check=False, timeout=30)
