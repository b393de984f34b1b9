{%- set commands = cookiecutter.command_types | command_list -%}
{%- set create = commands[0] -%}
{%- set others = commands[1:] -%}
{%- set noun = cookiecutter.key_field -%}
"""The {{ cookiecutter.aggregate }} aggregate: one state per {{ noun }}.

Commands are JSON objects, keyed by the {{ noun }} they are for:

    {"command_id": "c1", "type": "{{ create }}",
     "{{ noun }}": "a1", ...}

Command types, and the event each one records when it is accepted:

{%- for c in commands %}
    {{ c }} -> {{ c | past_tense }}
{%- endfor %}

The first creates the {{ noun }}{% if others %}; the others need it to exist{% endif %}.
Every event carries the command's other fields. The state of
one {{ noun }} is those fields merged in order, plus `version`, the
number of events applied.

This is a starting point generated from your answers: put the business rules where the TODOs
are (raise Rejection("why") to refuse a command), and shape events and state as your domain
needs. Keep the functions pure: the streaming service, the test driver and a PySpark backfill
run exactly this code, so keep I/O, clocks and randomness out of them.
"""

from __future__ import annotations

from typing import Any

from enhydra import Aggregate, InvalidCommand, Rejection

Command = dict[str, Any]
Event = dict[str, Any]
State = dict[str, Any]

KEY_FIELD = "{{ noun }}"
# Command type -> the event type it records when accepted.
EVENT_TYPES = {
{%- for c in commands %}
    "{{ c }}": "{{ c | past_tense }}",
{%- endfor %}
}
COMMAND_TYPES = tuple(EVENT_TYPES)
CREATE = COMMAND_TYPES[0]


def parse(command: Command) -> Command:
    """The command's shape: a known type and the {{ noun }} it is for.

    A malformed command is the sender's bug, not a business answer: raising InvalidCommand
    sends it to the dead-letter queue (with the template's settings) instead of publishing a
    rejection. decide below only ever sees well-formed commands.
    """
    kind = command.get("type")
    if kind not in COMMAND_TYPES:
        expected = ", ".join(COMMAND_TYPES)
        raise InvalidCommand(f"unknown command type {kind!r}; expected one of {expected}")
    key = command.get(KEY_FIELD)
    if not isinstance(key, str) or not key:
        raise InvalidCommand(f"{KEY_FIELD} must be a non-empty string, got {key!r}")
    return command


def fields(command: Command) -> dict[str, Any]:
    """A command's fields beyond command_id, type and the key: its event records them."""
    return {k: v for k, v in command.items() if k not in ("command_id", "type", KEY_FIELD)}


def decide(state: State | None, command: Command) -> list[Event]:
    """Check a well-formed command against the state: its events, or a Rejection."""
    kind, key = command["type"], command[KEY_FIELD]
    event = {"type": EVENT_TYPES[kind], **fields(command)}
    if kind == CREATE:
        if state is not None:
            raise Rejection(f"{KEY_FIELD} {key!r} already exists")
        # TODO: the rules of {{ create }}
        return [event]
{%- if others %}
    if state is None:
        raise Rejection(f"{KEY_FIELD} {key!r} does not exist: {CREATE} it first")
{%- for c in others %}
    if kind == "{{ c }}":
        # TODO: the rules of {{ c }}
        return [event]
{%- endfor %}
{%- endif %}
    raise InvalidCommand(f"unknown command type {kind!r}")  # parse lets none through


def apply(state: State | None, event: Event) -> State:
    """The only way a state changes; never raises for events decide produced."""
    kind = event["type"]
    data = {k: v for k, v in event.items() if k != "type"}
    if kind == EVENT_TYPES[CREATE]:
        return {**data, "version": 1}
    if state is None:
        raise ValueError(f"{kind!r} event for a {{ noun }} that was never created")
    if kind in EVENT_TYPES.values():
        return {**state, **data, "version": state["version"] + 1}
    raise ValueError(f"unknown event type {kind!r}")


{{ cookiecutter.aggregate }} = Aggregate(
    name="{{ cookiecutter.aggregate }}",
    decide=decide,
    apply=apply,
    parse=parse,
    description="One state per {{ noun }}: the fields its commands recorded.",
)
