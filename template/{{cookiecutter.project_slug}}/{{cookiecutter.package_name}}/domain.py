{%- set commands = cookiecutter.command_types | command_list -%}
{%- set create = commands[0] -%}
{%- set others = commands[1:] -%}
{%- set noun = cookiecutter.key_field -%}
{%- set created = create | past_tense -%}
{%- set State = noun | class_name -%}
{%- set command_classes = commands | map("class_name") | list -%}
{%- set event_classes = commands | map("past_tense") | map("class_name") | list -%}
{%- set others_patterns = [] -%}
{%- for e in event_classes[1:] %}{% set _ = others_patterns.append(e ~ "()") %}{% endfor -%}
{%- set Key = State ~ "Id" -%}
{#- A union or tuple of class names on one line, or one name a line where it is too long. -#}
{%- macro union(indent, head, names, tail) -%}
{%- if (indent ~ head ~ names | join(" | ") ~ tail) | length <= 100 -%}
{{ indent }}{{ head }}{{ names | join(" | ") }}{{ tail }}
{%- else -%}
{{ indent }}{{ head }}(
{{ indent }}    {{ names | join("\n" ~ indent ~ "    | ") }}
{{ indent }}){{ tail }}
{%- endif -%}
{%- endmacro -%}
{%- macro tuple(indent, head, names, tail) -%}
{%- set one = names | join(", ") ~ ("," if names | length == 1 else "") -%}
{%- if (indent ~ head ~ "(" ~ one ~ ")" ~ tail) | length <= 100 -%}
{{ indent }}{{ head }}({{ one }}){{ tail }}
{%- else -%}
{{ indent }}{{ head }}(
{%- for n in names %}
{{ indent }}    {{ n }},
{%- endfor %}
{{ indent }}){{ tail }}
{%- endif -%}
{%- endmacro -%}
"""The {{ cookiecutter.aggregate }} aggregate: one state per {{ noun }}.

Commands are JSON objects, keyed by the {{ noun }} they are for:

    {"command_id": "c1", "type": "{{ create }}",
     "{{ noun }}": "a1", "name": "first"}

Command types, and the event each one records when it is accepted:

{%- for c in commands %}
    {{ c }} -> {{ c | past_tense }}
{%- endfor %}

The first creates the {{ noun }}{% if others %}; the others need it to exist{% endif %}. The state
of one {{ noun }} is its name, the last note and
`version`, the number of events applied.

Commands, events and the state are declared below as msgspec Structs: the "type" field of the
JSON picks the Struct (its tag). A command that does not fit its type (no key, a name that is
not a string, an unknown type) never reaches decide: it goes to the dead-letter queue with the
field named. Fields a command type does not declare are ignored (add
`forbid_unknown_fields=True` to a command class to refuse them). The schemas of these types
go into the topology baseline that `enhydra topology check` compares the code with.

Events are kept forever, so their shapes are versioned:
`{{ created }}` is at version 2 (version 1 had no note), and
`{{ created }}_v1_to_v2` turns the stored JSON of a version 1
event into version 2 before `apply` sees it, on every path that reads events. To change an
event's shape, bump its version in EVENT_VERSIONS and add an upcaster (Enhydra's
docs/upgrades.md).

This is a starting point generated from your answers: put the business rules where the TODOs
are (raise Rejection("why") to refuse a command), and shape commands, events and state as your
domain needs. Keep the functions pure: the streaming service, the test driver and a PySpark
backfill run exactly this code, so keep I/O, clocks and randomness out of them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from enhydra import Aggregate, Rejection

KEY_FIELD = "{{ noun }}"
# Command type -> the event type it records when accepted.
EVENT_TYPES = {
{%- for c in commands %}
    "{{ c }}": "{{ c | past_tense }}",
{%- endfor %}
}
COMMAND_TYPES = tuple(EVENT_TYPES)
CREATE = COMMAND_TYPES[0]
# Event type -> the version its events are written at now (1 when not listed).
EVENT_VERSIONS = {"{{ created }}": 2}

{{ Key }} = Annotated[str, msgspec.Meta(min_length=1)]


# Commands
class {{ create | class_name }}(msgspec.Struct, tag="{{ create }}"):
    {{ noun }}: {{ Key }}
    name: str = ""
    note: str = ""
{%- for c in others %}


class {{ c | class_name }}(msgspec.Struct, tag="{{ c }}"):
    {{ noun }}: {{ Key }}
    note: str = ""
{%- endfor %}


{{ union("", "Command = ", command_classes, "") }}


# Events
class {{ created | class_name }}(msgspec.Struct, tag="{{ created }}"):
    """Version 2: version 1 had no note."""

    name: str
    note: str
{%- for c in others %}


class {{ c | past_tense | class_name }}(msgspec.Struct, tag="{{ c | past_tense }}"):
    note: str
{%- endfor %}


{{ union("", "Event = ", event_classes, "") }}


class {{ State }}(msgspec.Struct):
    name: str
    note: str
    version: int  # the number of events applied


def decide(state: {{ State }} | None, command: Command) -> list[Event]:
    """Check a well-formed command against the state: its events, or a Rejection."""
    key = command.{{ noun }}
    match command:
        case {{ create | class_name }}(name=name, note=note):
            if state is not None:
                raise Rejection(f"{KEY_FIELD} {key!r} already exists")
            # TODO: the rules of {{ create }}
            return [{{ created | class_name }}(name=name, note=note)]
{%- if others %}
    if state is None:
        raise Rejection(f"{KEY_FIELD} {key!r} does not exist: {CREATE} it first")
    match command:
{%- for c in others %}
        case {{ c | class_name }}(note=note):
            # TODO: the rules of {{ c }}
            return [{{ c | past_tense | class_name }}(note=note)]
{%- endfor %}
{%- endif %}
    raise TypeError(f"not a command type of this aggregate: {command!r}")


def apply(state: {{ State }} | None, event: Event) -> {{ State }}:
    """The only way a state changes; never raises for events decide produced."""
    match event:
        case {{ created | class_name }}(name=name, note=note):
            return {{ State }}(name=name, note=note, version=1)
{%- if others %}
    if state is None:
        raise ValueError(f"{event!r}: its {KEY_FIELD} was never created")
    match event:
{{ union("        ", "case ", others_patterns, ":") }}
            return msgspec.structs.replace(state, note=event.note, version=state.version + 1)
{%- endif %}
    raise ValueError(f"not an event type of this aggregate: {event!r}")


def {{ created }}_v1_to_v2(event: dict[str, Any]) -> dict[str, Any]:
    """A stored version 1 event (JSON, before it becomes a Struct) as version 2."""
    return {"note": "", **event}


{{ cookiecutter.aggregate }} = Aggregate(
    name="{{ cookiecutter.aggregate }}",
    decide=decide,
    apply=apply,
{{ tuple("    ", "command_types=", command_classes, ",") }}
{{ tuple("    ", "event_types=", event_classes, ",") }}
    state_type={{ State }},
    event_versions=EVENT_VERSIONS,
    upcasters={("{{ created }}", 1): {{ created }}_v1_to_v2},
    description="One state per {{ noun }}: its name, last note and events applied.",
)
