"""The local broker's pure parts: config rendering, recorded state, pid checks, jar fetching.

No Java or network here: Maven and Java are replaced by small fake executables, and "running
brokers" by Python processes whose command line looks like Kafka's.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from enhydra import toolcache
from enhydra.cli.kafka import kafka
from enhydra.devtools import broker as local
from enhydra.devtools.broker import (
    KAFKA_VERSION,
    PID_FILE,
    PROPERTIES_FILE,
    STATE_FILE,
    BrokerError,
    BrokerState,
    LocalBroker,
    MavenProgress,
    broker_properties,
    is_broker_process,
    kafka_classpath,
    log4j2_properties,
    new_cluster_id,
    pom_xml,
    read_state,
    render_properties,
    write_state,
)
from enhydra.testing.processes import free_port


def parse_properties(text: str) -> dict[str, str]:
    """Just enough of java.util.Properties to read back what we render."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out, i = [], 0
        while i < len(value):
            if value[i] == "\\" and i + 1 < len(value):
                out.append({"n": "\n", "r": "\r"}.get(value[i + 1], value[i + 1]))
                i += 2
            else:
                out.append(value[i])
                i += 1
        result[key] = "".join(out)
    return result


# --------------------------------------------------------------------------- config rendering


def test_broker_properties_single_node_on_loopback(tmp_path: Path) -> None:
    props = broker_properties(tmp_path, 19092, 19093)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["log.dirs"] == str(tmp_path / "logs")
    assert props["auto.create.topics.enable"] == "false"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["group.min.session.timeout.ms"] == "1000"


def test_overrides_replace_and_extend_defaults(tmp_path: Path) -> None:
    props = broker_properties(
        tmp_path, 1, 2, {"auto.create.topics.enable": "true", "log.retention.ms": "1000"}
    )
    assert props["auto.create.topics.enable"] == "true"
    assert props["log.retention.ms"] == "1000"


def test_rendered_properties_read_back_literally() -> None:
    props = {"a.path": "C:\\data\\kafka", "multi": "one\ntwo", "lead": "  spaced", "plain": "x=y"}
    text = render_properties(props, header="made by a test")
    assert text.startswith("# made by a test\n")
    assert parse_properties(text) == props


@pytest.mark.parametrize("key", ["", "has space", "a=b", "a:b", "#comment"])
def test_invalid_keys_are_rejected(key: str) -> None:
    with pytest.raises(BrokerError, match="invalid Kafka config key"):
        render_properties({key: "v"})


def test_log4j_writes_to_a_file_in_the_data_dir_not_the_console(tmp_path: Path) -> None:
    props = log4j2_properties(tmp_path)
    assert props["appender.file.fileName"] == str(tmp_path / "server.log")
    assert props["rootLogger.level"] == "INFO"
    assert not any(value == "Console" for value in props.values())


def test_pom_lists_kafka_log4j_and_slf4j_2() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.fromstring(pom_xml())
    deps = {
        (d.findtext("m:artifactId", namespaces=ns), d.findtext("m:version", namespaces=ns))
        for d in root.iterfind("m:dependencies/m:dependency", ns)
    }
    assert ("kafka_2.13", KAFKA_VERSION) in deps
    assert ("log4j-slf4j2-impl", local.LOG4J_VERSION) in deps
    assert ("log4j-core", local.LOG4J_VERSION) in deps
    assert any(a == "slf4j-api" and v.startswith("2.") for a, v in deps)


def test_cluster_id_has_kafka_uuid_format() -> None:
    for _ in range(200):
        cid = new_cluster_id()
        assert len(cid) == 22
        assert not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_292"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("something else", None),
    ],
)
def test_parse_java_major_version(output: str, major: int | None) -> None:
    assert toolcache.parse_java_major_version(output) == major


# --------------------------------------------------------------------------- locations


