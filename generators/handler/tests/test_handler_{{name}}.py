"""The `{{ name }}` handler: its rules alone, and wired into the service's aggregate."""

from __future__ import annotations

import pytest
from enhydra import Rejection
from enhydra.testing import Driver

from {{ package }}.handlers.{{ name }} import COMMAND, EVENT, apply, decide
from {{ package }}.service import service


def test_decide_records_the_command() -> None:
    events = decide({"version": 1}, {"type": COMMAND, "note": "hi"})
    assert events == [{"type": EVENT, "note": "hi"}]


def test_apply_counts_and_keeps_the_version() -> None:
    state = {"version": 3}
    assert apply(state, {"type": EVENT, "note": ""}) == {"version": 4, "{{ name }}_count": 1}
    assert state == {"version": 3}


def test_the_service_routes_the_command_type_here() -> None:
    events = service.aggregate.decide({"version": 1}, {"type": COMMAND})
    assert events == [{"type": EVENT, "note": ""}]
    assert service.aggregate.apply({"version": 1}, events[0])["{{ name }}_count"] == 1


def test_unknown_keys_are_rejected() -> None:
    outcome = Driver(service).send("nobody", {"command_id": "c1", "type": COMMAND})
    assert outcome.rejection == f"{COMMAND}: nothing is stored under this key yet"


def test_a_bad_note_is_rejected() -> None:
    with pytest.raises(Rejection, match="note must be a string, got 5"):
        decide({"version": 1}, {"type": COMMAND, "note": 5})
