"""`enhydra asyncapi [TARGET]`: the service's AsyncAPI 3 document (topics, messages, headers),
the same one every instance serves at /v1/asyncapi.json."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource

from enhydra.cli.common import kafka_options, load_service
from enhydra.cli.topology import locate, read_topology
from enhydra.messages import DeclarationError
from enhydra.plugins import PluginError
from enhydra.settings import Connection
from enhydra.topology import TopologyError
from enhydra.topology.asyncapi import asyncapi_of


@click.command()
@click.argument("target", required=False)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file."
)
@click.option(
    "--baseline",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A topology baseline (topology.json) whose older event versions' schemas to list "
    "under x-enhydra-versions.",
)
@kafka_options
def asyncapi(target: str | None, output: Path | None, baseline: Path | None, conn: Connection):
    """Print the AsyncAPI 3.0 document of TARGET (MODULE:ATTR; default: the service of the
    project around the current folder): its topics as channels, one message per command and
    event type with its JSON Schema, the event headers, and the Kafka servers with their
    security scheme (never a secret). --bootstrap documents other servers than the service's.

    \b
    Examples:
      enhydra asyncapi billing.service:service -o asyncapi.json
      enhydra asyncapi --bootstrap kafka-1.prod:9093,kafka-2.prod:9093 > asyncapi.json
    """
    target, _ = locate(target, None, "asyncapi")
    service = load_service(target)
    given = click.get_current_context().get_parameter_source("conn")
    chosen = conn if given is not ParameterSource.DEFAULT else None
    old = read_topology(baseline) if baseline is not None else None
    try:
        document = asyncapi_of(service, connection=chosen, baseline=old)
    except (PluginError, TopologyError, DeclarationError) as exc:  # bad settings: exit 2
        raise click.ClickException(f"{target}: {exc}") from exc
    text = json.dumps(document, indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    output.write_text(text)
    click.echo(
        f"wrote {output}: {len(document['channels'])} channels, "
        f"{sum(len(c['messages']) for c in document['channels'].values())} messages",
        err=True,
    )
