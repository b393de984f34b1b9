"""Property tests of the pure assignor over random clusters (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from enhydra.assignment import Assignment, AssignmentConfig, ClientState, assign
from enhydra.assignment.assignor import NO_STATE

ZONES = ["a", "b", "c"]


@st.composite
def clusters(draw, max_clients: int = 6, max_tasks: int = 12):
    tasks = list(range(draw(st.integers(1, max_tasks))))
    n = draw(st.integers(1, max_clients))
    clients = []
    owners = {t: draw(st.one_of(st.none(), st.integers(0, n - 1))) for t in tasks}
    for i in range(n):
        lags = {}
        for t in tasks:
            kind = draw(st.sampled_from(["none", "small", "large"]))
            if kind == "small":
                lags[t] = draw(st.integers(0, 100))
            elif kind == "large":
                lags[t] = draw(st.integers(101, 10**7))
        prev_active = frozenset(t for t, o in owners.items() if o == i)
        for t in prev_active:
            lags[t] = 0
        clients.append(
            ClientState(
                client_id=f"c{i}",
                tags={"zone": draw(st.sampled_from(ZONES))},
                previous_active=prev_active,
                previous_standby=frozenset(
                    t for t in tasks if t in lags and t not in prev_active and lags[t] <= 100
                ),
                lags=lags,
            )
        )
    config = AssignmentConfig(
        num_standby_replicas=draw(st.integers(0, 3)),
        acceptable_recovery_lag=100,
        max_warmup_replicas=draw(st.integers(1, 3)),
        rack_aware_assignment_tags=("zone",),
    )
    return tasks, clients, config


def counts(result: Assignment) -> dict[str, int]:
    return {cid: len(a.active) for cid, a in result.clients.items()}


@settings(max_examples=400, deadline=None)
@given(clusters())
def test_structural_invariants(cluster) -> None:
    tasks, clients, config = cluster
    result = assign(tasks, clients, config)
    wanted_standbys = min(config.num_standby_replicas, len(clients) - 1)
    warmups = 0
    for task in tasks:
        actives = [c for c, a in result.clients.items() if task in a.active]
        assert len(actives) == 1, f"task {task} has actives {actives}"
        standbys = [c for c, a in result.clients.items() if task in a.standby]
        assert len(standbys) == wanted_standbys
    for assigned in result.clients.values():
        # no instance holds two copies of a task
        assert not (assigned.active & assigned.standby)
        assert not (assigned.active & assigned.warmup)
        assert not (assigned.standby & assigned.warmup)
        warmups += len(assigned.warmup)
    assert warmups <= config.max_warmup_replicas


@settings(max_examples=400, deadline=None)
@given(clusters())
def test_caught_up_clients_are_preferred(cluster) -> None:
    tasks, clients, config = cluster
    result = assign(tasks, clients, config)
    by_id = {c.client_id: c for c in clients}
    for task in tasks:
        owner = result.active_owner(task)
        caught_up = [c for c in clients if c.lag(task) <= config.acceptable_recovery_lag]
        if caught_up:
            assert by_id[owner].lag(task) <= config.acceptable_recovery_lag
        else:
            assert by_id[owner].lag(task) == min(c.lag(task) for c in clients)


@settings(max_examples=300, deadline=None)
@given(clusters(), st.booleans())
def test_balanced_within_one_when_every_client_is_eligible(cluster, all_caught_up) -> None:
    tasks, clients, config = cluster
    lag = 0 if all_caught_up else NO_STATE
    clients = [
        ClientState(
            c.client_id,
            c.tags,
            c.previous_active,
            frozenset(),
            {t: (0 if t in c.previous_active else lag) for t in tasks},
        )
        for c in clients
    ]
    if not all_caught_up:
        clients = [ClientState(c.client_id, c.tags) for c in clients]
    load = counts(assign(tasks, clients, config))
    assert max(load.values()) - min(load.values()) <= 1


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_standbys_spread_over_zones_as_far_as_clients_allow(cluster) -> None:
    tasks, clients, config = cluster
    result = assign(tasks, clients, config)
    zone = {c.client_id: c.tags["zone"] for c in clients}
    zones_available = len(set(zone.values()))
    for task in tasks:
        holders = [c for c, a in result.clients.items() if task in a.active | a.standby]
        assert len({zone[c] for c in holders}) == min(len(holders), zones_available)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_an_unchanged_caught_up_group_keeps_its_assignment(cluster) -> None:
    tasks, clients, config = cluster
    first = assign(tasks, clients, config)
    assume(not first.probing_rebalance_needed)
    # Everyone now holds exactly what it was given, fully caught up.
    again = [
        ClientState(
            c.client_id,
            c.tags,
            first.clients[c.client_id].active,
            first.clients[c.client_id].standby,
            {t: 0 for t in first.clients[c.client_id].copies()},
        )
        for c in clients
    ]
    assert assign(tasks, again, config) == first


def test_scale_out_warms_up_before_moving() -> None:
    """1 -> 2 instances: nothing moves until the newcomer has caught up; then half moves."""
    tasks = list(range(4))
    config = AssignmentConfig(
        num_standby_replicas=0, acceptable_recovery_lag=100, max_warmup_replicas=2
    )
    old = ClientState("a", previous_active=frozenset(tasks), lags=dict.fromkeys(tasks, 0))
    new = ClientState("b")
    first = assign(tasks, [old, new], config)
    assert first.clients["a"].active == frozenset(tasks)
    assert len(first.clients["b"].warmup) == 2 and first.probing_rebalance_needed

    # The warm-ups caught up (lag within 100): the probing rebalance moves those two tasks.
    warmed = first.clients["b"].warmup
    new = ClientState("b", previous_standby=warmed, lags=dict.fromkeys(warmed, 40))
    old = ClientState("a", previous_active=frozenset(tasks), lags=dict.fromkeys(tasks, 0))
    second = assign(tasks, [old, new], config)
    assert second.clients["b"].active == warmed
    assert not second.probing_rebalance_needed


def test_a_lost_active_goes_to_its_caught_up_standby() -> None:
    config = AssignmentConfig(num_standby_replicas=1, acceptable_recovery_lag=100)
    survivor = ClientState(
        "b", previous_active=frozenset({1}), previous_standby=frozenset({0}), lags={0: 5, 1: 0}
    )
    fresh = ClientState("c")
    result = assign([0, 1], [survivor, fresh], config)
    assert result.clients["b"].active == frozenset({0, 1}) or result.active_owner(0) == "b"
    assert result.active_owner(0) == "b"


def test_standbys_go_to_the_other_zone() -> None:
    clients = [ClientState(f"{z}{i}", tags={"zone": z}) for z, i in itertools.product("ab", "12")]
    config = AssignmentConfig(num_standby_replicas=1, rack_aware_assignment_tags=("zone",))
    result = assign(range(8), clients, config)
    zone = {c.client_id: c.tags["zone"] for c in clients}
    for task in range(8):
        owner = result.active_owner(task)
        (standby,) = [c for c, a in result.clients.items() if task in a.standby]
        assert zone[standby] != zone[owner]


@pytest.mark.parametrize(
    ("instances", "tasks", "standbys"),
    [(4, 8, 1), (3, 6, 1), (6, 12, 1), (4, 12, 2), (5, 8, 1), (3, 4, 1)],
)
def test_instances_started_one_by_one_end_up_sharing_the_copies(
    instances: int, tasks: int, standbys: int
) -> None:
    """A rolling start: each new instance joins a group whose copies are all caught up.

    Sticky placement alone left the late joiners with no standbys at all (4 instances, 8
    partitions, 1 standby: 4, 4, 0, 0); every instance must end with its share, give or take
    one copy for each of the instance's own actives that excludes it from a task.
    """
    config = AssignmentConfig(
        num_standby_replicas=standbys, acceptable_recovery_lag=100, max_warmup_replicas=2
    )
    held: dict[str, tuple[frozenset[int], frozenset[int]]] = {}
    for joined in range(1, instances + 1):
        for _ in range(20):  # probing rebalances, copies caught up in between, until stable
            clients = [
                ClientState(
                    cid,
                    previous_active=held.get(cid, (frozenset(), frozenset()))[0],
                    previous_standby=held.get(cid, (frozenset(), frozenset()))[1],
                    lags=dict.fromkeys(frozenset().union(*held.get(cid, ())), 0),
                )
                for cid in (f"i{n}" for n in range(1, joined + 1))
            ]
            result = assign(range(tasks), clients, config)
            held = {c: (a.active, a.standby | a.warmup) for c, a in result.clients.items()}
            if not result.probing_rebalance_needed:
                break
    actives = counts(result)
    copies = {c: len(a.standby) for c, a in result.clients.items()}
    assert max(actives.values()) - min(actives.values()) <= 1
    assert sum(copies.values()) == tasks * standbys
    assert max(copies.values()) - min(copies.values()) <= 2, copies
