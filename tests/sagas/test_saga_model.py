"""Sagas' pure part and the Driver: correlation, dedup, deadlines that fire exactly once."""

from __future__ import annotations

import dataclasses

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enhydra import Aggregate, Service
from enhydra.processing.core import InputRecord
from enhydra.sagas import Cancel, Deadline, Emit, Saga, Upstream
from enhydra.sagas.model import TIMERS, NotACorrelationId, due_index, saga_batch
from enhydra.testing.driver import Driver, MemoryStore
from tests.sagas.checkout_service import apply, checkout_saga, decide


def shop(payments: str | None = "payments") -> Driver:
    saga = checkout_saga("shop", payments)
    return Driver(Service("shop", Aggregate("orders", decide, apply), sagas=[saga]))


def place(driver: Driver, order: str) -> None:
    driver.send(order, {"type": "place", "order": order, "amount": 5, "command_id": order})
    driver.feed_saga("checkout", "shop", order, {"type": "placed", "order": order})


def test_unpaid_order_is_cancelled_once_when_its_deadline_fires():
    driver = shop()
    place(driver, "o1")
    assert driver.deadlines("checkout", "o1") == {"unpaid": 900.0}
    assert driver.advance(899) == []
    [outcome] = driver.advance(1)
    assert outcome.accepted and driver.state("o1") == {"status": "cancelled", "cancels": 1}
    assert driver.deadlines("checkout", "o1") == {}
    assert driver.advance(10_000) == []


def test_payment_from_another_service_cancels_the_deadline():
    driver = shop()
    place(driver, "o1")
    driver.feed_saga("checkout", "payments", "p-77", {"type": "captured", "order": "o1"})
    assert driver.deadlines("checkout", "o1") == {}
    assert driver.advance(3600) == []
    assert driver.state("o1")["status"] == "placed"
    assert driver.saga_state("checkout", "o1") == {"placed": True, "paid": True}


def test_redelivered_upstream_event_is_handled_once():
    driver = shop()
    place(driver, "o1")
    driver.advance(100)
    # the same upstream event again (offset 0): same message id, skipped; the deadline stays
    driver.feed_saga("checkout", "shop", "o1", {"type": "placed", "order": "o1"}, offset=0)
    assert driver.deadlines("checkout", "o1") == {"unpaid": 900.0}


def test_ended_saga_ignores_later_events_and_keeps_no_deadline():
    driver = shop()
    place(driver, "o1")
    driver.advance(900)
    driver.feed_saga("checkout", "shop", "o1", {"type": "cancelled", "order": "o1"})
    assert driver.saga_state("checkout", "o1") is None
    driver.feed_saga("checkout", "shop", "o1", {"type": "placed", "order": "o1"})
    assert driver.deadlines("checkout", "o1") == {}


def test_events_not_for_the_saga_and_bad_correlation_ids():
    driver = shop()
    driver.feed_saga("checkout", "shop", "x", {"type": "noted"})  # no order: None, ignored
    assert driver.saga_stores["checkout"].data == {}
    bad = Saga("bad", ["shop"], lambda up: 42, lambda s, up: (s, [], []))
    with pytest.raises(NotACorrelationId, match="must return a non-empty str or None"):
        Driver(Service("shop", Aggregate("orders", decide, apply), sagas=[bad])).feed_saga(
            "bad", "shop", "k", {"type": "x"}
        )
    with pytest.raises(KeyError, match="does not read 'stock'"):
        driver.feed_saga("checkout", "stock", "k", {"type": "x"})


def test_declaration_errors_are_plain():
    def noop(state, up):
        return state, [], []

    with pytest.raises(ValueError, match="saga name"):
        Saga("a b", ["x"], str, noop)
    with pytest.raises(TypeError, match="list of app ids"):
        Saga("a", "orders", str, noop)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one upstream"):
        Saga("a", [], str, noop)


class Placed(msgspec.Struct, tag="placed"):
    order: str


def test_typed_sources_give_handle_structs():
    seen = []

    def handle(state, up: Upstream):
        seen.append(up.event)
        return state, [], []

    saga = Saga("typed", {"shop": [Placed]}, lambda up: up.event.order, handle)
    driver = Driver(Service("shop", Aggregate("orders", decide, apply), sagas=[saga]))
    driver.feed_saga("typed", "shop", "o1", {"type": "placed", "order": "o1"})
    driver.feed_saga("typed", "shop", "o1", {"type": "paid", "order": "o1"})  # not read
    assert seen == [Placed("o1")]


