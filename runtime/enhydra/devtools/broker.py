"""A single-node Apache Kafka broker (KRaft, broker+controller) for development and tests.

The jars come from Maven Central (via `mvn`) into a per-user cache, never into the repo, so the
same pinned Kafka runs on every laptop and CI machine without Docker. The broker runs detached;
everything needed to find it again (ports, pid, cluster id) lives in its data directory, so
`start`, `status` and `stop` can be called from different processes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from enhydra import toolcache
from enhydra.devtools.broker_security import (
    SecurityFiles,
    ensure_certificates,
    ensure_passwords,
    listener_properties,
    scram_format_args,
)
from enhydra.devtools.ports import claim, free_port, port_free
from enhydra.devtools.process import run_streaming

# The cache, Java and Maven are shared with spark/jars.py: they live in enhydra.toolcache.
from enhydra.toolcache import ToolError, cache_root
from enhydra.toolcache import file_lock as _file_lock
from enhydra.toolcache import last_lines as _last_lines
from enhydra.toolcache import write_atomic as _write_atomic

KAFKA_VERSION = "4.4.0"
LOG4J_VERSION = "2.24.3"
# Pinned explicitly: without it Maven resolves slf4j-api 1.7 through Kafka and logging goes NOP.
SLF4J_VERSION = "2.0.16"
DEFAULT_PORT = 9092
HOST = "127.0.0.1"
PORT_RELEASE_S = 10.0  # s: a stopped or killed broker is gone, its ports free, within this
NODE_ID = 1

STATE_FILE = "broker.json"
PID_FILE = "broker.pid"
STDOUT_LOG = "broker.log"  # raw stdout/stderr of the JVM (crashes, log4j trouble)
SERVER_LOG = "server.log"  # Kafka's own log4j output
PROPERTIES_FILE = "server.properties"
LOG4J_FILE = "log4j2.properties"
LOG_DIRS = "logs"
_MARKER = "complete.json"
_KAFKA_MAIN = "kafka.Kafka"

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The local broker could not be fetched, started or stopped; the message says why."""


@dataclass
class BrokerInfo:
    """Where a running local broker listens and which process it is."""

    bootstrap: str
    port: int
    pid: int
    data_dir: Path
    # With security: the SASL_SSL and mutual-TLS listeners (see devtools/broker_security.py).
    sasl_ssl_bootstrap: str | None = None
    ssl_bootstrap: str | None = None

    @property
    def security_files(self) -> SecurityFiles:
        return SecurityFiles(self.data_dir)


@dataclass
class BrokerState:
    """What `broker.json` records, so later calls find the broker from the data dir alone."""

    port: int
    controller_port: int
    cluster_id: str
    pid: int | None = None
    version: str = KAFKA_VERSION
    sasl_ssl_port: int | None = None
    ssl_port: int | None = None
    scram_users: bool = False  # SCRAM users were created when the storage was formatted

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BrokerState:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"{STATE_FILE} must hold a JSON object")
        pid = raw.get("pid")

        def port(name: str) -> int | None:
            value = raw.get(name)
            return int(value) if value is not None else None

        return cls(
            port=int(raw["port"]),
            controller_port=int(raw["controller_port"]),
            cluster_id=str(raw["cluster_id"]),
            pid=int(pid) if pid is not None else None,
            version=str(raw.get("version", KAFKA_VERSION)),
            sasl_ssl_port=port("sasl_ssl_port"),
            ssl_port=port("ssl_port"),
            scram_users=bool(raw.get("scram_users", False)),
        )


# --------------------------------------------------------------------------- locations


def kafka_home(cache_dir: Path | None = None) -> Path:
    """Directory holding the jars of the pinned Kafka version inside the cache."""
    return (cache_dir or cache_root()) / f"kafka-{KAFKA_VERSION}"


