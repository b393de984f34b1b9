"""Typed declarations and stored-state versions, through the same pure core production runs.

The typed ledger (ledger.typed) must be the untyped ledger (ledger.domain) with types: the same
events and states as JSON for any command stream, malformed commands refused at the edge with
the field named, and history (JSON, maybe of an older version) readable by its apply.
"""

from __future__ import annotations

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enhydra import Aggregate, InvalidCommand, Rejection
from enhydra.aggregate import dumps
from enhydra.contracts.codec import Entry, decode_entry, encode_entry
from enhydra.errors.failure import Stage
from enhydra.evolution import StateVersionError, migrate_state
from enhydra.messages import DeclarationError, json_schema
from enhydra.plugins import Handler, extend
from enhydra.processing.core import InputRecord, process_batch
from enhydra.testing.driver import Driver
from ledger import domain, typed
from ledger.workload import generate, model


def as_json(value):
    return orjson.loads(dumps(value))


def run(aggregate, commands):
    driver = Driver(aggregate)
    outcomes = driver.send_many(commands)
    return driver, outcomes


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_typed_ledger_writes_what_the_untyped_one_writes(seed):
    commands = generate(20, 300, seed=seed)
    _, plain_out = run(domain.accounts, commands)
    typed_, typed_out = run(typed.accounts, commands)
    for a, b in zip(plain_out, typed_out, strict=True):
        assert [as_json(e) for e in b.events] == a.events
        assert b.rejection == a.rejection
        assert (a.failure is None) == (b.failure is None)
    expected = model(commands)
    assert {k: as_json(typed_.state(k)) for k in expected} == expected


def test_a_command_that_does_not_fit_its_type_is_refused_at_the_edge_naming_the_field():
    driver = Driver(typed.accounts)
    driver.send("a", {"command_id": "1", "type": "open", "account": "a"})
    cases = {
        "amount": {"type": "deposit", "account": "a", "amount": "5"},
        ">= 1 - at `$.amount`": {"type": "deposit", "account": "a", "amount": 0},
        "unknown command type": {"type": "refund", "account": "a"},
        "missing required field `account`": {"type": "deposit", "amount": 5},
    }
    for i, (reason, command) in enumerate(cases.items()):
        outcome = driver.send("a", {"command_id": f"bad-{i}", **command})
        assert outcome.failure is not None, command
        assert outcome.failure.stage is Stage.DESERIALIZE  # the DLQ, not a rejection
        assert isinstance(outcome.failure.error, InvalidCommand)
        assert reason in str(outcome.failure.error), (reason, str(outcome.failure.error))
    assert as_json(driver.state("a")) == {"balance": 0, "status": "open", "version": 1}


def test_typed_apply_reads_history_as_json_and_upcasts_version_1():
    driver = Driver(typed.accounts)
    state = driver.given("a", [{"type": "opened"}, {"type": "deposited", "amount": 4}], version=1)
    assert state == typed.Account(balance=4, status="open", version=2)
    # a stored state (JSON) is converted on load: decide sees an Account
    with pytest.raises(Rejection, match="balance 4, asked 9"):
        typed.accounts.decide(
            {"balance": 4, "status": "open", "version": 2}, typed.Withdraw("a", 9)
        )


def test_decide_returning_an_undeclared_event_fails_the_record_not_the_batch():
    class Surprise(msgspec.Struct, tag="surprise"):
        pass

    agg = Aggregate(
        name="s",
        decide=lambda state, command: [Surprise()],
        apply=lambda state, event: state,
        command_types=(typed.Open,),
        event_types=(typed.Opened,),
    )
    outcome = Driver(agg).send("k", {"command_id": "1", "type": "open", "account": "k"})
    assert outcome.failure is not None and outcome.failure.stage is Stage.PROCESS
    assert "Surprise is not a declared event type" in str(outcome.failure.error)


def test_declarations_are_checked_when_the_aggregate_is_built():
    class Untagged(msgspec.Struct):
        pass

    class Twin(msgspec.Struct, tag="open"):
        pass

    noop = {"decide": lambda s, c: [], "apply": lambda s, e: s}
    with pytest.raises(DeclarationError, match="not a tagged msgspec Struct"):
        Aggregate(name="x", command_types=(Untagged,), **noop)
    with pytest.raises(DeclarationError, match="'open' is declared twice"):
        Aggregate(name="x", command_types=(typed.Open, Twin), **noop)
    with pytest.raises(DeclarationError, match="state type"):
        Aggregate(name="x", state_type=dict, **noop)


def test_the_json_schema_comes_from_the_declared_type():
    schema = json_schema(typed.Deposit)
    assert schema["required"] == ["type", "account", "amount"]
    assert schema["properties"]["type"] == {"enum": ["deposit"]}
    assert schema["properties"]["amount"]["exclusiveMinimum"] == 0


def test_a_typed_aggregate_copied_or_extended_is_wrapped_once():
    from dataclasses import replace

    copy = replace(typed.accounts, description="copy")
    assert copy.apply.__wrapped__ is typed.apply and copy.typed is not None
    state = copy.apply(None, {"type": "opened"})
    assert state == typed.Account(0, "open", 1)

    class Open(msgspec.Struct, tag="open"):
        account: str
        owner: str

    commands = (Open, typed.Deposit, typed.Withdraw, typed.Close)
    changed = replace(typed.accounts, command_types=commands)
    with pytest.raises(InvalidCommand, match="owner"):
        changed.parse({"type": "open", "account": "a"})  # the copy validates with its types


