"""`enhydra topology show|check|lock`: what a service reads, writes and stores, whether an
upgrade can be rolled out instance by instance, and the committed baseline (topology.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from enhydra.cli.common import load_service
from enhydra.cli.project import project_target, require_project, target_of
from enhydra.plugins import PluginError
from enhydra.settings import SettingsError
from enhydra.topology import (
    BaselineError,
    TopologyError,
    compare,
    is_deployed,
    locked,
    render,
    to_mermaid,
    topology_of,
    validate,
    verdict,
)
from enhydra.topology.reactions import (
    CONTRACTS_DIR,
    ContractError,
    Upstream,
    check_reactions,
    read_contract,
)

BASELINE = "topology.json"


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
            f"{path}: no such file (write it with `enhydra topology lock`)"
        ) from None
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"{path}: not valid JSON: {exc}") from None
    try:
        return validate(raw, str(path))
    except TopologyError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def topology() -> None:
    """Show a service's topology, check an upgrade against the deployed one, lock the baseline.

    \b
    Example:
      enhydra topology check billing.service:service --against topology.json
    """


@topology.command()
@click.argument("target", required=False)
@click.option(
    "--format", "fmt", type=click.Choice(["json", "mermaid"]), default="json", show_default=True
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to a file."
)
def show(target: str | None, fmt: str, output: Path | None) -> None:
    """Print TARGET's (MODULE:ATTR; default: the project's) topology and fingerprint, as JSON
    or a Mermaid diagram.

    \b
    Example:
      enhydra topology show billing.service:service --format mermaid
    """
    topo = _topology(target or project_target("topology show"))
    text = dump(topo) if fmt == "json" else to_mermaid(topo)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)
        click.echo(f"wrote {output} ({topo['fingerprint']})", err=True)


@topology.command()
@click.argument("target", required=False)
@click.option(
    "--against",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"The deployed topology (a file written by `topology show` or `lock`) [default: the "
    f"project's {BASELINE}].",
)
@click.option(
    "--live",
    is_flag=True,
    help="Check the running cluster's topics (ENHYDRA_BOOTSTRAP_SERVERS, the service's "
    "settings): partitions, compaction, retention, replication, min ISR.",
)
@click.option(
    "--upstream",
    "upstreams",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="An upstream service's contract (its AsyncAPI document or topology.json), checked "
    "against what TARGET's reactions read [default: contracts/*.json next to the baseline].",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def check(
    target: str | None, against: Path | None, live: bool, upstreams: tuple[Path, ...], fmt: str
) -> None:
    """Compare TARGET (MODULE:ATTR; default: the project's) with the deployed topology; exit 1
    if a change is incompatible.

    A baseline marked `"deployed": false` (see `topology lock`) only reports the changes.
    A service with reactions is also checked against its upstreams' contracts: an event type
    or field a reaction reads that the upstream no longer writes as read fails the check.
    With --live, TARGET's topics on the cluster are checked as a start would check them:
    exit 1 when one would refuse the start (each line says the fix).

    \b
    Examples:
      enhydra topology check                  # in a project made by `enhydra new`
      enhydra topology check billing.service:service --against topology.json
      enhydra topology check billing.service:service --live
    """
    if live and against is None:  # the cluster only
        target, _ = locate(target, None, "topology check")
        _check_live(target, fmt)
        return
    target, against = locate(target, against, "topology check")
    if live:
        _check_live(target, fmt)
    _check_against(target, against, fmt, upstreams or _contract_files(against))


def _contract_files(baseline: Path) -> tuple[Path, ...]:
    folder = baseline.parent / CONTRACTS_DIR
    return tuple(sorted(folder.glob("*.json"))) if folder.is_dir() else ()


def _upstream_contracts(paths: tuple[Path, ...]) -> dict[str, Upstream]:
    contracts: dict[str, Upstream] = {}
    for path in paths:
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            raise click.ClickException(f"{path}: no such file") from None
        except json.JSONDecodeError as exc:
            raise click.ClickException(f"{path}: not valid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise click.ClickException(f"{path}: not an AsyncAPI document or a topology")
        try:
            upstream = read_contract(document, str(path))
        except ContractError as exc:
            raise click.ClickException(str(exc)) from None
        contracts[upstream.app_id] = upstream
    return contracts


def _reaction_report(new: dict, upstreams: tuple[Path, ...]) -> tuple[list, list[str]]:
    """Findings against the upstreams' contracts, and a warning per upstream without one."""
    # A saga's forwarder may read this service's own events: their contract is this code.
    section = [r for r in new.get("reactions") or [] if r.get("source") != new["app_id"]]
    if not section:
        return [], []
    findings, missing = check_reactions(new["app_id"], section, _upstream_contracts(upstreams))
    sources = {r["name"]: r["source"] for r in section}
    warnings = [
        f"warning: reaction {name!r} reads {sources[name]}'s events but no contract of "
        f"{sources[name]} is here: save its `enhydra asyncapi` output as "
        f"{CONTRACTS_DIR}/{sources[name]}.json (or pass --upstream FILE)"
        for name in missing
    ]
    return findings, warnings


def _check_live(target: str, fmt: str) -> None:
    import asyncio

    from enhydra.kafka.errors import KafkaAccessError
    from enhydra.kafka.topics import TopicError, verify_topics
    from enhydra.runtime import topic_specs

    try:
        resolved = load_service(target).resolved()
    except (SettingsError, PluginError) as exc:
        raise click.ClickException(f"{target}: {exc}") from exc
    specs = topic_specs(resolved)
    try:
        findings = asyncio.run(verify_topics(resolved.settings.connection, specs))
    except (KafkaAccessError, TopicError) as exc:
        raise click.ClickException(str(exc)) from None
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "topics": [s.name for s in specs],
                    "findings": [{**vars(f), "line": f.line()} for f in findings],
                },
                indent=2,
            )
        )
    else:
        for finding in findings:
            click.echo(("" if finding.fatal else "warning: ") + finding.line())
        if not findings:
            click.echo(f"{len(specs)} topics checked: every layout is right")
    if any(f.fatal for f in findings):
        sys.exit(1)