def test_cache_locations_honour_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENHYDRA_CACHE_DIR", raising=False)
    monkeypatch.delenv("ENHYDRA_BROKER_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert local.cache_root() == tmp_path / "home" / ".cache" / "enhydra"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    assert local.cache_root() == tmp_path / "home" / ".cache" / "enhydra"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert local.cache_root() == tmp_path / "xdg" / "enhydra"
    monkeypatch.setenv("ENHYDRA_CACHE_DIR", str(tmp_path / "explicit"))
    assert local.kafka_home() == tmp_path / "explicit" / f"kafka-{KAFKA_VERSION}"
    assert LocalBroker().data_dir == (tmp_path / "explicit" / "broker").resolve()
    monkeypatch.setenv("ENHYDRA_BROKER_DIR", str(tmp_path / "b"))
    assert LocalBroker().data_dir == (tmp_path / "b").resolve()


# --------------------------------------------------------------------------- broker.json


def test_state_round_trip(tmp_path: Path) -> None:
    state = BrokerState(port=9092, controller_port=40001, cluster_id=new_cluster_id(), pid=1234)
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    recorded = json.loads((tmp_path / STATE_FILE).read_text())
    assert recorded["version"] == KAFKA_VERSION
    assert recorded["controller_port"] == 40001
    assert list(tmp_path.iterdir()) == [tmp_path / STATE_FILE]  # no temp files left behind


@pytest.mark.parametrize("content", [None, "", "{not json", '{"port": 1}', "[]"])
def test_missing_or_corrupt_state_reads_as_none(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / STATE_FILE).write_text(content)
    assert read_state(tmp_path) is None
    assert LocalBroker(tmp_path).status() is None


# --------------------------------------------------------------------------- pids


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def fake_kafka(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose argv looks like this data dir's Kafka broker."""
    props = (tmp_path / PROPERTIES_FILE).resolve()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "kafka.Kafka", str(props)]
    )
    yield proc
    proc.kill()
    proc.wait()


def record(data_dir: Path, pid: int, port: int | None = None) -> int:
    """Record a broker of `pid` in `data_dir`; its port (free ones by default: a stop waits
    until the node's ports bind again, and a fixed one may be another test's meanwhile)."""
    port = port if port is not None else free_port()
    state = BrokerState(port=port, controller_port=free_port(), cluster_id="x", pid=pid)
    write_state(data_dir, state)
    (data_dir / PID_FILE).write_text(f"{pid}\n")
    return port


def test_dead_pid_is_not_running_and_stop_cleans_up(tmp_path: Path) -> None:
    port = record(tmp_path, dead_pid())
    broker = LocalBroker(tmp_path)
    assert broker.status() is None
    assert not broker.is_running()
    assert broker.stop() is False
    assert not (tmp_path / PID_FILE).exists()
    state = read_state(tmp_path)
    assert state is not None and state.pid is None and state.port == port


def test_pid_reused_by_another_program_is_not_our_broker(tmp_path: Path) -> None:
    record(tmp_path, os.getpid())  # alive, but it is pytest, not kafka.Kafka
    assert LocalBroker(tmp_path).status() is None
    assert not is_broker_process(os.getpid(), tmp_path / PROPERTIES_FILE)


