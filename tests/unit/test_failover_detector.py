"""Property tests of the failure detector's pure core (hypothesis).

Each scenario is what a user would see from outside: a kill -9, a SIGSTOP, a stalled HTTP port,
a GC pause, a rolling restart. The last test checks every decision against the rules written
as a second, independent reading of the whole history.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enhydra.failover.detector import (
    BEACON_INTERVAL_S,
    DetectorConfig,
    PeerState,
    Signal,
    Verdict,
    decide,
    new_peer,
    observe,
)

CFG = DetectorConfig(suspect_after_s=1.0, probe_window_s=5.0, beacon_grace_s=2.0)
HB = 0.2  # heartbeat interval
BEACON_EVERY = BEACON_INTERVAL_S  # 0.2 s

History = list[tuple[float, Signal]]


def fold(history: History, start: float = 0.0, cfg: DetectorConfig = CFG) -> PeerState:
    state = new_peer(start)
    for at, signal in history:
        state = observe(state, signal, at, cfg)
    return state


def regular(signal: Signal, start: float, end: float, every: float, jitter: list[float]) -> History:
    out, t, i = [], start, 0
    while t < end:
        out.append((t, signal))
        t += every * (0.5 + jitter[i % len(jitter)]) if jitter else every
        i += 1
    return out


def merged(*histories: History) -> History:
    return sorted((item for h in histories for item in h), key=lambda x: x[0])


jitters = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8)
noise_signals = st.sampled_from([Signal.CONNECT_TIMEOUT, Signal.RESET])


@settings(max_examples=300, deadline=None)
@given(
    alive_for=st.floats(0.3, 60),
    jitter=jitters,
    with_beacons=st.booleans(),
    reset_after=st.floats(0.0, 0.2),
    refused_after=st.floats(0.0, 0.05),
)
def test_kill_9_is_dead_at_the_refusal_once_its_beacon_is_quiet_for_the_short_bound(
    alive_for, jitter, with_beacons, reset_after, refused_after
):
    """Its beacon stops with it; our own beacon's echo goes on (our view of Kafka works)."""
    history = merged(
        regular(Signal.HEARTBEAT, 0.0, alive_for, HB, jitter),
        regular(Signal.BEACON, 0.1, alive_for, BEACON_EVERY, jitter) if with_beacons else [],
    )
    last = history[-1][0]
    echoes = regular(Signal.ANY_BEACON, 0.05, last + 10, BEACON_EVERY, []) if with_beacons else []
    before = fold(merged(history, [(last + reset_after, Signal.RESET)]))
    assert decide(before, last + reset_after, CFG).verdict is not Verdict.DEAD
    refused_at = last + reset_after + refused_after
    # without a second channel: at once; with one: when its last beacon is the bound old and
    # a beacon of anyone (our echo) came more than the bound after it
    last_beacon = max((t for t, s in history if s is Signal.BEACON), default=None)
    dead_at = refused_at
    if last_beacon is not None:
        bound = last_beacon + CFG.refusal_beacon_quiet_s
        echo = min(t for t, _ in echoes if t > bound)
        dead_at = max(refused_at, bound, echo)
    after = [(last + reset_after, Signal.RESET), (refused_at, Signal.REFUSED)]
    for now in sorted({refused_at, dead_at - 0.01, dead_at + 1e-9}):
        if now < refused_at:
            continue
        state = fold([item for item in merged(history, echoes, after) if item[0] <= now])
        decision = decide(state, now, CFG)
        if now < dead_at:  # refused, but its beacon is younger than the bound
            assert decision.verdict is Verdict.SUSPECT and "refuses" in decision.reason
        else:
            assert decision.verdict is Verdict.DEAD and decision.remove
    # still the fast path: the bound and one beacon interval at most
    assert dead_at - refused_at <= CFG.refusal_beacon_quiet_s + BEACON_EVERY + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    alive_for=st.floats(0.3, 10),
    rejecting_for=st.floats(0.0, 30),
    gaps=st.lists(st.floats(0.05, 0.45), min_size=1, max_size=8),  # below the 0.5 s bound
    probes=st.lists(
        st.tuples(st.floats(0.0, 120.0), st.sampled_from([Signal.RESET, Signal.REFUSED])),
        min_size=1,
        max_size=30,
    ),
    checks=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
)
def test_a_refusal_never_removes_a_peer_whose_beacon_is_fresh(
    alive_for, rejecting_for, gaps, probes, checks
):
    """A firewall that rejects its port (or a reused port) while the process consumes: its
    beacon keeps coming, never more than the bound apart, so the refusals are not a death."""
    end = alive_for + rejecting_for
    beacons, t, i = [], 0.0, 0
    while t < end + 2:
        beacons.append((t, Signal.BEACON))
        t += gaps[i % len(gaps)]
        i += 1
    history = merged(
        regular(Signal.HEARTBEAT, 0.0, alive_for, HB, []),
        beacons,
        [(alive_for + dt, s) for dt, s in probes if dt <= rejecting_for],
    )
    for fraction in checks:
        now = alive_for + fraction * rejecting_for
        state = fold([item for item in history if item[0] <= now])
        assert decide(state, now, CFG).verdict is not Verdict.DEAD


