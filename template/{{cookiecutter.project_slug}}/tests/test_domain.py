{%- set commands = cookiecutter.command_types | command_list -%}
{%- set create = commands[0] -%}
{%- set others = commands[1:] -%}
{%- set noun = cookiecutter.key_field -%}
{%- set agg = cookiecutter.aggregate -%}
{%- set second = (others or [create])[0] -%}
{%- set created = create | past_tense -%}
{%- set Created = created | class_name -%}
{%- set Second = second | past_tense | class_name -%}
{%- set State = noun | class_name -%}
"""The domain rules, run through the same batch core as the service but without a broker.

Generated with the domain: as you add rules to decide and apply, add their cases here.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
{%- if not others %}
from enhydra import Rejection
{%- endif %}
from enhydra.testing import Driver

from {{ cookiecutter.package_name }}.domain import (
    COMMAND_TYPES,
    EVENT_TYPES,
    KEY_FIELD,
{%- for name in [Created, Second, State, second | class_name] | unique | sort %}
    {{ name }},
{%- endfor %}
{%- for name in ["apply", "decide", agg, created ~ "_v1_to_v2"] | sort %}
    {{ name }},
{%- endfor %}
)
from {{ cookiecutter.package_name }}.service import service

CREATE, *OTHERS = COMMAND_TYPES
FIRST = {{ State }}(name="first", note="", version=1)


def cmd(command_id: str, kind: str, key: str = "k1", **fields: Any) -> dict[str, Any]:
    return {"command_id": command_id, "type": kind, KEY_FIELD: key, **fields}


@pytest.fixture
def driver() -> Driver:
    return Driver(service)


@pytest.fixture
def created(driver: Driver) -> Driver:
    """k1: a {{ noun }} created with a name."""
    assert driver.send("k1", cmd("c0", CREATE, name="first")).accepted
    return driver


def test_create_records_the_fields(driver: Driver) -> None:
    outcome = driver.send("k1", cmd("c0", CREATE, name="first"))
    assert outcome.events == [{{ Created }}(name="first", note="")]
    assert driver.state("k1") == FIRST
    assert driver.rejections == []
    # What the events topic and the query API carry, as JSON.
    assert msgspec.to_builtins(outcome.events) == [
        {"type": EVENT_TYPES[CREATE], "name": "first", "note": ""}
    ]
    assert msgspec.to_builtins(FIRST) == {"name": "first", "note": "", "version": 1}


{%- if others %}


def test_every_command_type_is_applied_in_order(created: Driver) -> None:
    for n, kind in enumerate(OTHERS, start=1):
        outcome = created.send("k1", cmd(f"c{n}", kind, note=f"step {n}"))
        assert msgspec.to_builtins(outcome.events) == [
            {"type": EVENT_TYPES[kind], "note": f"step {n}"}
        ]
    last, note = len(OTHERS), f"step {len(OTHERS)}"
    assert created.state("k1") == {{ State }}(name="first", note=note, version=1 + last)
{%- endif %}


def test_creating_twice_is_rejected(created: Driver) -> None:
    outcome = created.send("k1", cmd("c9", CREATE, name="again"))
    assert outcome.rejection == f"{KEY_FIELD} 'k1' already exists"
    assert outcome.events == []
    assert created.state("k1") == FIRST
    assert created.rejections[-1]["command_id"] == "c9"


{%- if others %}


@pytest.mark.parametrize("kind", OTHERS)
def test_commands_need_an_existing_{{ noun }}(driver: Driver, kind: str) -> None:
    outcome = driver.send("k2", cmd("c1", kind, key="k2"))
    assert outcome.rejection == f"{KEY_FIELD} 'k2' does not exist: {CREATE} it first"
    assert driver.state("k2") is None
{%- endif %}


def test_keys_are_independent(driver: Driver) -> None:
    a, b = cmd("a1", CREATE, key="a"), cmd("b1", CREATE, key="b", note="x")
    driver.send_many([("a", a), ("b", b)])
    assert driver.state("a") == {{ State }}(name="", note="", version=1)
    assert driver.state("b") == {{ State }}(name="", note="x", version=1)
    assert driver.state("c") is None


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (
            cmd("r1", "no_such_type"),
            "unknown command type: Invalid value 'no_such_type' - at `$.type`",
        ),
        ({"command_id": "r2", KEY_FIELD: "k1"}, "Object missing required field `type`"),
        ({"command_id": "r3", "type": CREATE}, f"Object missing required field `{KEY_FIELD}`"),
        (cmd("r4", CREATE, key=""), f"Expected `str` of length >= 1 - at `$.{KEY_FIELD}`"),
        ({**cmd("r5", CREATE), KEY_FIELD: 5}, f"Expected `str`, got `int` - at `$.{KEY_FIELD}`"),
        (cmd("r6", CREATE, name=5), "Expected `str`, got `int` - at `$.name`"),
        (cmd("r7", "{{ second }}", note=["x"]), "Expected `str`, got `array` - at `$.note`"),
    ],
)
def test_malformed_commands_are_failures_for_the_dead_letter_queue(
    created: Driver, command: dict[str, Any], reason: str
) -> None:
    """A field of the wrong type is the sender's bug: the dead-letter queue, the field named."""
    outcome = created.send("k1", command)
    assert not outcome.accepted and outcome.rejection is None
    assert outcome.failure is not None and outcome.failure.stage == "deserialize"
    assert type(outcome.failure.error).__name__ == "InvalidCommand"
    assert str(outcome.failure.error) == reason
    assert created.state("k1") == FIRST


