"""Where each live snapshot stands, as every instance (and the CLI) reads it off the control topic.

Pure: no I/O, no clock of its own. A snapshot is state kept by every instance from the moment
it hears of it until it hears `snapshot_done`, not a message acted on once: an instance that
restarts, joins or takes a partition mid-snapshot learns it from the next re-announcement
and exports the partitions it owns then. Everything arrives on the control topic's one
partition, so every reader sees the reports in the same order, keeps the same first report
per partition, and whichever instance coordinates at the end writes the same manifest.

    snapshot_create   anyone -> all: please take a snapshot into this storage
    snapshot_request  all -> all, every ANNOUNCE_S until done: the snapshot, its deadline and
                      the reports so far (a late joiner learns the whole state from one)
    snapshot_claim    owner -> all: I am cutting partition p at offset o (progress, and who
                      was last seen on it when it times out)
    snapshot_part     owner -> all: partition p is written, cut at offset o
    snapshot_done     coordinator -> all: the manifest is written, or `error` says why not
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SNAPSHOT_CREATE = "snapshot_create"
SNAPSHOT_REQUEST = "snapshot_request"
SNAPSHOT_CLAIM = "snapshot_claim"
SNAPSHOT_PART = "snapshot_part"
SNAPSHOT_DONE = "snapshot_done"
SNAPSHOT_MESSAGES = frozenset(
    {SNAPSHOT_CREATE, SNAPSHOT_REQUEST, SNAPSHOT_CLAIM, SNAPSHOT_PART, SNAPSHOT_DONE}
)

ANNOUNCE_S = 1.0  # how often a known, unfinished snapshot is said again
FAIL_GRACE_S = 5.0  # past its deadline, any instance fails a snapshot no coordinator failed
ORPHAN_GRACE_S = 10.0  # a file found written but never reported: its writer stopped between
FINISHED_KEPT = 256  # ids of finished snapshots remembered, so a late announcement is ignored


def _int_keys(mapping: Any) -> dict[int, Any]:
    if not isinstance(mapping, Mapping):
        return {}
    out: dict[int, Any] = {}
    for key, value in mapping.items():
        try:
            out[int(key)] = value
        except (TypeError, ValueError):
            continue
    return out


@dataclass
class Snapshot:
    """One snapshot under way: what was asked, what is in, who was seen on what."""

    id: str
    storage: str
    deadline_at: float  # wall clock; the same on every instance once a request was heard
    started: bool = False  # a snapshot_request was heard: the "before" hooks passed
    parts: dict[int, dict[str, Any]] = field(default_factory=dict)  # first report stands
    claims: dict[int, dict[str, Any]] = field(default_factory=dict)  # last claim per partition
    owners: dict[int, str] = field(default_factory=dict)  # last owner seen per partition
    orphans: dict[int, float] = field(default_factory=dict)  # partition -> when found orphaned
    errors: dict[int, str] = field(default_factory=dict)  # partition -> its export's last error

    def missing(self, partitions: int) -> list[int]:
        return [p for p in range(partitions) if p not in self.parts]

    def complete(self, partitions: int) -> bool:
        return not self.missing(partitions)

    def last_seen(self, partition: int) -> str:
        """Who was last seen on `partition`, in a few words."""
        claim = self.claims.get(partition)
        if claim is not None:
            return f"claimed by {claim.get('instance')} at cut {claim.get('cut')}, never reported"
        owner = self.owners.get(partition)
        return f"last owned by {owner}, not claimed" if owner else "no owner seen"

    def why_missing(self, partitions: int) -> str:
        """One line: which partitions could not be exported and why."""
        missing = self.missing(partitions)
        grouped: dict[str, list[int]] = {}  # the same reason for several partitions, said once
        for p in missing:
            if p in self.errors:
                why = self.errors[p]
            elif p in self.orphans:
                why = "its file was written by an instance that stopped before reporting it"
            else:
                why = self.last_seen(p)
            grouped.setdefault(why, []).append(p)
        reasons = [f"{', '.join(map(str, ps))}: {why}" for why, ps in grouped.items()]
        return f"partitions {missing} not exported ({'; '.join(reasons)})"

    def announcement(self) -> dict[str, Any]:
        """The fields of a snapshot_request that carry this whole state."""
        return {
            "id": self.id,
            "storage": self.storage,
            "cut": None,
            "deadline_at": self.deadline_at,
            "parts": {str(p): r for p, r in self.parts.items()},
            "claims": {str(p): c for p, c in self.claims.items()},
            "owners": {str(p): o for p, o in self.owners.items()},
        }

    def describe(self, partitions: int, now: float) -> dict[str, Any]:
        """For /v1/stats: per partition written / claimed / waiting, and the time left."""
        state: dict[str, Any] = {}
        for p in range(partitions):
            if p in self.parts:
                report = self.parts[p]
                state[str(p)] = {
                    "state": "written",
                    "by": report.get("instance"),
                    "cut": report.get("cut"),
                }
            elif p in self.claims:
                claim = self.claims[p]
                state[str(p)] = {
                    "state": "cutting",
                    "by": claim.get("instance"),
                    "cut": claim.get("cut"),
                }
            else:
                state[str(p)] = {"state": "waiting", "owner": self.owners.get(p)}
        return {
            "id": self.id,
            "started": self.started,
            "written": len(self.parts),
            "partitions": state,
            "seconds_left": round(max(0.0, self.deadline_at - now), 1),
        }


class Progress:
    """Every snapshot this reader knows of, updated by the control topic's messages."""

    def __init__(self, partitions: int, timeout_s: float) -> None:
        self.partitions = partitions
        self.timeout_s = timeout_s
        self.snapshots: dict[str, Snapshot] = {}
        self.finished: dict[str, str] = {}  # id -> "" when written, else the error

    def on_message(self, message: Mapping[str, Any], now: float) -> Snapshot | None:
        """Apply one control message; returns the snapshot when this is the first word of it."""
        kind = message.get("type")
        snapshot_id = message.get("id")
        if kind not in SNAPSHOT_MESSAGES or not isinstance(snapshot_id, str):
            return None
        if kind == SNAPSHOT_DONE:
            self.snapshots.pop(snapshot_id, None)
            self._finish(snapshot_id, str(message.get("error") or ""))
            return None
        if snapshot_id in self.finished:
            return None
        known = self.snapshots.get(snapshot_id)
        new = known is None
        if known is None:
            if kind not in (SNAPSHOT_CREATE, SNAPSHOT_REQUEST):
                return None  # a report of a snapshot never heard of: its request will follow
            storage = message.get("storage")
            storage = storage if isinstance(storage, str) else ""
            known = Snapshot(snapshot_id, storage, deadline_at=now + self.timeout_s)
            self.snapshots[snapshot_id] = known
        if kind == SNAPSHOT_REQUEST:
            self._merge(known, message)
        elif kind == SNAPSHOT_CLAIM:
            partition = message.get("partition")
            if isinstance(partition, int):
                known.claims[partition] = {
                    "instance": message.get("instance"),
                    "cut": message.get("cut"),
                }
                known.owners[partition] = str(message.get("instance"))
        elif kind == SNAPSHOT_PART:
            partition = message.get("partition")
            if isinstance(partition, int):
                known.parts.setdefault(partition, dict(message))
                known.orphans.pop(partition, None)
        return known if new else None

    def _merge(self, known: Snapshot, message: Mapping[str, Any]) -> None:
        known.started = True
        deadline = message.get("deadline_at")
        if isinstance(deadline, int | float):
            known.deadline_at = float(deadline)  # the coordinator's: every reader agrees
        if not known.storage and isinstance(message.get("storage"), str):
            known.storage = message["storage"]
        for p, report in _int_keys(message.get("parts")).items():
            if isinstance(report, Mapping):
                known.parts.setdefault(p, dict(report))
                known.orphans.pop(p, None)
        for p, claim in _int_keys(message.get("claims")).items():
            if isinstance(claim, Mapping) and p not in known.claims:
                known.claims[p] = dict(claim)
        for p, owner in _int_keys(message.get("owners")).items():
            if isinstance(owner, str):
                known.owners[p] = owner

    def _finish(self, snapshot_id: str, error: str) -> None:
        self.finished[snapshot_id] = error
        while len(self.finished) > FINISHED_KEPT:
            del self.finished[next(iter(self.finished))]

    def to_take(self, serving: Iterable[int], busy: Iterable[int]) -> list[tuple[str, int]]:
        """(snapshot id, partition) pairs this instance should export now, oldest first."""
        busy = set(busy)
        out = []
        for snapshot in self.snapshots.values():
            if not snapshot.started:
                continue
            for p in sorted(serving):
                if p not in snapshot.parts and p not in snapshot.orphans and p not in busy:
                    out.append((snapshot.id, p))
                    busy.add(p)
        return out

    def overdue(self, now: float, *, coordinator: bool) -> list[Snapshot]:
        """Snapshots to fail now: at the deadline on the coordinator, a little later anywhere,
        or as soon as a partition's file turned out written by a writer that never reported."""
        grace = 0.0 if coordinator else FAIL_GRACE_S
        return [
            s
            for s in self.snapshots.values()
            if now > s.deadline_at + grace
            or any(now - at > ORPHAN_GRACE_S for at in s.orphans.values())
        ]

    def describe(self, now: float) -> list[dict[str, Any]]:
        return [s.describe(self.partitions, now) for s in self.snapshots.values()]
