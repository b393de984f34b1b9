"""`enhydra postgres start|stop|status`: the local PostgreSQL a service's SQL projections write
to in dev, as `enhydra kafka start` is its broker (enhydra.devtools.postgres)."""

from __future__ import annotations

from pathlib import Path

import click

from enhydra.cli.common import load_service

_data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The server's folder [default: $ENHYDRA_POSTGRES_DIR, else ~/.cache/enhydra/postgres].",
)


@click.group()
def postgres() -> None:
    """The local PostgreSQL for SQL projections in dev (Debian's server programs).

    \b
    Examples:
      enhydra postgres start
      eval "$(enhydra postgres start --env)"
      enhydra postgres start --for billing.service:service --env   # only if it has SQL projections
      enhydra postgres stop
    """


def _print(settings: dict[str, str], as_env: bool) -> None:
    for name, value in settings.items():
        click.echo(
            f"{name}={value}" if as_env else f"{name.removeprefix('ENHYDRA_').lower()}={value}"
        )


@postgres.command("start")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port for a server not running yet [default: the one it used last, else 5432 when "
    "free, else a free one].",
)
@_data_dir_option
@click.option(
    "--for",
    "target",
    metavar="MODULE:ATTR",
    help="Start it only when this service declares a SQL projection; else print nothing.",
)
@click.option("--env", "as_env", is_flag=True, help="Print the settings as ENHYDRA_*= lines.")
def start(port: int | None, data_dir: Path | None, target: str | None, as_env: bool) -> None:
    """Start the server (or reuse the one of the data dir: never a second one) and print
    `database_url=...` and `database_password_file=...` (with --env: ENHYDRA_DATABASE_URL=...).

    Its data and password stay in the data dir between runs; `stop` keeps them.

    \b
    Examples:
      enhydra postgres start
      enhydra postgres start --port 15432
      eval "$(enhydra postgres start --for billing.service:service --env)"
    """
    from enhydra.devtools.postgres import PostgresError
    from enhydra.devtools.postgres import start as start_server

    if target is not None:
        from enhydra.sql.model import SqlProjection

        if not any(isinstance(p, SqlProjection) for p in load_service(target).projections):
            return
    try:
        server, started = start_server(data_dir, port)
    except PostgresError as exc:
        raise click.ClickException(str(exc)) from None
    where = f"pid {server.pid}, port {server.port}, data in {server.root}"
    note = "PostgreSQL is ready" if started else "reusing the running PostgreSQL"
    click.echo(f"enhydra: {note} ({where})", err=True)
    _print(server.settings(), as_env)


@postgres.command("stop")
@_data_dir_option
def stop(data_dir: Path | None) -> None:
    """Stop the server of the data dir (its data is kept).

    \b
    Example:
      enhydra postgres stop
    """
    from enhydra.devtools.postgres import stop as stop_server

    stopped = stop_server(data_dir)
    if stopped is None:
        click.echo("enhydra: no PostgreSQL was running", err=True)
    else:
        click.echo(
            f"enhydra: stopped PostgreSQL (pid {stopped.pid}, port {stopped.port})", err=True
        )


@postgres.command("status")
@_data_dir_option
@click.option("--env", "as_env", is_flag=True, help="Print the settings as ENHYDRA_*= lines.")
def status(data_dir: Path | None, as_env: bool) -> None:
    """Print the running server's settings; exit 1 if none is running.

    \b
    Example:
      enhydra postgres status || enhydra postgres start
    """
    from enhydra.devtools.postgres import default_data_dir, running

    server = running((data_dir or default_data_dir()).absolute())
    if server is None:
        click.echo("enhydra: no PostgreSQL is running", err=True)
        raise SystemExit(1)
    _print(server.settings() if as_env else {**server.settings(), "pid": str(server.pid)}, as_env)