@settings(max_examples=300, deadline=None)
@given(
    alive_for=st.floats(0.3, 30),
    cut_for=st.floats(0.0, 300),
    jitter=jitters,
    probes=st.lists(
        st.tuples(st.floats(0.0, 300.0), st.sampled_from(list(Signal)[3:6])), max_size=30
    ),
    checks=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
)
def test_an_observer_cut_off_from_the_control_topic_and_the_peer_removes_nobody(
    alive_for, cut_for, jitter, probes, checks
):
    """From `alive_for` on we hear nothing: no heartbeat, no beacon of anyone, not our own echo.
    The peer is healthy; the silence is ours, so it is never taken for the peer's death."""
    history = merged(
        regular(Signal.HEARTBEAT, 0.0, alive_for, HB, jitter),
        regular(Signal.BEACON, 0.0, alive_for, BEACON_EVERY, jitter),
        regular(Signal.ANY_BEACON, 0.3, alive_for, BEACON_EVERY, jitter),
        [(alive_for + dt, s) for dt, s in probes if dt <= cut_for],
    )
    for fraction in checks:
        now = alive_for + fraction * cut_for
        state = fold([item for item in history if item[0] <= now])
        decision = decide(state, now, CFG)
        assert decision.verdict is not Verdict.DEAD, decision


@settings(max_examples=300, deadline=None)
@given(
    alive_for=st.floats(0.3, 60),
    jitter=jitters,
    probes=st.lists(st.tuples(st.floats(0.0, 30.0), noise_signals), max_size=20),
    now_after=st.floats(0.0, 30.0),
)
def test_sigstop_is_dead_after_the_probe_window_and_not_before(
    alive_for, jitter, probes, now_after
):
    history = merged(
        regular(Signal.HEARTBEAT, 0.0, alive_for, HB, jitter),
        regular(Signal.BEACON, 0.0, alive_for, BEACON_EVERY, jitter),
    )
    stopped = history[-1][0]
    last_heartbeat = max(t for t, s in history if s is Signal.HEARTBEAT)
    last_beacon = max(t for t, s in history if s is Signal.BEACON)
    now = stopped + now_after
    after = merged(
        [(stopped + dt, s) for dt, s in probes if dt <= now_after],
        regular(Signal.ANY_BEACON, stopped, now, BEACON_EVERY, []),  # our own echo
    )
    decision = decide(fold(history + after), now, CFG)
    silent = min(now - last_heartbeat, now - last_beacon)
    if silent >= CFG.probe_window_s:
        assert decision.verdict is Verdict.DEAD and decision.remove
    else:
        assert decision.verdict is not Verdict.DEAD


@settings(max_examples=300, deadline=None)
@given(
    alive_for=st.floats(0.3, 30),
    stalled_for=st.floats(0.0, 120),
    jitter=jitters,
    probes=st.lists(st.tuples(st.floats(0.0, 120.0), noise_signals), max_size=30),
    checks=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
)
def test_a_stalled_http_port_is_never_dead_while_the_beacon_arrives(
    alive_for, stalled_for, jitter, probes, checks
):
    """The process consumes (its beacon arrives at most every second); only HTTP is silent."""
    end = alive_for + stalled_for
    history = merged(
        regular(Signal.HEARTBEAT, 0.0, alive_for, HB, jitter),
        regular(Signal.BEACON, 0.0, end + BEACON_EVERY, BEACON_EVERY, []),
        [(alive_for + dt, s) for dt, s in probes if dt <= stalled_for],
    )
    for fraction in checks:
        now = alive_for + fraction * stalled_for
        state = fold([item for item in history if item[0] <= now])
        assert decide(state, now, CFG).verdict is not Verdict.DEAD


