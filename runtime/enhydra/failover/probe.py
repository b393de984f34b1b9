"""The failure detector's I/O shell: keep a heartbeat stream open to every peer, act on deaths.

For each peer (instance id -> advertised URL, from the group map) one task holds a GET on the
peer's liveness stream (endpoint.py) and turns what happens into observations for the pure
core (detector.py): a line is a heartbeat, a `bye` line a goodbye, an end without one a reset,
a refused connect a refusal, a connect that gets no answer a timeout. After a reset it
reconnects at once, so a dead process is confirmed by a refusal within milliseconds. A stream
that stays quiet for `suspect_after_s` is dropped and reopened, so a silently lost connection
never hides a peer. Beacons (beacon.py) are fed in by whoever reads the control topic.

Every `tick_s` the core decides each peer; a decision to remove is made again right before
`on_dead(instance, member_id)` is called (a heartbeat or a beacon may have come meanwhile),
e.g. remove_static_members with that member id, so a newer incarnation is never removed, and,
when it returns True, records the removal. Our own lateness is measured on each
tick: a tick later than `observer_stall_s` restarts the silence counts (rule 6).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from enhydra.failover.beacon import beacon_origin
from enhydra.failover.detector import (
    Decision,
    DetectorConfig,
    PeerState,
    Signal,
    Verdict,
    decide,
    new_peer,
    observe,
)
from enhydra.failover.endpoint import STREAM_PATH
from enhydra.logs import get_logger

log = get_logger("enhydra.failover")

OnDead = Callable[[str, str | None], Awaitable[bool]]
_REFUSED_ERRNOS = {errno.ECONNREFUSED}


@dataclass
class Peer:
    """One watched peer: its URL, the core's state, the last decision and its member id."""

    instance: str
    url: str
    state: PeerState
    decision: Decision = field(default_factory=lambda: Decision(Verdict.SUSPECT, "not probed yet"))
    member_id: str | None = None
    lag_ms: float = 0.0
    task: asyncio.Task[None] | None = None
    removing: asyncio.Task[None] | None = None
    retry_at: float = 0.0  # after a failed removal, not before this