def _check_against(target: str, against: Path, fmt: str, upstreams: tuple[Path, ...]) -> None:
    old = read_topology(against)
    new = _topology(target)
    broken, warnings = _reaction_report(new, upstreams)
    changes = compare(old, new)
    path = verdict(changes)
    deployed = is_deployed(old)
    incompatible = deployed and any(not c.compatible for c in changes)
    if fmt == "json":
        report = {
            "app_id": new["app_id"],
            "against": str(against),
            "fingerprint": {"old": old.get("fingerprint"), "new": new["fingerprint"]},
            "deployed": deployed,
            "compatible": not incompatible,
            "upgrade": str(path) if path is not None else None,
            "changes": [c.to_json() for c in changes],
        }
        if new.get("reactions"):
            report["upstreams"] = {
                "compatible": not broken,
                "findings": [{**vars(f), "line": f.line()} for f in broken],
                "warnings": warnings,
            }
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render(changes, app_id=new["app_id"], against=str(against)))
        if not deployed:
            click.echo(
                f"{against} is not deployed yet: nothing runs that a change could break; "
                "`enhydra topology lock` rewrites it, `enhydra topology lock --deployed` after "
                "the first deploy"
            )
        for finding in broken:
            click.echo(f"INCOMPATIBLE  {finding.line()}")
        for warning in warnings:
            click.echo(warning)
        if new.get("reactions") and not broken:
            click.echo("upstream contracts: every event a reaction reads still fits")
    if incompatible or broken:
        sys.exit(1)


def locate(
    target: str | None, output: Path | None, command: str = "topology lock"
) -> tuple[str, Path]:
    """TARGET and the baseline file: given, or those of the project around the current folder."""
    if target is not None:
        return target, output or Path(BASELINE)
    project = require_project(command)
    return target_of(project), output or project.root / BASELINE


@topology.command()
@click.argument("target", required=False)
@click.option(
    "--deployed",
    is_flag=True,
    help="Mark the baseline deployed: from now on incompatible changes fail `check`.",
)
@click.option(
    "--file",
    "-f",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"The baseline [default: {BASELINE} of the project around the current folder].",
)
def lock(target: str | None, deployed: bool, output: Path | None) -> None:
    """(Re)write the topology baseline from the code of TARGET (MODULE:ATTR).

    Until the first deploy the baseline is marked not deployed and follows the code: run this
    (a generated project's tests do) whenever the topology changes. After the first deploy,
    and after each deploy of an incompatible change, run it with --deployed.

    \b
    Examples:
      enhydra topology lock                   # in a project made by `enhydra new`
      enhydra topology lock --deployed        # right after deploying this version
      enhydra topology lock billing.service:service -f topology.json
    """
    target, path = locate(target, output)
    previous = read_topology(path) if path.exists() else None
    current = _topology(target)
    try:
        baseline = locked(current, previous, deployed=deployed)
    except BaselineError as exc:
        raise click.ClickException(f"{path}: {exc}") from None
    state = "deployed" if deployed else "not deployed: it follows the code until --deployed"
    if previous == baseline:
        click.echo(f"{path}: unchanged ({baseline['fingerprint']}, {state})")
        return
    path.write_text(dump(baseline))
    click.echo(f"{path}: locked at {baseline['fingerprint']} ({state})")
    retired = sorted((baseline.get("messages") or {}).get("retired_events") or {})
    kept = sorted(((previous or {}).get("messages") or {}).get("retired_events") or {})
    if retired != kept:
        click.echo(
            f"{path}: event type(s) {', '.join(retired)} no longer declared: kept under "
            "messages.retired_events (the history still holds them)"
        )