@settings(max_examples=300, deadline=None)
@given(
    alive_for=st.floats(0.3, 30),
    pause=st.floats(0.0, CFG.probe_window_s - 0.01),
    jitter=jitters,
    checks=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
)
def test_a_pause_shorter_than_the_window_gc_or_a_busy_loop_is_never_dead(
    alive_for, pause, jitter, checks
):
    before = merged(
        regular(Signal.HEARTBEAT, 0.0, alive_for, HB, jitter),
        regular(Signal.BEACON, 0.0, alive_for, BEACON_EVERY, jitter),
        [(alive_for, Signal.HEARTBEAT), (alive_for, Signal.BEACON)],  # then the pause starts
    )
    resumed = before[-1][0] + pause
    history = [*before, (resumed, Signal.SLOW_HEARTBEAT), (resumed, Signal.BEACON)]
    for fraction in checks:
        now = before[-1][0] + fraction * pause
        state = fold([item for item in history if item[0] <= now])
        assert decide(state, now, CFG).verdict is not Verdict.DEAD
    state = fold(history)
    assert decide(state, resumed, CFG).verdict is Verdict.ALIVE


@settings(max_examples=300, deadline=None)
@given(
    alive_for=st.floats(0.3, 30),
    jitter=jitters,
    down_for=st.floats(0.0, 300),
    probes=st.lists(
        st.tuples(st.floats(0.0, 300.0), st.sampled_from(list(Signal)[3:6])), max_size=30
    ),
)
def test_a_rolling_restart_that_said_goodbye_is_never_removed(alive_for, jitter, down_for, probes):
    history = regular(Signal.HEARTBEAT, 0.0, alive_for, HB, jitter)
    bye = history[-1][0] + 0.01
    after = sorted((bye + dt, s) for dt, s in probes if dt <= down_for)
    state = fold([*history, (bye, Signal.GOODBYE), *after])
    assert decide(state, bye + down_for, CFG).verdict is not Verdict.DEAD
    back = bye + down_for + 0.01
    state = observe(state, Signal.HEARTBEAT, back, CFG)
    assert decide(state, back, CFG).verdict is Verdict.ALIVE


@settings(max_examples=200)
@given(probes=st.lists(st.tuples(st.floats(0.0, 600.0), noise_signals), max_size=30))
def test_a_peer_never_seen_alive_and_without_a_beacon_is_never_removed(probes):
    history = sorted([(t, Signal.REFUSED) for t, _ in probes] + probes)
    now = max([t for t, _ in history], default=0.0) + 600
    assert decide(fold(history), now, CFG).verdict is not Verdict.DEAD


@settings(max_examples=200)
@given(resumed=st.floats(0.0, 100), now_after=st.floats(0.0, 10))
def test_our_own_late_loop_restarts_the_silence_count(resumed, now_after):
    history = [(0.0, Signal.HEARTBEAT), (0.0, Signal.BEACON)]
    now = resumed + now_after
    echo = [(now, Signal.ANY_BEACON)]  # our view of the control topic works
    state = fold([*history, (resumed, Signal.OBSERVER_RESUMED), *echo])
    verdict = decide(state, now, CFG).verdict
    assert (verdict is Verdict.DEAD) == (now - resumed >= CFG.probe_window_s)


@settings(max_examples=200)
@given(
    refusals=st.lists(st.floats(0.0, 60.0), min_size=1, max_size=20),
    beacon_gap=st.floats(CFG.beacon_grace_s + 0.01, 10.0),
)
def test_a_port_that_rejects_while_kafka_shows_life_costs_one_removal_at_most(refusals, beacon_gap):
    """A firewall that answers RST: the first refusal looks like a death, the beacons correct it."""
    state = fold([(0.0, Signal.HEARTBEAT), (0.05, Signal.RESET), (0.1, Signal.REFUSED)])
    assert decide(state, 0.1, CFG).remove
    state = observe(state, Signal.REMOVED, 0.1, CFG)
    t = 0.1
    state = observe(state, Signal.BEACON, t + beacon_gap, CFG)
    t += beacon_gap
    for dt in sorted(refusals):
        state = observe(state, Signal.REFUSED, t + dt, CFG)
        state = observe(state, Signal.BEACON, t + dt + 0.5, CFG)
        assert decide(state, t + dt + 0.5, CFG).verdict is not Verdict.DEAD


def test_a_dead_peer_is_removed_once_until_it_comes_back_and_dies_again():
    state = fold([(0.0, Signal.HEARTBEAT), (1.0, Signal.RESET), (1.0, Signal.REFUSED)])
    assert decide(state, 1.0, CFG).remove
    state = observe(state, Signal.REMOVED, 1.1, CFG)
    for t in (1.2, 5.0, 60.0):
        state = observe(state, Signal.REFUSED, t, CFG)
        decision = decide(state, t, CFG)
        assert decision.verdict is Verdict.DEAD and not decision.remove
    state = observe(state, Signal.HEARTBEAT, 61.0, CFG)  # restarted, rejoined
    assert decide(state, 61.0, CFG).verdict is Verdict.ALIVE
    state = observe(observe(state, Signal.RESET, 62.0, CFG), Signal.REFUSED, 62.0, CFG)
    assert decide(state, 62.0, CFG).remove


