"""`enhydra dlq list|show|replay`: see what failed and why, and send it back once fixed."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import click

from enhydra.admin.dlq import DlqError, read_dead_letters, replay
from enhydra.cli.common import app_option, kafka_options
from enhydra.errors.dlq import Selection, dlq_topic_name, format_table

COLUMNS = ("dlq", "origin", "stage", "error", "attempts", "replays", "age_s", "message")


def _when(value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected an ISO time, e.g. 2026-11-22T10:00"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _selection(opts: dict) -> Selection:
    return Selection(
        error_class=opts["error_class"],
        stage=opts["stage"],
        origin_partition=opts["partition"],
        min_offset=opts["from_offset"],
        max_offset=opts["to_offset"],
        since=_when(opts["since"]),
        until=_when(opts["until"]),
    )


def _common(fn):
    options = [
        app_option(),
        kafka_options,
        click.option("--topic", help="DLQ topic, if not <app>-dlq."),
        click.option("--error-class", help="Only this error class (e.g. InvalidCommand)."),
        click.option("--stage", type=click.Choice(["deserialize", "process", "produce"])),
        click.option("--partition", type=int, help="Only this origin partition."),
        click.option("--from-offset", type=int, help="Origin offsets from this one."),
        click.option("--to-offset", type=int, help="Origin offsets up to this one."),
        click.option("--since", help="Failed at or after (ISO time, UTC by default)."),
        click.option("--until", help="Failed at or before (ISO time)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _filtered(opts: dict) -> bool:
    names = ("error_class", "stage", "partition", "from_offset", "to_offset", "since", "until")
    return any(opts[name] is not None for name in names)


def _load(opts: dict):
    topic = opts["topic"] or dlq_topic_name(opts["app_id"])
    try:
        letters = asyncio.run(read_dead_letters(opts["conn"], topic))
    except DlqError as exc:
        raise click.ClickException(str(exc)) from exc
    return topic, _selection(opts).select(letters)


@click.group()
def dlq() -> None:
    """Inspect and replay the dead-letter queue.

    \b
    Example:
      enhydra dlq list --app billing --since 2026-11-22T10:00
      enhydra dlq show 0@17          # inside a project: its app id
    """


@dlq.command("list")
@_common
def list_(**opts: object) -> None:
    """A table of dead letters: origin, stage, error, age.

    \b
    Example:
      enhydra dlq list --app billing --error-class InvalidCommand
    """
    topic, letters = _load(opts)
    if not letters:
        click.echo(
            f"0 dead letter(s) in {topic} (none match)"
            if _filtered(opts)
            else f"0 dead letter(s) in {topic}"
        )
        return
    now = dt.datetime.now(dt.UTC)
    rows = [letter.summary(now) for letter in letters]
    for row in rows:
        row["message"] = str(row["message"])[:60]
    click.echo(format_table(rows, COLUMNS))
    click.echo(f"{len(rows)} dead letter(s)")


def parse_position(text: str) -> tuple[int, int]:
    """`PARTITION@OFFSET` as `dlq list` prints it (e.g. 0@17): (partition, offset)."""
    partition, sep, offset = text.partition("@")
    if not sep or not partition.isdigit() or not offset.isdigit():
        raise click.BadParameter(
            f"{text!r}: expected PARTITION@OFFSET as `enhydra dlq list` prints it, e.g. 0@17",
            param_hint="DLQ",
        )
    return int(partition), int(offset)


@dlq.command()
@click.argument("position", metavar="[PARTITION@OFFSET]", required=False)
@_common
@click.option("--offset", "dlq_offset", type=int, help="DLQ offset to show (or PARTITION@OFFSET).")
@click.option("--dlq-partition", type=int, help="DLQ partition [default: 0].")
def show(
    position: str | None, dlq_offset: int | None, dlq_partition: int | None, **opts: object
) -> None:
    """One dead letter in full: key, decoded value, every header, the stack trace.

    PARTITION@OFFSET is the `dlq` column of `enhydra dlq list`.

    \b
    Examples:
      enhydra dlq show 0@17
      enhydra dlq show --app billing --offset 17
    """
    if position is not None:
        if dlq_offset is not None or dlq_partition is not None:
            raise click.UsageError("give PARTITION@OFFSET or --offset/--dlq-partition, not both")
        dlq_partition, dlq_offset = parse_position(position)
    elif dlq_offset is None:
        raise click.UsageError("which dead letter? Give PARTITION@OFFSET, e.g. 0@17 (dlq list)")
    dlq_partition = dlq_partition or 0
    _, letters = _load(opts)
    found = [x for x in letters if x.dlq_offset == dlq_offset and x.dlq_partition == dlq_partition]
    if not found:
        raise click.ClickException(
            f"no dead letter at {dlq_partition}@{dlq_offset} (`enhydra dlq list` shows them)"
        )
    letter = found[0]
    body = {
        "key": letter.key.decode("utf-8", "replace") if letter.key is not None else None,
        "value": letter.decoded_value(),
        "headers": {k: v.decode("utf-8", "replace") for k, v in letter.headers},
    }
    click.echo(json.dumps(body, indent=2, ensure_ascii=False))


@dlq.command("replay")
@_common
@click.option("--to-topic", help="Send here instead of each record's source topic.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; send nothing.")
def replay_(to_topic: str | None, dry_run: bool, **opts: object) -> None:
    """Send the selected dead letters back to their source topic (after fixing the cause).

    \b
    Example:
      enhydra dlq replay --app billing --stage process --since 2026-11-22T10:00 --dry-run
    """
    topic, letters = _load(opts)
    now = dt.datetime.now(dt.UTC)
    if dry_run:
        click.echo(format_table([x.summary(now) for x in letters], COLUMNS[:-1]))
        click.echo(f"dry run: {len(letters)} dead letter(s) would be replayed")
        return
    stderr = click.get_text_stream("stderr")
    with click.progressbar(length=len(letters), label="replaying", file=stderr) as bar:
        try:
            sent = asyncio.run(
                replay(opts["conn"], topic, letters, to_topic=to_topic, progress=bar.update)
            )
        except DlqError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"replayed {sent} dead letter(s)")