# -- stored-state versions ---------------------------------------------------------------


def add_currency(state):
    return {**state, "currency": "EUR"}


def apply_v2(state, event):
    state = domain.apply(state, event)
    return {**state, "currency": "EUR"}


ledger_v2 = Aggregate(
    name="accounts",
    decide=domain.decide,
    apply=apply_v2,
    parse=domain.parse,
    event_versions={"deposited": 2},
    upcasters={("deposited", 1): domain.deposited_v1_to_v2},
    state_version=2,
    state_migrations={1: add_currency},
)


def record(offset, command):
    return InputRecord(offset, b"a", orjson.dumps(command))


def test_an_entry_written_by_older_code_is_migrated_when_loaded_and_stored_at_the_new_version():
    old = Entry({"balance": 5, "status": "open", "version": 2}, offset=1, command_ids=["c1"])
    raw = encode_entry(old)
    assert orjson.loads(raw) == [1, ["c1"], {"balance": 5, "status": "open", "version": 2}]
    deposit = {"command_id": "c2", "type": "deposit", "account": "a", "amount": 3}
    result = process_batch(ledger_v2, [record(2, deposit)], lambda key: decode_entry(raw))
    entry = result.changed["a"]
    assert entry.version == 2
    assert entry.state == {"balance": 8, "status": "open", "version": 3, "currency": "EUR"}
    stored = orjson.loads(encode_entry(entry))
    assert stored[3] == 2 and decode_entry(encode_entry(entry)) == entry
    # the loaded entry (what the store holds) was not changed in place
    assert decode_entry(raw).version == 1


def test_a_state_of_a_newer_version_is_refused_not_guessed():
    raw = encode_entry(Entry({"balance": 5}, offset=1, version=3))
    deposit = {"command_id": "c2", "type": "deposit", "account": "a", "amount": 3}
    result = process_batch(ledger_v2, [record(2, deposit)], lambda key: decode_entry(raw))
    assert not result.changed and result.failures[0].stage is Stage.PROCESS
    assert "version 3" in str(result.failures[0].error)
    with pytest.raises(StateVersionError, match="newer deployment"):
        migrate_state(ledger_v2, {}, 3)


def test_state_versions_need_a_migration_for_every_step():
    noop = {"decide": lambda s, c: [], "apply": lambda s, e: s}
    with pytest.raises(
        ValueError, match=r"no migration from version 1 to 2; add state_migrations\[1\]"
    ):
        Aggregate(name="x", state_version=2, **noop)
    with pytest.raises(ValueError, match="bump state_version"):
        Aggregate(name="x", state_migrations={1: add_currency}, **noop)


def test_a_snapshot_export_of_versioned_entries_cuts_the_state_exactly():
    import pyarrow as pa

    from enhydra.snapshots.format import _columns

    entries = [
        Entry({"balance": i}, offset=i, command_ids=[f"c{i}"], version=2 if i % 2 else 1)
        for i in range(6)
    ]
    keys = pa.array([f"k{i}".encode() for i in range(6)], pa.binary())
    values = pa.array([encode_entry(e) for e in entries], pa.binary())
    batch = _columns(keys, values)
    states = [
        orjson.loads(s) for s in batch.column(batch.schema.get_field_index("state")).to_pylist()
    ]
    assert states == [{"balance": i} for i in range(6)]


# -- plugins -----------------------------------------------------------------------------


def test_a_plugin_handler_declares_the_versions_of_its_own_event_types():
    def fee_v1_to_v2(event):
        return {**event, "reason": "unspecified"}

    handler = Handler(
        command="charge",
        decide=lambda state, command: [{"type": "charged", "amount": 1, "reason": "fee"}],
        apply={"charged": lambda state, event: {**state, "balance": state["balance"] - 1}},
        event_versions={"charged": 2},
        upcasters={("charged", 1): fee_v1_to_v2},
    )
    extended = extend(domain.accounts, handler)
    assert extended.event_versions == {"deposited": 2, "charged": 2}
    driver = Driver(extended)
    state = driver.given("a", [{"type": "opened"}, {"type": "charged", "amount": 1}], version=1)
    assert state["balance"] == -1
    with pytest.raises(ValueError, match="does not apply"):
        Handler(command="x", decide=lambda s, c: [], apply={}, event_versions={"other": 2})


def test_replay_projection_upcasts_stored_events_like_the_running_projection():
    from enhydra.projections.model import Projection, replay_projection
    from tests.integration.ledger_versions import balances

    projection = Projection("balances", balances)
    history = [("a", {"type": "opened"}, 1), ("a", {"type": "deposited", "amount": 4}, 1)]
    history.append(("a", {"type": "deposited", "amount": 2, "currency": "EUR"}, 2))
    assert replay_projection(projection, history, aggregate=domain.accounts) == {"a": {"EUR": 6}}
    with pytest.raises(ValueError, match="need the aggregate"):
        replay_projection(projection, history)
