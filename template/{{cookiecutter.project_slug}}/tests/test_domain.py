{%- set commands = cookiecutter.command_types | command_list -%}
{%- set create = commands[0] -%}
{%- set others = commands[1:] -%}
{%- set noun = cookiecutter.key_field -%}
{%- set agg = cookiecutter.aggregate -%}
{%- set second = (others or [create])[0] -%}
"""The domain rules, run through the same batch core as the service but without a broker.

Generated with the domain: as you add rules to decide and apply, add their cases here.
"""

from __future__ import annotations

from typing import Any

import pytest
{%- if not others %}
from enhydra import Rejection
{%- endif %}
from enhydra.testing import Driver

from {{ cookiecutter.package_name }}.domain import (
    COMMAND_TYPES,
    EVENT_TYPES,
    KEY_FIELD,
{%- for name in ["apply", "decide", agg] | sort %}
    {{ name }},
{%- endfor %}
)
from {{ cookiecutter.package_name }}.service import service

CREATE, *OTHERS = COMMAND_TYPES


def cmd(command_id: str, kind: str, key: str = "k1", **fields: Any) -> dict[str, Any]:
    return {"command_id": command_id, "type": kind, KEY_FIELD: key, **fields}


@pytest.fixture
def driver() -> Driver:
    return Driver(service)


@pytest.fixture
def created(driver: Driver) -> Driver:
    """A {{ noun }} k1, created with a name."""
    assert driver.send("k1", cmd("c0", CREATE, name="first")).accepted
    return driver


def test_create_records_the_fields(driver: Driver) -> None:
    outcome = driver.send("k1", cmd("c0", CREATE, name="first"))
    assert outcome.events == [{"type": EVENT_TYPES[CREATE], "name": "first"}]
    assert driver.state("k1") == {"name": "first", "version": 1}
    assert driver.rejections == []


{%- if others %}


def test_every_command_type_is_applied_in_order(created: Driver) -> None:
    for n, kind in enumerate(OTHERS, start=1):
        outcome = created.send("k1", cmd(f"c{n}", kind, step=n))
        assert outcome.events == [{"type": EVENT_TYPES[kind], "step": n}]
    expected = {"name": "first", "step": len(OTHERS), "version": 1 + len(OTHERS)}
    assert created.state("k1") == expected
{%- endif %}


def test_creating_twice_is_rejected(created: Driver) -> None:
    outcome = created.send("k1", cmd("c9", CREATE, name="again"))
    assert outcome.rejection == f"{KEY_FIELD} 'k1' already exists"
    assert outcome.events == []
    assert created.state("k1") == {"name": "first", "version": 1}
    assert created.rejections[-1]["command_id"] == "c9"


{%- if others %}


@pytest.mark.parametrize("kind", OTHERS)
def test_commands_need_an_existing_{{ noun }}(driver: Driver, kind: str) -> None:
    outcome = driver.send("k2", cmd("c1", kind, key="k2"))
    assert outcome.rejection == f"{KEY_FIELD} 'k2' does not exist: {CREATE} it first"
    assert driver.state("k2") is None
{%- endif %}


def test_keys_are_independent(driver: Driver) -> None:
    driver.send_many([("a", cmd("a1", CREATE, key="a")), ("b", cmd("b1", CREATE, key="b", x=7))])
    assert driver.state("a") == {"version": 1}
    assert driver.state("b") == {"x": 7, "version": 1}
    assert driver.state("c") is None


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (cmd("r1", "no_such_type"), "unknown command type 'no_such_type'"),
        ({"command_id": "r2", "type": CREATE}, f"{KEY_FIELD} must be a non-empty string, got None"),
        (cmd("r3", CREATE, key=""), f"{KEY_FIELD} must be a non-empty string, got ''"),
        ({**cmd("r4", CREATE), KEY_FIELD: 5}, f"{KEY_FIELD} must be a non-empty string, got 5"),
    ],
)
def test_malformed_commands_are_failures_for_the_dead_letter_queue(
    created: Driver, command: dict[str, Any], reason: str
) -> None:
    outcome = created.send("k1", command)
    assert not outcome.accepted and outcome.rejection is None
    assert outcome.failure is not None and outcome.failure.stage == "deserialize"
    assert str(outcome.failure.error).startswith(reason)
    assert created.state("k1") == {"name": "first", "version": 1}


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
    assert created.state("k1") == {"name": "first", "version": 1}


def test_apply_is_pure() -> None:
    before = {"name": "first", "version": 1}
    after = apply(before, {"type": EVENT_TYPES["{{ second }}"], "name": "second"})
    assert after == {"name": "second", "version": {{ 2 if others else 1 }}}
    assert before == {"name": "first", "version": 1}


def test_decide_does_not_change_state() -> None:
    state = {"name": "first", "version": 1}
    {% if not others %}with pytest.raises(Rejection):
        {% endif %}decide(state, cmd("c1", "{{ second }}", name="x"))
    assert state == {"name": "first", "version": 1}


def test_service_wiring() -> None:
    assert service.aggregate is {{ agg }}
    assert {{ agg }}.name == "{{ agg }}"
