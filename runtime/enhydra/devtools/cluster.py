"""A local Kafka cluster of N KRaft nodes (each broker and controller) from the same jars.

Replication factor N (at most 3) and min.insync.replicas N-1, so a fault test can stop, kill
and restart one node and watch leaders move while writes still need a quorum. Each node is a
LocalBroker in `data_dir/node-<id>`; the ports of every node are chosen once and recorded in
`data_dir/cluster.json`, so `start`, `status` and `stop` work from different processes and a
restarted node keeps its address. Nodes run with a small heap: CI machines have 2 cores.

Lanes are extra listeners advertised at proxy ports (one proxy per node and lane, see
`LocalBroker`): a client bootstrapped on a lane reaches every node through its proxies.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from enhydra.devtools.broker import (
    HOST,
    BrokerError,
    LocalBroker,
    _file_lock,
    _write_atomic,
    cache_root,
    free_port,
    new_cluster_id,
)

CLUSTER_FILE = "cluster.json"
MAX_BROKERS = 9


@dataclass
class NodePorts:
    node_id: int
    port: int
    controller_port: int
    lanes: dict[str, list[int]] = field(default_factory=dict)  # name -> [port, proxy port]


@dataclass
class ClusterLayout:
    """What cluster.json records: the cluster id and every node's ports."""

    cluster_id: str
    nodes: list[NodePorts]
    heap: str = "256m"

    @property
    def voters(self) -> str:
        return ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in self.nodes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterLayout:
        raw = json.loads(text)
        nodes = [
            NodePorts(
                int(n["node_id"]),
                int(n["port"]),
                int(n["controller_port"]),
                {str(k): [int(p) for p in v] for k, v in n.get("lanes", {}).items()},
            )
            for n in raw["nodes"]
        ]
        return cls(str(raw["cluster_id"]), nodes, str(raw.get("heap", "256m")))


def cluster_overrides(brokers: int) -> dict[str, str]:
    """Replicate everything on every node (up to 3); writes need all but one of them."""
    replicas = str(min(brokers, 3))
    min_isr = str(max(1, min(brokers, 3) - 1))
    return {
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        # A killed node's partitions move within seconds, not the default 9-18 s.
        "broker.session.timeout.ms": "4000",
        "broker.heartbeat.interval.ms": "1000",
        "controller.quorum.fetch.timeout.ms": "4000",
        "controlled.shutdown.enable": "true",
        "num.io.threads": "2",
        "num.replica.fetchers": "1",
        "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
    }


def default_cluster_dir() -> Path:
    return cache_root() / "cluster"


def is_cluster_dir(data_dir: Path) -> bool:
    return (data_dir / CLUSTER_FILE).is_file()


class LocalCluster:
    """N local Kafka nodes under one data dir; nodes are numbered 1..N."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        brokers: int = 3,
        *,
        lanes: tuple[str, ...] = (),
        heap: str = "256m",
    ) -> None:
        if not 1 <= brokers <= MAX_BROKERS:
            raise BrokerError(f"--brokers must be between 1 and {MAX_BROKERS}, got {brokers}")
        self.data_dir = (
            Path(data_dir).expanduser() if data_dir is not None else default_cluster_dir()
        ).resolve()
        self.brokers = brokers
        self.lane_names = tuple(lanes)
        self.heap = heap
        self._layout: ClusterLayout | None = None

    # ---- layout

    def layout(self) -> ClusterLayout:
        """The recorded layout, or a new one (free ports) when the dir has none or another size."""
        if self._layout is not None:
            return self._layout
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.data_dir / ".lock"):
            path = self.data_dir / CLUSTER_FILE
            layout = None
            if path.is_file():
                try:
                    layout = ClusterLayout.from_json(path.read_text(encoding="utf-8"))
                except (ValueError, KeyError, TypeError) as exc:
                    raise BrokerError(f"{path} is corrupt ({exc}); remove the directory") from exc
                if len(layout.nodes) != self.brokers:
                    raise BrokerError(
                        f"{self.data_dir} holds a cluster of {len(layout.nodes)} brokers; "
                        f"use another --data-dir for {self.brokers}"
                    )
                missing = set(self.lane_names) - set(layout.nodes[0].lanes)
                if missing:
                    raise BrokerError(
                        f"the cluster in {self.data_dir} has no lane {sorted(missing)}; "
                        "use another --data-dir"
                    )
            else:
                layout = self._new_layout()
                _write_atomic(path, layout.to_json())
            self._layout = layout
            return layout

    def _new_layout(self) -> ClusterLayout:
        taken: set[int] = set()

        def pick() -> int:
            port = free_port(exclude=taken)
            taken.add(port)
            return port

        nodes = [
            NodePorts(i, pick(), pick(), {name: [pick(), pick()] for name in self.lane_names})
            for i in range(1, self.brokers + 1)
        ]
        return ClusterLayout(new_cluster_id(), nodes, self.heap)

    def node(self, node_id: int) -> LocalBroker:
        """The LocalBroker of node `node_id` (1..N): start, stop (SIGTERM), kill (SIGKILL)."""
        layout = self.layout()
        ports = next((n for n in layout.nodes if n.node_id == node_id), None)
        if ports is None:
            raise BrokerError(f"no node {node_id}: the cluster has nodes 1..{len(layout.nodes)}")
        return LocalBroker(
            self.data_dir / f"node-{node_id}",
            ports.port,
            overrides=cluster_overrides(len(layout.nodes)),
            lanes={name: (p[0], p[1]) for name, p in ports.lanes.items()},
            node_id=node_id,
            controller_port=ports.controller_port,
            voters=layout.voters,
            cluster_id=layout.cluster_id,
            heap=layout.heap,
        )

    def nodes(self) -> list[LocalBroker]:
        return [self.node(n.node_id) for n in self.layout().nodes]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{HOST}:{n.port}" for n in self.layout().nodes)

    def lane_bootstrap(self, lane: str) -> str:
        """Bootstrap servers of a lane: every node's proxy address."""
        return ",".join(f"{HOST}:{n.lanes[lane][1]}" for n in self.layout().nodes)

    def lane_routes(self, lane: str) -> list[tuple[int, str, str]]:
        """(node id, proxy listen address, node's lane address) for every node of a lane."""
        return [
            (n.node_id, f"{HOST}:{n.lanes[lane][1]}", f"{HOST}:{n.lanes[lane][0]}")
            for n in self.layout().nodes
        ]

    # ---- lifecycle

    def start(self, timeout: float = 120.0) -> str:
        """Start every node that is not running (in parallel: the quorum needs a majority
        before any node answers); the bootstrap servers of the plain listeners."""
        nodes = self.nodes()
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            for future in [pool.submit(node.start, timeout) for node in nodes]:
                future.result()
        return self.bootstrap

    def running(self) -> list[int]:
        if not is_cluster_dir(self.data_dir):
            return []
        return [node_id for node_id, node in enumerate(self.nodes(), 1) if node.is_running()]

    def stop(self, timeout: float = 30.0) -> list[int]:
        """Stop every node (in parallel); the ids of those that were running."""
        if not is_cluster_dir(self.data_dir):
            return []
        nodes = self.nodes()
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            stopped = list(pool.map(lambda node: node.stop(timeout), nodes))
        return [node_id for node_id, was in enumerate(stopped, 1) if was]
