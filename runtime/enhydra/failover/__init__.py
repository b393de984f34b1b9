"""Fast failover: notice a dead instance in about a second and remove it from the group.

detector.py is the pure decision core (its docstring holds the rules), probe.py the I/O shell
that watches peers, endpoint.py the heartbeat stream every instance serves, beacon.py the
second channel through Kafka. Removing a member is enhydra.kafka.membership.
"""

from enhydra.failover.beacon import BEACON, Beacon, beacon_origin
from enhydra.failover.detector import Decision, DetectorConfig, Signal, Verdict
from enhydra.failover.endpoint import STREAM_PATH, LivenessEndpoint, add_liveness_routes
from enhydra.failover.probe import FailureDetector, group_remover

__all__ = [
    "BEACON",
    "STREAM_PATH",
    "Beacon",
    "Decision",
    "DetectorConfig",
    "FailureDetector",
    "LivenessEndpoint",
    "Signal",
    "Verdict",
    "add_liveness_routes",
    "beacon_origin",
    "group_remover",
]
