"""Deadlines that cannot hold up a task: bounded turns, bad deadlines dead-lettered, the due
check answered from memory (TimerIndex over a real RocksDB store)."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from enhydra import Aggregate, Service
from enhydra.reactions.engine import UnknownTarget
from enhydra.reactions.model import command_id, event_version
from enhydra.sagas import Deadline, Emit, Saga, Upstream
from enhydra.sagas.engine import TimerIndex
from enhydra.sagas.model import TIMERS, DeadlineFailed, pending_deadlines, saga_batch
from enhydra.stores.partition import PartitionStore
from enhydra.testing.driver import Driver, MemoryStore
from tests.sagas.checkout_service import apply, checkout_saga, decide
from tests.sagas.seeks import Seeks
from tests.sagas.test_saga_model import ids_of, message


def run(saga: Saga, store, records, now: float, index: TimerIndex | None = None, **options):
    def due(ms):
        if index is not None:
            return index.timers(store, ms)
        return ((k, v) for k, v in store.items(TIMERS) if k.startswith(TIMERS))

    options.setdefault("partitions_of", lambda topic: 4)
    result = saga_batch(
        saga,
        records,
        load=store.get,
        due=lambda ms: (t for t in due(ms) if int.from_bytes(t[0][2:10], "big") <= ms),
        now=now,
        commands_topic="shop-commands",
        **options,
    )
    store.write(result.puts.items())
    if index is not None:
        index.changed(result)
    return result


def placed(orders: range, first_offset: int = 0) -> list:
    return [
        message(first_offset + i, f"o{n}", {"type": "placed", "order": f"o{n}"}, n)
        for i, n in enumerate(orders)
    ]


def test_a_turn_fires_at_most_max_fired_deadlines_and_the_rest_on_the_next_turns():
    saga, store = checkout_saga("shop"), MemoryStore()
    run(saga, store, placed(range(5)), now=0)
    turns = [ids_of(run(saga, store, [], now=1000, max_fired=2)) for _ in range(4)]
    assert [len(fired) for fired in turns] == [2, 2, 1, 0]
    fired = sorted(i for ids in turns for i in ids)
    assert fired == [f"checkout:o{n}:deadline:unpaid:1" for n in range(5)]


def test_a_deadline_too_far_or_not_finite_is_a_failure_of_its_record_not_a_crash():
    def handle(state, upstream):
        after = {"o1": float("inf"), "o2": 1e17, "o3": float("nan")}[upstream.key]
        return {}, [], [Deadline("d", after, Emit("x", {"type": "cancel"}))]

    saga = Saga("far", ["shop"], lambda u: u.key, handle)
    store = MemoryStore()
    result = run(saga, store, [message(n, f"o{n + 1}", {"type": "placed"}, n) for n in range(3)], 0)
    assert [type(f.error) for f in result.failures] == [ValueError] * 3
    assert "finite number of seconds" in str(result.failures[0].error)
    assert list(store.items(TIMERS)) == []


def test_a_due_deadline_whose_command_cannot_be_sent_is_dead_lettered_and_removed():
    def handle(state, upstream):
        return {}, [], [Deadline("pay", 5, Emit("p1", {"type": "refund"}, topic="pay-commands"))]

    saga = Saga("refund", ["shop"], lambda u: u.key, handle, sends_to=["pay-commands"])
    store = MemoryStore()
    run(saga, store, [message(0, "o1", {"type": "placed"}, 0)], now=0)

    def removed(topic: str) -> int:  # a later version no longer sends to pay-commands
        if topic != "shop-commands":
            raise UnknownTarget(f"saga 'refund' wrote to {topic!r}: list it in sends_to")
        return 4

    result = run(saga, store, [], now=10, partitions_of=removed)
    [failure] = result.failures
    assert isinstance(failure.error, DeadlineFailed) and "'o1' deadline 'pay'" in str(failure.error)
    origin = orjson.loads(failure.record.value)
    assert (origin["saga"], origin["key"], origin["deadline"]) == ("refund", "o1", "pay")
    assert failure.record.key == b"o1" and result.outputs == {}
    assert list(store.items(TIMERS)) == [] and pending_deadlines(store.get(b"s:o1")) == {}
    assert run(saga, store, [], now=20, partitions_of=removed).failures == []  # not again


def test_a_saga_with_its_own_command_id_field_reads_its_inbox():
    saga = dataclasses.replace(checkout_saga("shop"), command_id_field="request_id")
    driver = Driver(Service("shop", Aggregate("orders", decide, apply), sagas=[saga]))
    driver.feed_saga("checkout", "shop", "o1", {"type": "placed", "order": "o1"})
    assert driver.saga_state("checkout", "o1") == {"placed": True}
    assert driver.deadlines("checkout", "o1") == {"unpaid": 900.0}


def test_sources_with_dots_get_distinct_valid_forwarder_names():
    saga = Saga("x", ["shop.orders", "shop_orders", "shop"], lambda u: None, lambda s, u: s)
    names = [f.name for f in saga.forwarders()]
    assert len(set(names)) == 3 and names[2] == "x-from-shop"
    assert names[1] == "x-from-shop_orders" and names[0].startswith("x-from-shop_orders-")


def test_handle_sees_the_upstream_headers_and_the_event_version():
    seen: list[Upstream] = []

    def handle(state, upstream):
        seen.append(upstream)
        return {}, [], []

    saga = Saga("v", ["shop"], lambda u: u.key, handle)
    driver = Driver(Service("shop", Aggregate("orders", decide, apply), sagas=[saga]))
    driver.feed_saga(
        "v", "shop", "o1", {"type": "placed"}, headers=[("enhydra.event_version", b"3")]
    )
    assert event_version(seen[0].headers) == 3


def test_a_sagas_command_ids_are_the_reactions_ids():
    saga, store = checkout_saga("shop"), MemoryStore()
    sent = []

    def handle(state, upstream):
        sent.append(upstream.position)
        return {}, [Emit("o1", {"type": "pay", "order": "o1"})], []

    saga = Saga("checkout", ["shop"], lambda u: u.key, handle)
    result = run(saga, store, [message(0, "o1", {"type": "placed"}, 7)], now=0)
    assert ids_of(result) == [command_id("checkout", sent[0], 0)]


# the timer index ---------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path):
    store = PartitionStore(tmp_path / "p0")
    yield store
    store.close()


def test_the_due_check_reads_nothing_until_a_deadline_is_due(store):
    saga, index, seeks = checkout_saga("shop"), TimerIndex(), Seeks(store)
    run(saga, store, placed(range(50)), now=0, index=index)
    run(saga, store, [], now=1000, index=index)  # all 50 fired: 50 tombstones
    run(saga, store, placed(range(50, 53), 50), now=2000, index=index)
    seeks.read = 0
    assert not index.due(seeks, 2000_000) and seeks.read == 0  # answered from memory
    assert index.due(seeks, 2900_000) and seeks.read == 1  # one entry: the first pending
    assert index.pending == 3


def test_the_index_follows_schedules_fires_and_cancels_and_a_rebuild_agrees(store):
    saga, index = checkout_saga("shop", "payments"), TimerIndex()
    run(saga, store, placed(range(10)), now=0, index=index)
    paid = [
        message(10 + i, f"o{n}", {"type": "captured", "order": f"o{n}"}, 100 + n)
        for i, n in enumerate((1, 3, 5))
    ]
    run(saga, store, paid, now=10, index=index)
    assert index.pending == 7
    run(saga, store, [], now=1000, index=index, max_fired=4)
    assert index.pending == 3 and index.due(store, 1000_000)
    rebuilt = TimerIndex()
    assert rebuilt.due(store, 1000_000) and rebuilt.pending == index.pending == 3
    run(saga, store, [], now=1000, index=index)
    assert index.pending == 0 and not index.due(store, 10**12)
    index.clear()  # the runner clears it when the store may have changed (a restore)
    assert not index.due(store, 10**12) and index.pending == 0


def test_a_status_read_while_a_batch_is_in_flight_loses_none_of_its_timers(store):
    # The status page may ask while a batch's timers are counted but not yet in the store.
    saga, index = checkout_saga("shop"), TimerIndex()
    assert not index.due(store, 0)
    result = saga_batch(
        saga,
        placed(range(1)),
        load=store.get,
        due=lambda ms: index.timers(store, ms),
        now=0,
        commands_topic="shop-commands",
        partitions_of=lambda topic: 4,
    )
    index.changed(result)
    assert index.peek(store) is None and index.pending == 1  # not written yet
    store.write(result.puts.items())  # the flight lands
    assert index.due(store, 900_000)


def test_an_ended_entrys_removal_is_due_but_no_pending_deadline(store):
    """The status and /metrics count deadlines: an ended saga's removal timer is not one, but
    the task still gets its turn when it is due; a rebuilt index agrees."""
    saga, index = checkout_saga("shop"), TimerIndex()
    run(saga, store, placed(range(3)), now=0, index=index)
    ended = [
        message(3 + i, f"o{n}", {"type": "cancelled", "order": f"o{n}"}, 10 + n)
        for i, n in enumerate((0, 1))
    ]
    run(saga, store, ended, now=10, index=index)
    assert index.pending == 1  # o2's deadline; o0 and o1 wait for their removal
    assert index.next_deadline(store) == 900_000  # o2's, not a removal
    rebuilt = TimerIndex()
    assert not rebuilt.due(store, 899_999) and rebuilt.pending == 1
    run(saga, store, [], now=900, index=index)  # o2's deadline fires
    assert index.pending == 0 and index.next_deadline(store) is None
    week = 10 + 7 * 86400
    assert not index.due(store, week * 1000 - 1) and index.due(store, week * 1000)
    result = run(saga, store, [], now=week, index=index)
    assert result.counts == {"forgotten": 2} and not result.outputs
    assert store.get(b"s:o0") is None and store.get(b"s:o1") is None
    assert store.get(b"s:o2") is not None  # cancelled by its deadline, not ended
    assert not index.due(store, 10**13)
