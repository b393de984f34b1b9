"""`enhydra kafka ...`: run the pinned Apache Kafka locally for development and tests.

A thin shell over enhydra.devtools.broker. Machine-readable results (`bootstrap=...`,
`pid=...`) go to stdout, one per line, so scripts can `eval` or grep them; progress (Maven's,
as a live status line) and notes go to stderr.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
from click.core import ParameterSource

from enhydra.cli.common import StatusLine
from enhydra.cli.extras import require_dev_tools
from enhydra.devtools.broker import (
    DEFAULT_PORT,
    HOST,
    KAFKA_VERSION,
    PROPERTIES_FILE,
    BrokerError,
    BrokerInfo,
    LocalBroker,
    kafka_classpath,
    read_state,
)
from enhydra.devtools.broker_security import ADMIN_USER
from enhydra.devtools.cluster import MAX_BROKERS, LocalCluster, default_cluster_dir

F = TypeVar("F", bound=Callable[..., object])


def _note(message: str) -> None:
    click.echo(f"enhydra: {message}", err=True)


class _MavenStatus:
    """Maven's progress as a status line: live on a terminal, every few seconds in a log."""

    def __init__(self) -> None:
        self.line = StatusLine(every_s=5.0)

    def note(self, line: str) -> None:
        self.line.flush()
        self.line.clear()
        click.echo(line, err=True)

    def status(self, line: str) -> None:
        self.line.show(f"enhydra: {line}")

    def done(self) -> None:
        self.line.clear()


def _data_dir_option(func: F) -> F:
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        envvar="ENHYDRA_BROKER_DIR",
        show_envvar=True,
        help="Where the broker keeps data, config, logs and state "
        "[default: ~/.cache/enhydra/broker].",
    )(func)


def _brokers_option(func: F) -> F:
    return click.option(
        "--brokers",
        type=click.IntRange(1, MAX_BROKERS),
        default=1,
        show_default=True,
        help="Nodes: 1 is the single dev broker; more is a local KRaft cluster (replication "
        "factor 3, min.insync.replicas 2) in ~/.cache/enhydra/cluster unless --data-dir.",
    )(func)


def _timeout_option(default: float, text: str, *, minimum: float = 0) -> Callable[[F], F]:
    """`--timeout SECONDS`: how long start and stop wait for the broker."""
    return click.option(
        "--timeout",
        type=click.FloatRange(min=minimum),
        default=default,
        show_default=True,
        help=text,
    )


