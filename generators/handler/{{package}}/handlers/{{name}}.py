"""A command type of the aggregate, and the event it records:

    {{ name }} -> {{ event }}

Added by `enhydra generate handler`.

A handler owns one command type and the event types it emits; the aggregate dispatches
`{"type": "{{ name }}", ...}` here and every other command to its own decide (see
{{ package }}/handlers/__init__.py and the end of {{ package }}/domain.py). Keep both functions
pure: the service, the test driver and a backfill run exactly this code.
"""

from __future__ import annotations

from typing import Any

from enhydra import Rejection
from enhydra.plugins import Handler

COMMAND = "{{ name }}"
EVENT = "{{ event }}"


def decide(state: dict[str, Any] | None, command: dict[str, Any]) -> list[dict[str, Any]]:
    """Check the command against the key's state; say what happened or raise Rejection."""
    if state is None:
        raise Rejection(f"{COMMAND}: nothing is stored under this key yet")
    note = command.get("note", "")
    if not isinstance(note, str):
        raise Rejection(f"{COMMAND}: note must be a string, got {note!r}")
    return [{"type": EVENT, "note": note}]


def apply(state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """Count the command on the state; keep `version` counting every applied event."""
    changed = {**state, "{{ name }}_count": state.get("{{ name }}_count", 0) + 1}
    if "version" in state:
        changed["version"] = state["version"] + 1
    return changed


handler = Handler(COMMAND, decide, {EVENT: apply})