def test_a_deadline_set_again_after_firing_makes_a_new_command_id():
    def handle(state, up):
        reminder = Emit("o1", {"type": "cancel", "order": "o1"}, topic="mail-commands")
        return {}, [], [Deadline("remind", 10, reminder)]

    saga = Saga("remind", ["shop"], lambda up: "o1", handle, sends_to=["mail-commands"])
    driver = Driver(Service("shop", Aggregate("orders", decide, apply), sagas=[saga]))
    driver.feed_saga("remind", "shop", "o1", {"type": "placed"})
    driver.advance(10)
    driver.feed_saga("remind", "shop", "o1", {"type": "placed"})
    driver.advance(5)
    assert len(driver.sent["mail-commands"]) == 1  # the second is not due yet
    driver.advance(5)
    ids = [command["command_id"] for _, command in driver.sent["mail-commands"]]
    assert ids == ["remind:o1:deadline:remind:1", "remind:o1:deadline:remind:2"]


def message(offset: int, key: str, event: dict, upstream_offset: int) -> InputRecord:
    body = {
        "type": "saga-message",
        "source": "shop",
        "key": key,
        "event": event,
        "position": ["shop-events", 0, upstream_offset, 0],
        "offset": upstream_offset,
        "command_id": f"fwd:shop-events:0:{upstream_offset}:0:0",
    }
    return InputRecord(offset, key.encode(), orjson.dumps(body))


def run(saga: Saga, store: MemoryStore, records, now: float, *, persist: bool = True):
    result = saga_batch(
        saga,
        records,
        load=store.get,
        due=lambda ms: due_index(store.items(TIMERS), ms),
        now=now,
        commands_topic="shop-commands",
        partitions_of=lambda topic: 4,
    )
    if persist:
        store.write(result.puts.items())
    return result


def ids_of(result) -> list[str]:
    return [orjson.loads(v)["command_id"] for out in result.outputs.values() for _, v, _ in out]


def test_a_batch_computed_again_after_a_crash_sends_the_same_command_ids():
    saga = checkout_saga("shop")
    store = MemoryStore()
    run(saga, store, [message(0, "o1", {"type": "placed", "order": "o1"}, 7)], now=0)
    first = run(saga, store, [], now=900, persist=False)  # crash before the store was written
    again = run(saga, store, [], now=901)
    assert ids_of(first) == ids_of(again) == ["checkout:o1:deadline:unpaid:1"]
    assert ids_of(run(saga, store, [], now=2000)) == []
    # the inbox record read again (the saga crashed before committing): skipped by its offset
    redo = run(saga, store, [message(0, "o1", {"type": "placed", "order": "o1"}, 7)], now=2000)
    assert redo.counts == {"duplicates": 1} and ids_of(redo) == []


def test_a_due_deadline_fires_before_an_event_of_the_same_turn_can_cancel_it():
    # So a command sent just before a crash is sent again first, whatever the inbox holds.
    saga = checkout_saga("shop")
    store = MemoryStore()
    run(saga, store, [message(0, "o1", {"type": "placed", "order": "o1"}, 1)], now=0)
    late = run(saga, store, [message(1, "o1", {"type": "paid", "order": "o1"}, 2)], now=5000)
    assert ids_of(late) == ["checkout:o1:deadline:unpaid:1"]
    assert late.counts.get("cancelled") is None
    assert [k for k in store.data if k.startswith(b"t:")] == []