def _start_cluster(brokers: int, data_dir: Path | None, port: int | None, timeout: float) -> None:
    if port is not None:
        raise click.UsageError("--port picks one broker's port; a cluster chooses free ports")
    cluster = LocalCluster(data_dir or default_cluster_dir(), brokers)
    _note(f"starting {brokers} Apache Kafka {KAFKA_VERSION} nodes (data in {cluster.data_dir})")
    try:
        kafka_classpath(report=_MavenStatus())
        bootstrap = cluster.start(timeout=timeout)
    except (BrokerError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    where = f" --data-dir {data_dir}" if data_dir is not None else ""
    _note(f"the cluster is ready; stop it with: enhydra kafka stop --brokers {brokers}{where}")
    click.echo(f"bootstrap={bootstrap}")


@click.group("kafka")
def kafka() -> None:
    """Run a local single-node Apache Kafka broker (KRaft) for development and tests.

    \b
    Example:
      enhydra kafka start && enhydra kafka status && enhydra kafka stop
    """
    require_dev_tools("kafka")


@kafka.command("start")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help=f"Client port; 0 picks a free one [default: {DEFAULT_PORT}, or the port this data "
    "dir used last].",
)
@_data_dir_option
@_timeout_option(60.0, "Seconds to wait for the broker to answer.", minimum=1)
@click.option(
    "--security",
    type=click.Choice(["sasl_ssl", "ssl"]),
    default=None,
    help="Also open a secured listener and print its settings: sasl_ssl (SCRAM-SHA-512 over "
    "TLS) or ssl (mutual TLS with a client certificate).",
)
@click.option("--env", "as_env", is_flag=True, help="Print the settings as ENHYDRA_*= lines.")
@_brokers_option
@click.pass_context
def start(
    ctx: click.Context,
    port: int | None,
    data_dir: Path | None,
    timeout: float,
    security: str | None,
    as_env: bool,
    brokers: int,
) -> None:
    """Start the broker (or reuse the one already running) and print `bootstrap=HOST:PORT`.

    A broker already running on this machine is used first, never doubled by surprise: the one
    of the data dir, else (without --data-dir, ENHYDRA_BROKER_DIR or --port) the one started
    from another data dir, else whatever Kafka answers on the port. A note says which.

    \b
    Examples:
      enhydra kafka start
      enhydra kafka start --port 19092
      enhydra kafka start --security sasl_ssl
      eval "$(enhydra kafka start --security ssl --env)"
      enhydra kafka start --brokers 3
    """
    if brokers > 1:
        if security is not None or as_env:
            raise click.UsageError("--security and --env are for the single broker (--brokers 1)")
        _start_cluster(brokers, data_dir, port, timeout)
        return
    broker = LocalBroker(data_dir, port, secured=security is not None)
    explicit_dir = ctx.get_parameter_source("data_dir") is not ParameterSource.DEFAULT
    if security is None and broker.status() is None:
        found = _running_elsewhere(broker, port, explicit_dir)
        if found is not None:
            _print({"bootstrap": found}, as_env)
            return
    status = _MavenStatus()
    try:
        running = broker.status()
        if running is None:
            chosen = "a free port" if port == 0 else f"port {port or _last_port(broker)}"
            _note(f"starting Apache Kafka {KAFKA_VERSION} on {chosen} (data in {broker.data_dir})")
        info = broker.start(timeout=timeout, report=status)
    except (BrokerError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        status.done()
    if running is not None and running.pid == info.pid:
        _note(f"reusing the running broker (pid {info.pid}, data in {info.data_dir})")
    else:
        _note(f"Kafka is ready (pid {info.pid}); logs in {broker.server_log}")
    _print(client_settings(info, security), as_env)


def _print(settings: dict[str, str], as_env: bool) -> None:
    for name, value in settings.items():
        if as_env:
            setting = "bootstrap_servers" if name == "bootstrap" else name
            click.echo(f"ENHYDRA_{setting.upper()}={value}")
        else:
            click.echo(f"{name}={value}")


def _last_port(broker: LocalBroker) -> int:
    previous = read_state(broker.data_dir)
    return previous.port if previous is not None else DEFAULT_PORT


def _running_elsewhere(broker: LocalBroker, port: int | None, explicit_dir: bool) -> str | None:
    """The bootstrap of a broker this machine already runs that `start` should use instead of
    starting one from `broker.data_dir`, with a note saying which; None: start one."""
    others = [] if explicit_dir or port is not None else running_brokers(exclude=broker.data_dir)
    if len(others) == 1:
        (other,) = others
        _note(
            f"using the broker already running from {other.data_dir} (pid {other.pid}); "
            f"--data-dir {broker.data_dir} or --port N starts another one"
        )
        return other.bootstrap
    wanted = port if port not in (None, 0) else _last_port(broker) if port is None else None
    if wanted is not None and kafka_answers(f"{HOST}:{wanted}"):
        _note(
            f"Kafka already answers at {HOST}:{wanted} (not started from {broker.data_dir}): "
            "using it; --port N starts a broker on another port"
        )
        return f"{HOST}:{wanted}"
    if others:
        listed = ", ".join(f"{o.bootstrap} from {o.data_dir}" for o in others)
        _note(f"other brokers are running ({listed}); this starts one from {broker.data_dir}")
    return None


def running_brokers(exclude: Path | None = None) -> list[BrokerInfo]:
    """Brokers `enhydra kafka start` runs on this machine from other data dirs (Linux: found in
    /proc), leaving out test sessions' ones: those live in the temp folder and go with it."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    temp = Path(tempfile.gettempdir()).resolve()
    found: dict[Path, BrokerInfo] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        if len(argv) < 2 or argv[-2] != "kafka.Kafka" or not argv[-1].endswith(PROPERTIES_FILE):
            continue
        data_dir = Path(argv[-1]).parent
        if data_dir == exclude or data_dir.is_relative_to(temp) or data_dir in found:
            continue
        info = LocalBroker(data_dir).status()
        if info is not None:
            found[data_dir] = info
    return sorted(found.values(), key=lambda info: str(info.data_dir))


def kafka_answers(bootstrap: str) -> bool:
    """Something at `bootstrap` answers a Kafka metadata request (in a few seconds)."""
    import asyncio

    from enhydra.kafka.clients import check_access
    from enhydra.kafka.errors import KafkaAccessError

    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            pass
    except OSError:
        return False
    try:
        asyncio.run(check_access(bootstrap, timeout=5.0))
    except (KafkaAccessError, OSError, TimeoutError):
        return False
    return True


def client_settings(info: BrokerInfo, security: str | None) -> dict[str, str]:
    """What a client needs for the chosen listener (the password as a file, never its value)."""
    files = info.security_files
    if security == "sasl_ssl":
        return {
            "bootstrap": str(info.sasl_ssl_bootstrap),
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": ADMIN_USER,
            "sasl_password_file": str(files.password_file(ADMIN_USER)),
            "ssl_cafile": str(files.ca),
        }
    if security == "ssl":
        return {
            "bootstrap": str(info.ssl_bootstrap),
            "security_protocol": "SSL",
            "ssl_cafile": str(files.ca),
            "ssl_certfile": str(files.client_cert),
            "ssl_keyfile": str(files.client_key),
        }
    return {"bootstrap": info.bootstrap}


@kafka.command("stop")
@_data_dir_option
@_timeout_option(30.0, "Seconds to wait for a clean shutdown before killing the broker.")
@_brokers_option
def stop(data_dir: Path | None, timeout: float, brokers: int) -> None:
    """Stop the broker recorded in the data dir (its data is kept).

    \b
    Example:
      enhydra kafka stop --timeout 10
      enhydra kafka stop --brokers 3
    """
    if brokers > 1:
        cluster = LocalCluster(data_dir or default_cluster_dir(), brokers)
        try:
            stopped = cluster.stop(timeout=timeout)
        except (BrokerError, OSError) as exc:
            raise click.ClickException(str(exc)) from exc
        _note(f"stopped nodes {stopped}" if stopped else f"no node running in {cluster.data_dir}")
        return
    broker = LocalBroker(data_dir)
    try:
        running = broker.status()
        stopped = broker.stop(timeout=timeout)
    except (BrokerError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if stopped and running is not None:
        _note(f"stopped the broker (pid {running.pid})")
    else:
        _note(f"no broker running from {broker.data_dir}")


@kafka.command("status")
@_data_dir_option
@_brokers_option
@click.pass_context
def status(ctx: click.Context, data_dir: Path | None, brokers: int) -> None:
    """Print `bootstrap=...` and `pid=...` of the running broker; exit 1 if none is running.

    \b
    Example:
      enhydra kafka status | grep bootstrap= | cut -d= -f2
    """
    if brokers > 1:
        cluster = LocalCluster(data_dir or default_cluster_dir(), brokers)
        try:
            running = cluster.running()
        except (BrokerError, OSError) as exc:
            raise click.ClickException(str(exc)) from exc
        if not running:
            _note(f"no node running in {cluster.data_dir}")
            ctx.exit(1)
        click.echo(f"bootstrap={cluster.bootstrap}")
        click.echo(f"running={','.join(map(str, running))}")
        return
    broker = LocalBroker(data_dir)
    info = broker.status()
    if info is None:
        _note(f"no broker running from {broker.data_dir}")
        ctx.exit(1)
    click.echo(f"bootstrap={info.bootstrap}")
    click.echo(f"pid={info.pid}")


@kafka.command("fetch")
def fetch() -> None:
    """Download the Kafka jars into the cache (once), and print `classpath=...`.

    The first time, Maven downloads about 45 MB from Maven Central (minutes on a slow link);
    its progress shows on stderr. ENHYDRA_CACHE_DIR moves the cache [default: ~/.cache/enhydra].

    \b
    Example:
      ENHYDRA_CACHE_DIR=/var/cache/enhydra enhydra kafka fetch
    """
    status = _MavenStatus()
    try:
        classpath = kafka_classpath(report=status)
    except (BrokerError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        status.done()
    click.echo(f"classpath={classpath}")
