"""The AsyncAPI document (topology/asyncapi.py) says what a consumer of the topics relies on.

Pure: the document is built from `build_topology` and a connection's public description, and
its schemas are checked against the records the runtime really writes (events with their
headers, rejections, dead letters). tests/unit/test_asyncapi_parser.py runs the reference
parser over whole documents.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import msgspec
import orjson
import pytest
from jsonschema import Draft7Validator

from enhydra import Aggregate
from enhydra.contracts.headers import EVENT_VERSION_HEADER, event_headers, version_header
from enhydra.errors.dlq import dead_letter_headers
from enhydra.errors.failure import Failure, Stage
from enhydra.processing.core import InputRecord, Rejected
from enhydra.projections.model import Projection
from enhydra.settings import Connection
from enhydra.topology import build_topology
from enhydra.topology.asyncapi import build_asyncapi
from ledger import domain, typed

DLQ = "ledger-dlq"


def topology_of(aggregate: Aggregate, **kw: Any) -> dict[str, Any]:
    kw.setdefault("dlq_topic", DLQ)
    return build_topology("ledger", aggregate, partitions=4, replication_factor=3, **kw)


def payload_validator(doc: dict[str, Any], schema: dict[str, Any]) -> Draft7Validator:
    """A validator for a schema inside `doc`: its $refs point into the document's components."""
    return Draft7Validator({**schema, "components": doc.get("components", {})})


def message(doc: dict[str, Any], channel: str, name: str) -> dict[str, Any]:
    return doc["channels"][channel]["messages"][name]


@pytest.fixture(scope="module")
def typed_doc() -> dict[str, Any]:
    return build_asyncapi(topology_of(typed.accounts), description="typed ledger")


def test_channels_are_the_topics_with_their_partitions_and_replicas(typed_doc) -> None:
    channels = typed_doc["channels"]
    assert set(channels) == {"ledger-commands", "ledger-events", "ledger-rejections", DLQ}
    for name, channel in channels.items():
        assert channel["address"] == name
        binding = channel["bindings"]["kafka"]
        assert (binding["topic"], binding["partitions"], binding["replicas"]) == (name, 4, 3)
    assert typed_doc["asyncapi"] == "3.0.0"
    assert typed_doc["info"]["title"] == "ledger"
    assert typed_doc["info"]["version"].startswith("sha256:")
    assert typed_doc["info"]["description"] == "typed ledger"


def test_the_version_follows_the_contract_not_the_handler_code() -> None:
    """A committed asyncapi.json stays right through a logic change, not a schema change."""
    import dataclasses

    import msgspec

    def other_apply(state, event):
        return typed.accounts.apply(state, event)

    logic = dataclasses.replace(typed.accounts, apply=other_apply)
    base = build_asyncapi(topology_of(typed.accounts))["info"]["version"]
    assert build_asyncapi(topology_of(logic))["info"]["version"] == base

    class Deposit(msgspec.Struct, tag="deposit"):
        account: str
        amount: int
        reference: str

    commands = (typed.Open, Deposit, typed.Withdraw, typed.Close)
    shape = dataclasses.replace(typed.accounts, command_types=commands)
    assert build_asyncapi(topology_of(shape))["info"]["version"] != base


def test_each_command_type_is_a_message_whose_payload_is_its_schema(typed_doc) -> None:
    messages = typed_doc["channels"]["ledger-commands"]["messages"]
    assert set(messages) == {"open", "deposit", "withdraw", "close"}
    deposit = messages["deposit"]
    assert deposit["name"] == "deposit" and deposit["contentType"] == "application/json"
    assert deposit["bindings"]["kafka"]["key"]["type"] == "string"
    check = payload_validator(typed_doc, deposit["payload"])
    good = msgspec.json.encode(typed.Deposit("a1", 5))
    assert check.is_valid(json.loads(good))
    assert "amount" in deposit["payload"]["required"]
    assert not check.is_valid({"type": "deposit", "account": "a1"})  # no amount
    assert not check.is_valid({"type": "deposit", "account": "a1", "amount": "5"})
    assert not check.is_valid({"type": "deposit", "account": "a1", "amount": 0})


