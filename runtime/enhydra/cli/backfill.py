"""`enhydra backfill MODULE:ATTR`: rebuild a service's state from its events topic with PySpark.

Every generated service's `jobs/backfill.py` runs this same command with its target fixed
(`main`), so `enhydra backfill ledger.service:service --help` and `python jobs/backfill.py
--help` list the same options. Everything a user can get wrong (the target, the bounds, the
output paths, Kafka and its credentials) is checked before Spark starts; Spark's own log goes
to a file unless --spark-logs, and progress is printed on stderr while the job runs.

Kafka is reached like by every other command: `--bootstrap` (else the service's) with TLS and
SASL from the ENHYDRA_* variables; Kafka that cannot be used ends the command with exit 3.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from enhydra.cli.common import (
    EXIT_KAFKA,
    EXIT_USAGE,
    app_option,
    debugging,
    deprecated_option,
    fail,
    kafka_options,
)

if TYPE_CHECKING:
    from enhydra.settings import Connection

EXAMPLES = """
\b
Examples:
  enhydra backfill ledger.service:service --snapshot snapshots/full --output state.parquet
  enhydra backfill ledger.service:service --until-time 2025-01-31T00:00:00Z \\
      --snapshot snapshots/jan
  ENHYDRA_DATABASE_URL=postgresql://enhydra@db/reads \\
      enhydra backfill ledger.service:service --sql-projection balances
  PYSPARK_PYTHON=/opt/py/bin/python enhydra backfill ledger.service:service \\
      --master spark://spark-master:7077 --snapshot /shared/snapshots/full
"""

METHODS = ("auto", "kafka", "python")


def _options() -> list[Callable[[Any], Any]]:
    return [
        app_option(required=False, help="Application id [default: the service's]."),
        deprecated_option("--app-id", "old_app_id", "use --app"),
        kafka_options(default="the service's, from TARGET's settings"),
        click.option(
            "--until-time",
            metavar="TIME",
            help="Stop each partition before its first event at or after TIME "
            "(ISO 8601, e.g. 2025-01-31T12:00:00Z, or epoch ms).",
        ),
        click.option(
            "--until-offsets",
            metavar="P=OFFSET,...",
            help="Exclusive end offsets of the events topic, e.g. 0=1200,1=980.",
        ),
        click.option("--output", metavar="PATH", help="Write the state as Parquet (analytics)."),
        click.option(
            "--snapshot",
            metavar="DIR",
            help="Write a snapshot (manifest + Parquet) that a service can start from; "
            "on a cluster DIR must be shared by the driver and the executors.",
        ),
        click.option("--emit-events", metavar="TOPIC", help="Write the corrected events here."),
        click.option(
            "--sql-projection",
            metavar="NAME",
            help="Fill the tables of the service's SQL projection NAME with its own project: "
            "new tables, swapped in like `enhydra projection rebuild` (ENHYDRA_DATABASE_URL).",
        ),
        click.option(
            "--method",
            type=click.Choice(METHODS),
            default="auto",
            show_default=True,
            help="Kafka reader: Spark's connector, the Python one, or the connector if present.",
        ),
        click.option(
            "--master",
            help="Spark master: local[N], spark://HOST:7077, k8s://https://HOST, yarn "
            "[default: local[*], or spark-submit's].",
        ),
        click.option(
            "--conf",
            "confs",
            metavar="KEY=VALUE",
            multiple=True,
            help="A Spark setting (repeatable), e.g. spark.executor.memory=4g.",
        ),
        click.option(
            "--shuffle/--no-shuffle",
            default=None,
            help="Shuffle events by key before the fold [default: fold each Kafka partition "
            "in place, unless there are fewer partitions than cores].",
        ),
        click.option("--tasks", type=click.IntRange(min=1), help="Fold tasks (implies --shuffle)."),
        click.option(
            "--fold",
            type=click.Choice(["hash", "sort"]),
            default=None,
            help="In place, fold each task's events in log order holding every key in memory "
            "(hash), or sort them by key first, one key in memory at a time (sort) "
            "[default: hash in place, sort after a shuffle].",
        ),
        click.option(
            "--spark-logs",
            is_flag=True,
            help="Show Spark's own log instead of writing it to a file.",
        ),
    ]


def _command(target: str | None, pythonpath: Sequence[str]) -> click.Command:
    def callback(**opts: Any) -> None:
        opts["app_id"] = opts["app_id"] or opts.pop("old_app_id")
        source = click.get_current_context().get_parameter_source("conn")
        opts["bootstrap_given"] = source in (
            ParameterSource.COMMANDLINE,
            ParameterSource.ENVIRONMENT,
        )
        _run(opts.pop("target", None) or target, opts, pythonpath)

    for option in reversed(_options()):
        callback = option(callback)
    if target is None:
        callback = click.argument("target", metavar="MODULE:ATTR")(callback)
    return click.command(
        "backfill",
        help="Rebuild the state of MODULE:ATTR (a Service, or an Aggregate with --app) from "
        "its events topic with the service's own apply, in PySpark. The job ships its code to "
        "the executors: a cluster's workers need only pyspark, pyarrow and orjson.",
        epilog=EXAMPLES,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    )(callback)


def _local_path(path: str) -> Path | None:
    """A path on this machine, or None for a URI Spark writes itself (s3a://, hdfs://)."""
    if "://" in path:
        return Path(path[len("file://") :]) if path.startswith("file://") else None
    return Path(path)


def _check_writable(path: Path, option: str) -> None:
    """The directory PATH is, or will be created in, exists as a directory and is writable."""
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{path}: {existing} is a file", param_hint=option)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{path}: {existing} is not writable", param_hint=option)