def test_kafka_of_another_data_dir_is_not_ours(
    tmp_path: Path, fake_kafka: subprocess.Popen[bytes]
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    record(other, fake_kafka.pid)
    assert LocalBroker(other).status() is None


def test_live_broker_is_found_and_stopped(
    tmp_path: Path, fake_kafka: subprocess.Popen[bytes]
) -> None:
    port = record(tmp_path, fake_kafka.pid)
    broker = LocalBroker(tmp_path)
    info = broker.status()
    assert info is not None
    assert (info.pid, info.port, info.bootstrap) == (fake_kafka.pid, port, f"127.0.0.1:{port}")
    assert info.data_dir == tmp_path.resolve()
    assert broker.stop(timeout=10) is True
    assert fake_kafka.wait(timeout=5) == -15  # SIGTERM first, for a clean Kafka shutdown
    assert broker.status() is None
    assert not (tmp_path / PID_FILE).exists()


def test_start_refuses_a_different_port_than_the_running_broker(
    tmp_path: Path, fake_kafka: subprocess.Popen[bytes]
) -> None:
    port = record(tmp_path, fake_kafka.pid)
    with pytest.raises(BrokerError, match=rf"already running .* port {port}"):
        LocalBroker(tmp_path, port=free_port()).start(timeout=5)


def test_start_reports_a_busy_port_before_doing_anything(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(BrokerError, match=f"127.0.0.1:{port} is already in use"):
            LocalBroker(tmp_path, port=port).start(timeout=5)


# --------------------------------------------------------------------------- tools and fetching


def write_tool(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


FAKE_JAVA = """\
import sys
print('openjdk version "17.0.1" 2021-10-19', file=sys.stderr)
"""

FAKE_MVN = """\
import pathlib, sys
log = pathlib.Path(__file__).with_name("mvn-calls")
log.write_text(log.read_text() + "call\\n" if log.exists() else "call\\n")
out = pathlib.Path(next(a for a in sys.argv if a.startswith("-DoutputDirectory="))[18:])
central = "https://repo.maven.apache.org/maven2/org/apache/kafka"
print("\x1b[0m[INFO] Scanning for projects...", flush=True)
print(f"[INFO] Downloading from central: {central}/kafka_2.13/{version}/kafka_2.13-{version}.jar")
print(f"[INFO] Downloaded from central: {central}/kafka_2.13/{version}/kafka_2.13-{version}.jar"
      " (11 MB at 4.2 MB/s)")
print(f"[INFO] Downloaded from central: {central}/kafka-clients/{version}/"
      "kafka-clients-{version}.pom (492 B at 82 kB/s)")
for name in ("kafka_2.13-{version}.jar", "kafka-clients-{version}.jar"):
    print(f"[INFO] Copying {name} to {out / name}")
    (out / name).write_bytes(b"jar")
"""

FAILING_MVN = """\
import sys
print("[ERROR] Failed to execute goal on project local-kafka: Could not resolve dependencies")
sys.exit(1)
"""


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only our fake tools."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    toolcache.java_major_version.cache_clear()
    return bin_dir


def test_missing_java_is_explained(tools: Path) -> None:
    with pytest.raises(BrokerError, match=r"`java` was not found.*apt-get install openjdk-17"):
        local.find_java()


def test_old_java_is_rejected(tools: Path) -> None:
    write_tool(tools, "java", "import sys; print('java version \"1.8.0_292\"', file=sys.stderr)")
    with pytest.raises(BrokerError, match=r"is Java 8; .* needs Java 17"):
        local.find_java()


def test_missing_maven_is_explained(tools: Path, tmp_path: Path) -> None:
    write_tool(tools, "java", FAKE_JAVA)
    with pytest.raises(BrokerError, match=r"`mvn`.*apt-get install openjdk-17-jre-headless maven"):
        kafka_classpath(tmp_path / "cache", quiet=True)


def test_fetch_runs_maven_once(tools: Path, tmp_path: Path) -> None:
    write_tool(tools, "java", FAKE_JAVA)
    write_tool(tools, "mvn", FAKE_MVN.replace("{version}", KAFKA_VERSION))
    home = tmp_path / "cache" / f"kafka-{KAFKA_VERSION}"
    assert kafka_classpath(tmp_path / "cache", quiet=True) == f"{home}/libs/*"
    assert kafka_classpath(tmp_path / "cache", quiet=True) == f"{home}/libs/*"
    assert (tools / "mvn-calls").read_text() == "call\n"
    assert sorted(p.name for p in (home / "libs").iterdir()) == [
        f"kafka-clients-{KAFKA_VERSION}.jar",
        f"kafka_2.13-{KAFKA_VERSION}.jar",
    ]
    assert (home / "pom.xml").read_text() == pom_xml()


def test_fetch_prints_progress_to_stderr_unless_quiet(
    tools: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tool(tools, "java", FAKE_JAVA)
    write_tool(tools, "mvn", FAKE_MVN.replace("{version}", KAFKA_VERSION))
    kafka_classpath(tmp_path / "cache")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"downloading Apache Kafka {KAFKA_VERSION}" in captured.err


def test_half_finished_download_is_redone(tools: Path, tmp_path: Path) -> None:
    write_tool(tools, "java", FAKE_JAVA)
    write_tool(tools, "mvn", FAKE_MVN.replace("{version}", KAFKA_VERSION))
    home = tmp_path / "cache" / f"kafka-{KAFKA_VERSION}"
    (home / "libs").mkdir(parents=True)
    (home / "libs" / "truncated.jar").write_bytes(b"ja")
    (home / "libs.partial-abc").mkdir()
    kafka_classpath(tmp_path / "cache", quiet=True)
    assert (tools / "mvn-calls").read_text() == "call\n"
    assert not (home / "libs" / "truncated.jar").exists()
    assert not list(home.glob("libs.partial-*"))
    # A jar deleted after a complete fetch also triggers a new download.
    (home / "libs" / f"kafka_2.13-{KAFKA_VERSION}.jar").unlink()
    kafka_classpath(tmp_path / "cache", quiet=True)
    assert (tools / "mvn-calls").read_text() == "call\ncall\n"


def test_maven_failure_shows_mavens_error(tools: Path, tmp_path: Path) -> None:
    write_tool(tools, "java", FAKE_JAVA)
    write_tool(tools, "mvn", FAILING_MVN)
    with pytest.raises(BrokerError, match=r"(?s)exit code 1.*Could not resolve dependencies"):
        kafka_classpath(tmp_path / "cache", quiet=True)
    home = tmp_path / "cache" / f"kafka-{KAFKA_VERSION}"
    assert not (home / "libs").exists()
    assert not list(home.glob("libs.partial-*"))
    assert not (home / local._MARKER).exists()


def test_maven_progress_counts_downloads_and_copies() -> None:
    progress = MavenProgress()
    assert progress.describe() == "Maven: resolving dependencies"
    assert not progress.feed("[INFO] Scanning for projects...")
    assert not progress.feed("[INFO] Downloading from central: https://x/a/kafka-raft-4.4.0.jar")
    assert progress.feed(
        "\x1b[0m[INFO] Downloaded from central: https://repo.maven.apache.org/maven2/org/apache/"
        "kafka/kafka-raft/4.4.0/kafka-raft-4.4.0.jar (2.3 MB at 5.1 MB/s)"
    )
    assert progress.feed(
        "[INFO] Downloaded from central: https://x/y/apache-13.pom (14 kB at 1 MB/s)"
    )
    assert progress.describe() == "Maven: downloaded 2 files (2.3 MB) - apache-13.pom"
    assert progress.feed(
        "[INFO] Copying kafka-clients-4.4.0.jar to /c/libs/kafka-clients-4.4.0.jar"
    )
    assert progress.describe() == (
        "Maven: downloaded 2 files (2.3 MB), copied 1 jars - kafka-clients-4.4.0.jar"
    )


def test_the_fetch_command_shows_mavens_progress(tools: Path, tmp_path: Path) -> None:
    write_tool(tools, "java", FAKE_JAVA)
    write_tool(tools, "mvn", FAKE_MVN.replace("{version}", KAFKA_VERSION))
    env = {"ENHYDRA_CACHE_DIR": str(tmp_path / "cache")}
    result = CliRunner().invoke(kafka, ["fetch"], env=env)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"enhydra: downloading Apache Kafka {KAFKA_VERSION} jars")
    # Not a terminal: the last state Maven reached is kept as a line before the summary.
    assert lines[1] == (
        "enhydra: Maven: downloaded 2 files (11.0 MB), copied 2 jars - "
        f"kafka-clients-{KAFKA_VERSION}.jar"
    )
    assert lines[2].startswith("enhydra: fetched 2 jars")
    assert result.stdout == f"classpath={tmp_path}/cache/kafka-{KAFKA_VERSION}/libs/*\n"


def test_cli_turns_errors_into_click_errors(tools: Path, tmp_path: Path) -> None:
    env = {"ENHYDRA_CACHE_DIR": str(tmp_path / "cache")}
    result = CliRunner().invoke(kafka, ["fetch"], env=env)
    assert result.exit_code == 1
    assert "Error: `java` was not found" in result.output
    result = CliRunner().invoke(kafka, ["status", "--data-dir", str(tmp_path / "none")], env=env)
    assert result.exit_code == 1


def test_stop_of_a_never_started_dir_is_a_no_op(tmp_path: Path) -> None:
    started = time.monotonic()
    assert LocalBroker(tmp_path / "missing").stop() is False
    assert not (tmp_path / "missing").exists()
    assert time.monotonic() - started < 5


# --------------------------------------------------------------------------- start, with a fake JVM

FAKE_KAFKA_JVM = """\
import pathlib, sys, time
here = pathlib.Path(__file__).parent
args = sys.argv[1:]
if "-version" in args:
    print('openjdk version "17.0.1" 2021-10-19', file=sys.stderr)
    sys.exit(0)
if "kafka.tools.StorageTool" in args:
    with (here / "format-calls").open("a") as calls:
        calls.write("format\\n")
    logs = pathlib.Path(args[args.index("-c") + 1]).parent / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "meta.properties").write_text(f"cluster.id={args[args.index('-t') + 1]}\\n")
    sys.exit(0)
if (here / "mode").read_text() == "die":
    print("ERROR Exiting Kafka due to fatal exception: boom", file=sys.stderr)
    sys.exit(1)
time.sleep(60)  # "hang": alive, but never listens
"""


@pytest.fixture
def fake_jvm(tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `java` that formats like StorageTool and then dies or hangs, plus a cached classpath."""
    write_tool(tools, "java", FAKE_KAFKA_JVM)
    home = tmp_path / "cache" / f"kafka-{KAFKA_VERSION}"
    (home / "libs").mkdir(parents=True)
    (home / "libs" / "kafka.jar").write_bytes(b"jar")
    (home / local._MARKER).write_text(json.dumps({"jars": ["kafka.jar"]}))
    monkeypatch.setenv("ENHYDRA_CACHE_DIR", str(tmp_path / "cache"))
    return tools


def test_broker_dying_at_startup_is_reported_with_its_output(
    fake_jvm: Path, tmp_path: Path
) -> None:
    (fake_jvm / "mode").write_text("die")
    broker = LocalBroker(tmp_path / "data", port=0)
    with pytest.raises(BrokerError, match=r"(?s)exited during startup.*boom"):
        broker.start(timeout=20)
    assert broker.status() is None
    state = read_state(broker.data_dir)
    assert state is not None and state.pid is None
    meta = (broker.data_dir / "logs" / "meta.properties").read_text()
    assert meta == f"cluster.id={state.cluster_id}\n"
    # Storage is formatted only once: a second attempt keeps the data (and the cluster id).
    with pytest.raises(BrokerError, match="exited during startup"):
        broker.start(timeout=20)
    assert (fake_jvm / "format-calls").read_text() == "format\n"
    again = read_state(broker.data_dir)
    assert again is not None and again.cluster_id == state.cluster_id


def test_broker_that_never_answers_times_out_and_is_stopped(fake_jvm: Path, tmp_path: Path) -> None:
    (fake_jvm / "mode").write_text("hang")
    broker = LocalBroker(tmp_path / "data", port=0)
    started = time.monotonic()
    with pytest.raises(BrokerError, match=r"did not answer on 127\.0\.0\.1:\d+ within 2s"):
        broker.start(timeout=2)
    assert time.monotonic() - started < 15
    assert broker.status() is None
    assert not (broker.data_dir / PID_FILE).exists()


def test_lanes_listen_locally_and_advertise_their_proxy(tmp_path: Path) -> None:
    props = broker_properties(tmp_path, 9092, 9093, lanes={"i1": (7001, 8001), "i2": (7002, 8002)})
    assert props["listeners"].split(",") == [
        "PLAINTEXT://127.0.0.1:9092",
        "I1://127.0.0.1:7001",
        "I2://127.0.0.1:7002",
        "CONTROLLER://127.0.0.1:9093",
    ]
    assert props["advertised.listeners"].split(",") == [
        "PLAINTEXT://127.0.0.1:9092",
        "I1://127.0.0.1:8001",
        "I2://127.0.0.1:8002",
    ]
    assert "I1:PLAINTEXT" in props["listener.security.protocol.map"].split(",")
    assert props["inter.broker.listener.name"] == "PLAINTEXT"  # brokers never use a proxy


def test_a_cluster_records_its_ports_once_and_its_nodes_share_the_quorum(tmp_path: Path) -> None:
    from enhydra.devtools.cluster import LocalCluster

    cluster = LocalCluster(tmp_path, 3, lanes=("i1",))
    node = cluster.node(2)
    again = LocalCluster(tmp_path, 3, lanes=("i1",)).node(2)
    assert (node.port, node.controller_port, node.lanes) == (
        again.port,
        again.controller_port,
        again.lanes,
    )
    assert node.node_id == 2 and node.voters is not None and node.voters.count("@") == 3
    assert node.overrides["default.replication.factor"] == "3"
    assert node.overrides["min.insync.replicas"] == "2"
    assert len(cluster.lane_bootstrap("i1").split(",")) == 3
    with pytest.raises(BrokerError, match="holds a cluster of 3 brokers"):
        LocalCluster(tmp_path, 2).layout()


def test_cli_cluster_options_fail_in_one_line(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "c")]
    result = CliRunner().invoke(kafka, ["start", "--brokers", "3", "--port", "9092", *data])
    assert result.exit_code == 2 and "a cluster chooses free ports" in result.output
    result = CliRunner().invoke(kafka, ["start", "--brokers", "12", *data])
    assert result.exit_code == 2 and "--brokers" in result.output
    result = CliRunner().invoke(kafka, ["status", "--brokers", "3", *data])
    assert result.exit_code == 1 and "no node running" in result.output
    assert not (tmp_path / "c" / "cluster.json").exists()  # asking created nothing
