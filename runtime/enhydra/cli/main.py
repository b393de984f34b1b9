"""Entry point of the `enhydra` command: one click group, one module per sub-command."""

from __future__ import annotations

import click

from enhydra.cli.kafka import kafka
from enhydra.cli.new import new
from enhydra.cli.run import run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="enhydra")
def main() -> None:
    """Enhydra: event-sourced microservices on Kafka."""


main.add_command(kafka)
main.add_command(new)
main.add_command(run)


if __name__ == "__main__":
    main()
