"""Event versions and upcasters: declared once on the aggregate, applied by every reader."""

from __future__ import annotations

import enum
from typing import Any

import orjson
import pytest

from enhydra.aggregate import Aggregate
from enhydra.contracts.headers import EVENT_VERSION_HEADER, VERSION_1, header, version_header
from enhydra.evolution import (
    EventVersionError,
    read_event,
    reader,
    upcast,
    version_headers,
)
from enhydra.processing.core import InputRecord, process_batch
from enhydra.processing.step import event_outputs
from enhydra.projections.model import EventRecord, Projection, fold_batch
from enhydra.testing import Driver


def decide(state: Any, command: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "moved", "to": {"x": command["x"], "y": command["y"]}}, {"type": "noted"}]


def apply(state: Any, event: dict[str, Any]) -> Any:
    if event["type"] == "moved":
        return {**(state or {}), "at": event["to"]}
    return {**(state or {}), "notes": (state or {}).get("notes", 0) + 1}


# moved v1 {"x"}, v2 {"x", "y"}, v3 {"to": {"x", "y"}}
def moved_1_to_2(event: dict[str, Any]) -> dict[str, Any]:
    return {**event, "y": 0}


def moved_2_to_3(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": "moved", "to": {"x": event["x"], "y": event["y"]}}


UPCASTERS = {("moved", 1): moved_1_to_2, ("moved", 2): moved_2_to_3}
robot = Aggregate("robot", decide, apply, event_versions={"moved": 3}, upcasters=UPCASTERS)
plain = Aggregate("plain", decide, apply)


def test_upcasters_chain_from_any_older_version() -> None:
    assert upcast(robot, {"type": "moved", "x": 4}, 1) == {"type": "moved", "to": {"x": 4, "y": 0}}
    assert upcast(robot, {"type": "moved", "x": 4, "y": 2}, 2) == {
        "type": "moved",
        "to": {"x": 4, "y": 2},
    }
    current = {"type": "moved", "to": {"x": 1, "y": 1}}
    assert upcast(robot, current, 3) is current  # nothing to do: not even a copy
    assert upcast(robot, {"type": "noted"}, 1) == {"type": "noted"}  # undeclared: version 1


@pytest.mark.parametrize(
    ("event", "version", "message"),
    [
        ({"type": "moved", "to": {}}, 4, "'moved' at version 4: this code reads versions up to 3"),
        ({"type": "noted"}, 2, "'noted' at version 2: this code reads versions up to 1"),
        ([1, 2], 2, "None at version 2"),  # an event without a type is version 1
        ({"type": "moved"}, 0, "version 0 is not a version"),
    ],
)
def test_versions_this_code_cannot_read_are_refused(event: Any, version: int, message: str) -> None:
    with pytest.raises(EventVersionError, match=message):
        upcast(robot, event, version)


def test_a_failing_upcaster_names_its_step() -> None:
    with pytest.raises(EventVersionError, match="'moved': the upcaster from version 2 to 3 failed"):
        upcast(robot, {"type": "moved", "x": 1}, 2)  # a v2 event without its y
    broken = Aggregate(
        "broken",
        decide,
        apply,
        event_versions={"moved": 2},
        upcasters={("moved", 1): lambda e: {"type": "jumped"}},
    )
    with pytest.raises(EventVersionError, match="returned an event of type 'jumped'"):
        upcast(broken, {"type": "moved"}, 1)


@pytest.mark.parametrize(
    ("versions", "upcasters", "message"),
    [
        (
            {"moved": 3},
            {("moved", 1): moved_1_to_2},
            "'moved' is at version 3 but has no upcaster from version 2 to 3",
        ),
        ({"moved": 2}, {}, r"add upcasters\[\('moved', 1\)\]"),
        ({"moved": 0}, {}, "'moved' has version 0; versions are whole numbers from 1"),
        ({"moved": "2"}, {}, "has version '2'"),
        (
            {"moved": 2},
            {("moved", 1): moved_1_to_2, ("moved", 2): moved_2_to_3},
            r"upcaster \('moved', 2\) upcasts beyond the declared version 2",
        ),
        ({}, {("noted", 1): moved_1_to_2}, "beyond the declared version 1 of 'noted'"),
        ({"moved": 2}, {("moved", 1): "not a function"}, "is not callable"),
        ({}, {"moved": moved_1_to_2}, "is not \\(event type, from version\\)"),
    ],
)
def test_declarations_with_a_missing_step_fail_when_the_aggregate_is_built(
    versions: dict, upcasters: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Aggregate("robot", decide, apply, event_versions=versions, upcasters=upcasters)


def test_readers_and_writers_cost_nothing_without_declarations() -> None:
    assert reader(plain) is None and version_headers(plain) is None
    assert read_event(plain, {"type": "moved"}, None) == {"type": "moved"}
    assert read_event(plain, {"type": "moved"}, b"1") == {"type": "moved"}
    with pytest.raises(EventVersionError, match="'moved' at version 2: this code reads version 1"):
        read_event(plain, {"type": "moved"}, b"2")
    read = reader(robot)
    assert read is not None
    assert read({"type": "moved", "x": 1}, None) == {"type": "moved", "to": {"x": 1, "y": 0}}
    assert read({"type": "moved", "x": 1, "y": 5}, b"2") == {
        "type": "moved",
        "to": {"x": 1, "y": 5},
    }


def test_published_events_carry_their_types_current_version() -> None:
    records = [InputRecord(0, b"r", orjson.dumps({"command_id": "c", "x": 1, "y": 2}))]
    for aggregate, moved in ((robot, b"3"), (plain, b"1")):
        result = process_batch(aggregate, records, lambda key: None)
        outputs = event_outputs(result, version_headers(aggregate))
        assert [header(h, EVENT_VERSION_HEADER) for _, _, h in outputs] == [moved, b"1"]
    header_of = version_headers(robot)
    assert header_of is not None and header_of(["no", "type"]) == VERSION_1
    assert header_of({"type": ["not", "a", "name"]}) == VERSION_1


def test_an_event_type_named_by_a_str_enum_gets_its_version() -> None:
    class Kind(enum.StrEnum):
        MOVED = "moved"

    header_of = version_headers(robot)
    assert header_of is not None and header_of({"type": Kind.MOVED}) == version_header(3)


def _positions(state: Any, event: dict[str, Any]) -> Any:
    return [*(state or []), event["to"]["x"]]  # reads v3's shape


def test_projections_read_old_versions_through_the_upcasters() -> None:
    projection = Projection("positions", _positions)
    records = [
        EventRecord(0, b"r", b'{"type":"moved","x":1}', None, None),
        EventRecord(1, b"r", b'{"type":"moved","x":2,"y":0}', None, b"2"),
        EventRecord(2, b"r", b'{"type":"moved","to":{"x":3,"y":0}}', None, b"3"),
    ]
    result = fold_batch(projection, records, lambda key: None, read=reader(robot))
    assert result.changed["r"].state == [1, 2, 3]
    with pytest.raises(EventVersionError, match="'moved' at version 2: this code reads version 1"):
        fold_batch(projection, records[1:], lambda key: None)  # no versions known: v1 only


def test_the_driver_starts_a_key_from_an_old_history() -> None:
    driver = Driver(robot)
    assert driver.given("r", [{"type": "moved", "x": 7}, {"type": "noted"}], version=1) == {
        "at": {"x": 7, "y": 0},
        "notes": 1,
    }
    driver.given("r", [{"type": "moved", "to": {"x": 8, "y": 8}}])  # current version
    assert driver.send("r", {"command_id": "c", "x": 9, "y": 9}).accepted
    assert driver.state("r") == {"at": {"x": 9, "y": 9}, "notes": 2}
    with pytest.raises(EventVersionError, match="'moved' at version 4"):
        driver.given("r", [{"type": "moved"}], version=4)
