"""What every `enhydra` command shares: option names, plain failures, progress lines.

One convention for every command:
- `--bootstrap` (else ENHYDRA_BOOTSTRAP_SERVERS) with the security settings from the same
  ENHYDRA_* variables as `enhydra run`, so one set of variables serves the service and the tools;
- `--app` (else ENHYDRA_APP_ID) for the application id; an option that stands for a setting
  reads that setting's variable and is checked by the same parser (`setting_option`);
- a positional TARGET (MODULE:ATTR) where a command needs the service, imported before
  anything starts (`load_service`);
- environment variables shown in `--help`, and an example in every command's help.

A failure a user can cause prints one line and a hint, never a traceback (set
ENHYDRA_LOG_LEVEL=debug for one). Exit codes: 0 done, 1 refused or nothing found, 2 bad
arguments or settings, 3 Kafka or the service cannot be reached.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from enhydra.errors.uncaught import EXIT_CANNOT_START
from enhydra.kafka.errors import KafkaAccessError
from enhydra.logs import configure_logging
from enhydra.settings import PREFIX, Connection, Settings, SettingsError

if TYPE_CHECKING:
    from enhydra.service import Service

F = TypeVar("F", bound=Callable[..., Any])

# Exit codes of the tools: 1 a refused request, bad input or nothing found, 2 bad arguments or
# settings, 3 Kafka (or the service's instances) cannot be reached.
EXIT_NOTHING = 1
EXIT_USAGE = 2
EXIT_KAFKA = EXIT_CANNOT_START
EXIT_UNREACHABLE = EXIT_CANNOT_START


def debugging() -> bool:
    return os.environ.get("ENHYDRA_LOG_LEVEL", "").strip().lower() == "debug"


def _connection(ctx: click.Context, param: click.Parameter, value: str | None) -> Connection:
    try:
        return Connection.from_env(bootstrap_servers=value)
    except SettingsError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def kafka_options(func: F | None = None, *, default: str = "127.0.0.1:9092") -> Any:
    """`--bootstrap`, turned into the command's `conn` (a Connection with the security settings).

    `@kafka_options`, or `@kafka_options(default="the service's")` for a command whose TARGET's
    own settings apply when the flag and ENHYDRA_BOOTSTRAP_SERVERS are absent.
    """

    def decorate(fn: F) -> F:
        return click.option(
            "--bootstrap",
            "conn",
            envvar="ENHYDRA_BOOTSTRAP_SERVERS",
            show_envvar=True,
            default=None,
            callback=_connection,
            metavar="HOST:PORT[,...]",
            help=f"Kafka bootstrap servers [default: {default}]. TLS and SASL come from "
            "ENHYDRA_SECURITY_PROTOCOL, ENHYDRA_SASL_* and ENHYDRA_SSL_* "
            "(see docs/operations.md).",
        )(fn)

    return decorate(func) if func is not None else decorate


class PlainGroup(click.Group):
    """The `enhydra` group: Kafka and settings failures end as one line, a hint and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        tool_logging()
        try:
            return super().invoke(ctx)
        except KafkaAccessError as exc:
            fail(exc.lines(), EXIT_KAFKA, exc)
        except SettingsError as exc:
            fail([str(exc)], 2, exc)


class LazyGroup(PlainGroup):
    """A group whose sub-commands are imported when used, from `lazy` {name: "module:attr"}.

    So `enhydra run` loads the runtime and not what other commands need: pyarrow for snapshots,
    cookiecutter, Spark's helpers. Importing every command cost a running service ~80 MiB of
    resident memory (pyarrow and numpy alone), more than the service itself.
    """

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        if target is not None and cmd_name not in self.commands:
            module, attr = target.split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


def fail(lines: list[str], code: int, exc: BaseException | None = None) -> None:
    if exc is not None and debugging():
        traceback.print_exception(exc, file=sys.stderr)
    for index, line in enumerate(lines):
        click.echo(("Error: " if index == 0 else "  ") + line, err=True)
    sys.exit(code)


def tool_logging() -> None:
    """A command's own output says what it did: library log lines are warnings and up only, on
    stderr (stdout stays for results), and aiokafka's error lines, which repeat what the
    command explains in one line, not at all. ENHYDRA_LOG_LEVEL=debug shows everything.

    `enhydra run` sets up the service's logging itself when it starts.
    """
    configure_logging(fmt="console", level="debug" if debugging() else "warning")
    if not debugging():
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


# --------------------------------------------------------------------------- options