def _connection(service: Connection | None, opts: dict[str, Any]) -> Connection:
    """The service's connection (its settings: code defaults, then ENHYDRA_*) with --bootstrap
    (or ENHYDRA_BOOTSTRAP_SERVERS) on top; for an Aggregate, the flag's and the environment's."""
    if service is None:
        return opts["conn"]
    if not opts["bootstrap_given"]:
        return service
    from_file = service.sasl_password_file is not None  # read again from the file
    return dataclasses.replace(
        service,
        bootstrap_servers=opts["conn"].bootstrap_servers,
        sasl_password="" if from_file else service.sasl_password,
    )


def _prepare(target: str, opts: dict[str, Any], pythonpath: Sequence[str]) -> dict[str, Any]:
    """Every check that needs no Spark: the job starts only when they all pass."""
    try:
        from enhydra.spark.job import (
            BackfillError,
            parse_until_offsets,
            parse_until_time,
            resolve_target,
        )
    except ImportError as exc:
        raise click.ClickException(
            f"the backfill needs PySpark: pip install 'enhydra[spark]' ({exc})"
        ) from exc
    paths = [*pythonpath, os.getcwd()]
    for path in reversed(paths):  # the target imports like `enhydra run` imports it
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        info = resolve_target(target)
    except BackfillError as exc:
        raise click.BadParameter(f"{exc}", param_hint="MODULE:ATTR") from exc
    if opts["until_time"] and opts["until_offsets"]:
        raise click.UsageError("give --until-time or --until-offsets, not both")
    if not (opts["output"] or opts["snapshot"] or opts["emit_events"] or opts["sql_projection"]):
        raise click.UsageError(
            "nothing to write: give --output, --snapshot, --emit-events and/or --sql-projection"
        )
    try:
        until_offsets = (
            parse_until_offsets(opts["until_offsets"]) if opts["until_offsets"] else None
        )
        until_time = parse_until_time(opts["until_time"]) if opts["until_time"] else None
    except BackfillError as exc:
        raise click.UsageError(str(exc)) from exc
    if not (opts["app_id"] or info.app_id):
        raise click.UsageError(f"{target} is an Aggregate: give the application id with --app")
    for option in ("output", "snapshot"):
        local = _local_path(opts[option]) if opts[option] else None
        if local is not None:
            _check_writable(local.absolute(), f"--{option}")
    if opts["snapshot"] and (Path(opts["snapshot"]) / "manifest.json").exists():
        raise click.BadParameter(
            f"{opts['snapshot']} already holds a snapshot; choose a new directory",
            param_hint="--snapshot",
        )
    conf = {}
    for item in opts["confs"]:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--conf")
        conf[key.strip()] = value
    if opts["tasks"] is not None and opts["shuffle"] is False:
        raise click.UsageError("--tasks sets the tasks after a shuffle: drop --no-shuffle")
    if opts["fold"] == "hash" and (opts["shuffle"] or opts["tasks"] is not None):
        raise click.UsageError(
            "--fold hash folds Kafka partitions in place: drop --shuffle/--tasks"
        )
    return {
        "paths": paths,
        # A Service's own connection (its settings read ENHYDRA_* and the flag), else the
        # flag's and the environment's: the same variables as every other command.
        "connection": _connection(info.connection, opts),
        "until_offsets": until_offsets,
        "until_time": until_time,
        "conf": conf,
    }


def _start_spark(master: str | None, conf: dict[str, str], paths: list[str], jvm_log: Path | None):
    from enhydra.spark.session import cluster_session, is_local, local_session

    if "PYSPARK_GATEWAY_PORT" in os.environ and master is None:  # under spark-submit
        from pyspark.sql import SparkSession

        session = SparkSession.builder.appName("enhydra-backfill").getOrCreate()
        if jvm_log is not None:  # spark-submit's own start-up lines are out of our hands
            session.sparkContext.setLogLevel("WARN")
        return session, False
    master = master or "local[*]"
    if is_local(master):
        session = local_session(
            "enhydra-backfill", master=master, pythonpath=paths, conf=conf, jvm_log=jvm_log
        )
    else:
        session = cluster_session("enhydra-backfill", master=master, conf=conf, jvm_log=jvm_log)
    return session, True


