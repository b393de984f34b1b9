"""Entry point of the `enhydra` command: one click group, one module per sub-command."""

from __future__ import annotations

import click

from enhydra.cli.common import LazyGroup

# name -> where it lives; imported when used (LazyGroup), so a running service holds only
# what `run` needs.
COMMANDS = {
    "asyncapi": "enhydra.cli.asyncapi:asyncapi",
    "backfill": "enhydra.cli.backfill:backfill",
    "dlq": "enhydra.cli.dlq:dlq",
    "generate": "enhydra.cli.generate:generate",
    "image": "enhydra.cli.image:image",
    "kafka": "enhydra.cli.kafka:kafka",
    "new": "enhydra.cli.new:new",
    "postgres": "enhydra.cli.postgres:postgres",
    "projection": "enhydra.cli.projection:projection",
    "query": "enhydra.cli.query:query",
    "rejections": "enhydra.cli.rejections:rejections",
    "reset": "enhydra.cli.reset:reset",
    "run": "enhydra.cli.run:run",
    "send": "enhydra.cli.send:send",
    "snapshot": "enhydra.cli.snapshot:snapshot",
    "topology": "enhydra.cli.topology:topology",
    "upgrade-runtime": "enhydra.cli.upgrade_runtime:upgrade_runtime",
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
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


if __name__ == "__main__":
    main()
