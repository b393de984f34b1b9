"""The `{{ name }}` handler: its rules alone, and wired into the service's aggregate."""

from __future__ import annotations

import msgspec
import pytest
from enhydra import InvalidCommand, Rejection
from enhydra.testing import Driver

from {{ package }}.domain import CREATE, KEY_FIELD
from {{ package }}.handlers.{{ name }} import (
    COMMAND,
    EVENT,
{%- for cls in [name | class_name, event | class_name] | sort %}
    {{ cls }},
{%- endfor %}
    decide,
    parse,
)
from {{ package }}.service import service


@pytest.fixture
def driver() -> Driver:
    """A driver with one key, k1, created."""
    driver = Driver(service)
    assert driver.send("k1", {"command_id": "c0", "type": CREATE, KEY_FIELD: "k1"}).accepted
    return driver


def test_parse_types_the_command() -> None:
    assert parse({"type": COMMAND, KEY_FIELD: "k1", "note": "hi"}) == {{ name | class_name }}(note="hi")
    assert parse({"type": COMMAND, KEY_FIELD: "k1"}) == {{ name | class_name }}(note="")


def test_a_field_of_the_wrong_type_is_an_invalid_command() -> None:
    with pytest.raises(InvalidCommand) as raised:
        parse({"type": COMMAND, KEY_FIELD: "k1", "note": 5})
    assert str(raised.value) == f"{COMMAND}: Expected `str`, got `int` - at `$.note`"


def test_the_service_routes_the_command_type_here(driver: Driver) -> None:
    before = driver.state("k1")
    command = {"command_id": "c1", "type": COMMAND, KEY_FIELD: "k1", "note": "hi"}
    outcome = driver.send("k1", command)
    assert outcome.events == [{{ event | class_name }}(note="hi")]
    assert driver.state("k1") == msgspec.structs.replace(before, version=before.version + 1)


def test_a_malformed_command_goes_to_the_dead_letter_queue(driver: Driver) -> None:
    before = driver.state("k1")
    outcome = driver.send("k1", {"command_id": "c1", "type": COMMAND, KEY_FIELD: "k1", "note": 5})
    assert outcome.failure is not None and outcome.failure.stage == "deserialize"
    assert str(outcome.failure.error) == f"{COMMAND}: Expected `str`, got `int` - at `$.note`"
    assert driver.state("k1") == before


def test_a_state_read_back_from_the_store_reaches_apply_typed(driver: Driver) -> None:
    """After a restart the state comes from the store as JSON; apply still gets the class."""
    state = driver.state("k1")
    stored = msgspec.to_builtins(state)
    after = service.aggregate.apply(stored, {"type": EVENT, "note": ""})
    assert after == msgspec.structs.replace(state, version=state.version + 1)


def test_the_event_is_recorded_in_past_tense_as_declared() -> None:
    assert msgspec.to_builtins({{ event | class_name }}(note="n")) == {"type": EVENT, "note": "n"}
    assert EVENT == "{{ event }}"


def test_unknown_keys_are_rejected() -> None:
    outcome = Driver(service).send("nobody", {"command_id": "c1", "type": COMMAND})
    assert outcome.rejection == f"{COMMAND}: nothing is stored under this key yet"
    with pytest.raises(Rejection):
        decide(None, {{ name | class_name }}(note="x"))
