"""`enhydra topology show|check`: what a service reads, writes and stores, and whether an
upgrade can be rolled out instance by instance."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from enhydra.cli.run import load_service
from enhydra.plugins import PluginError
from enhydra.settings import SettingsError
from enhydra.topology import (
    TopologyError,
    compare,
    render,
    to_mermaid,
    topology_of,
    validate,
    verdict,
)


def _topology(target: str) -> dict:
    service = load_service(target)
    try:
        return topology_of(service)
    except (SettingsError, PluginError, TopologyError) as exc:
        raise click.ClickException(f"{target}: {exc}") from exc


def dump(topology: dict) -> str:
    return json.dumps(topology, indent=2) + "\n"


def read_topology(path: Path) -> dict:
    """A topology file written by `topology show`, with errors naming the file."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise click.ClickException(
            f"{path}: no such file (write it with `enhydra topology show MODULE:ATTR -o {path}`)"
        ) from None
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"{path}: not valid JSON: {exc}") from None
    try:
        return validate(raw, str(path))
    except TopologyError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def topology() -> None:
    """Show a service's topology, or check an upgrade against the deployed one."""


@topology.command()
@click.argument("target")
@click.option(
    "--format", "fmt", type=click.Choice(["json", "mermaid"]), default="json", show_default=True
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file."
)
def show(target: str, fmt: str, output: Path | None) -> None:
    """Print TARGET's (MODULE:ATTR) topology and fingerprint, as JSON or a Mermaid diagram."""
    topo = _topology(target)
    text = dump(topo) if fmt == "json" else to_mermaid(topo)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)
        click.echo(f"wrote {output} ({topo['fingerprint']})", err=True)


@topology.command()
@click.argument("target")
@click.option(
    "--against",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The deployed topology (a file written by `topology show`).",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def check(target: str, against: Path, fmt: str) -> None:
    """Compare TARGET with the deployed topology; exit 1 if a change is incompatible."""
    old = read_topology(against)
    new = _topology(target)
    changes = compare(old, new)
    path = verdict(changes)
    incompatible = any(not c.compatible for c in changes)
    if fmt == "json":
        report = {
            "app_id": new["app_id"],
            "against": str(against),
            "fingerprint": {"old": old.get("fingerprint"), "new": new["fingerprint"]},
            "compatible": not incompatible,
            "upgrade": str(path) if path is not None else None,
            "changes": [c.to_json() for c in changes],
        }
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render(changes, app_id=new["app_id"], against=str(against)))
    if incompatible:
        sys.exit(1)