# A random run against a model: which deadlines fire, once each, around crashes.
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("set"), st.sampled_from("abc"), st.sampled_from("xy"), st.integers(0, 50)
        ),
        st.tuples(st.just("cancel"), st.sampled_from("abc"), st.sampled_from("xy")),
        st.tuples(st.just("end"), st.sampled_from("abc")),
        st.tuples(st.just("wait"), st.integers(0, 40)),
        st.tuples(st.just("crash"), st.integers(0, 40)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_deadlines_fire_exactly_once_as_a_model_says(script):
    def handle(state, up):
        op = up.event
        if op["op"] == "set":
            cmd = Emit(up.event["key"], {"type": "cancel", "order": op["key"]})
            return {}, [], [Deadline(op["id"], op["after"], cmd)]
        if op["op"] == "cancel":
            return {}, [], [Cancel(op["id"])]
        return None, [], []

    saga = Saga("m", ["shop"], lambda up: up.event["key"], handle)
    store = MemoryStore()
    now, offset = 0.0, 0
    pending: dict[tuple[str, str], tuple[float, int]] = {}  # model: (key, id) -> (due, seq)
    seqs: dict[str, int] = {}
    ended: set[str] = set()
    expected: set[str] = set()
    fired: list[str] = []

    def model_fire(until: float) -> None:
        for (key, did), (due, seq) in list(pending.items()):
            if due <= until:
                expected.add(f"m:{key}:deadline:{did}:{seq}")
                del pending[(key, did)]

    for op in [*script, ("wait", 0)]:
        model_fire(now)
        if op[0] in ("wait", "crash"):
            now += op[1]
            result = run(saga, store, [], now, persist=op[0] == "wait")
            fired += ids_of(result)
            if op[0] == "wait":
                model_fire(now)
            continue
        model_fire(now)
        key = op[1]
        event = {"op": op[0], "key": key}
        if op[0] != "end":
            event["id"] = op[2]
        if op[0] == "set":
            event["after"] = op[3]
        result = run(saga, store, [message(offset, key, event, offset)], now)
        offset += 1
        fired += ids_of(result)
        if key in ended:
            continue
        if op[0] == "set":
            seqs[key] = seqs.get(key, 0) + 1
            pending[(key, op[2])] = (now + op[3], seqs[key])
        elif op[0] == "cancel":
            pending.pop((key, op[2]), None)
        else:
            ended.add(key)
            for k in [k for k in pending if k[0] == key]:
                del pending[k]
    assert set(fired) == expected  # every due deadline fired, no cancelled one did
    assert len(fired) - len(set(fired)) <= sum(op[0] == "crash" for op in script) * 6


def test_a_payment_seen_before_its_order_schedules_no_deadline():
    driver = shop()
    driver.feed_saga("checkout", "payments", "p-1", {"type": "captured", "order": "o1"})
    place(driver, "o1")
    assert driver.deadlines("checkout", "o1") == {} and driver.advance(1000) == []


def test_an_ended_sagas_entry_goes_after_its_retention_and_the_id_may_start_again():
    """An ended saga keeps its entry (so a late event of its id is ignored) for
    `ended_retention_s`, then a timer of the index removes it: the store does not grow by one
    entry per saga ever run."""
    driver = shop()
    place(driver, "o1")
    driver.feed_saga("checkout", "shop", "o1", {"type": "cancelled", "order": "o1"})
    store = driver.saga_stores["checkout"]
    assert store.get(b"s:o1") is not None  # ended, kept
    assert driver.advance(7 * 86400 - 1) == []
    driver.feed_saga("checkout", "shop", "o1", {"type": "placed", "order": "o1"})
    assert driver.deadlines("checkout", "o1") == {}  # still ended: ignored
    assert driver.advance(1) == []  # the removal sends nothing
    assert store.get(b"s:o1") is None
    assert [k for k, _ in store.items(TIMERS) if k.startswith(TIMERS)] == []
    driver.feed_saga("checkout", "shop", "o1", {"type": "placed", "order": "o1"})
    # a new saga of that id (due times are the driver's clock, in seconds)
    assert driver.deadlines("checkout", "o1") == {"unpaid": 7 * 86400 + 900.0}


def test_ended_sagas_kept_for_good_when_asked():
    saga = dataclasses.replace(checkout_saga("shop"), ended_retention_s=None)
    driver = Driver(Service("shop", Aggregate("orders", decide, apply), sagas=[saga]))
    place(driver, "o1")
    driver.feed_saga("checkout", "shop", "o1", {"type": "cancelled", "order": "o1"})
    driver.advance(10 * 365 * 86400)
    assert driver.saga_stores["checkout"].get(b"s:o1") is not None


@pytest.mark.parametrize("keep", [-1, float("inf"), "1d", 11 * 366 * 86400])
def test_a_bad_retention_is_refused_naming_the_setting(keep):
    with pytest.raises(ValueError, match="ended_retention_s"):
        Saga("checkout", ["shop"], lambda u: None, lambda s, u: (s, [], []), ended_retention_s=keep)


def test_a_deadline_id_may_not_hold_nul():
    """A NUL would make a deadline's timer look like an ended entry's removal (id "")."""
    saga = Saga(
        "s",
        ["shop"],
        lambda u: u.event["order"],
        lambda s, u: ({}, [], [Deadline("x\0", 1, Emit("o", {"type": "cancel"}))]),
    )
    record = message(0, "o1", {"type": "placed", "order": "o1"}, 0)
    result = saga_batch(
        saga,
        [record],
        load=lambda k: None,
        due=lambda ms: (),
        now=0,
        commands_topic="c",
        partitions_of=lambda t: 1,
    )
    assert [f.error for f in result.failures if "NUL" in str(f.error)], result.failures
