"""A reaction of the service to {{ source }}'s events:

    {{ name }}

Added by `enhydra generate reaction`.

It reads {{ source }}'s events topic (`{{ source }}-events`) in its own consumer group and turns
the events it reads into commands for this service's aggregate. Each command's id is derived
from the event's position upstream, so an event read twice (after a crash) makes the same
command again and the aggregate skips the copy. `react` must be pure.

The types in READS are your side of the contract with {{ source }}: declare the event types
and the fields you read, as {{ source }}'s contract names them. Save {{ source }}'s AsyncAPI
document (`enhydra asyncapi` in its project) as contracts/{{ source }}.json: `enhydra topology
check` then reports any change upstream that removes or narrows a field read here.
"""

from __future__ import annotations

import msgspec
from enhydra.reactions import Emit, Reaction, Upstream

from {{ package }}.domain import CREATE, KEY_FIELD


# TODO: the {{ source }} event type(s) this reaction reads, with the fields it needs.
class {{ name | class_name }}Trigger(msgspec.Struct, tag="{{ name }}_trigger"):
    name: str = ""


READS = [{{ name | class_name }}Trigger]


def react(upstream: Upstream) -> list[Emit]:
    """One `create` command for the same key, named after the upstream event.

    TODO: your rule. Return [] to ignore an event; Emit(key, command, topic=...) writes to
    another service's commands topic (list it in the Reaction's sends_to).
    """
    event = upstream.event
    if upstream.key is None:
        return []
    command = {"type": CREATE, KEY_FIELD: upstream.key, "name": event.name}
    return [Emit(upstream.key, command)]


reaction = Reaction(
    "{{ name }}",
    "{{ source }}",
    react,
    reads=READS,
    description="Creates an entry for every {{ name }}_trigger event of {{ source }}.",
)
