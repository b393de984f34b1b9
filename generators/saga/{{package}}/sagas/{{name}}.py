"""A saga of the service:

    {{ name }}

Added by `enhydra generate saga`.

A saga (process manager) keeps one state per correlation id across the events of several
services ({{ sources | join(", ") }}) and schedules deadlines that become commands when they
fire. Here: when an entry is created, a follow-up command is due AFTER_S seconds later,
unless the follow-up's event arrives first. `correlate` and `handle` must be pure.

Effectively once: each upstream event is handled once per correlation id (copies are
skipped by an id derived from their position), and a deadline fires once; if a crash makes it
fire twice, both commands carry the id `{{ name }}:<key>:deadline:<id>:<n>` and the aggregate
skips the copy. Deadlines are kept in the saga's changelog-backed store: they survive
restarts, kill -9 and failover. The saga reads its sources through its own inbox topic, keyed
by correlation id (docs/sagas.md).
"""

from __future__ import annotations

from typing import Any

from enhydra.sagas import Cancel, Deadline, Emit, Saga, Upstream

from {{ package }}.domain import COMMAND_TYPES, CREATE, EVENT_TYPES, KEY_FIELD

# The services whose events the saga reads (app ids): this one first.
SOURCES = {{ sources | tojson }}
FOLLOW_UP = COMMAND_TYPES[-1]  # TODO: the command a deadline sends
AFTER_S = 3600.0  # TODO: how long after the start the follow-up is due
STARTED = EVENT_TYPES[CREATE]
DONE = EVENT_TYPES[FOLLOW_UP]


def correlate(upstream: Upstream) -> str | None:
    """The correlation id of an upstream event, or None when it is not for this saga.

    TODO: for another service's events, the field that names this service's key.
    """
    return upstream.key


def handle(state: dict[str, Any] | None, upstream: Upstream):
    """(new state or None to end the saga, commands to send now, deadlines to set or cancel)."""
    key = correlate(upstream)
    if upstream.type == STARTED and state is None:
        command = {"type": FOLLOW_UP, KEY_FIELD: key, "note": "follow-up by {{ name }}"}
        return {"started": True}, [], [Deadline("follow_up", AFTER_S, Emit(key, command))]
    if upstream.type == DONE and state is not None:
        return None, [], [Cancel("follow_up")]
    return state, [], []


saga = Saga(
    "{{ name }}",
    SOURCES,
    correlate,
    handle,
    description="Sends a follow-up for every entry not followed up within AFTER_S seconds.",
)