_KAFKA_JVM_ERRORS = (
    "SaslAuthenticationException",
    "SslAuthenticationException",
    "TopicAuthorizationException",
    "GroupAuthorizationException",
)


def _spark_failure(exc: BaseException) -> str | None:
    """The one line that says why a Spark job failed (an executor's FoldError, say)."""
    text = str(exc)
    markers = ("FoldError: ", "SourceError: ", "SnapshotError: ", "ImportError: ")
    markers += ("PartitionLost: ", "OperationalError: ")  # a SQL projection's executors
    for marker in markers:
        lines = [line for line in text.splitlines() if marker in line]
        if lines:
            return lines[-1].split(marker, 1)[1].strip()
    for marker in _KAFKA_JVM_ERRORS:  # Spark's Kafka connector (Kafka's Java client)
        lines = [line for line in text.splitlines() if marker + ": " in line]
        if lines:
            return (
                f"Spark's Kafka connector: {marker}: {lines[-1].split(marker + ': ', 1)[1]} "
                "(check ENHYDRA_SECURITY_PROTOCOL, ENHYDRA_SASL_* and ENHYDRA_SSL_*)"
            )
    module = [line for line in text.splitlines() if "ModuleNotFoundError: " in line]
    if module:
        return module[-1].strip() + (
            " on an executor: the workers need what the modules of apply (and of a SQL "
            "projection's project) import; keep them in modules that import no more than "
            "Enhydra's pure parts (the template's domain.py, a generated projection), or install "
            "the service's dependencies there; pyarrow and orjson are needed on the workers in "
            "any case, and psycopg for --sql-projection"
        )
    return None


def _run(target: str, opts: dict[str, Any], pythonpath: Sequence[str]) -> None:
    from enhydra.logs import configure_logging

    configure_logging(fmt=os.environ.get("ENHYDRA_LOG_FORMAT") or "auto")
    if not debugging():  # aiokafka's own error lines repeat what the one-line error explains
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    prepared = _prepare(target, opts, pythonpath)

    from enhydra.kafka.errors import KafkaAccessError, scrub
    from enhydra.kafka.topics import TopicError
    from enhydra.settings import SettingsError
    from enhydra.snapshots.format import SnapshotError
    from enhydra.spark.fold import FoldError
    from enhydra.spark.job import BackfillError, execute_backfill, plan_backfill, summary
    from enhydra.spark.source import SourceError

    known = (BackfillError, SourceError, SnapshotError, FoldError, TopicError)
    try:  # Kafka's offsets and the snapshot directory, still before Spark starts
        plan = plan_backfill(
            target,
            connection=prepared["connection"],
            app_id=opts["app_id"],
            until_offsets=prepared["until_offsets"],
            until_time=prepared["until_time"],
            output=opts["output"],
            snapshot=opts["snapshot"],
            method=opts["method"],
            tasks=opts["tasks"],
            shuffle=opts["shuffle"],
            emit_events=opts["emit_events"],
            fold=opts["fold"],
            sql_projection=opts["sql_projection"],
        )
    except known as exc:
        raise click.ClickException(str(exc)) from exc
    except KafkaAccessError as exc:  # unreachable, refused credentials: exit 3, like every tool
        fail(exc.lines(), EXIT_KAFKA, exc)
    except SettingsError as exc:  # e.g. a TLS file Spark's Kafka connector cannot use
        fail([str(exc)], EXIT_USAGE, exc)
    jvm_log = None
    if not opts["spark_logs"]:
        jvm_log = Path(tempfile.gettempdir()) / f"enhydra-backfill-{os.getpid()}-spark.log"
    hint = f" (Spark's own log: {jvm_log})" if jvm_log else ""
    spark, owned = _start_spark(opts["master"], prepared["conf"], prepared["paths"], jvm_log)
    try:
        result = execute_backfill(spark, plan)
    except known as exc:
        raise click.ClickException(str(exc)) from exc
    except KafkaAccessError as exc:
        fail(exc.lines(), EXIT_KAFKA, exc)
    except Exception as exc:
        reason = _spark_failure(exc)
        if reason is None:
            raise
        reason = scrub(reason, plan.connection)
        raise click.ClickException(f"the Spark job failed: {reason}{hint}") from exc
    finally:
        if owned:
            spark.stop()
    if jvm_log is not None:  # kept only when something failed
        jvm_log.unlink(missing_ok=True)
    click.echo(summary(result))


backfill = _command(None, ())


def main(
    target: str | None = None,
    argv: Sequence[str] | None = None,
    *,
    pythonpath: Sequence[str] = (),
) -> None:
    """`jobs/backfill.py`: this command with the service's target fixed."""
    command = _command(target, pythonpath)
    prog = "enhydra backfill" if target is None else os.path.basename(sys.argv[0] or "backfill.py")
    command.main(args=list(argv) if argv is not None else None, prog_name=prog)
