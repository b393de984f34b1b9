"""`enhydra send TOPIC [FILE...]`: JSON lines to a Kafka topic, one record per line.

Each line is sent as it is (the record's value), keyed by one of its fields (--key-field), so
records land in the partition Kafka's default partitioner picks, as the service's do. Lines
are read and sent as a stream; a line that is not JSON, or lacks the key field, stops the
command at that line once everything before it is acknowledged, and says how much that was.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click
from aiokafka.errors import KafkaError

from enhydra import tracing
from enhydra.cli.common import StatusLine, kafka_options
from enhydra.kafka.clients import as_connection, open_producer
from enhydra.kafka.reading import known_topics
from enhydra.settings import Connection
from enhydra.tracing.context import BadTraceParent, parse

if TYPE_CHECKING:
    from enhydra.tracing.spans import Tracing

# Records in flight before the command waits for their acknowledgements (and shows progress).
WINDOW = 2000
Record = tuple[bytes | None, bytes]
# Tracing for the records sent: the tracer, and the traceparent and tracestate they continue.
Traced = tuple["Tracing", bytes | None, bytes | None]


class BadLine(ValueError):
    """A line that cannot be sent; `sent` is filled in with what went out before it."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.sent = 0


class SendError(RuntimeError):
    """Kafka refused or could not be reached; the message says what to check."""