def test_events_carry_the_runtime_headers_with_the_current_version(typed_doc) -> None:
    deposited = message(typed_doc, "ledger-events", "deposited")
    headers = deposited["headers"]
    assert headers["properties"][EVENT_VERSION_HEADER]["enum"] == ["2"]
    assert EVENT_VERSION_HEADER in headers["required"]
    # The headers the runtime writes on a deposited (v2) event fit the schema...
    written = dict(event_headers(b"c-1", 17, 0, version_header(2)))
    as_text = {name: value.decode() for name, value in written.items()}
    assert Draft7Validator(headers).is_valid(as_text)
    # ...and a version the code does not write does not.
    assert not Draft7Validator(headers).is_valid({**as_text, EVENT_VERSION_HEADER: "1"})
    assert message(typed_doc, "ledger-events", "opened")["headers"]["properties"][
        EVENT_VERSION_HEADER
    ]["enum"] == ["1"]
    payload = payload_validator(typed_doc, deposited["payload"])
    assert payload.is_valid(json.loads(msgspec.json.encode(typed.Deposited(5))))


def test_older_event_versions_are_listed_with_their_upcaster_and_baseline_schema() -> None:
    doc = build_asyncapi(topology_of(typed.accounts))
    deposited = message(doc, "ledger-events", "deposited")
    assert deposited["x-enhydra-event-version"] == 2
    assert deposited["x-enhydra-versions"] == {"1": {"upcaster": True, "upcastTo": 2}}
    assert "x-enhydra-versions" not in message(doc, "ledger-events", "opened")
    v1 = {"type": "object", "required": ["type", "amount"], "properties": {"amount": {}}}
    baseline = {"messages": {"events": {"deposited": {"schemas": {"1": v1}}}}}
    with_baseline = build_asyncapi(topology_of(typed.accounts), baseline=baseline)
    versions = message(with_baseline, "ledger-events", "deposited")["x-enhydra-versions"]
    assert versions["1"]["payload"] == v1
    # The current version's schema stays the code's, whatever the baseline holds.
    current = message(with_baseline, "ledger-events", "deposited")["payload"]
    assert current == message(doc, "ledger-events", "deposited")["payload"]


def test_an_untyped_service_gets_generic_messages_or_its_declared_schemas() -> None:
    doc = build_asyncapi(topology_of(domain.accounts))
    commands = doc["channels"]["ledger-commands"]["messages"]
    assert list(commands) == ["command"]
    assert commands["command"]["payload"]["required"] == ["type"]
    events = doc["channels"]["ledger-events"]["messages"]
    assert set(events) == {"deposited", "event"}  # the versioned type, and any other
    deposited = events["deposited"]["payload"]
    assert payload_validator(doc, deposited).is_valid({"type": "deposited", "amount": 1})
    assert not payload_validator(doc, deposited).is_valid({"type": "withdrawn", "amount": 1})

    declared = {
        "type": "object",
        "required": ["type", "account", "amount"],
        "properties": {"amount": {"type": "integer"}},
    }
    doc = build_asyncapi(topology_of(domain.accounts, schemas={"commands": declared}))
    assert doc["channels"]["ledger-commands"]["messages"]["command"]["payload"] == declared


class Address(msgspec.Struct):
    city: str


class Moved(msgspec.Struct, tag="moved"):
    to: Address


class Move(msgspec.Struct, tag="move"):
    to: Address


def test_nested_types_are_shared_components_the_payloads_refer_to() -> None:
    mover = Aggregate(
        "movers",
        decide=lambda s, c: [Moved(c.to)],
        apply=lambda s, e: s,
        command_types=(Move,),
        event_types=(Moved,),
    )
    doc = build_asyncapi(topology_of(mover))
    assert doc["components"]["schemas"]["Address"]["required"] == ["city"]
    move = message(doc, "ledger-commands", "move")["payload"]
    assert move["properties"]["to"] == {"$ref": "#/components/schemas/Address"}
    assert "$defs" not in move
    check = payload_validator(doc, move)
    assert check.is_valid({"type": "move", "to": {"city": "Oslo"}})
    assert not check.is_valid({"type": "move", "to": {}})


def test_rejections_and_dead_letters_are_described_as_the_runtime_writes_them(typed_doc) -> None:
    rejection = message(typed_doc, "ledger-rejections", "rejection")["payload"]
    written = Rejected("a1", "c-9", 12, "account is not open", {"type": "deposit"}).to_value()
    assert Draft7Validator(rejection).is_valid(written)

    letter = message(typed_doc, DLQ, "deadLetter")
    record = InputRecord(41, b"a1", b"{nope", 1_700_000_000_000, (("trace", b"abc"),))
    headers = dead_letter_headers(
        Failure(record, Stage.DESERIALIZE, ValueError("not JSON"), "a1"),
        topic="ledger-commands",
        partition=2,
        app_id="ledger",
        instance_id="i1",
        now=dt.datetime(2026, 11, 23, tzinfo=dt.UTC),
    )
    added = {name for name, _ in headers if name.startswith("enhydra.dlq.")}
    assert added == set(letter["headers"]["required"])  # the document names every one
    as_text = {name: value.decode() for name, value in headers}
    assert Draft7Validator(letter["headers"]).is_valid(as_text)