def test_a_slow_heartbeat_is_alive_and_says_so():
    decision = decide(fold([(0.0, Signal.SLOW_HEARTBEAT)]), 0.1, CFG)
    assert decision.verdict is Verdict.ALIVE and "late" in decision.reason


def test_bad_settings_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="below probe_window_s"):
        DetectorConfig(suspect_after_s=5.0, probe_window_s=5.0)
    with pytest.raises(ValueError, match="beacon_grace_s"):
        DetectorConfig(beacon_grace_s=0)
    with pytest.raises(ValueError, match="refusal_beacon_quiet_s"):
        DetectorConfig(refusal_beacon_quiet_s=0)
    with pytest.raises(ValueError, match="view_quiet_s"):
        DetectorConfig(view_quiet_s=5.0, probe_window_s=5.0)
    assert DetectorConfig(probe_window_s=2.0).view_quiet_s == pytest.approx(1.2)


# ------------------------------------------------------------- the rules, read over the history


def rules(history: History, start: float, now: float, cfg: DetectorConfig) -> tuple[Verdict, bool]:
    """The docstring's rules applied to the raw history (no folded state)."""
    life = (Signal.HEARTBEAT, Signal.SLOW_HEARTBEAT)
    hb_idx = max((i for i, (_, s) in enumerate(history) if s in life), default=None)
    since = history[hb_idx + 1 :] if hb_idx is not None else history
    offset = hb_idx + 1 if hb_idx is not None else 0
    untrusting = []  # indexes of beacons that arrived long after the latest refusal
    latest_refusal = None
    for i, (t, s) in enumerate(since):
        if s is Signal.REFUSED:
            latest_refusal = t
        elif (
            s is Signal.BEACON
            and latest_refusal is not None
            and t - latest_refusal > cfg.beacon_grace_s
        ):
            untrusting.append(offset + i)
    evidence = max([i for i in (hb_idx,) if i is not None] + untrusting, default=-1)
    removed = any(s is Signal.REMOVED for _, s in history[evidence + 1 :])

    if any(s is Signal.GOODBYE for _, s in since):
        return Verdict.SUSPECT, False
    floor = max([start] + [t for t, s in history if s is Signal.OBSERVER_RESUMED])
    beacons = [t for t, s in history if s is Signal.BEACON]
    anyone = [t for t, s in history if s in (Signal.BEACON, Signal.ANY_BEACON)]
    kafka_quiet = now - max(max(beacons), floor) if beacons else None
    blind = bool(anyone) and now - max(max(anyone), floor) >= cfg.view_quiet_s
    refused = any(s is Signal.REFUSED for _, s in since)
    if hb_idx is not None and refused and not untrusting:
        if kafka_quiet is None:
            return Verdict.DEAD, not removed
        bound = cfg.refusal_beacon_quiet_s
        heard_since = max(anyone) - max(beacons) > bound  # its slot passed while we heard others
        if not blind and kafka_quiet >= bound and heard_since:
            return Verdict.DEAD, not removed
        return Verdict.SUSPECT, False
    last_hb = history[hb_idx][0] if hb_idx is not None else start
    http_quiet = now - max(last_hb, floor)
    window = cfg.probe_window_s
    if kafka_quiet is not None and not blind and min(http_quiet, kafka_quiet) >= window:
        return Verdict.DEAD, not removed
    if refused or http_quiet >= cfg.suspect_after_s:
        return Verdict.SUSPECT, False
    if hb_idx is None or any(s in (Signal.RESET, Signal.CONNECT_TIMEOUT) for _, s in since):
        return Verdict.SUSPECT, False
    return Verdict.ALIVE, False


@settings(max_examples=1000)
@given(
    steps=st.lists(st.tuples(st.floats(0.0, 3.0), st.sampled_from(list(Signal))), max_size=40),
    now_after=st.floats(0.0, 10.0),
)
def test_every_decision_follows_the_rules_over_any_history(steps, now_after):
    history, t = [], 0.0
    for dt, signal in steps:
        t += dt
        history.append((t, signal))
    now = t + now_after
    decision = decide(fold(history), now, CFG)
    assert (decision.verdict, decision.remove) == rules(history, 0.0, now, CFG)


def test_a_peer_not_heard_from_yet_is_only_suspect_however_fresh():
    assert decide(new_peer(10.0), 10.0, CFG).verdict is Verdict.SUSPECT
    state = observe(new_peer(10.0), Signal.HEARTBEAT, 10.2, CFG)
    assert decide(state, 10.2, CFG).verdict is Verdict.ALIVE
