"""Kafka behind Toxiproxy: the brokers every fault test reaches through proxies it controls.

One LocalCluster (1 or 3 nodes) with one lane per service instance: each node has a listener
per lane whose advertised port is a Toxiproxy proxy, so an instance bootstrapped on its lane
talks to every node through its own proxies, and a toxic on them cuts, slows or resets that
instance alone. Tests and checkers use the plain listeners (`bootstrap`), which no toxic
touches.
"""

from __future__ import annotations

from pathlib import Path

from enhydra.devtools.cluster import LocalCluster
from enhydra.devtools.toxiproxy import ToxiproxyServer
from enhydra.testing.toxiproxy import Proxy, Toxiproxy


class ProxiedKafka:
    def __init__(self, root: Path, brokers: int = 1, lanes: tuple[str, ...] = ("i1", "i2")):
        self.cluster = LocalCluster(root / "kafka", brokers, lanes=lanes)
        self.server = ToxiproxyServer(root / "toxiproxy.log")
        self.lanes = lanes
        self.api: Toxiproxy | None = None

    def start(self) -> ProxiedKafka:
        self.server.start()
        self.api = Toxiproxy(self.server.api_url)
        for lane in self.lanes:
            for node_id, listen, upstream in self.cluster.lane_routes(lane):
                self.api.create(self._name(lane, node_id), listen, upstream)
        try:
            self.cluster.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            self.cluster.stop(timeout=5)  # throwaway data: no need to wait for a clean stop
        finally:
            self.server.stop()

    @staticmethod
    def _name(lane: str, node_id: int) -> str:
        return f"{lane}-node{node_id}"

    @property
    def bootstrap(self) -> str:
        """The plain listeners: for producers, checkers and anything not under test."""
        return self.cluster.bootstrap

    def lane_bootstrap(self, lane: str) -> str:
        return self.cluster.lane_bootstrap(lane)

    def proxies(self, lane: str, node_ids: list[int] | None = None) -> list[Proxy]:
        """The proxies of `lane` (to the given nodes, default all of them)."""
        assert self.api is not None, "start() first"
        ids = node_ids or [node_id for node_id, _, _ in self.cluster.lane_routes(lane)]
        return [self.api.proxy(self._name(lane, node_id)) for node_id in ids]

    def heal(self) -> None:
        """Every proxy enabled and without toxics."""
        assert self.api is not None
        self.api.reset()
