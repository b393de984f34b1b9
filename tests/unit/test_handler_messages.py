"""The command and event types of handlers (generated ones, installed plugins) are part of the
contract: the topology's `messages`, the AsyncAPI document and `topology check`."""

from __future__ import annotations

from typing import Any

import msgspec
from jsonschema import Draft7Validator

from enhydra.plugins import Handler, extend
from enhydra.topology import Path, build_topology, compare, locked
from enhydra.topology.asyncapi import build_asyncapi
from ledger import domain, typed


class Renew(msgspec.Struct, tag="renew"):
    days: int


class Renewed(msgspec.Struct, tag="renewed"):
    days: int


def decide(state: Any, command: Any) -> list[dict[str, Any]]:
    return [{"type": "renewed", "days": command.days}]


def apply(state: Any, event: Any) -> Any:
    return state


RENEW = Handler(
    "renew",
    decide,
    {"renewed": apply},
    command_type=Renew,
    event_types={"renewed": Renewed},
)
UNDECLARED = Handler("audit", decide, {"audited": apply})


def topology(aggregate: Any) -> dict[str, Any]:
    return build_topology("ledger", aggregate, partitions=4)


def test_a_typed_services_handlers_are_in_its_messages_with_their_schemas() -> None:
    messages = topology(extend(typed.accounts, RENEW, UNDECLARED))["messages"]
    renew = messages["commands"]["renew"]["schema"]
    assert Draft7Validator(renew).is_valid({"type": "renew", "days": 7})
    assert not Draft7Validator(renew).is_valid({"type": "renew", "days": "seven"})
    assert messages["events"]["renewed"]["version"] == 1
    assert set(messages["events"]["renewed"]["schemas"]) == {"1"}
    assert messages["commands"]["audit"] == {"schema": None}  # listed by name
    assert messages["events"]["audited"] == {"version": 1, "schemas": {}, "upcasters": []}
    assert set(typed.accounts.typed.command_names) < set(messages["commands"])


def test_an_untyped_services_handlers_are_listed_by_name() -> None:
    messages = topology(extend(domain.accounts, UNDECLARED))["messages"]
    assert messages["commands"] == {"audit": {"schema": None}}
    assert "audited" in messages["events"]


def test_the_asyncapi_document_has_a_message_per_handler_type() -> None:
    document = build_asyncapi(topology(extend(typed.accounts, RENEW, UNDECLARED)))
    commands = document["channels"]["ledger-commands"]["messages"]
    events = document["channels"]["ledger-events"]["messages"]
    assert {"renew", "audit"} <= set(commands) and {"renewed", "audited"} <= set(events)
    untyped = build_asyncapi(topology(extend(domain.accounts, UNDECLARED)))
    assert {"audit", "command"} <= set(untyped["channels"]["ledger-commands"]["messages"])


def test_topology_check_guards_a_handlers_command_and_event() -> None:
    deployed = locked(topology(extend(typed.accounts, RENEW)), None, deployed=True)
    without = compare(deployed, topology(typed.accounts))
    bad = {c.subject: c for c in without if not c.compatible}
    assert bad["command renew"].path is Path.SENDERS_FIRST
    assert "event renewed" in bad  # the history holds it: apply must still read it

    class Narrower(msgspec.Struct, tag="renew"):
        days: int
        reason: str

    narrowed = Handler("renew", decide, {"renewed": apply}, command_type=Narrower)
    changes = compare(deployed, topology(extend(typed.accounts, narrowed)))
    assert any(c.subject == "command renew" and not c.compatible for c in changes), changes