def test_invalid_json_is_a_failure_with_a_reason(driver: Driver) -> None:
    outcome = driver.send("k1", b"{not json")
    assert outcome.failure is not None and outcome.failure.stage == "deserialize"
    assert str(outcome.failure.error).startswith("value is not valid JSON")
    assert driver.rejections == [] and driver.state("k1") is None


def test_command_without_id_is_a_failure(driver: Driver) -> None:
    outcome = driver.send("k1", {"type": CREATE, KEY_FIELD: "k1"})
    assert outcome.failure is not None
    assert str(outcome.failure.error) == "command has no 'command_id' (a non-empty string)"


def test_duplicate_command_id_is_rejected_not_applied(created: Driver) -> None:
    outcome = created.send("k1", cmd("c0", "{{ second }}"))
    assert outcome.rejection == "duplicate command_id"
    assert created.state("k1") == FIRST


def test_apply_is_pure() -> None:
    before = {{ State }}(name="first", note="", version=1)
{%- if others %}
    after = apply(before, {{ Second }}(note="second"))
    assert after == {{ State }}(name="first", note="second", version=2)
{%- else %}
    after = apply(before, {{ Second }}(name="second", note=""))
    assert after == {{ State }}(name="second", note="", version=1)
{%- endif %}
    assert before == FIRST


def test_decide_does_not_change_state() -> None:
    state = {{ State }}(name="first", note="", version=1)
    command = {{ second | class_name }}({{ noun }}="k1", note="x")
    {% if not others %}with pytest.raises(Rejection):
        {% endif %}decide(state, command)
    assert state == FIRST


# Event versions: the create event is at version 2; history written at version 1 is upcast.
V1_CREATED = {"type": "{{ created }}", "name": "first"}


def test_the_upcaster_turns_a_version_1_event_into_version_2() -> None:
    upcast = {{ created }}_v1_to_v2(V1_CREATED)
    assert upcast == {"type": "{{ created }}", "name": "first", "note": ""}
    kept = {**V1_CREATED, "note": "from v1"}
    assert {{ created }}_v1_to_v2(kept) == kept
    assert {{ agg }}.event_versions == {"{{ created }}": 2}


def test_a_version_1_event_does_not_fit_the_current_type_without_its_upcaster() -> None:
    with pytest.raises(msgspec.ValidationError, match="missing required field `note`"):
        {{ agg }}.apply(None, V1_CREATED)


def test_history_written_at_version_1_reaches_the_current_state(driver: Driver) -> None:
    later = [{"type": EVENT_TYPES[kind], "note": f"step {n}"} for n, kind in enumerate(OTHERS, 1)]
    old = driver.given("old", [V1_CREATED, *later], version=1)
    current = driver.given("new", [{**V1_CREATED, "note": ""}, *later])
    assert old == current
    last, note = len(OTHERS), f"step {len(OTHERS)}" if OTHERS else ""
    assert old == {{ State }}(name="first", note=note, version=1 + last)
    # and a command on the upcast history is decided like on any other
    outcome = driver.send("old", cmd("c1", CREATE, key="old"))
    assert outcome.rejection == f"{KEY_FIELD} 'old' already exists"


def test_service_wiring() -> None:
    assert service.aggregate is {{ agg }}
    assert {{ agg }}.name == "{{ agg }}"
