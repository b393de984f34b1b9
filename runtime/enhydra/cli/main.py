"""Entry point of the `enhydra` command: one click group, one module per sub-command."""

from __future__ import annotations

import click

from enhydra.cli.asyncapi import asyncapi
from enhydra.cli.backfill import backfill
from enhydra.cli.common import PlainGroup
from enhydra.cli.dlq import dlq
from enhydra.cli.generate import generate
from enhydra.cli.image import image
from enhydra.cli.kafka import kafka
from enhydra.cli.new import new
from enhydra.cli.query import query
from enhydra.cli.reset import reset
from enhydra.cli.run import run
from enhydra.cli.send import send
from enhydra.cli.snapshot import snapshot
from enhydra.cli.topology import topology
from enhydra.cli.upgrade_runtime import upgrade_runtime


@click.group(cls=PlainGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="enhydra")
def main() -> None:
    """Enhydra: event-sourced microservices on Kafka.

    Every command takes the same names for the same things: --app (ENHYDRA_APP_ID),
    --bootstrap (ENHYDRA_BOOTSTRAP_SERVERS, with TLS and SASL from ENHYDRA_SECURITY_PROTOCOL,
    ENHYDRA_SASL_* and ENHYDRA_SSL_*), and a positional TARGET (MODULE:ATTR) for the service.
    Exit codes: 0 done, 1 refused or nothing found, 2 bad arguments or settings, 3 Kafka or the
    service cannot be reached.

    \b
    Example:
      enhydra new && cd billing && make test
      enhydra run billing.service:service --web-port 6067
    """


main.add_command(asyncapi)
main.add_command(image)
main.add_command(backfill)
main.add_command(dlq)
main.add_command(generate)
main.add_command(kafka)
main.add_command(new)
main.add_command(query)
main.add_command(reset)
main.add_command(run)
main.add_command(send)
main.add_command(snapshot)
main.add_command(topology)
main.add_command(upgrade_runtime)


if __name__ == "__main__":
    main()
