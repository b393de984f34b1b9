"""Typed declarations at the edge (messages.py): what a sender of a bad command is told."""

from __future__ import annotations

import msgspec
import pytest

from enhydra import Aggregate, InvalidCommand
from enhydra.testing import Driver


class Write(msgspec.Struct, tag="write"):
    page: str


class Written(msgspec.Struct, tag="written"):
    page: str


def decide(state: object, command: Write) -> list[Written]:
    return [Written(command.page)]


def apply(state: object, event: Written) -> int:
    return 1 if state is None else state + 1  # type: ignore[operator]


PAGES = Aggregate("pages", decide, apply, command_types=(Write,), event_types=(Written,))


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ({"command_id": "c1", "page": "p1"}, "Object missing required field `type`"),
        ({"command_id": "c2", "type": "read", "page": "p1"}, "Invalid value 'read' - at `$.type`"),
        ({"command_id": "c3", "type": "write", "page": 5}, "Expected `str`, got `int`"),
    ],
)
def test_with_one_command_type_the_type_field_is_still_required(command: dict, reason: str) -> None:
    """msgspec accepts a lone tagged Struct without its tag; a command needs its type."""
    outcome = Driver(PAGES).send("p1", command)
    assert outcome.failure is not None and outcome.failure.stage == "deserialize"
    assert isinstance(outcome.failure.error, InvalidCommand)
    assert reason in str(outcome.failure.error)


def test_a_command_of_the_one_type_is_accepted() -> None:
    outcome = Driver(PAGES).send("p1", {"command_id": "c1", "type": "write", "page": "p1"})
    assert outcome.events == [Written("p1")]
