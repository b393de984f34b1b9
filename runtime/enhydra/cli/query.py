"""`enhydra query STORE KEY`: read one key from a running service, from any of its instances."""

from __future__ import annotations

import asyncio
import sys

import click
import orjson

from enhydra.cli.common import EXIT_NOTHING, EXIT_UNREACHABLE, EXIT_USAGE, fail
from enhydra.cli.project import default_query_url
from enhydra.query.client import Client, QueryError


@click.command()
@click.argument("store")
@click.argument("key")
@click.option(
    "--url",
    "urls",
    multiple=True,
    envvar="ENHYDRA_QUERY_URL",
    show_envvar=True,
    metavar="URL",
    help="An instance's URL (repeatable; any instance answers for every key) "
    "[default: the project's web port inside a project made by `enhydra new`, else "
    "http://127.0.0.1:6066].",
)
@click.option(
    "--token",
    envvar="ENHYDRA_QUERY_TOKEN",
    show_envvar=True,
    help="The bearer token, when the service sets ENHYDRA_QUERY_TOKEN.",
)
@click.option("--allow-stale", is_flag=True, help="Let a standby copy answer (it may lag).")
@click.option(
    "--retry-for",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Seconds to wait while the service is not ready (a rebalance, a restore).",
)
def query(
    store: str,
    key: str,
    urls: tuple[str, ...],
    token: str | None,
    allow_stale: bool,
    retry_for: float,
) -> None:
    """Print KEY's state in STORE as JSON.

    Exits 1 when there is no such key, 2 for an unknown store, 3 when no instance answers.

    \b
    Examples:
      enhydra query accounts acct-42
      enhydra query accounts acct-42 --url http://ledger-1:6066 --url http://ledger-2:6066
    """
    seeds = list(urls) or [default_query_url() or "http://127.0.0.1:6066"]
    said: list[str] = []

    def waiting(reason: str) -> None:
        if reason not in said:
            said.append(reason)
            click.echo(
                f"enhydra: waiting for the service ({reason}); retrying for up to "
                f"{retry_for:g} s (--retry-for)",
                err=True,
            )

    async def ask():
        async with Client(
            seeds, token=token or None, retry_for=retry_for, retry_unreachable=False,
            on_wait=waiting,
        ) as client:  # fmt: skip
            return await client.get(store, key, allow_stale=allow_stale)

    try:
        state = asyncio.run(ask())
    except QueryError as exc:
        _explain(exc, seeds)
    if state is None:
        click.echo(f"no such key: {key!r} in {store!r}", err=True)
        sys.exit(EXIT_NOTHING)
    click.echo(orjson.dumps(state, option=orjson.OPT_INDENT_2).decode())


def _explain(exc: QueryError, seeds: list[str]) -> None:
    """One line (and a hint) for each way a query fails."""
    body = exc.body if isinstance(exc.body, dict) else {}
    if exc.code == "unreachable":
        why = exc.reason.rsplit(": ", 1)[-1]
        fail(
            [
                f"no instance answers at {', '.join(seeds)} ({why})",
                "is the service running? Start one with `enhydra run MODULE:ATTR`, or pass "
                "the --url (ENHYDRA_QUERY_URL) of a running instance",
            ],
            EXIT_UNREACHABLE,
        )
    if exc.code == "no_such_store":
        known = ", ".join(map(str, body.get("stores") or [])) or "none"
        fail([f"{exc.reason} (this service has: {known})"], EXIT_USAGE)
    if exc.status == 0:
        fail([exc.reason, "no instance answered in time; raise --retry-for"], EXIT_UNREACHABLE)
    if exc.status in (401, 403):
        hint = "pass --token (ENHYDRA_QUERY_TOKEN) with the service's query token"
        fail([str(exc), hint], 1)
    if exc.status in (502, 503):
        fail([f"the service is not ready: {exc.reason}", "try again, or raise --retry-for"], 1)
    fail([str(exc)], 1)