def record_of(line: str, key_field: str | None) -> Record:
    """The (key, value) of one JSON line; ValueError says why the line cannot be sent."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if key_field is None:
        return None, line.encode()
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object, so it has no {key_field!r} field")
    key = value.get(key_field)
    if key is None:
        raise ValueError(f"no {key_field!r} field (the key)")
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise ValueError(f"{key_field!r} is {json.dumps(key)}: a key must be a string or integer")
    if key == "":
        raise ValueError(f"{key_field!r} is empty")
    return str(key).encode(), line.encode()


def records(
    sources: Iterable[tuple[str, Iterable[str]]], key_field: str | None
) -> Iterator[Record]:
    """The records of every source's lines, in order; blank lines are skipped.

    A bad line raises BadLine naming the source and the line number.
    """
    for name, lines in sources:
        for number, line in enumerate(lines, start=1):
            text = line.strip()
            if not text:
                continue
            try:
                yield record_of(text, key_field)
            except ValueError as exc:
                raise BadLine(f"{name} line {number}", str(exc)) from None


async def _settle(pending: list[asyncio.Future]) -> int:
    """Wait until the records in flight are acknowledged; how many they were."""
    count = len(pending)
    await asyncio.gather(*pending)
    pending.clear()
    return count


async def produce(
    conn: Connection | str,
    topic: str,
    items: Iterable[Record],
    progress: Callable[[int], None],
    traced: Traced | None = None,
) -> int:
    """Send every record to `topic`, in order, and return how many Kafka acknowledged.

    The topic must exist: a service creates its own topics with its partition count, and a
    topic created by the first record would have the broker's default instead. With `traced`
    (tracing on: the Tracing, and the traceparent and tracestate the records continue, if
    any), each record is a `send` span, its context in the record's headers.
    """
    sent = 0
    pending: list[asyncio.Future] = []
    settings = {"acks": "all", "enable_idempotence": True, "linger_ms": 5}
    async with open_producer(conn, **settings) as producer:
        if topic not in await known_topics(producer):
            raise SendError(
                f"no topic {topic!r} on {as_connection(conn).bootstrap_servers}: start the "
                "service once (it creates its topics with their partition count), or check "
                "the name"
            )
        try:
            for key, value in items:
                if traced is None:
                    pending.append(await producer.send(topic, value, key=key))
                else:
                    tracer, parent, state = traced
                    span, headers = tracer.start_send(topic, parent, state)
                    future = await producer.send(topic, value, key=key, headers=headers)
                    future.add_done_callback(functools.partial(_sent, tracer, span))
                    pending.append(future)
                if len(pending) >= WINDOW:
                    sent += await _settle(pending)
                    progress(sent)
        except BadLine as exc:
            exc.sent = sent + await _settle(pending)
            raise
        except KafkaError as exc:
            raise SendError(f"sending to {topic!r} failed after {sent} records: {exc}") from None
        sent += await _settle(pending)
        progress(sent)
        return sent


def _sent(tracer: Tracing, span: object, future: asyncio.Future) -> None:
    error = None if future.cancelled() else future.exception()
    tracer.end_send(span, error)


def tracing_for_send(env: Mapping[str, str]) -> Traced | None:
    """Tracing for `enhydra send` (None: off), continuing TRACEPARENT/TRACESTATE if set.

    The upper-case names are OpenTelemetry's for a context handed to a process in its
    environment (a CI job, a script's own span). Bad values: ClickException, one line.
    """
    try:
        tracer = tracing.current("enhydra-send")
    except tracing.TracingError as exc:
        raise click.ClickException(str(exc)) from None
    if tracer is None:
        return None
    parent = env.get("TRACEPARENT", "").strip() or None
    state = env.get("TRACESTATE", "").strip() or None
    if parent is not None:
        try:
            parse(parent)
        except BadTraceParent as exc:
            raise click.ClickException(
                f"TRACEPARENT {exc}: expected 00-<32 hex>-<16 hex>-<2 hex>, or leave it unset"
            ) from None
    return (
        tracer,
        parent.encode() if parent else None,
        state.encode("ascii", "replace") if state else None,
    )


class Progress:
    """How many records went out, as a status line (see StatusLine)."""

    def __init__(self, topic: str, stream: IO[str]) -> None:
        self.topic = topic
        self.line = StatusLine(stream)

    def __call__(self, sent: int) -> None:
        rate = sent / max(time.monotonic() - self.line.started, 1e-6)
        self.line.show(f"enhydra: sent {sent:,} records to {self.topic} ({rate:,.0f}/s)")

    def done(self) -> float:
        return self.line.clear()


def _sources(files: tuple[Path, ...]) -> Iterator[tuple[str, Iterable[str]]]:
    """(name, lines) of each FILE in turn, or of stdin when there is none (or for '-')."""
    for path in files or (Path("-"),):
        if str(path) == "-":
            yield "stdin", sys.stdin
            continue
        try:
            with path.open(encoding="utf-8") as lines:
                yield str(path), lines
        except OSError as exc:
            raise click.ClickException(f"{path}: {exc.strerror}") from None


@click.command()
@click.argument("topic")
@click.argument(
    "files",
    nargs=-1,
    metavar="[FILE]...",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
)
@click.option(
    "--key-field",
    "-k",
    metavar="FIELD",
    help="Key each record by this field of its JSON object [default: no key].",
)
@kafka_options
def send(topic: str, files: tuple[Path, ...], key_field: str | None, conn: Connection) -> None:
    """Send JSON lines from FILEs (or stdin) to TOPIC, one record per line.

    Each line is a record's value as written; with --key-field its key is that field of the
    line's JSON object. Blank lines are skipped. A line that is not JSON or has no key field
    stops the command there (exit 1), after the lines before it were sent.

    \b
    Examples:
      enhydra send inventory-commands --key-field item commands.jsonl
      echo '{"command_id": "c1", "type": "register", "item": "apple"}' \\
        | enhydra send inventory-commands -k item
    """
    for path in files:
        if str(path) != "-" and not path.is_file():
            raise click.BadParameter(f"{path}: no such file", param_hint="FILE")
    if not files and sys.stdin.isatty():
        click.echo("enhydra: reading JSON lines from the terminal (Ctrl-D ends)", err=True)
    traced = tracing_for_send(os.environ)
    progress = Progress(topic, click.get_text_stream("stderr"))
    try:
        lines = records(_sources(files), key_field)
        sent = asyncio.run(produce(conn, topic, lines, progress, traced))
    except BadLine as exc:
        progress.done()
        raise click.ClickException(
            f"{exc}; stopped there, after sending the {exc.sent} records before it"
        ) from None
    except SendError as exc:
        progress.done()
        raise click.ClickException(str(exc)) from None
    seconds = progress.done()
    keyed = f", keyed by {key_field}" if key_field else ", without keys"
    if sent == 0:
        click.echo(f"sent nothing to {topic}: the input had no JSON lines")
    else:
        click.echo(f"sent {sent} records to {topic}{keyed} in {seconds:.1f} s")
