"""`enhydra reset --app X`: reprocess an application from a point, offline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from enhydra.admin.reset import (
    ResetError,
    ResetPoint,
    apply_reset,
    gather_facts,
    parse_datetime,
    parse_offsets,
    plan_reset,
)
from enhydra.cli.common import app_option, kafka_options
from enhydra.settings import Connection


@click.command()
@app_option()
@kafka_options
@click.option("--to-earliest", "earliest", is_flag=True, help="Reprocess everything (default).")
@click.option("--to-datetime", help="From the first command at or after this time (ISO 8601).")
@click.option("--to-offsets", help="From a snapshot's cut: partition=offset,... for every one.")
@click.option("--commands-topic", help="The input topic, if not <app>-commands.")
@click.option("--events-topic", help="The events topic, if not <app>-events.")
@click.option("--include-dlq", is_flag=True, help="Also delete and recreate <app>-dlq.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Wipe <state-dir>/<app> here (ENHYDRA_STATE_DIR of an instance on this machine).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be done, change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def reset(
    app_id: str,
    conn: Connection,
    earliest: bool,
    to_datetime: str | None,
    to_offsets: str | None,
    commands_topic: str | None,
    events_topic: str | None,
    include_dlq: bool,
    state_dir: Path | None,
    dry_run: bool,
    yes: bool,
) -> None:
    """Reset an application's offsets, changelogs and local state; refuses while instances run.

    Shows the plan and asks before changing anything.

    \b
    Examples:
      enhydra reset --app billing --dry-run
      enhydra reset --app billing --to-datetime 2026-11-22T10:00:00Z --state-dir state
    """
    chosen = [
        n
        for n, v in (
            ("--to-earliest", earliest),
            ("--to-datetime", to_datetime),
            ("--to-offsets", to_offsets),
        )
        if v
    ]
    if len(chosen) > 1:
        raise click.UsageError(f"choose one reset point, not {' and '.join(chosen)}")
    try:
        if to_datetime:
            point = parse_datetime(to_datetime)
        elif to_offsets:
            point = parse_offsets(to_offsets)
        else:
            point = ResetPoint("earliest")
        facts = asyncio.run(
            gather_facts(
                conn, app_id, point, commands_topic=commands_topic, events_topic=events_topic
            )
        )
        plan = plan_reset(
            app_id,
            facts,
            point,
            commands_topic=commands_topic,
            events_topic=events_topic,
            include_dlq=include_dlq,
            state_dir=state_dir,
        )
    except ResetError as exc:
        raise click.ClickException(str(exc)) from exc
    for line in plan.describe():
        click.echo(line)
    if dry_run:
        click.echo("dry run: nothing changed")
        return
    if not yes:
        click.confirm("reset now?", abort=True)
    try:
        asyncio.run(apply_reset(conn, plan))
    except ResetError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"reset done: start {app_id} to reprocess from {point.describe()}")