def setting_option(
    *decls: str,
    setting: str,
    fallback: Callable[[], Any] | None = None,
    **attrs: Any,
) -> Callable[[F], F]:
    """A flag for one setting: ENHYDRA_<SETTING> is its variable, Settings' own parser checks it.

    The value reaches the command parsed (a port as an int); when neither the flag nor the
    variable is given, `fallback()` (e.g. the project's value, cli/project.py), else None.
    """
    field = {f.name: f for f in dataclasses.fields(Settings)}[setting]
    parser = field.metadata["parser"]

    def parse(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return fallback() if fallback is not None else None
        try:
            return parser(setting, str(value).strip())
        except SettingsError as exc:
            raise click.BadParameter(f"{value!r}: expected {exc.expected}") from None

    attrs.setdefault("metavar", setting.rsplit("_", 1)[-1].upper())
    return click.option(
        *decls,
        envvar=PREFIX + setting.upper(),
        show_envvar=True,
        callback=parse,
        **attrs,
    )


def app_option(required: bool = True, **attrs: Any) -> Callable[[F], F]:
    """`--app`: the application id (group id and topic prefix), else ENHYDRA_APP_ID, else (when
    `required`) the app id of the project around the current folder."""
    attrs.setdefault(
        "help",
        "The application id: its group id and the prefix of its topics "
        "[default: the project's, inside a project made by `enhydra new`].",
    )
    fallback = _project_app_id if required else None
    return setting_option("--app", "app_id", setting="app_id", fallback=fallback, **attrs)


def _project_app_id() -> str:
    from enhydra.cli.project import default_app_id

    app_id = default_app_id()
    if app_id is None:
        raise click.UsageError(
            "no application id: give --app (or ENHYDRA_APP_ID), or run inside the project "
            "made by `enhydra new`"
        )
    return app_id


def deprecated_option(old: str, dest: str, instead: str) -> Callable[[F], F]:
    """A hidden spelling kept for scripts that still use it; it says what to use instead."""

    def warn(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            click.echo(f"enhydra: {old} is deprecated: {instead}", err=True)
        return value

    return click.option(old, dest, hidden=True, callback=warn, help=instead)


def target_or_alias(target: str | None, alias: str | None, alias_name: str) -> str | None:
    """TARGET given once: as the argument, or through its deprecated option."""
    if target is not None and alias is not None and target != alias:
        raise click.UsageError(f"TARGET given twice ({target!r} and {alias_name} {alias!r})")
    return target or alias


def load_service(target: str) -> Service:
    """Import `package.module:attribute` and check that it is a Service (before anything runs)."""
    from enhydra.service import Service

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(
            f"{target!r}: expected MODULE:ATTR, e.g. ledger.service:service", param_hint="TARGET"
        )
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc} (run from the project folder, or install it)",
            param_hint="TARGET",
        ) from None
    service = getattr(module, attr, None)
    if not isinstance(service, Service):
        found = type(service).__name__ if service is not None else "nothing"
        raise click.BadParameter(
            f"{target!r} is {found}, not an enhydra.Service", param_hint="TARGET"
        )
    return service


# --------------------------------------------------------------------------- progress


class StatusLine:
    """One line of progress on stderr: redrawn in place on a terminal, every few seconds if not.

    A terminal sees a live line; a log file or CI sees a line every `every_s` seconds, so a
    long step is never silent and never floods.
    """

    def __init__(self, stream: IO[str] | None = None, *, every_s: float = 5.0) -> None:
        self.stream = stream or click.get_text_stream("stderr")
        self.live = self.stream.isatty()
        self.every_s = 0.2 if self.live else every_s
        self.started = self.shown = time.monotonic()
        self.drawn = False
        self.pending: str | None = None  # the latest text not shown yet

    def show(self, text: str, *, now: bool = False) -> None:
        """Show `text` (unless a line was shown moments ago and `now` is not set)."""
        clock = time.monotonic()
        if not now and clock - self.shown < self.every_s:
            self.pending = text
            return
        self.shown, self.pending = clock, None
        if self.live:
            width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
            self.stream.write("\r\033[K" + text[:width])
            self.drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def flush(self) -> None:
        """Show the latest text if it was held back (the last state belongs in a log)."""
        if self.pending is not None and not self.live:
            self.show(self.pending, now=True)

    def clear(self) -> float:
        """Remove the live line (a permanent line follows); seconds since the start."""
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False
        return time.monotonic() - self.started
