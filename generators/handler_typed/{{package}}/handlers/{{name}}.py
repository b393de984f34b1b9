"""A command type of the aggregate:

    {{ name }}

Added by `enhydra generate handler`.

A handler owns one command type and the event types it emits; the aggregate dispatches
`{"type": "{{ name }}", ...}` here and every other command to its own decide (see
{{ package }}/handlers/__init__.py and the end of {{ package }}/domain.py). The aggregate declares
its types, so this command is declared too: `parse` checks a command against {{ name | class_name }}
(a field of the wrong type sends it to the dead-letter queue, named), decide receives it typed,
and decide and apply receive the state as the aggregate's state type. Keep both functions
pure: the service, the test driver and a backfill run exactly this code.
"""

from __future__ import annotations

from typing import Any

import msgspec
from enhydra import InvalidCommand, Rejection
from enhydra.plugins import Handler

COMMAND = "{{ name }}"
EVENT = "{{ name }}_recorded"


class {{ name | class_name }}(msgspec.Struct, tag=COMMAND):
    """The command's fields besides the key (fields it does not declare are ignored)."""

    note: str = ""


def parse(command: dict[str, Any]) -> {{ name | class_name }}:
    """The command as {{ name | class_name }}, or InvalidCommand naming the field that does not fit."""
    try:
        return msgspec.convert(command, {{ name | class_name }})
    except msgspec.ValidationError as exc:
        raise InvalidCommand(f"{COMMAND}: {exc}") from None


def decide(state: Any, command: {{ name | class_name }}) -> list[dict[str, Any]]:
    """Check the command against the key's state; say what happened or raise Rejection."""
    if state is None:
        raise Rejection(f"{COMMAND}: nothing is stored under this key yet")
    return [{"type": EVENT, "note": command.note}]


def apply(state: Any, event: dict[str, Any]) -> Any:
    """Count the event in the state's `version`; to keep more of it, add a field to the
    state's class in domain.py and set it here."""
    return msgspec.structs.replace(state, version=state.version + 1)


# command_type puts the command's JSON Schema into topology.json and asyncapi.json, so
# `enhydra topology check` guards its shape and senders can discover it.
handler = Handler(
    COMMAND,
    decide,
    {EVENT: apply},
    parse=parse,
    command_type={{ name | class_name }},
)
