"""Headers on every event the runtime publishes, read back by whoever folds the events again.

- `enhydra.command_id`: the command that caused the event, for deduplication when state is
  rebuilt from events (the fold keeps the last ids, as the live store does);
- `enhydra.command_offset`: the command's offset in the commands partition of the same number,
  so a state rebuilt from events resumes on the commands topic exactly after it;
- `enhydra.event_index`: the event's position among its command's events, which tells a
  redelivered duplicate from the next event of the same command;
- `enhydra.event_version`: the version of the event's shape (its type's current version when
  it was written; an event without it predates versions and is version 1), which tells the
  readers which upcasters to chain before `apply` (evolution.py).

On every changelog record written under at-least-once:
- `enhydra.owner_epoch`: the epoch of the task owner that wrote it. Each new owner of a
  partition writes with a higher epoch than every owner before it, so a record of a lower
  epoch that lands after a higher one is a cut-off previous owner's late write: readers skip
  it (runner/fencing.py). A record without it claims nothing and is always applied.

On commands and events when tracing is on (enhydra/tracing/), the W3C Trace Context headers
under the names the W3C and OpenTelemetry's Kafka instrumentations use, so other producers and
consumers join the same trace:
- `traceparent`: the span that caused the record (version-trace id-span id-flags);
- `tracestate`: the vendors' part of the context, carried along unchanged when present.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

COMMAND_ID_HEADER = "enhydra.command_id"
COMMAND_OFFSET_HEADER = "enhydra.command_offset"
EVENT_INDEX_HEADER = "enhydra.event_index"
EVENT_VERSION_HEADER = "enhydra.event_version"
OWNER_EPOCH_HEADER = "enhydra.owner_epoch"
TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"

# The index header of the positions commands commonly reach, built once (the hot path).
_INDEX = [(EVENT_INDEX_HEADER, b"%d" % i) for i in range(16)]
VERSION_1 = (EVENT_VERSION_HEADER, b"1")


def version_header(version: int) -> tuple[str, bytes]:
    """The version header of an event of this version (built once per type, not per event)."""
    return VERSION_1 if version == 1 else (EVENT_VERSION_HEADER, b"%d" % version)


def event_headers(
    command_id: bytes, command_offset: int, index: int, version: tuple[str, bytes] = VERSION_1
) -> list[tuple[str, bytes]]:
    """The headers of the `index`-th event of the command at `command_offset`; `version` is
    its `version_header`."""
    return [
        (COMMAND_ID_HEADER, command_id),
        (COMMAND_OFFSET_HEADER, b"%d" % command_offset),
        _index_header(index),
        version,
    ]


def command_event_headers(
    command_id: bytes, command_offset: int, versions: Sequence[tuple[str, bytes]]
) -> list[list[tuple[str, bytes]]]:
    """The headers of each event of one command, `versions[i]` the i-th event's version header.

    The same headers as `event_headers` per event; the hot path calls this once per command,
    so the command's two headers are built once and most commands (one event) take no loop.
    """
    id_header = (COMMAND_ID_HEADER, command_id)
    offset_header = (COMMAND_OFFSET_HEADER, b"%d" % command_offset)
    if len(versions) == 1:
        return [[id_header, offset_header, _INDEX[0], versions[0]]]
    return [
        [id_header, offset_header, _index_header(index), version]
        for index, version in enumerate(versions)
    ]


def _index_header(index: int) -> tuple[str, bytes]:
    return _INDEX[index] if index < 16 else (EVENT_INDEX_HEADER, b"%d" % index)


def header(headers: Iterable[tuple[str, bytes]] | None, name: str) -> bytes | None:
    """The value of header `name`, or None."""
    for key, value in headers or ():
        if key == name:
            return value
    return None


Source = tuple[int, int]  # (command offset, event index): an event's place in its key's history


def event_source(headers: Iterable[tuple[str, bytes]] | None) -> Source | None:
    """(command offset, event index) from an event's headers, or None if it has no such pair."""
    offset = index = None
    for name, value in headers or ():
        if name == COMMAND_OFFSET_HEADER:
            offset = value
        elif name == EVENT_INDEX_HEADER:
            index = value
    if offset is None or index is None:
        return None
    try:
        return int(offset), int(index)
    except ValueError:
        return None


def epoch_headers(epoch: int) -> list[tuple[str, bytes]]:
    """The headers of a changelog record written by the owner of epoch `epoch`."""
    return [(OWNER_EPOCH_HEADER, b"%d" % epoch)]


def record_epoch(headers: Iterable[tuple[str, bytes]] | None) -> int | None:
    """The owner epoch a changelog record carries, or None (it claims none)."""
    for name, value in headers or ():
        if name == OWNER_EPOCH_HEADER:
            try:
                return int(value)
            except ValueError:
                return None
    return None
