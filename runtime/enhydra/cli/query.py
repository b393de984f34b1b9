"""`enhydra query STORE KEY`: read one key from a running service, from any of its instances."""

from __future__ import annotations

import asyncio
import os
import sys

import click
import orjson

from enhydra.query.client import Client, QueryError


@click.command()
@click.argument("store")
@click.argument("key")
@click.option(
    "--url",
    "urls",
    multiple=True,
    help="an instance URL (repeatable); default $ENHYDRA_QUERY_URL or http://127.0.0.1:6066",
)
@click.option("--token", envvar="ENHYDRA_QUERY_TOKEN", help="bearer token ($ENHYDRA_QUERY_TOKEN)")
@click.option("--allow-stale", is_flag=True, help="let a standby copy answer (it may lag)")
@click.option("--retry-for", default=10.0, show_default=True, help="seconds to retry a 503")
def query(
    store: str, key: str, urls: tuple[str, ...], token: str | None, allow_stale: bool, retry_for
) -> None:
    """Print KEY's state in STORE as JSON; exit 1 when there is no such key."""
    seeds = list(urls) or [os.environ.get("ENHYDRA_QUERY_URL", "http://127.0.0.1:6066")]

    async def ask():
        async with Client(seeds, token=token or None, retry_for=retry_for) as client:
            return await client.get(store, key, allow_stale=allow_stale)

    try:
        state = asyncio.run(ask())
    except QueryError as exc:
        raise click.ClickException(str(exc)) from exc
    if state is None:
        click.echo(f"no such key: {key!r} in {store!r}", err=True)
        sys.exit(1)
    click.echo(orjson.dumps(state, option=orjson.OPT_INDENT_2).decode())
