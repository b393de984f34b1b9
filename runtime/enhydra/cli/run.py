"""`enhydra run TARGET`: run a worker of a service defined in user code.

Every flag stands for one ENHYDRA_* setting and wins over it: the flag is written into this
process's environment before the settings are read, so the service sees one set of values
whichever way they were given, checked by the same parsers.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.core import ParameterSource

from enhydra.cli.common import (
    app_option,
    kafka_options,
    load_service,
    setting_option,
)
from enhydra.settings import PREFIX, Connection

# Re-exported for callers of the old location (the CLI modules use enhydra.cli.common).
__all__ = ["load_service", "run"]

FLAGS = ("app_id", "instance_id", "web_port", "state_dir", "log_level", "log_format")
SWITCHES = {"leave_group": "leave_group_on_shutdown"}


@click.command()
@click.argument("target", metavar="TARGET")
@app_option(required=False, help="The application id [default: the one in TARGET's code].")
@kafka_options(default="the service's, from TARGET's settings")
@setting_option(
    "--instance-id",
    setting="instance_id",
    metavar="NAME",
    help="This instance's name in the group, logs and metrics [default: HOSTNAME-PID].",
)
@setting_option(
    "--web-port",
    setting="web_port",
    metavar="PORT",
    help="Port of the HTTP API and status page [default: 6066].",
)
@setting_option(
    "--state-dir",
    setting="state_dir",
    metavar="DIR",
    help="Where the RocksDB stores live [default: ./state].",
)
@setting_option(
    "--log-level",
    setting="log_level",
    metavar="debug|info|warning|error",
    help="How much the worker logs [default: info].",
)
@setting_option(
    "--log-format",
    setting="log_format",
    metavar="auto|json|console",
    help="json for log shippers, console for people [default: auto, by the terminal].",
)
@click.option(
    "--leave-group",
    is_flag=True,
    default=False,
    help="On SIGTERM, leave the group at once so the others take over now (a scale-down). "
    "Without it, the instance is expected back under the same id (a rolling restart), "
    "unless it is a Deployment's pod [env var: ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN, default auto].",
)
@click.pass_context
def run(ctx: click.Context, target: str, conn: Connection, **flags: object) -> None:
    """Run a worker of TARGET (MODULE:ATTR) until SIGTERM or SIGINT.

    Every other setting comes from its ENHYDRA_* variable (see docs/operations.md); a flag
    wins over its variable. The settings and TARGET are checked before anything starts.

    \b
    Examples:
      enhydra run billing.service:service
      enhydra run billing.service:service --instance-id billing-2 --web-port 6067 \\
        --state-dir state/2 --bootstrap kafka-1:9092
      enhydra run billing.service:service --leave-group   # the last run before a scale-down
    """
    for name in FLAGS:
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            os.environ[PREFIX + name.upper()] = str(flags[name])
    for flag, setting in SWITCHES.items():
        if flags[flag]:
            os.environ[PREFIX + setting.upper()] = "true"
    if ctx.get_parameter_source("conn") is ParameterSource.COMMANDLINE:
        os.environ["ENHYDRA_BOOTSTRAP_SERVERS"] = conn.bootstrap_servers
    service = load_service(target)
    _check_state_dir(service.settings.state_dir)  # a bad setting ends as `Error: ...`, exit 2
    service.run()


def _check_state_dir(state_dir: Path) -> None:
    """The stores' folder exists and is writable, or the worker would fail after joining."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        ok = state_dir.is_dir() and os.access(state_dir, os.W_OK | os.X_OK)
        reason = "not writable"
    except OSError as exc:
        ok, reason = False, exc.strerror or str(exc)
    if not ok:
        raise click.BadParameter(
            f"{state_dir}: cannot create or write it ({reason})",
            param_hint="'--state-dir' / ENHYDRA_STATE_DIR",
        )
