"""The failure detector's decision core: from what we observed of a peer, is it alive or dead?

Pure: observations in, a decision out, no clock and no I/O (the shell in probe.py passes the
time). A DEAD decision removes the peer's static member from the group at once, so a false one
costs the whole group a rebalance (the removed instance rejoins, is fenced, and loses nothing).
The rules therefore say "dead" only when the process is gone or is certainly not working, and
"suspect" for everything that could be slowness or a network problem.

Two channels are watched:
- HTTP: a long-lived stream from the peer's liveness endpoint with a heartbeat line every
  0.2 s, written by the peer's event loop. Its close is noticed at once.
- Kafka: a beacon the peer writes to the control topic every `BEACON_INTERVAL_S` (the second
  signal). It says the process runs and reaches Kafka, whatever happens to its HTTP port.

The rules, in order:
1. A peer that said goodbye (a clean stop: SIGTERM of a rolling restart) and has not sent a
   heartbeat since is never removed here: it is expected back within the session timeout, and
   the broker's session timeout removes it if it does not come back.
2. Fast: a refused connection after the peer was seen alive (and after its stream broke without
   a goodbye) means nothing listens on its port: the process is gone, if its beacon has gone
   quiet too for `refusal_beacon_quiet_s` (two and a half beacon intervals) while we kept
   hearing beacons: one of anyone (another peer, our own echo) arrived more than that bound
   after the peer's last, so its slot passed while our view of the control topic worked. A
   kill -9 closes the peer's sockets, so the stream ends and the reconnect is refused within
   milliseconds; its beacon stops with it, so it is DEAD within the bound plus one beacon
   interval. A fresh beacon says the process runs (a firewall that rejects, a port taken by
   someone else): SUSPECT. A peer that never sent a beacon (the second channel is not wired)
   is DEAD at the refusal.
3. Refusals are not trusted while the process shows life: a beacon that arrives more than
   `beacon_grace_s` after a refusal was written after it, so the port refuses while the process
   runs (a firewall that rejects). The fast rule stays off for that peer until its next
   heartbeat, so such a network fault costs at most one removal, never a removal loop.
4. Slow: silence on both channels for `probe_window_s` means the process is not running (a
   SIGSTOP, a hung machine, an event loop blocked for that long: it processes nothing either).
   DEAD. Silence on HTTP alone (a stalled network path to the HTTP port, a partition between
   two instances) is never enough: the beacon shows the process consuming, so it stays SUSPECT.
   A peer that never sent a beacon (the second channel is not wired) is never removed on
   silence: only the fast rule or the broker's session timeout remove it.
5. Timeouts (a connect that gets no answer, a stream that goes quiet) only ever make a peer
   SUSPECT; they feed rule 4 through the silence they measure, never rule 2.
6. When our own event loop was late (a GC pause or a busy loop here), the silence we measured
   proves nothing about the peer: silence is counted again from when we resumed.
7. Only a heartbeat makes a peer ALIVE (a peer not heard from yet is SUSPECT); a slow one (the
   peer's loop runs late) is a heartbeat too: ALIVE, with the lag noted.
8. A DEAD peer is removed once; it is removed again only after new evidence of life (it came
   back, then died again).
9. Our own view: when no beacon arrived from anyone (any peer, or our own beacon's echo) for
   `view_quiet_s`, we are cut off from the control topic, and a quiet beacon proves nothing
   about the peer: rules 2 and 4 do not remove it (SUSPECT). If it is dead, the broker's session
   timeout, or an observer that still hears the beacons, removes it. The view bound is below the
   probe window, so an isolation long enough for rule 4 is always noticed as one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

# How often every instance sends its beacon (beacon.py). Short, because a refusal waits for
# the beacon to go quiet before it counts (rule 2): that wait is the kill -9 path's latency.
BEACON_INTERVAL_S = 0.2


class Signal(StrEnum):
    """One thing the shell observed about a peer."""

    HEARTBEAT = "heartbeat"  # a heartbeat line arrived on the stream on time
    SLOW_HEARTBEAT = "slow_heartbeat"  # a heartbeat line that says the peer's loop runs late
    GOODBYE = "goodbye"  # the peer said it stops cleanly (a restart: expected back)
    RESET = "reset"  # the stream ended (EOF, RST) without a goodbye
    REFUSED = "refused"  # a connect was refused: nothing listens on the peer's port
    CONNECT_TIMEOUT = "connect_timeout"  # a connect or a first answer did not come in time
    BEACON = "beacon"  # the peer's beacon arrived through Kafka
    ANY_BEACON = "any_beacon"  # a beacon of anyone arrived (another peer, our own echo)
    OBSERVER_RESUMED = "observer_resumed"  # our own loop ran late: restart silence counting
    REMOVED = "removed"  # we removed the peer's member from the group


class Verdict(StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True)
class DetectorConfig:
    """How long silences must last; the defaults suit a 0.2 s heartbeat and a 0.2 s beacon."""

    suspect_after_s: float = 1.0  # no heartbeat for this long: suspect
    probe_window_s: float = 5.0  # silent on HTTP and Kafka for this long: dead
    beacon_grace_s: float = 2.0  # a beacon this much later than a refusal was sent after it
    refusal_beacon_quiet_s: float = 2.5 * BEACON_INTERVAL_S  # then a refusal is a death
    view_quiet_s: float | None = None  # no beacon from anyone this long: we are cut off
    # (None: 0.6 x probe_window_s, so that a silence of the window always notices it)

    @property
    def view_bound_s(self) -> float:
        assert self.view_quiet_s is not None  # resolved in __post_init__
        return self.view_quiet_s

    def __post_init__(self) -> None:
        if self.view_quiet_s is None:
            object.__setattr__(self, "view_quiet_s", 0.6 * self.probe_window_s)
        if not 0 < self.suspect_after_s < self.probe_window_s:
            raise ValueError(
                f"failover: suspect_after_s ({self.suspect_after_s}) must be above 0 and below "
                f"probe_window_s ({self.probe_window_s})"
            )
        if self.beacon_grace_s <= 0:
            raise ValueError(f"failover: beacon_grace_s ({self.beacon_grace_s}) must be above 0")
        if self.refusal_beacon_quiet_s <= 0:
            raise ValueError(
                f"failover: refusal_beacon_quiet_s ({self.refusal_beacon_quiet_s}) must be above 0"
            )
        if not 0 < self.view_bound_s < self.probe_window_s:
            raise ValueError(
                f"failover: view_quiet_s ({self.view_quiet_s}) must be above 0 and below "
                f"probe_window_s ({self.probe_window_s})"
            )


@dataclass(frozen=True)
class PeerState:
    """What we know of one peer; every time is on the observer's monotonic clock."""

    watching_since: float
    quiet_floor: float  # silences are measured from here at the earliest
    last_heartbeat: float | None = None
    last_beacon: float | None = None
    last_any_beacon: float | None = None  # anyone's beacon: our view of the control topic works
    slow: bool = False
    goodbye_at: float | None = None
    broken_at: float | None = None  # the stream broke or a connect timed out since a heartbeat
    refused_at: float | None = None  # a connect was refused since the last heartbeat
    refusals_untrusted: bool = False  # rule 3: alive on Kafka while the port refuses
    removed_at: float | None = None


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    remove: bool = False  # act now: remove the peer's static member from the group