def default_data_dir() -> Path:
    """Where the dev broker keeps its data unless told otherwise: $ENHYDRA_BROKER_DIR or cache."""
    explicit = os.environ.get("ENHYDRA_BROKER_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return cache_root() / "broker"


# --------------------------------------------------------------------------- tools


def find_java() -> str:
    """Absolute path of a Java >= 17 (JAVA_HOME first, like Kafka's own scripts)."""
    try:
        return toolcache.find_java(f"Apache Kafka {KAFKA_VERSION}")
    except ToolError as exc:
        raise BrokerError(str(exc)) from None


def find_mvn() -> str:
    """Maven resolves Kafka and its exact transitive dependencies from Maven Central."""
    try:
        return toolcache.find_mvn(f"Apache Kafka {KAFKA_VERSION}")
    except ToolError as exc:
        raise BrokerError(str(exc)) from None


# --------------------------------------------------------------------------- jars


def pom_xml() -> str:
    """A throwaway POM whose runtime dependencies are exactly the broker's classpath."""
    deps = [
        ("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
    ]
    rendered = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by enhydra.devtools.broker: the runtime classpath of a local Kafka broker. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.enhydra</groupId>
  <artifactId>local-kafka</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
{rendered}
  </dependencies>
</project>
"""


def _fetched_jars(home: Path) -> list[str] | None:
    """Jar names of a completed fetch, or None if the cache is missing or incomplete."""
    try:
        recorded = json.loads((home / _MARKER).read_text(encoding="utf-8"))
        jars = [str(name) for name in recorded["jars"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    libs = home / "libs"
    if not jars or not all((libs / name).is_file() for name in jars):
        return None
    return jars


class Report(Protocol):
    """Where a long step tells what it does: lines to keep, and a status that changes."""

    def note(self, line: str) -> None: ...

    def status(self, line: str) -> None: ...


class _Stderr:
    """Without a report: the lines to keep go to stderr, the changing status nowhere."""

    def note(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def status(self, line: str) -> None:
        pass


class _Quiet(_Stderr):
    def note(self, line: str) -> None:
        pass


def kafka_classpath(
    cache_dir: Path | None = None, *, quiet: bool = False, report: Report | None = None
) -> str:
    """Return the broker classpath (`<libs>/*`), downloading the jars with Maven the first time.

    `cache_dir` replaces the enhydra cache root (default: see `cache_root`). The download goes
    to a scratch directory that is renamed into place and only then marked complete, so an
    interrupted run is simply redone. `report` hears what Maven does as it does it (else two
    lines go to stderr, or none when `quiet`).
    """
    home = kafka_home(cache_dir)
    libs = home / "libs"
    if _fetched_jars(home) is None:
        with _file_lock(home / ".lock"):
            if _fetched_jars(home) is None:
                _fetch(home, report or (_Quiet() if quiet else _Stderr()))
    return str(libs / "*")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DOWNLOADED = re.compile(r"Downloaded from [^:]+: (\S+) \(([\d.]+) (B|kB|MB|GB) at ")
_COPYING = re.compile(r"Copying (\S+\.jar) to ")
_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


@dataclass
class MavenProgress:
    """What Maven's batch-mode output says it has done so far (downloads, then copies)."""

    downloaded: int = 0
    downloaded_bytes: float = 0.0
    copied: int = 0
    last: str = ""

    def feed(self, line: str) -> bool:
        """Take one output line; True when it moved the progress on."""
        line = _ANSI.sub("", line)
        if found := _DOWNLOADED.search(line):
            self.downloaded += 1
            self.downloaded_bytes += float(found.group(2)) * _UNITS[found.group(3)]
            self.last = found.group(1).rsplit("/", 1)[-1]
            return True
        if found := _COPYING.search(line):
            self.copied += 1
            self.last = found.group(1)
            return True
        return False

    def describe(self) -> str:
        parts = []
        if self.downloaded:
            mb = self.downloaded_bytes / 1e6
            parts.append(f"downloaded {self.downloaded} files ({mb:.1f} MB)")
        if self.copied:
            parts.append(f"copied {self.copied} jars")
        done = ", ".join(parts) or "resolving dependencies"
        return f"Maven: {done}" + (f" - {self.last}" if self.last else "")


def _fetch(home: Path, report: Report) -> None:
    find_java()  # Maven needs Java too; fail with our hint rather than Maven's
    mvn = find_mvn()
    for stale in home.glob("libs.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    (home / _MARKER).unlink(missing_ok=True)
    pom = home / "pom.xml"
    _write_atomic(pom, pom_xml())
    scratch = Path(tempfile.mkdtemp(prefix="libs.partial-", dir=home))
    report.note(
        f"enhydra: downloading Apache Kafka {KAFKA_VERSION} jars with Maven into {home} "
        "(once, ~45 MB)..."
    )
    started = time.monotonic()
    # Not -q: Maven's "Downloaded ..." and "Copying ..." lines are the progress we show.
    command = [
        mvn, "-B", "-Dstyle.color=never", "-f", str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={scratch}", "-DincludeScope=runtime",
    ]  # fmt: skip
    state = MavenProgress()

    def on_line(line: str) -> None:
        if state.feed(line):
            report.status(state.describe())

    report.status(state.describe())
    try:
        done = run_streaming(command, timeout=900, on_line=on_line, cwd=home)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if done.timed_out:
        shutil.rmtree(scratch, ignore_errors=True)
        raise BrokerError(
            f"Maven did not finish downloading Kafka within 900s ({state.describe()})"
        )
    jars = sorted(p.name for p in scratch.glob("*.jar"))
    main_jar = f"kafka_2.13-{KAFKA_VERSION}.jar"
    if done.returncode != 0 or main_jar not in jars:
        shutil.rmtree(scratch, ignore_errors=True)
        output = _ANSI.sub("", done.last_lines(40)).strip() or "(no output)"
        reason = f"exit code {done.returncode}" if done.returncode else f"{main_jar} missing"
        raise BrokerError(
            f"Maven could not download Apache Kafka {KAFKA_VERSION} ({reason}). "
            f"Command: {' '.join(command)}\n{output}"
        )
    libs = home / "libs"
    if libs.exists():
        shutil.rmtree(libs)
    os.rename(scratch, libs)
    _write_atomic(home / _MARKER, json.dumps({"version": KAFKA_VERSION, "jars": jars}) + "\n")
    size_mb = sum((libs / name).stat().st_size for name in jars) / 1e6
    report.note(
        f"enhydra: fetched {len(jars)} jars ({size_mb:.0f} MB) in {time.monotonic() - started:.1f}s"
    )


# --------------------------------------------------------------------------- config files


def broker_properties(
    data_dir: Path,
    port: int,
    controller_port: int,
    overrides: Mapping[str, str] | None = None,
    *,
    secured_ports: tuple[int, int] | None = None,
    lanes: Mapping[str, tuple[int, int]] | None = None,
    node_id: int = NODE_ID,
    voters: str | None = None,
) -> dict[str, str]:
    """server.properties for one node acting as broker and controller on 127.0.0.1.

    `secured_ports` (sasl_ssl, ssl) adds the secured listeners of devtools/broker_security.py.
    `lanes` adds PLAINTEXT listeners NAME -> (port, advertised port): a client that reaches
    the node through a proxy on the advertised port is told to keep using proxies, so a fault
    test can cut one client off (one lane per client) while others talk to the node directly.
    `voters` is the controller quorum of a cluster (default: this node alone).
    """
    listeners = [f"PLAINTEXT://{HOST}:{port}"]
    advertised = list(listeners)
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    if secured_ports is not None:
        listeners += [f"SASL_SSL://{HOST}:{secured_ports[0]}", f"SSL://{HOST}:{secured_ports[1]}"]
        advertised = list(listeners)
        protocols += ["SASL_SSL:SASL_SSL", "SSL:SSL"]
    for name, (lane_port, advertised_port) in (lanes or {}).items():
        lane = _escape_key(name.upper())
        listeners.append(f"{lane}://{HOST}:{lane_port}")
        advertised.append(f"{lane}://{HOST}:{advertised_port}")
        protocols.append(f"{lane}:PLAINTEXT")
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@{HOST}:{controller_port}",
        "listeners": ",".join([*listeners, f"CONTROLLER://{HOST}:{controller_port}"]),
        "advertised.listeners": ",".join(advertised),
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": ",".join(protocols),
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir / LOG_DIRS),
        "num.partitions": "1",
        "default.replication.factor": "1",
        # Our runtime creates topics explicitly; a typo must fail, not create a topic.
        "auto.create.topics.enable": "false",
        # Internal topics: one replica, few partitions (fast to create on first use).
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # Groups: no join delay, and allow the short session timeouts tests like to use.
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "group.consumer.min.session.timeout.ms": "1000",
        # Compaction: check often, and keep the dedupe buffer small enough for a 512 MB heap.
        "log.cleaner.backoff.ms": "1000",
        "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
    }
    if secured_ports is not None:
        props.update(listener_properties(SecurityFiles(data_dir), *secured_ports, host=HOST))
    for key, value in (overrides or {}).items():
        props[str(key)] = str(value)
    return props


def _escape_key(key: str) -> str:
    if not key or re.search(r"[\s=:#!\\]", key):
        raise BrokerError(f"invalid Kafka config key {key!r}")
    return key


def _escape_value(value: str) -> str:
    """java.util.Properties treats backslashes and line breaks specially; keep values literal."""
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if escaped[:1].isspace():
        escaped = "\\" + escaped  # leading blanks would be stripped
    return escaped


def render_properties(props: Mapping[str, str], header: str = "") -> str:
    """Render a java.util.Properties file (keys in insertion order)."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"{_escape_key(k)}={_escape_value(v)}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def log4j2_properties(data_dir: Path) -> dict[str, str]:
    """Kafka's INFO log goes to a rolling file in the data dir, never to the console."""
    log_file = str(data_dir / SERVER_LOG)
    return {
        "status": "warn",
        "name": "enhydra-local-kafka",
        "appender.file.type": "RollingFile",
        "appender.file.name": "file",
        "appender.file.fileName": log_file,
        "appender.file.filePattern": log_file.replace("%", "%%") + ".%i",
        "appender.file.layout.type": "PatternLayout",
        "appender.file.layout.pattern": "[%d] %p %m (%c)%n",
        "appender.file.policies.type": "Policies",
        "appender.file.policies.size.type": "SizeBasedTriggeringPolicy",
        "appender.file.policies.size.size": "10MB",
        "appender.file.strategy.type": "DefaultRolloverStrategy",
        "appender.file.strategy.max": "3",
        "rootLogger.level": "INFO",
        "rootLogger.appenderRef.file.ref": "file",
        # Per-request logging is noise for a dev broker.
        "logger.request.name": "kafka.request.logger",
        "logger.request.level": "WARN",
        "logger.channel.name": "kafka.network.RequestChannel$",
        "logger.channel.level": "WARN",
    }


def new_cluster_id() -> str:
    """Same format as `kafka-storage random-uuid` (Kafka's Uuid), without starting a JVM."""
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
        # Kafka reserves the all-zero and 0...01 ids and avoids ids that look like CLI flags.
        if not text.startswith("-") and int.from_bytes(raw, "big") > 1:
            return text


def read_state(data_dir: Path) -> BrokerState | None:
    """The recorded broker state, or None if missing/corrupt (then we start from scratch)."""
    try:
        return BrokerState.from_json((data_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_state(data_dir: Path, state: BrokerState) -> None:
    _write_atomic(data_dir / STATE_FILE, state.to_json())


def _read_meta_cluster_id(meta: Path) -> str | None:
    try:
        text = meta.read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^cluster\.id=(\S+)\s*$", text, re.MULTILINE)
    return match.group(1) if match else None


# --------------------------------------------------------------------------- processes


# Brokers this process spawned: only these are ours to reap. Reaping any other child would steal
# its exit status from whoever started it (e.g. a Popen that later calls wait()).
_SPAWNED: set[int] = set()


def _reap(pid: int) -> None:
    """Collect a broker we spawned once it exited, so it does not linger as a zombie."""
    if pid not in _SPAWNED:
        return
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        done = pid
    if done == pid:
        _SPAWNED.discard(pid)


def _exists(pid: int) -> bool:
    """Whether `pid` names a process at all (a zombie too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_zombie(pid: int) -> bool:
    """A process that has exited entirely and waits only for its parent to reap it."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return not Path("/proc").is_dir()  # no /proc (macOS): exited once kill stopped it
    return state in ("Z", "X", "x")


def _process_argv(pid: int) -> list[str] | None:
    """argv of a live process, or None if it is gone (zombies have an empty cmdline)."""
    proc = Path("/proc") / str(pid)
    if Path("/proc").is_dir():
        # A process that is still exec'ing (right after posix_spawn returns) briefly has an
        # empty cmdline too, so only a zombie or a vanished pid counts as gone.
        for _ in range(100):
            try:
                raw = (proc / "cmdline").read_bytes()
                if raw:
                    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
                state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                return None
            if state in ("Z", "X", "x"):
                return None
            time.sleep(0.01)
        return None
    try:  # no /proc (macOS): fall back to ps
        os.kill(pid, 0)
        out = subprocess.run(
            ["ps", "-ww", "-o", "command=", "-p", str(pid)],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    command = out.stdout.strip()
    return [command] if command else None


def is_broker_process(pid: int, properties_path: Path) -> bool:
    """True if `pid` is alive and is the Kafka started with this data dir's server.properties.

    Pids get reused: a recorded pid may now belong to anything, so check the command line.
    """
    if pid <= 0:
        return False
    _reap(pid)
    argv = _process_argv(pid)
    if not argv:
        return False
    # `_spawn` ends the command line with exactly these two arguments.
    return " ".join(argv).endswith(f" {_KAFKA_MAIN} {properties_path}")


def _port_accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _kafka_metadata_ok(bootstrap: str, timeout: float) -> bool:
    """A Metadata request succeeds and lists our broker (i.e. it is registered and unfenced).

    Runs on its own thread and event loop so `start()` also works inside a running loop.
    """
    from aiokafka.errors import KafkaError

    from enhydra.kafka.clients import check_access
    from enhydra.kafka.errors import KafkaAccessError
    from enhydra.settings import Connection

    async def probe() -> bool:
        try:
            return await check_access(Connection.plain(bootstrap), timeout=timeout) > 0
        except (KafkaAccessError, KafkaError, TimeoutError):
            # Not ready yet: in a cluster starting up, the metadata may name a node that does
            # not answer yet (NodeNotReadyError). Asked again until the start's deadline.
            return False

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="enhydra-broker-probe") as pool:
        return pool.submit(lambda: asyncio.run(probe())).result()


def _tail(path: Path, since: int = 0, lines: int = 30) -> str:
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = since if 0 <= since <= size else 0
            handle.seek(max(start, size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return _last_lines(text, lines)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# --------------------------------------------------------------------------- the broker


class LocalBroker:
    """One local Kafka node whose data, config, logs and state all live in `data_dir`."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        port: int | None = None,
        *,
        overrides: dict[str, str] | None = None,
        secured: bool = False,
        lanes: Mapping[str, tuple[int, int]] | None = None,
        node_id: int = NODE_ID,
        controller_port: int | None = None,
        voters: str | None = None,
        cluster_id: str | None = None,
        heap: str = "512m",
    ) -> None:
        """`port=None`: the port this data dir used last, else 9092; `port=0`: any free port
        (the previous one if still free, so restarts keep their bootstrap address).

        `secured`: also open the SASL_SSL and mutual-TLS listeners (devtools/broker_security.py).
        `lanes`: extra listeners advertised at proxies (see `broker_properties`). `node_id`,
        `controller_port`, `voters` and `cluster_id` make the node one of a cluster
        (devtools/cluster.py); `heap` is the JVM's -Xmx.
        """
        self.data_dir = (
            Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        ).resolve()
        self._owner = str(self.data_dir)  # its reserved ports (devtools/ports.py) stay its own
        if port is not None and not 0 <= port <= 65535:
            raise BrokerError(f"invalid port {port}")
        self.port = port
        self.overrides = dict(overrides or {})
        self.secured = secured
        self.lanes = dict(lanes or {})
        self.node_id = node_id
        self.controller_port = controller_port
        self.voters = voters
        self.cluster_id = cluster_id
        self.heap = heap

    @property
    def properties_path(self) -> Path:
        return self.data_dir / PROPERTIES_FILE

    @property
    def server_log(self) -> Path:
        return self.data_dir / SERVER_LOG

    @property
    def stdout_log(self) -> Path:
        return self.data_dir / STDOUT_LOG

    def _info(self, state: BrokerState, pid: int) -> BrokerInfo:
        return BrokerInfo(
            bootstrap=f"{HOST}:{state.port}",
            port=state.port,
            pid=pid,
            data_dir=self.data_dir,
            sasl_ssl_bootstrap=f"{HOST}:{state.sasl_ssl_port}" if state.sasl_ssl_port else None,
            ssl_bootstrap=f"{HOST}:{state.ssl_port}" if state.ssl_port else None,
        )

    # ---- queries

    def status(self) -> BrokerInfo | None:
        """The recorded broker if its process is alive (it may still be starting up)."""
        state = read_state(self.data_dir)
        if state is None or state.pid is None:
            return None
        if not is_broker_process(state.pid, self.properties_path):
            return None
        return self._info(state, state.pid)

    def is_running(self) -> bool:
        return self.status() is not None

    # ---- start

    def start(self, timeout: float = 60.0, *, report: Report | None = None) -> BrokerInfo:
        """Start the broker (or reuse the one already running here) and wait until it serves.

        The jars are fetched first when missing (`report` hears Maven); `timeout` counts
        from then on.
        """
        if self.status() is None:
            kafka_classpath(report=report)
        deadline = time.monotonic() + timeout
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.data_dir / ".lock"):
            running = self.status()
            if running is not None:
                if self.port not in (None, 0) and self.port != running.port:
                    raise BrokerError(
                        f"a broker is already running from {self.data_dir} on port "
                        f"{running.port} (pid {running.pid}); stop it first to use port "
                        f"{self.port}"
                    )
                if self.secured and running.sasl_ssl_bootstrap is None:
                    raise BrokerError(
                        f"the broker running from {self.data_dir} (pid {running.pid}) has no "
                        "secured listeners; stop it first (enhydra kafka stop), then start it "
                        "again with --security"
                    )
                self._wait_ready(running, deadline, timeout, spawned=False, log_offsets=(0, 0))
                return running
            self._forget_pid()
            previous = read_state(self.data_dir)
            port, controller_port = self._choose_ports(previous)
            classpath = kafka_classpath()
            java = find_java()
            state = self._prepare(java, classpath, previous, port, controller_port)
            offsets = (_file_size(self.stdout_log), _file_size(self.server_log))
            pid = self._spawn(java, classpath)
            state.pid = pid
            write_state(self.data_dir, state)
            _write_atomic(self.data_dir / PID_FILE, f"{pid}\n")
            info = self._info(state, pid)
            try:
                self._wait_ready(info, deadline, timeout, spawned=True, log_offsets=offsets)
            except BaseException:
                self._terminate(pid, 10.0)
                self._forget_pid()
                raise
            log.info("Kafka %s ready at %s (pid %d)", KAFKA_VERSION, info.bootstrap, pid)
            return info

    def _choose_ports(self, previous: BrokerState | None) -> tuple[int, int]:
        if self.port == 0:
            if previous is not None and claim(previous.port, owner=self._owner):
                port = previous.port
            else:
                port = free_port(owner=self._owner)
        elif self.port is None:
            port = previous.port if previous is not None else DEFAULT_PORT
        else:
            port = self.port
        if not port_free(port):
            raise BrokerError(
                f"{HOST}:{port} is already in use by another process; stop it or choose "
                "another port (--port N, or --port 0 for any free port)"
            )
        if self.controller_port is not None:
            controller_port = self.controller_port
        elif (
            previous is not None
            and previous.controller_port != port
            and claim(previous.controller_port, owner=self._owner)
        ):
            controller_port = previous.controller_port
        else:
            controller_port = free_port(exclude={port}, owner=self._owner)
        return port, controller_port

    def _prepare(
        self,
        java: str,
        classpath: str,
        previous: BrokerState | None,
        port: int,
        controller_port: int,
    ) -> BrokerState:
        """Write config files and format storage once; existing data is kept across restarts."""
        meta = self.data_dir / LOG_DIRS / "meta.properties"
        formatted_id = _read_meta_cluster_id(meta)
        cluster_id = (
            formatted_id
            or self.cluster_id
            or (previous.cluster_id if previous else None)
            or new_cluster_id()
        )
        scram_users = formatted_id is None or bool(previous and previous.scram_users)
        state = BrokerState(
            port=port, controller_port=controller_port, cluster_id=cluster_id,
            scram_users=scram_users,
        )  # fmt: skip
        files = SecurityFiles(self.data_dir)
        passwords = ensure_passwords(files)
        secured_ports = None
        if self.secured:
            if not scram_users:
                raise BrokerError(
                    f"the broker storage in {self.data_dir} was formatted without SCRAM users, "
                    "so SASL_SSL cannot work there; use another --data-dir for a secured broker"
                )
            ensure_certificates(files)
            secured_ports = self._secured_ports(previous, {port, controller_port})
            state.sasl_ssl_port, state.ssl_port = secured_ports
        props = broker_properties(
            self.data_dir, port, controller_port, self.overrides, secured_ports=secured_ports,
            lanes=self.lanes, node_id=self.node_id, voters=self.voters,
        )  # fmt: skip
        header = f"Generated by enhydra for Apache Kafka {KAFKA_VERSION}; rewritten on each start."
        _write_atomic(self.properties_path, render_properties(props, header))
        _write_atomic(
            self.data_dir / LOG4J_FILE, render_properties(log4j2_properties(self.data_dir))
        )
        write_state(self.data_dir, state)
        if formatted_id is None:
            self._format(java, classpath, cluster_id, scram_format_args(passwords))
        return state

    def _secured_ports(self, previous: BrokerState | None, taken: set[int]) -> tuple[int, int]:
        """The SASL_SSL and SSL ports: those of the last start when still free, else new ones."""
        chosen = []
        for last in (previous.sasl_ssl_port, previous.ssl_port) if previous else (None, None):
            if last and last not in taken and claim(last, owner=self._owner):
                port = last
            else:
                port = free_port(exclude=taken, owner=self._owner)
            taken.add(port)
            chosen.append(port)
        return chosen[0], chosen[1]

    def _format(self, java: str, classpath: str, cluster_id: str, extra: list[str]) -> None:
        command = [
            java, "-Xmx256m", f"-Dlog4j2.configurationFile={self.data_dir / LOG4J_FILE}",
            "-cp", classpath, "kafka.tools.StorageTool", "format",
            "-t", cluster_id, "-c", str(self.properties_path), "--ignore-formatted", *extra,
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired as exc:
            raise BrokerError("formatting Kafka storage timed out after 120s") from exc
        if done.returncode != 0:
            # Java puts the cause first and the stack trace after it.
            output = "\n".join((done.stdout + done.stderr).strip().splitlines()[:15])
            raise BrokerError(f"formatting Kafka storage in {self.data_dir} failed:\n{output}")

    def _spawn(self, java: str, classpath: str) -> int:
        """Start the JVM in its own session, detached from our stdio, so it outlives us.

        posix_spawn instead of Popen: there is no handle to keep alive (or to warn about at
        exit); `stop()` reaps the child if it is ours. Only fds 0-2 are passed on (all others
        are close-on-exec), so callers capturing our output never wait for the broker.
        """
        argv = [
            java, f"-Xmx{self.heap}", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
            f"-XX:ErrorFile={self.data_dir / 'hs_err_pid%p.log'}",
            f"-Dlog4j2.configurationFile={self.data_dir / LOG4J_FILE}",
            # Log4j's own shutdown hook would otherwise stop logging halfway through Kafka's.
            "-Dlog4j2.shutdownHookEnabled=false",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp", classpath, _KAFKA_MAIN, str(self.properties_path),
        ]  # fmt: skip
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self.stdout_log.open("a", encoding="utf-8") as out:
            out.write(f"=== {stamp} enhydra: starting Apache Kafka {KAFKA_VERSION}\n")
        file_actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(self.stdout_log), os.O_WRONLY | os.O_APPEND, 0),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        try:
            pid = os.posix_spawn(
                java, argv, dict(os.environ), file_actions=file_actions, setsid=True
            )
        except OSError as exc:
            raise BrokerError(f"could not start {java}: {exc}") from exc
        _SPAWNED.add(pid)
        return pid

    def _wait_ready(
        self,
        info: BrokerInfo,
        deadline: float,
        timeout: float,
        *,
        spawned: bool,
        log_offsets: tuple[int, int],
    ) -> None:
        while True:
            if not is_broker_process(info.pid, self.properties_path):
                raise BrokerError(
                    f"Kafka (pid {info.pid}) exited during startup.\n"
                    + self._log_excerpt(log_offsets)
                )
            remaining = deadline - time.monotonic()
            if _port_accepts(info.port) and _kafka_metadata_ok(
                info.bootstrap, max(1.0, min(5.0, remaining))
            ):
                return
            if time.monotonic() >= deadline:
                what = "start" if spawned else "running broker"
                raise BrokerError(
                    f"Kafka ({what}, pid {info.pid}) did not answer on {info.bootstrap} "
                    f"within {timeout:.0f}s.\n" + self._log_excerpt(log_offsets)
                )
            time.sleep(0.2)

    def _log_excerpt(self, offsets: tuple[int, int]) -> str:
        parts = []
        for path, since in ((self.stdout_log, offsets[0]), (self.server_log, offsets[1])):
            text = _tail(path, since)
            if text:
                parts.append(f"--- last lines of {path}:\n{text}")
        return "\n".join(parts) or f"(no output; see {self.stdout_log} and {self.server_log})"

    # ---- stop

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the recorded broker: SIGTERM (clean shutdown), then SIGKILL after `timeout`."""
        return self._end(timeout, signal.SIGTERM)

    def kill(self) -> bool:
        """SIGKILL the recorded broker at once: a crash, nothing flushed (its data is kept)."""
        return self._end(0.0, signal.SIGKILL)

    def _end(self, timeout: float, first: signal.Signals) -> bool:
        """Send `first` to the recorded broker (SIGKILL after `timeout`); False if none runs.

        Returns once the process is gone and its ports can be bound again, so a restart right
        after gets the same ports: a JVM's main thread shows as exited while its other threads
        still hold the sockets.
        """
        if not self.data_dir.is_dir():
            return False
        with _file_lock(self.data_dir / ".lock"):
            info = self.status()
            if info is None:
                self._forget_pid()
                return False
            self._terminate(info.pid, timeout, first=first)
            self._forget_pid()
            self._wait_gone(info.pid)
            return True

    def _ports(self) -> list[int]:
        """Every port this node binds: client, controller, secured and lane listeners."""
        state = read_state(self.data_dir)
        recorded = [] if state is None else [state.port, state.controller_port]
        if state is not None:
            recorded += [p for p in (state.sasl_ssl_port, state.ssl_port) if p]
        return recorded + [listen for listen, _advertised in self.lanes.values()]

    def _wait_gone(self, pid: int, timeout: float = PORT_RELEASE_S) -> None:
        """Wait until `pid` has exited entirely (reaped, if it is our child) and every port
        of this node can be bound again; a BrokerError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            _reap(pid)
            alive = _exists(pid) and (pid in _SPAWNED or not _is_zombie(pid))
            held = [port for port in self._ports() if not port_free(port)]
            if not alive and not held:
                return
            if time.monotonic() > deadline:
                what = f"{HOST}:{held[0]} is still in use" if held else "it has not exited"
                raise BrokerError(
                    f"Kafka (pid {pid}) was stopped but {what} after {timeout:.0f}s"
                    + (f"; find the port's owner with `lsof -i :{held[0]}`" if held else "")
                )
            time.sleep(0.05)

    def _terminate(self, pid: int, timeout: float, first: int = signal.SIGTERM) -> None:
        steps = ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0))
        for sig, wait in steps if first == signal.SIGTERM else steps[1:]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                _reap(pid)
                return
            end = time.monotonic() + wait
            while time.monotonic() < end:
                if not is_broker_process(pid, self.properties_path):
                    return
                time.sleep(0.1)
            if sig == signal.SIGTERM:
                log.warning("Kafka (pid %d) ignored SIGTERM for %.0fs; killing it", pid, wait)
        raise BrokerError(f"Kafka (pid {pid}) is still alive after SIGKILL")

    def _forget_pid(self) -> None:
        """Drop a dead or stopped pid from the records; keep ports and cluster id for restarts."""
        (self.data_dir / PID_FILE).unlink(missing_ok=True)
        state = read_state(self.data_dir)
        if state is not None and state.pid is not None:
            state.pid = None
            write_state(self.data_dir, state)
