"""What every `enhydra` command shares: the Kafka connection option and plain failures.

A command that talks to Kafka takes `--bootstrap` (else ENHYDRA_BOOTSTRAP_SERVERS) and reads the
security settings from the same ENHYDRA_* variables as `enhydra run`, so one set of variables
serves the service and the tools. A failure a user can cause prints one line and a hint, never
a traceback (set ENHYDRA_LOG_LEVEL=debug for one).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click

from enhydra.errors.uncaught import EXIT_CANNOT_START
from enhydra.kafka.errors import KafkaAccessError
from enhydra.settings import Connection, SettingsError

F = TypeVar("F", bound=Callable[..., Any])

# Exit codes of the tools: 1 a refused request or bad input, 3 Kafka cannot be used.
EXIT_KAFKA = EXIT_CANNOT_START


def debugging() -> bool:
    return os.environ.get("ENHYDRA_LOG_LEVEL", "").strip().lower() == "debug"


def _connection(ctx: click.Context, param: click.Parameter, value: str | None) -> Connection:
    try:
        return Connection.from_env(bootstrap_servers=value)
    except SettingsError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def kafka_options(func: F) -> F:
    """`--bootstrap`, turned into the command's `conn` (a Connection with the security settings)."""
    return click.option(
        "--bootstrap",
        "conn",
        envvar="ENHYDRA_BOOTSTRAP_SERVERS",
        show_envvar=True,
        default=None,
        callback=_connection,
        metavar="HOST:PORT[,...]",
        help="Kafka bootstrap servers [default: 127.0.0.1:9092]. TLS and SASL come from "
        "ENHYDRA_SECURITY_PROTOCOL, ENHYDRA_SASL_* and ENHYDRA_SSL_* (see docs/operations.md).",
    )(func)


class PlainGroup(click.Group):
    """The `enhydra` group: Kafka and settings failures end as one line, a hint and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        quiet_kafka_logs()
        try:
            return super().invoke(ctx)
        except KafkaAccessError as exc:
            fail(exc.lines(), EXIT_KAFKA, exc)
        except SettingsError as exc:
            fail([str(exc)], 2, exc)


def fail(lines: list[str], code: int, exc: BaseException | None = None) -> None:
    if exc is not None and debugging():
        traceback.print_exception(exc, file=sys.stderr)
    for index, line in enumerate(lines):
        click.echo(("Error: " if index == 0 else "  ") + line, err=True)
    sys.exit(code)


def quiet_kafka_logs() -> None:
    """aiokafka's own error lines repeat what the command explains in one line."""
    if not debugging():
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