def new_peer(now: float) -> PeerState:
    return PeerState(watching_since=now, quiet_floor=now)


def observe(state: PeerState, signal: Signal, at: float, config: DetectorConfig) -> PeerState:
    """The state after `signal` observed at `at` (observations come in time order)."""
    if signal in (Signal.HEARTBEAT, Signal.SLOW_HEARTBEAT):
        return replace(
            state,
            last_heartbeat=at,
            slow=signal is Signal.SLOW_HEARTBEAT,
            goodbye_at=None,
            broken_at=None,
            refused_at=None,
            refusals_untrusted=False,
            removed_at=None,
        )
    if signal is Signal.GOODBYE:
        return replace(state, goodbye_at=at)
    if signal in (Signal.RESET, Signal.CONNECT_TIMEOUT):
        return state if state.broken_at is not None else replace(state, broken_at=at)
    if signal is Signal.REFUSED:
        return replace(state, refused_at=at)
    if signal is Signal.ANY_BEACON:
        return replace(state, last_any_beacon=_latest(state.last_any_beacon, at))
    if signal is Signal.BEACON:
        state = replace(state, last_beacon=at, last_any_beacon=_latest(state.last_any_beacon, at))
        if state.refused_at is not None and at - state.refused_at > config.beacon_grace_s:
            state = replace(state, refusals_untrusted=True, removed_at=None)
        return state
    if signal is Signal.OBSERVER_RESUMED:
        return replace(state, quiet_floor=max(state.quiet_floor, at))
    if signal is Signal.REMOVED:
        return replace(state, removed_at=at)
    raise ValueError(f"unknown signal {signal!r}")


