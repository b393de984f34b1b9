"""Real service instances as OS processes, and small Kafka helpers for tests and the demo.

A test that kills an instance must kill a process, not a coroutine: only then are the crash
semantics (no flush, no commit, no goodbye to the group) the ones production sees.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enhydra.devtools.ports import free_port
from enhydra.kafka.clients import as_connection, open_admin, open_producer
from enhydra.kafka.groups import committed_offsets
from enhydra.kafka.reading import end_offsets, read_all
from enhydra.settings import Connection

__all__ = [
    "ServiceProcess",
    "end_offsets",
    "free_port",
    "http_get",
    "produce_json",
    "read_topic",
    "service_env",
    "wait_for_committed",
]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    """GET a JSON endpoint; returns (status, decoded body)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body or b"null")
        except json.JSONDecodeError:
            return exc.code, body.decode("utf-8", "replace")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


@dataclass
class ServiceProcess:
    """One instance of a service started with `enhydra run TARGET`."""

    target: str
    env: dict[str, str]
    log_path: Path
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['ENHYDRA_WEB_PORT']}"

    @property
    def instance_id(self) -> str:
        return self.env["ENHYDRA_INSTANCE_ID"]

    def start(self) -> ServiceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "enhydra.cli.main", "run", self.target],
            env={**os.environ, **self.env},
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until /health/ready answers 200; fail with the log tail if the process died."""
        assert self.process is not None
        self.wait_until_ready(self.process, self.url, self.log_path, timeout)

    @staticmethod
    def wait_until_ready(
        process: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float = 60.0
    ) -> None:
        """Poll `url`/health/ready of any instance process until it answers 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{url} exited early:\n{_tail(log_path)}")
            try:
                status, _ = http_get(url + "/health/ready", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{url} not ready after {timeout}s:\n{_tail(log_path)}")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait: the graceful path (flush, commit, leave the group)."""
        if not self.alive():
            return self.process.returncode if self.process else None
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"{self.instance_id} ignored SIGTERM for {timeout}s") from None

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed."""
        if self.alive():
            assert self.process is not None
            self.process.kill()
            self.process.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def get(self, path: str) -> tuple[int, Any]:
        return http_get(self.url + path)


def service_env(
    *,
    app_id: str,
    bootstrap: str,
    instance_id: str,
    state_dir: Path,
    web_port: int | None = None,
    partitions: int = 4,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for one test instance: short timeouts so rebalances take seconds.

    A stopped test instance leaves its groups at once (a scale-down), as most tests stop one
    instance and start another; a test of rolling restarts sets
    ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN=false, the production default.
    """
    return {
        "ENHYDRA_APP_ID": app_id,
        "ENHYDRA_BOOTSTRAP_SERVERS": bootstrap,
        "ENHYDRA_INSTANCE_ID": instance_id,
        "ENHYDRA_STATE_DIR": str(state_dir),
        "ENHYDRA_WEB_HOST": "127.0.0.1",
        "ENHYDRA_WEB_PORT": str(web_port or free_port()),
        "ENHYDRA_PARTITIONS": str(partitions),
        "ENHYDRA_SESSION_TIMEOUT_MS": "6000",
        "ENHYDRA_HEARTBEAT_INTERVAL_MS": "1000",
        "ENHYDRA_REBALANCE_TIMEOUT_MS": "10000",
        "ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN": "true",
        "ENHYDRA_LOG_FORMAT": "json",
        **(extra or {}),
    }


async def produce_json(
    conn: Connection | str,
    topic: str,
    records: Iterable[tuple[str, Any]],
    *,
    linger_ms: int = 5,
) -> int:
    """Produce (key, value) pairs as JSON, partitioned by key like any Kafka producer."""
    count = 0
    async with open_producer(as_connection(conn), linger_ms=linger_ms, acks="all") as producer:
        futures = []
        for key, value in records:
            data = value if isinstance(value, bytes) else json.dumps(value).encode()
            futures.append(await producer.send(topic, data, key=key.encode()))
            count += 1
        await asyncio.gather(*futures)
    return count


async def read_topic(conn: Connection | str, topic: str) -> list[Any]:
    """Every record currently in `topic` (up to its end offsets), oldest first per partition."""
    return await read_all(as_connection(conn), topic)


async def wait_for_committed(
    conn: Connection | str, group: str, topic: str, *, timeout: float = 60.0
) -> None:
    """Wait until the group has committed every partition of `topic` up to its end."""
    conn = as_connection(conn)
    deadline = time.monotonic() + timeout
    async with open_admin(conn) as admin:
        while True:
            ends = await end_offsets(conn, topic)
            committed = {
                tp.partition: offset
                for tp, offset in (await committed_offsets(admin, group)).items()
                if tp.topic == topic
            }
            behind = {p: end - committed.get(p, 0) for p, end in ends.items()}
            if all(lag <= 0 for lag in behind.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"group {group} still behind on {topic}: {behind}")
            await asyncio.sleep(0.3)
