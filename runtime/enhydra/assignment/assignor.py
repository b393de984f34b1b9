"""Task assignment as a pure function: who runs each task, who keeps copies, who warms up.

The semantics follow Kafka Streams' high-availability assignor (KIP-441) and its client-tag
aware standby placement (KIP-708):

1. Every task gets one active. It stays with its previous owner when that owner is caught up;
   otherwise it goes to a caught-up client (lag <= acceptable_recovery_lag), the least loaded
   first; with no caught-up client at all, to the client with the least lag.
2. Actives are then balanced, so no client runs more than one task more than another. A task
   only moves to a client that is caught up on it. When balance wants it on a client that is not,
   the task stays where it is, the destination is recorded, and that client keeps a copy that
   catches up: a standby if it already is one, otherwise a warm-up replica (at most
   max_warmup_replicas in the whole group). A probing rebalance later moves the task once the
   copy is caught up, so processing never waits for a restore.
3. Each task gets min(num_standby_replicas, clients - 1) standbys on clients other than its
   active, chosen to spread the values of the rack-aware tags as widely as the clients allow,
   then among clients below their fair share of copies (actives and standbys), the least
   loaded, a client that already holds the state counting one copy less: copies stay where
   they are unless that leaves another client two behind, so instances started one by one
   end up sharing the standbys instead of the first ones keeping them all.

No client holds two copies (active, standby, warm-up) of one task. The same input always gives
the same output, and an unchanged caught-up group keeps its assignment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

NO_STATE = 2**62  # lag of a client that has no local copy of a task at all


@dataclass(frozen=True)
class ClientState:
    """What a client (instance) reports when it joins."""

    client_id: str
    tags: Mapping[str, str] = field(default_factory=dict)
    previous_active: frozenset[int] = frozenset()
    previous_standby: frozenset[int] = frozenset()
    lags: Mapping[int, int] = field(default_factory=dict)  # task -> changelog lag of local copy

    def lag(self, task: int) -> int:
        if task in self.previous_active and task not in self.lags:
            return 0
        return self.lags.get(task, NO_STATE)


@dataclass(frozen=True)
class AssignmentConfig:
    num_standby_replicas: int = 1
    acceptable_recovery_lag: int = 10_000
    max_warmup_replicas: int = 2
    rack_aware_assignment_tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_standby_replicas < 0:
            raise ValueError("num_standby_replicas must be 0 or more")
        if self.acceptable_recovery_lag < 0:
            raise ValueError("acceptable_recovery_lag must be 0 or more")
        if self.max_warmup_replicas < 1:
            # With none, a task could never move to a client that lacks its state.
            raise ValueError("max_warmup_replicas must be 1 or more")


@dataclass(frozen=True)
class ClientAssignment:
    active: frozenset[int] = frozenset()
    standby: frozenset[int] = frozenset()
    warmup: frozenset[int] = frozenset()

    def copies(self) -> frozenset[int]:
        return self.active | self.standby | self.warmup


@dataclass(frozen=True)
class Assignment:
    clients: Mapping[str, ClientAssignment]
    # task -> client that balance wants it on, once that client is caught up
    pending_moves: Mapping[int, str] = field(default_factory=dict)

    @property
    def probing_rebalance_needed(self) -> bool:
        """True while some task waits for a copy to catch up before it moves."""
        return bool(self.pending_moves)

    def active_owner(self, task: int) -> str | None:
        for client_id, assigned in self.clients.items():
            if task in assigned.active:
                return client_id
        return None


def assign(
    tasks: Sequence[int], clients: Sequence[ClientState], config: AssignmentConfig
) -> Assignment:
    """Assign every task; see the module docstring for the rules."""
    if not clients:
        return Assignment({})
    by_id = {c.client_id: c for c in sorted(clients, key=lambda c: c.client_id)}
    ids = list(by_id)
    tasks = sorted(set(tasks))

    def lag(client_id: str, task: int) -> int:
        return by_id[client_id].lag(task)

    def caught_up(client_id: str, task: int) -> bool:
        return lag(client_id, task) <= config.acceptable_recovery_lag

    active = _initial_actives(tasks, ids, by_id, lag, caught_up)
    pending = _balance(tasks, ids, active, lag, caught_up)
    standby = _standbys(tasks, ids, by_id, active, pending, lag, config)
    warmup = _warmups(ids, active, standby, pending, lag, config)
    # A pending move whose destination got no copy to warm cannot happen: forget it.
    pending = {t: dest for t, dest in pending.items() if t in standby[dest] or t in warmup[dest]}
    result = {
        cid: ClientAssignment(
            active=frozenset(t for t, owner in active.items() if owner == cid),
            standby=frozenset(standby[cid]),
            warmup=frozenset(warmup[cid]),
        )
        for cid in ids
    }
    return Assignment(result, pending)


def _previous_owner(task: int, ids: list[str], by_id: Mapping[str, ClientState]) -> str | None:
    owners = [cid for cid in ids if task in by_id[cid].previous_active]
    return owners[0] if len(owners) == 1 else None


def _initial_actives(tasks, ids, by_id, lag, caught_up) -> dict[int, str]:
    active: dict[int, str] = {}
    load = dict.fromkeys(ids, 0)
    for task in tasks:
        previous = _previous_owner(task, ids, by_id)
        if previous is not None and caught_up(previous, task):
            owner = previous
        else:
            ready = [cid for cid in ids if caught_up(cid, task)]
            if ready:
                owner = min(ready, key=lambda c: (load[c], lag(c, task), c))
            else:
                owner = min(ids, key=lambda c: (lag(c, task), load[c], c))
        active[task] = owner
        load[owner] += 1
    return active


def _balance(tasks, ids, active, lag, caught_up) -> dict[int, str]:
    """Even out active counts; moves to clients not caught up become pending moves."""
    planned = dict(active)  # where each task will be once pending moves complete
    pending: dict[int, str] = {}
    load = {cid: 0 for cid in ids}
    for owner in planned.values():
        load[owner] += 1
    while True:
        busiest = max(ids, key=lambda c: (load[c], c))
        idlest = min(ids, key=lambda c: (load[c], c))
        if load[busiest] - load[idlest] <= 1:
            return pending
        movable = [t for t in tasks if planned[t] == busiest]
        # Prefer a task the receiver can take over now, then the one it is closest to having.
        task = min(movable, key=lambda t: (not caught_up(idlest, t), lag(idlest, t), -t))
        planned[task] = idlest
        if caught_up(idlest, task):
            active[task] = idlest
            pending.pop(task, None)
        else:
            pending[task] = idlest
        load[busiest] -= 1
        load[idlest] += 1


def _tag_spread(candidate: ClientState, used: Mapping[str, set[str]], keys) -> int:
    """How many rack-aware tag keys would gain a value not yet used by this task's copies."""
    return sum(1 for key in keys if candidate.tags.get(key) not in used[key])