def decide(state: PeerState, now: float, config: DetectorConfig) -> Decision:
    """Alive, suspect or dead at `now`, and whether to remove the peer now (rules above)."""
    if state.goodbye_at is not None:
        return Decision(Verdict.SUSPECT, "stopped cleanly and expected back; not removed")
    seen = state.last_heartbeat is not None
    kafka_quiet = _quiet(state.last_beacon, state, now)
    view_quiet = _quiet(state.last_any_beacon, state, now)
    cut_off = view_quiet is not None and view_quiet >= config.view_bound_s
    blind = f"no beacon from anyone for {view_quiet or 0.0:.1f} s: our own view is cut off"
    if seen and state.refused_at is not None and not state.refusals_untrusted:
        if kafka_quiet is None:
            return _dead("process gone: its port refuses connections", state)
        if cut_off:
            return Decision(Verdict.SUSPECT, f"its port refuses, but {blind}")
        bound = config.refusal_beacon_quiet_s
        if kafka_quiet < bound:
            return Decision(Verdict.SUSPECT, "its port refuses but its beacon is fresh")
        assert state.last_beacon is not None and state.last_any_beacon is not None
        if state.last_any_beacon - state.last_beacon <= bound:
            return Decision(
                Verdict.SUSPECT, "its port refuses; no beacon of anyone yet to show its own is late"
            )
        return _dead(f"process gone: its port refuses and no beacon for {kafka_quiet:.1f} s", state)
    last_heard = state.watching_since if state.last_heartbeat is None else state.last_heartbeat
    http_quiet = now - max(last_heard, state.quiet_floor)
    window = config.probe_window_s
    if kafka_quiet is not None and http_quiet >= window and kafka_quiet >= window:
        if cut_off:
            return Decision(Verdict.SUSPECT, f"silent on HTTP and Kafka, but {blind}")
        return _dead(f"silent on HTTP and Kafka for {window:g} s: paused or hung", state)
    kafka_fresh = kafka_quiet is not None and kafka_quiet < window
    if state.refused_at is not None:
        if state.refusals_untrusted:
            return Decision(Verdict.SUSPECT, "its port refuses but it is alive on Kafka")
        return Decision(Verdict.SUSPECT, "not listening yet (never seen alive)")
    if not seen:
        return Decision(Verdict.SUSPECT, "no heartbeat yet")
    if http_quiet >= config.suspect_after_s or state.broken_at is not None:
        where = "alive on Kafka" if kafka_fresh else "no beacon either"
        return Decision(Verdict.SUSPECT, f"no heartbeat for {http_quiet:.1f} s ({where})")
    if state.slow:
        return Decision(Verdict.ALIVE, "alive but its event loop runs late")
    return Decision(Verdict.ALIVE, "heartbeat on time")


def _latest(last: float | None, at: float) -> float:
    return at if last is None else max(last, at)


def _quiet(last: float | None, state: PeerState, now: float) -> float | None:
    """How long a channel has been quiet at `now`, counted from our resumption at the earliest."""
    return None if last is None else now - max(last, state.quiet_floor)


def _dead(reason: str, state: PeerState) -> Decision:
    return Decision(Verdict.DEAD, reason, remove=state.removed_at is None)