class FailureDetector:
    """Probes every peer of this instance and reports (and acts on) the dead ones."""

    def __init__(
        self,
        instance_id: str,
        peers: Callable[[], Mapping[str, str]],
        on_dead: OnDead,
        config: DetectorConfig | None = None,
        *,
        connect_timeout_s: float = 0.5,
        tick_s: float = 0.1,
        observer_stall_s: float = 0.5,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.instance_id = instance_id
        self.config = config or DetectorConfig()
        self._peers_of_group = peers
        self._on_dead = on_dead
        self._connect_timeout_s = connect_timeout_s
        self._tick_s = tick_s
        self._observer_stall_s = observer_stall_s
        self._clock = clock
        self._headers = dict(headers or {})  # e.g. the query token, if the route is guarded
        self.peers: dict[str, Peer] = {}
        self._beacons: dict[str, float] = {}  # instance -> when its last beacon arrived
        self._any_beacon: float | None = None  # anyone's, our own echo too (rule 9)
        self.removed: list[tuple[str, float]] = []  # (instance, when) for stats and tests
        self._session: aiohttp.ClientSession | None = None
        self._ticker: asyncio.Task[None] | None = None

    # lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self._ticker = asyncio.create_task(self._tick_loop(), name="enhydra-failover-detector")

    async def stop(self) -> None:
        tasks = [self._ticker] if self._ticker else []
        for peer in self.peers.values():
            tasks += [t for t in (peer.task, peer.removing) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.peers.clear()
        if self._session is not None:
            await self._session.close()

    # inputs ------------------------------------------------------------------------------
    def on_beacon(self, instance: str) -> None:
        """A beacon of `instance` arrived through Kafka (see beacon.beacon_origin).

        Our own beacon's echo counts too: it shows our view of the control topic works, which
        is what makes a quiet beacon of a peer mean something (rule 9).
        """
        now = self._clock()
        self._beacons[instance] = now
        self._any_beacon = now  # given to each peer's state when it is decided (_decide)
        if instance in self.peers:
            self._observe(self.peers[instance], Signal.BEACON, now)

    async def on_control_message(self, message: Mapping[str, Any]) -> None:
        """Feed every control-topic message here; beacons are kept, the rest ignored."""
        origin = beacon_origin(message)
        if origin is not None:
            self.on_beacon(origin)

    def status(self) -> dict[str, dict[str, Any]]:
        """Each peer's verdict and why, for /v1/stats and logs."""
        return {
            name: {
                "url": p.url,
                "verdict": p.decision.verdict.value,
                "reason": p.decision.reason,
                "member": p.member_id,
                "lag_ms": p.lag_ms,
            }
            for name, p in sorted(self.peers.items())
        }

    # the core's loop ---------------------------------------------------------------------
    def _observe(self, peer: Peer, signal: Signal, at: float) -> None:
        peer.state = observe(peer.state, signal, at, self.config)

    def _decide(self, peer: Peer) -> Decision:
        """The core's decision now, once the latest beacon of anyone is in the peer's state
        (passed here rather than to every peer at every beacon: N peers, N beacons)."""
        heard = self._any_beacon
        if heard is not None and (peer.state.last_any_beacon or float("-inf")) < heard:
            self._observe(peer, Signal.ANY_BEACON, heard)
        return decide(peer.state, self._clock(), self.config)

    def _evaluate(self, peer: Peer) -> None:
        decision = self._decide(peer)
        if decision.verdict is not peer.decision.verdict:
            log.info(
                "peer liveness changed",
                peer=peer.instance,
                verdict=decision.verdict.value,
                was=peer.decision.verdict.value,
                reason=decision.reason,
            )
        peer.decision = decision
        if decision.remove and peer.removing is None and self._clock() >= peer.retry_at:
            peer.removing = asyncio.create_task(self._remove(peer, decision))

    async def _remove(self, peer: Peer, decision: Decision) -> None:
        try:
            # Decided a moment ago (or a retry later): a heartbeat or a beacon may have come
            # since, and a removal of a live peer costs the group a rebalance. Decide again.
            decision = self._decide(peer)
            if not decision.remove:
                log.info(
                    "peer not removed: alive again", peer=peer.instance, reason=decision.reason
                )
                peer.decision = decision
                return
            log.warning("removing dead peer", peer=peer.instance, reason=decision.reason)
            if await self._on_dead(peer.instance, peer.member_id):
                now = self._clock()
                self._observe(peer, Signal.REMOVED, now)
                self.removed.append((peer.instance, now))
            else:
                peer.retry_at = self._clock() + 1.0
        except Exception as exc:  # tried again a second later
            peer.retry_at = self._clock() + 1.0
            log.warning("could not remove dead peer", peer=peer.instance, error=repr(exc))
        finally:
            peer.removing = None

    async def _tick_loop(self) -> None:
        last = self._clock()
        while True:
            await asyncio.sleep(self._tick_s)
            now = self._clock()
            if now - last > self._tick_s + self._observer_stall_s:
                log.warning("failure detector ran late", late_s=round(now - last - self._tick_s, 2))
                for peer in self.peers.values():
                    self._observe(peer, Signal.OBSERVER_RESUMED, now)
            last = now
            self._sync_peers(now)
            for peer in list(self.peers.values()):
                self._evaluate(peer)

    def _sync_peers(self, now: float) -> None:
        wanted = {k: v for k, v in self._peers_of_group().items() if k != self.instance_id and v}
        for name in [n for n, p in self.peers.items() if wanted.get(n) != p.url]:
            peer = self.peers.pop(name)
            for task in (peer.task, peer.removing):
                if task is not None:
                    task.cancel()
        for name, url in wanted.items():
            if name not in self.peers:
                state = new_peer(now)
                if name in self._beacons:
                    state = observe(state, Signal.BEACON, self._beacons[name], self.config)
                peer = Peer(name, url, state)
                peer.task = asyncio.create_task(self._watch(peer), name=f"enhydra-probe-{name}")
                self.peers[name] = peer

    # one peer's stream -------------------------------------------------------------------
    async def _watch(self, peer: Peer) -> None:
        backoff = 0.0
        while True:
            signal, worked = await self._stream_once(peer)
            if signal is not None:
                self._observe(peer, signal, self._clock())
                self._evaluate(peer)  # at once: a refusal after a reset is the fast rule
            # a stream that worked and ended is reopened at once: that is how a death shows
            backoff = 0.0 if worked else min(max(backoff * 2, 0.05), 1.0)
            await asyncio.sleep(backoff)

    async def _stream_once(self, peer: Peer) -> tuple[Signal | None, bool]:
        """Read one stream to its end: what ended it, and whether it carried any line."""
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self._connect_timeout_s,
            sock_read=self.config.suspect_after_s,
        )
        got_line = False
        try:
            url = peer.url + STREAM_PATH
            async with self._session.get(url, timeout=timeout, headers=self._headers) as response:
                if response.status != 200:
                    log.warning(
                        "peer has no liveness stream", peer=peer.instance, status=response.status
                    )
                    return Signal.CONNECT_TIMEOUT, False
                async for raw in response.content:
                    line = orjson.loads(raw)
                    if line.get("instance") != peer.instance:  # someone else lives there now
                        return Signal.REFUSED, got_line
                    if "bye" in line:
                        return Signal.GOODBYE, True
                    got_line = True
                    peer.member_id = line.get("member") or peer.member_id
                    peer.lag_ms = float(line.get("lag_ms") or 0.0)
                    slow = Signal.SLOW_HEARTBEAT if line.get("slow") else Signal.HEARTBEAT
                    self._observe(peer, slow, self._clock())
            return Signal.RESET, got_line  # ended without a goodbye
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError) or (
                getattr(exc.os_error, "errno", None) in _REFUSED_ERRNOS
            )
            return (Signal.REFUSED if refused else Signal.CONNECT_TIMEOUT), False
        except (TimeoutError, aiohttp.ServerTimeoutError):
            # no answer, or a stream that went quiet: the silence is the core's business
            return (None, True) if got_line else (Signal.CONNECT_TIMEOUT, False)
        except (aiohttp.ClientError, ConnectionError, orjson.JSONDecodeError):
            return Signal.RESET, got_line


def group_remover(client_or_bootstrap: Any, group_id: str) -> OnDead:
    """`on_dead` that removes the peer's static member from `group_id` (that incarnation only).

    Done (True) when it was removed, was no longer in the group, or a newer incarnation holds
    its instance id now; anything else is tried again on the next tick.
    """
    from aiokafka.errors import UnknownMemberIdError

    from enhydra.kafka.membership import FencedInstanceIdError, remove_static_members

    async def remove(instance: str, member_id: str | None) -> bool:
        result = await remove_static_members(client_or_bootstrap, group_id, {instance: member_id})
        error = result.get(instance)
        return error is None or isinstance(error, (UnknownMemberIdError, FencedInstanceIdError))

    return remove
