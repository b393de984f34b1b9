"""A command type of the aggregate, and the event it records:

    {{ name }} -> {{ event }}

Added by `enhydra generate handler`.

A handler owns one command type and the event types it emits; the aggregate dispatches
`{"type": "{{ name }}", ...}` here and every other command to its own decide (see
{{ package }}/handlers/__init__.py and the end of {{ package }}/domain.py).

The aggregate declares its types, so this handler declares its own as msgspec Structs, like
domain.py does:
- `parse` checks a command against {{ name | class_name }}: a field of the wrong type sends it
  to the dead-letter queue, named;
- decide receives it typed and returns {{ event | class_name }} events;
- decide and apply receive the state as {{ state }}.

Keep both functions pure: the service, the test driver and a backfill run exactly this code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from enhydra import InvalidCommand, Rejection
from enhydra.plugins import Handler

if TYPE_CHECKING:  # domain.py imports the handlers at its end: read its names for types only
    from {{ package }}.domain import {{ state }}

COMMAND = "{{ name }}"
EVENT = "{{ event }}"


class {{ name | class_name }}(msgspec.Struct, tag=COMMAND):
    """The command's fields besides the key (fields it does not declare are ignored)."""

    note: str = ""


class {{ event | class_name }}(msgspec.Struct, tag=EVENT):
    note: str


def parse(command: dict[str, Any]) -> {{ name | class_name }}:
    """The command as {{ name | class_name }}, or InvalidCommand naming the field that does not fit."""
    try:
        return msgspec.convert(command, {{ name | class_name }})
    except msgspec.ValidationError as exc:
        raise InvalidCommand(f"{COMMAND}: {exc}") from None


def decide(state: {{ state }} | None, command: {{ name | class_name }}) -> list[{{ event | class_name }}]:
    """Check the command against the key's state; say what happened or raise Rejection."""
    if state is None:
        raise Rejection(f"{COMMAND}: nothing is stored under this key yet")
    return [{{ event | class_name }}(note=command.note)]


def apply(state: {{ state }}, event: {{ event | class_name }} | dict[str, Any]) -> {{ state }}:
    """Count the event in the state's `version`; to keep more of it, add a field to
    {{ state }} in domain.py and set it here. A stored event arrives as its JSON."""
    if isinstance(event, dict):
        event = msgspec.convert(event, {{ event | class_name }})
    return msgspec.structs.replace(state, version=state.version + 1)


# command_type and event_types put their JSON Schemas into topology.json and asyncapi.json, so
# `enhydra topology check` guards their shapes and senders can discover them.
handler = Handler(
    COMMAND,
    decide,
    {EVENT: apply},
    parse=parse,
    command_type={{ name | class_name }},
    event_types={EVENT: {{ event | class_name }}},
)
