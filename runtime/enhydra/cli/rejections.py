"""`enhydra rejections list|tail`: the commands decide refused, each with its reason.

A rejection is an answer to the sender (aggregate.Rejection), published to the rejections
topic; these commands read it decoded, one line per rejection: key, command id, command type,
reason. `--json` writes one JSON object per line instead. Reading goes through the Kafka
access layer (kafka/reading.py); `tail` asks for the topic's end every `POLL_S` and reads up
to it, so it follows a topic that grows, one bounded read at a time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Callable, Iterable
from typing import Any

import click

from enhydra.cli.common import EXIT_NOTHING, app_option, kafka_options
from enhydra.kafka.clients import Consumer, open_consumer
from enhydra.kafka.reading import TopicMissing, offsets, read_ranges
from enhydra.query.rejections import line, summary
from enhydra.settings import Connection

POLL_S = 0.5  # how often `tail` asks for the topic's end


def row_of(record: Any) -> dict[str, Any]:
    """One rejection record as the fields the CLI prints (query/rejections.py `summary`)."""
    row = summary(record.value, record.key)
    row["partition"], row["offset"] = record.partition, record.offset
    row["time"] = dt.datetime.fromtimestamp(record.timestamp / 1000, dt.UTC).isoformat(
        timespec="milliseconds"
    )
    return row


def in_order(records: Iterable[Any]) -> list[Any]:
    """Records of several partitions in the order they were written (timestamp, then place)."""
    return sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset))


def show(row: dict[str, Any], as_json: bool) -> None:
    click.echo(json.dumps(row, ensure_ascii=False) if as_json else line(row))


def topic_for(app_id: str, given: str | None) -> str:
    """--topic, else the project's rejections topic for this app id, else <app>-rejections."""
    if given:
        return given
    from enhydra.cli.project import project_service

    service = project_service()
    if service is not None and service.settings.app_id == app_id:
        return service.aggregate.bind(app_id).rejections_topic
    return f"{app_id}-rejections"


async def _read(consumer: Consumer, topic: str, ranges: dict[int, tuple[int, int]]) -> list[Any]:
    found: list[Any] = []
    async for _, records in read_ranges(consumer, topic, ranges):
        found.extend(records)
    return found


async def read_last(conn: Connection, topic: str, last: int | None) -> list[Any]:
    """The topic's records now (the last `last` of them, when given), in written order."""
    async with open_consumer(conn, isolation_level="read_committed") as consumer:
        begins, ends = await offsets(consumer, topic)
        return _last(await _read(consumer, topic, _tail_ranges(begins, ends, last)), last)


def _tail_ranges(
    begins: dict[int, int], ends: dict[int, int], last: int | None
) -> dict[int, tuple[int, int]]:
    """Per partition, the range holding its last `last` records (all of them for None)."""
    if last is None:
        return {p: (begins[p], ends[p]) for p in ends}
    return {p: (max(begins[p], ends[p] - last), ends[p]) for p in ends}


def _last(records: list[Any], last: int | None) -> list[Any]:
    """The last `last` records in written order (all of them for None)."""
    ordered = in_order(records)
    if last is None:
        return ordered
    return ordered[len(ordered) - last :] if last else []


async def follow(
    conn: Connection,
    topic: str,
    emit: Callable[[Any], bool],
    *,
    last: int = 0,
    stop_after: int | None = None,
) -> None:
    """Emit the last `last` records, then every new one as it comes; stop once `emit` said
    True (shown) `stop_after` times for new ones."""
    seen = 0
    async with open_consumer(conn, isolation_level="read_committed") as consumer:
        begins, ends = await offsets(consumer, topic)
        for record in _last(await _read(consumer, topic, _tail_ranges(begins, ends, last)), last):
            emit(record)
        position = dict(ends)
        while stop_after is None or seen < stop_after:
            _, ends = await offsets(consumer, topic, sorted(position))
            ranges = {p: (position[p], end) for p, end in ends.items() if end > position[p]}
            if not ranges:
                await asyncio.sleep(POLL_S)
                continue
            for record in in_order(await _read(consumer, topic, ranges)):
                seen += emit(record)
                if stop_after is not None and seen >= stop_after:
                    return
            position.update(ends)


def _missing(topic: str) -> click.ClickException:
    error = click.ClickException(
        f"no topic {topic!r}: has the service run yet? (or give --topic; "
        "`enhydra topology show` lists the service's topics)"
    )
    error.exit_code = EXIT_NOTHING
    return error


def _common(fn):
    options = [
        app_option(),
        kafka_options,
        click.option("--topic", help="Rejections topic, if not the service's (<app>-rejections)."),
        click.option("--key", help="Only the rejections of this key."),
        click.option("--json", "as_json", is_flag=True, help="One JSON object per line."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.group()
def rejections() -> None:
    """Read the commands decide refused, with their reasons.

    One line per rejection: KEY COMMAND_ID TYPE REASON.

    \b
    Example:
      enhydra rejections list                 # inside a project: its app id
      enhydra rejections tail --app library --json
    """


@rejections.command("list")
@_common
@click.option("--last", type=click.IntRange(min=1), help="Only the last N rejections.")
def list_(
    app_id: str,
    conn: Connection,
    topic: str | None,
    key: str | None,
    as_json: bool,
    last: int | None,
) -> None:
    """Every rejection in the topic now, oldest first.

    \b
    Example:
      enhydra rejections list --app library --key a1
    """
    name = topic_for(app_id, topic)
    try:
        records = asyncio.run(read_last(conn, name, None if key else last))
    except TopicMissing:
        raise _missing(name) from None
    rows = [row_of(r) for r in records]
    if key is not None:
        rows = [row for row in rows if row["key"] == key]
        rows = rows[-last:] if last else rows  # --last counts this key's only
    for row in rows:
        show(row, as_json)
    if not as_json:
        which = f" of key {key!r}" if key is not None else ""
        click.echo(f"{len(rows)} rejection(s){which} in {name}", err=True)


@rejections.command()
@_common
@click.option(
    "--last",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Show the last N rejections first.",
)
@click.option("--max", "stop_after", type=click.IntRange(min=1), help="Exit after N new ones.")
def tail(
    app_id: str,
    conn: Connection,
    topic: str | None,
    key: str | None,
    as_json: bool,
    last: int,
    stop_after: int | None,
) -> None:
    """Follow the rejections as they come (Ctrl-C stops).

    \b
    Example:
      enhydra rejections tail --last 0 --max 1 --json
    """
    name = topic_for(app_id, topic)

    def emit(record: Any) -> bool:
        row = row_of(record)
        if key is not None and row["key"] != key:
            return False
        show(row, as_json)
        return True

    try:
        asyncio.run(follow(conn, name, emit, last=last, stop_after=stop_after))
    except TopicMissing:
        raise _missing(name) from None
    except KeyboardInterrupt:
        pass