def _standbys(tasks, ids, by_id, active, pending, lag, config) -> dict[str, set[int]]:
    standby: dict[str, set[int]] = {cid: set() for cid in ids}
    wanted = min(config.num_standby_replicas, len(ids) - 1)
    keys = config.rack_aware_assignment_tags
    share = -(-len(tasks) * (1 + wanted) // len(ids))  # of copies, active or standby
    # A client's load: its actives, its standbys so far, and the copies pending moves will
    # give it (a pending move's destination takes that task's standby when it is chosen).
    load = {cid: sum(1 for owner in active.values() if owner == cid) for cid in ids}
    for dest in pending.values():
        load[dest] += 1
    for task in _round_robin_by_owner(tasks, active):
        if task in pending:
            load[pending[task]] -= 1
        holders = {active[task]}
        used = {key: {by_id[active[task]].tags.get(key)} for key in keys}
        for _ in range(wanted):
            candidates = [cid for cid in ids if cid not in holders]

            def rank(cid: str, task: int = task, used=used) -> tuple:
                client = by_id[cid]
                return (
                    -_tag_spread(client, used, keys),
                    pending.get(task) != cid,  # the destination of a pending move warms here
                    load[cid] >= share,
                    load[cid] - (lag(cid, task) <= config.acceptable_recovery_lag),
                    lag(cid, task),
                    cid,
                )

            chosen = min(candidates, key=rank)
            standby[chosen].add(task)
            load[chosen] += 1
            holders.add(chosen)
            for key in keys:
                used[key].add(by_id[chosen].tags.get(key))
    return standby


def _round_robin_by_owner(tasks, active) -> list[int]:
    """Each owner's first task, then each one's second, and so on.

    In plain task order, the tasks whose actives sit on the last clients would come when every
    other client has reached its share, and their standbys would have nowhere fair to go.
    """
    seen: dict[str, int] = {}
    place = {}
    for task in tasks:
        owner = active[task]
        place[task] = (seen.get(owner, 0), task)
        seen[owner] = seen.get(owner, 0) + 1
    return sorted(tasks, key=place.__getitem__)


def _warmups(ids, active, standby, pending, lag, config) -> dict[str, set[int]]:
    warmup: dict[str, set[int]] = {cid: set() for cid in ids}
    budget = config.max_warmup_replicas
    # Closest to caught up first: those finish soonest and free the budget again.
    for task, dest in sorted(pending.items(), key=lambda item: (lag(item[1], item[0]), item[0])):
        if task in standby[dest] or active[task] == dest:
            continue
        if budget == 0:
            break
        warmup[dest].add(task)
        budget -= 1
    return warmup
