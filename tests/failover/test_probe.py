"""The probe shell's own decisions, without sockets: what it feeds the core and when it acts."""

from __future__ import annotations

from enhydra.failover import FailureDetector, Signal, Verdict
from enhydra.failover.detector import new_peer, observe
from enhydra.failover.probe import Peer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def detector_with_peer(clock: Clock, calls: list[str]) -> tuple[FailureDetector, Peer]:
    async def on_dead(instance: str, member: str | None) -> bool:
        calls.append(instance)
        return True

    detector = FailureDetector("me", dict, on_dead, clock=clock)
    peer = Peer("a", "http://127.0.0.1:1", new_peer(0.0))
    detector.peers["a"] = peer
    return detector, peer


async def test_the_removal_is_decided_again_right_before_it_is_sent():
    """Decided dead, then its heartbeat arrives before the removal task runs: nobody is removed."""
    clock, calls = Clock(), []
    detector, peer = detector_with_peer(clock, calls)
    for at, signal in [(0.0, Signal.HEARTBEAT), (0.1, Signal.RESET), (0.1, Signal.REFUSED)]:
        peer.state = observe(peer.state, signal, at, detector.config)
    clock.now = 0.1
    detector._evaluate(peer)
    removing = peer.removing
    assert removing is not None and peer.decision.verdict is Verdict.DEAD
    clock.now = 0.2
    detector._observe(peer, Signal.HEARTBEAT, 0.2)  # back (a restart on the same port)
    await removing
    assert calls == [] and detector.removed == []
    assert peer.decision.verdict is Verdict.ALIVE


async def test_a_dead_decision_that_still_holds_is_acted_on():
    clock, calls = Clock(), []
    detector, peer = detector_with_peer(clock, calls)
    for at, signal in [(0.0, Signal.HEARTBEAT), (0.1, Signal.RESET), (0.1, Signal.REFUSED)]:
        peer.state = observe(peer.state, signal, at, detector.config)
    clock.now = 0.1
    detector._evaluate(peer)
    assert peer.removing is not None
    await peer.removing
    assert calls == ["a"] and detector.removed == [("a", 0.1)]


def test_every_beacon_our_own_echo_too_tells_each_peer_that_our_view_works():
    clock, calls = Clock(), []
    detector, peer = detector_with_peer(clock, calls)
    clock.now = 3.0
    detector.on_beacon("me")  # the echo of our own beacon
    detector._evaluate(peer)
    assert peer.state.last_any_beacon == 3.0 and peer.state.last_beacon is None
    clock.now = 4.0
    detector.on_beacon("a")
    assert peer.state.last_any_beacon == 4.0 and peer.state.last_beacon == 4.0
    clock.now = 5.0
    detector.on_beacon("b")  # another peer's
    detector._evaluate(peer)
    assert peer.state.last_any_beacon == 5.0 and peer.state.last_beacon == 4.0