def test_operations_receive_commands_and_send_events_rejections_and_dead_letters() -> None:
    audit = Projection("activity", project=lambda state, event: state)
    doc = build_asyncapi(topology_of(typed.accounts, projections=[(audit, None)]))
    ops = doc["operations"]
    assert ops["receiveCommands"]["action"] == "receive"
    assert ops["receiveCommands"]["channel"] == {"$ref": "#/channels/ledger-commands"}
    assert ops["receiveCommands"]["bindings"]["kafka"]["groupId"]["enum"] == ["ledger"]
    for name, channel in [
        ("sendEvents", "ledger-events"),
        ("sendRejections", "ledger-rejections"),
        ("sendDeadLetters", DLQ),
    ]:
        assert ops[name]["action"] == "send"
        assert ops[name]["channel"]["$ref"] == f"#/channels/{channel}"
    projection = ops["project_activity"]
    assert projection["action"] == "receive"
    assert projection["bindings"]["kafka"]["groupId"]["enum"] == ["ledger-projection-activity"]
    # Every message an operation names is one of its channel's.
    for op in ops.values():
        channel = op["channel"]["$ref"].rsplit("/", 1)[-1]
        for ref in op["messages"]:
            assert ref["$ref"].rsplit("/", 1)[-1] in doc["channels"][channel]["messages"]
    no_dlq = build_asyncapi(topology_of(typed.accounts, dlq_topic=None))
    assert DLQ not in no_dlq["channels"] and "sendDeadLetters" not in no_dlq["operations"]


@pytest.mark.parametrize(
    "env,protocol,scheme",
    [
        ({}, "kafka", None),
        (
            {
                "SECURITY_PROTOCOL": "SASL_SSL",
                "SASL_MECHANISM": "SCRAM-SHA-512",
                "SASL_USERNAME": "ledger-svc",
                "SASL_PASSWORD": "s3cr3t-pw",
            },
            "kafka-secure",
            "scramSha512",
        ),
        (
            {
                "SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "SASL_MECHANISM": "PLAIN",
                "SASL_USERNAME": "ledger-svc",
                "SASL_PASSWORD": "s3cr3t-pw",
            },
            "kafka",
            "plain",
        ),
        (
            {
                "SECURITY_PROTOCOL": "SASL_SSL",
                "SASL_MECHANISM": "OAUTHBEARER",
                "SASL_OAUTH_TOKEN_PROVIDER": "tokens:fetch",
            },
            "kafka-secure",
            "oauth2",
        ),
        ({"SECURITY_PROTOCOL": "SSL", "SSL_CERTFILE": "CERT"}, "kafka-secure", "X509"),
        ({"SECURITY_PROTOCOL": "SSL"}, "kafka-secure", None),
    ],
)
def test_servers_carry_the_protocol_and_security_scheme_but_no_secret(
    env: dict[str, str], protocol: str, scheme: str | None, tmp_path
) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("not read here")
    variables = {"ENHYDRA_BOOTSTRAP_SERVERS": "k1.example:9093,k2.example:9093"}
    variables |= {"ENHYDRA_" + k: str(cert) if v == "CERT" else v for k, v in env.items()}
    conn = Connection.from_env(variables)
    doc = build_asyncapi(topology_of(typed.accounts), connection=conn.describe())
    assert [s["host"] for s in doc["servers"].values()] == ["k1.example:9093", "k2.example:9093"]
    assert list(doc["servers"]) == ["kafka", "kafka-2"]
    schemes = doc.get("components", {}).get("securitySchemes", {})
    for server in doc["servers"].values():
        assert server["protocol"] == protocol
        if scheme is None:
            assert "security" not in server
        else:
            (ref,) = server["security"]
            assert schemes[ref["$ref"].rsplit("/", 1)[-1]]["type"] == scheme
    text = orjson.dumps(doc).decode()
    assert "s3cr3t-pw" not in text and "ledger-svc" not in text
