"""Plugins and projections without a broker: loading, extension of an aggregate, the fold."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from enhydra import Aggregate, Rejection, Service
from enhydra.plugins import (
    Handler,
    PluginError,
    extend,
    load_entry_point,
    load_plugins,
)
from enhydra.projections import Projection, fold_batch, replay_projection
from enhydra.projections.model import (
    EventRecord,
    ProjectedEntry,
    decode,
    encode,
    event_source,
)
from enhydra.testing import Driver
from enhydra.topology import topology_of
from ledger.domain import accounts
from ledger.typed import Account
from ledger.typed import accounts as typed_accounts
from ledger.workload import generate


def count(state: Any, event: dict) -> Any:
    return (state or 0) + 1


def record(offset: int, key: str, event: Any) -> EventRecord:
    return EventRecord(offset, key.encode(), orjson.dumps(event))


# --------------------------------------------------------------------------- the fold


def test_fold_batch_folds_per_key_and_skips_redelivered_events() -> None:
    projection = Projection("counts", count)
    stored = {"a": ProjectedEntry(5, offset=3)}
    records = [
        record(2, "a", {"type": "x"}),  # at or below the stored offset: already folded
        record(3, "a", {"type": "x"}),
        record(4, "a", {"type": "x"}),
        record(5, "b", {"type": "x"}),
        record(6, "b", {"type": "x"}),
        EventRecord(7, None, b"{}"),
    ]
    result = fold_batch(projection, records, stored.get)
    assert result.changed == {"a": ProjectedEntry(6, 4), "b": ProjectedEntry(2, 6)}
    assert (result.skipped, result.ignored, result.last_offset) == (2, 1, 7)


def test_events_the_service_published_twice_are_folded_once() -> None:
    """A crash between publishing a batch's events and writing its changelog re-publishes them.

    The copies sit at new events offsets, so only their source tells them apart: command 10
    emitted two events, command 11 one; the crash re-published command 10's second event and
    command 11's event, after which command 12 is new.
    """
    projection = Projection("counts", count)

    def event(offset: int, command: int, index: int) -> EventRecord:
        headers = [
            ("enhydra.command_offset", b"%d" % command),
            ("enhydra.event_index", b"%d" % index),
        ]
        return EventRecord(offset, b"a", b'{"type": "x"}', event_source(headers))

    stored = {"a": ProjectedEntry(2, offset=1, source=(10, 0))}  # folded command 10's first
    records = [event(2, 10, 1), event(3, 11, 0), event(4, 10, 1), event(5, 11, 0), event(6, 12, 0)]
    result = fold_batch(projection, records, stored.get)
    assert result.changed == {"a": ProjectedEntry(5, 6, (12, 0))}
    assert (result.duplicates, result.skipped) == (2, 0)
    # An event without Enhydra's headers is folded and keeps the bookkeeping it found.
    later = fold_batch(projection, [EventRecord(7, b"a", b'{"type": "x"}')], result.changed.get)
    assert later.changed == {"a": ProjectedEntry(6, 7, (12, 0))}
    assert event_source([("enhydra.command_offset", b"3")]) is None
    assert event_source([("enhydra.command_offset", b"x"), ("enhydra.event_index", b"0")]) is None


def test_a_projection_returning_none_deletes_the_key() -> None:
    def forget(state: Any, event: dict) -> Any:
        return None if event["type"] == "closed" else (state or 0) + 1

    projection = Projection("open-counts", forget)
    result = fold_batch(
        projection, [record(0, "a", {"type": "x"}), record(1, "a", {"type": "closed"})], {}.get
    )
    assert result.changed == {"a": ProjectedEntry(None, 1)}
    assert result.changed["a"].deleted
    assert replay_projection(projection, [("a", {"type": "x"}), ("a", {"type": "closed"})]) == {}


def test_a_deleted_key_keeps_its_offsets_so_a_redelivery_is_skipped() -> None:
    """A crash after the deletion was stored, before the offsets were committed: Kafka sends the
    same events again. They must not fold into a fresh state from the start."""

    def forget(state: Any, event: dict) -> Any:
        return None if event["type"] == "closed" else (state or 0) + 1

    projection = Projection("open-counts", forget)
    events = [record(0, "a", {"type": "x"}), record(1, "a", {"type": "closed"})]
    stored = {
        k: encode(e) for k, e in fold_batch(projection, events, {}.get).changed.items()
    }  # the bytes the engine writes to RocksDB and the changelog

    def load(key: str) -> ProjectedEntry | None:
        return decode(stored[key]) if key in stored else None

    again = fold_batch(projection, [*events, record(2, "a", {"type": "x"})], load)
    assert again.skipped == 2
    assert again.changed == {"a": ProjectedEntry(1, 2)}  # a new life starts from initial_state
    published_again = EventRecord(
        3,
        b"a",
        b'{"type": "x"}',
        event_source([("enhydra.command_offset", b"9"), ("enhydra.event_index", b"0")]),
    )
    deleted = {"a": ProjectedEntry(None, 2, (9, 0))}
    assert fold_batch(projection, [published_again], deleted.get).duplicates == 1


def test_entry_round_trip() -> None:
    entry = ProjectedEntry({"n": 1}, 42)
    assert decode(encode(entry)) == entry
    with_source = ProjectedEntry({"n": 1}, 42, (7, 1))
    assert decode(encode(with_source)) == with_source


@pytest.mark.parametrize("name", ["", "a b", "x/y"])
def test_projection_names_are_checked(name: str) -> None:
    with pytest.raises(ValueError, match="projection name"):
        Projection(name, count)


def test_the_ledger_audit_plugin_matches_a_plain_count() -> None:
    from ledger_audit import activity

    commands = generate(30, 400, seed=4)
    driver = Driver(accounts)
    driver.send_many(commands)
    states = replay_projection(activity, driver.events)
    for key in driver.stored_keys():
        events = [e for k, e in driver.events if k == key]
        assert states[key]["deposits"] == sum(e["type"] == "deposited" for e in events)
        assert states[key]["withdrawn"] == sum(
            e["amount"] for e in events if e["type"] == "withdrawn"
        )
        assert driver.state(key)["balance"] == states[key]["deposited"] - states[key]["withdrawn"]


# --------------------------------------------------------------------------- handlers


def refund_decide(state: Any, command: dict) -> list[dict]:
    if state is None:
        raise Rejection("account is not open")
    return [{"type": "refunded", "amount": command["amount"]}]


def refund_apply(state: Any, event: dict) -> Any:
    return {**state, "balance": state["balance"] + event["amount"], "version": state["version"] + 1}


REFUND = Handler("refund", refund_decide, {"refunded": refund_apply})


def test_extend_adds_a_command_type_and_keeps_the_rest() -> None:
    extended = extend(accounts, REFUND)
    driver = Driver(extended)
    driver.send("a", {"command_id": "1", "type": "open", "account": "a"})
    outcome = driver.send("a", {"command_id": "2", "type": "refund", "account": "a", "amount": 7})
    assert outcome.events == [{"type": "refunded", "amount": 7}]
    assert driver.state("a") == {"balance": 7, "status": "open", "version": 2}
    unknown = driver.send("a", {"command_id": "3", "type": "bogus", "account": "a"})
    assert unknown.failure is not None  # the base parse still refuses unknown types
    assert extend(accounts) is accounts


def test_a_command_type_handled_twice_is_an_error() -> None:
    with pytest.raises(PluginError, match="command type 'refund' is handled twice"):
        extend(extend(accounts, REFUND), REFUND)


def typed_refund_apply(state: Any, event: dict) -> Any:
    return msgspec.structs.replace(
        state, balance=state.balance + event["amount"], version=state.version + 1
    )


def test_handlers_of_a_typed_aggregate_see_its_state_type_after_a_restore() -> None:
    """A restored state is JSON from the store: the handler still gets the declared class."""
    typed_refund = Handler("refund", refund_decide, {"refunded": typed_refund_apply})
    extended = extend(typed_accounts, typed_refund)
    driver = Driver(extended)
    driver.send("a", {"command_id": "1", "type": "open", "account": "a"})
    stored = msgspec.to_builtins(driver.state("a"))
    driver.entries["a"].state = stored  # as a restart reads it back from the store
    outcome = driver.send("a", {"command_id": "2", "type": "refund", "account": "a", "amount": 7})
    assert outcome.events == [{"type": "refunded", "amount": 7}]
    assert driver.state("a") == Account(balance=7, status="open", version=2)
    after = extended.apply(stored, {"type": "refunded", "amount": 1})  # e.g. the Spark fold
    assert after == Account(balance=1, status="open", version=2)
    service = Service("bank", extended)
    handlers = topology_of(service.resolved(plugins=[]))["handlers"][0]
    assert handlers["apply"]["refunded"] == f"{__name__}:typed_refund_apply"


def test_topology_lists_the_parts_of_an_extended_aggregate() -> None:
    service = Service("bank", extend(accounts, REFUND))
    handlers = topology_of(service.resolved(plugins=[]))["handlers"][0]
    assert handlers["decide"] == {
        "base": "ledger.domain:decide",
        "refund": f"{__name__}:refund_decide",
    }
    assert handlers["apply"]["refunded"] == f"{__name__}:refund_apply"


# --------------------------------------------------------------------------- loading


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module defining plugins, importable for the length of a test."""
    (tmp_path / "fake_plugins.py").write_text(
        "from enhydra.plugins import Plugin\n"
        "from enhydra.projections import Projection\n"
        "def count(state, event):\n    return (state or 0) + 1\n"
        "good = Plugin('counts', projections=[Projection('event-counts', count)],"
        " aggregates=('accounts',))\n"
        "other = Plugin('others', projections=[Projection('x', count)], aggregates=('items',))\n"
        "clash = Plugin('clash', projections=[Projection('accounts', count)])\n"
        "def factory():\n    return good\n"
        "not_a_plugin = 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fake_plugins"
    sys.modules.pop("fake_plugins", None)


def ep(name: str, value: str) -> EntryPoint:
    return EntryPoint(name, value, "enhydra.handlers")


def test_plugins_apply_to_their_aggregates_only(plugin_module: str) -> None:
    service = Service("bank", accounts)
    installed = load_plugins(
        [ep("counts", f"{plugin_module}:good"), ep("o", f"{plugin_module}:other")]
    )
    resolved = service.resolved(plugins=installed)
    loaded = resolved.plugins
    assert [p.name for p in loaded] == ["counts"]
    assert [(p.name, plugin) for p, plugin in resolved.projections] == [("event-counts", "counts")]
    assert loaded[0].describe()["projections"] == ["event-counts"]
    assert service.resolved() is service.resolved()  # installed plugins are loaded once
    assert service.aggregate is accounts  # resolving never changes the declaration
    topology = topology_of(resolved)
    assert topology["projections"][0]["group"] == "bank-projection-event-counts"
    assert topology["projections"][0]["plugin"] == "counts"


def test_a_factory_entry_point_is_called(plugin_module: str) -> None:
    assert load_entry_point(ep("f", f"{plugin_module}:factory")).plugin.name == "counts"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "no_such_module_xyz:plugin",
            "plugin 'p' (entry point 'no_such_module_xyz:plugin' of ? ?) "
            "failed to load: ModuleNotFoundError",
        ),
        ("fake_plugins:missing", "failed to load: AttributeError"),
        ("fake_plugins:not_a_plugin", "is a int, not an enhydra.plugins.Plugin"),
    ],
)
def test_a_broken_plugin_is_an_error_naming_it(
    plugin_module: str, value: str, message: str
) -> None:
    with pytest.raises(PluginError) as raised:
        load_plugins([ep("p", value)])
    assert message in str(raised.value)


def test_a_projection_named_like_the_aggregate_is_refused(plugin_module: str) -> None:
    clash = load_plugins([ep("clash", f"{plugin_module}:clash")])
    with pytest.raises(PluginError, match="projection 'accounts' of plugin 'clash'"):
        Service("bank", accounts).resolved(plugins=clash)


def test_services_declare_projections_in_code() -> None:
    own = Projection("event-counts", count)
    service = Service(
        "bank",
        Aggregate("accounts", decide=accounts.decide, apply=accounts.apply),
        projections=[own],
    )
    assert service.resolved(plugins=[]).projections == ((own, None),)
