"""Live snapshots: a consistent cut of a running application, taken over the control topic.

The messages, and the state every instance keeps of a snapshot until it is done, are in
progress.py. The cut of a partition is its input end offset when its owner takes it: the owner
processes exactly up to the cut, pauses that partition, writes its store to the snapshot, and
resumes. Other partitions keep flowing. Whoever owns a partition when its turn comes exports
it, so a partition that moves mid-snapshot (a death, a detector removal, a rebalance) is
exported by its next owner, which knows the snapshot from the re-announcements.

The instance serving partition 0 coordinates: it runs the "before" hooks and sends the first
request, writes the manifest once every partition is reported, and fails the snapshot at its
deadline with one line naming the partitions missing and why. The role moves with partition 0;
since every instance keeps the same state, the next coordinator carries on from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from enhydra.contracts.fingerprint import store_fingerprint
from enhydra.logs import get_logger
from enhydra.runner.registry import Verdict
from enhydra.snapshots.format import (
    FORMAT_VERSION,
    Cut,
    Manifest,
    PartitionFile,
    PartitionTaken,
    SnapshotError,
    file_digest,
    partition_file,
    write_partition_file,
)
from enhydra.snapshots.progress import (
    ANNOUNCE_S,
    SNAPSHOT_CLAIM,
    SNAPSHOT_CREATE,
    SNAPSHOT_DONE,
    SNAPSHOT_MESSAGES,
    SNAPSHOT_PART,
    SNAPSHOT_REQUEST,
    Progress,
    Snapshot,
)
from enhydra.snapshots.storage import open_storage

if TYPE_CHECKING:
    from enhydra.aggregate import BoundAggregate
    from enhydra.runner.runner import TaskRunner
    from enhydra.settings import Settings
    from enhydra.stores.partition import PartitionStore

__all__ = [
    "SNAPSHOT_CLAIM",
    "SNAPSHOT_CREATE",
    "SNAPSHOT_DONE",
    "SNAPSHOT_PART",
    "SNAPSHOT_REQUEST",
    "LiveSnapshots",
    "in_progress",
    "new_snapshot_id",
]

log = get_logger("enhydra.snapshots")

REPORTS = ".reports"  # in a snapshot's folder: each placed file's report, by partition and digest
TICK_S = 0.2  # how often an instance looks for partitions to export and snapshots to finish

Send = Callable[..., Awaitable[None]]
Hook = Callable[[str, dict[str, Any]], Any]  # (phase "before"/"after", info) -> None

_current: LiveSnapshots | None = None  # this process's (one per instance), for /v1/stats


def new_snapshot_id(app_id: str) -> str:
    return f"{app_id}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S%fZ}"


def in_progress() -> list[dict[str, Any]]:
    """The snapshots this instance knows are under way, per partition (for /v1/stats)."""
    live = _current
    return [] if live is None else live.progress.describe(time.time())


def _place_with_report(
    local: Path, store: str, partition: int, rows: Any, report: dict[str, Any]
) -> PartitionFile:
    """Write a partition file, leave its report beside it, then place it (never replacing).

    A placed file always has its report on disk first, so when its writer dies before sending
    the report, whoever finds the file placed sends it: a kill between the two loses nothing.
    """
    staging = local / f".staging-{uuid.uuid4().hex}"
    try:
        written = write_partition_file(staging, store, partition, rows)
        reports = local / REPORTS
        reports.mkdir(parents=True, exist_ok=True)
        left = reports / f"{partition}-{written.sha256}.json"
        tmp = reports / f".{left.name}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_bytes(orjson.dumps({**report, "file": asdict(written)}))
        os.replace(tmp, left)
        target = local / written.file
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(staging / written.file, target)  # fails if the target exists: first wins
        except FileExistsError:
            raise PartitionTaken(f"{written.file} was written by another instance first") from None
        for directory in (reports, target.parent):
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _why(exc: Exception, storage: str) -> str:
    """An export's error in a few words: an OS error names the storage, not a temp path."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__} writing to {storage}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


def left_report(local: Path, store: str, partition: int) -> dict[str, Any] | None:
    """The report left beside `partition`'s placed file (the one of that very file), if any."""
    placed = local / partition_file(store, partition)
    if not placed.is_file():
        return None
    sha256, _ = file_digest(placed)
    left = local / REPORTS / f"{partition}-{sha256}.json"
    return orjson.loads(left.read_bytes()) if left.is_file() else None


class SnapshotHost(Protocol):
    """What live snapshots need from the instance they run in (the runtime)."""

    settings: Settings

    @property
    def bound(self) -> BoundAggregate: ...

    @property
    def engine(self) -> TaskRunner | None: ...  # the current one: it is replaced after a crash

    async def run_snapshot_hooks(self, phase: str, info: dict[str, Any]) -> None: ...


class LiveSnapshots:
    """One per instance: exports its partitions' share and, while coordinating, the whole."""

    def __init__(self, owner: SnapshotHost, send: Send) -> None:
        self.owner = owner
        self.send = send
        s = owner.settings
        self.progress = Progress(s.partitions, s.snapshot_timeout_s)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._takes: dict[int, str] = {}  # partition -> the snapshot it is being exported for
        self._coordinating: set[str] = set()  # a start, finish or failure under way here
        self._announced: dict[str, float] = {}  # id -> monotonic time of the last announcement
        self._heard: dict[str, float] = {}  # id -> monotonic time this instance heard of it
        self._loop_task: asyncio.Task[None] | None = None

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        global _current
        _current = self
        self._loop_task = asyncio.create_task(self._run(), name="enhydra-snapshots")

    async def stop(self) -> None:
        for task in [self._loop_task, *self._tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def instance(self) -> str:
        return self.owner.settings.instance_id

    @property
    def partitions(self) -> int:
        return self.owner.settings.partitions

    @property
    def is_coordinator(self) -> bool:
        engine = self.owner.engine
        return engine is not None and engine.registry.access(0).verdict is Verdict.SERVE

    def _serving(self) -> list[int]:
        engine = self.owner.engine
        if engine is None:
            return []
        registry = engine.registry
        return [
            p for p in registry.active_partitions() if registry.access(p).verdict is Verdict.SERVE
        ]

    # messages --------------------------------------------------------------------------------
    async def on_message(self, message: dict[str, Any]) -> None:
        """Record what the control topic says; the loop acts on it (never blocks the reader)."""
        kind = message.get("type")
        if kind not in SNAPSHOT_MESSAGES:
            return
        snapshot_id = message.get("id")
        knew = snapshot_id in self.progress.snapshots
        first = self.progress.on_message(message, time.time())
        if first is not None:
            self._heard[first.id] = time.monotonic()
            log.info(
                "snapshot request received",
                snapshot=first.id,
                via=kind,
                origin=message.get("origin"),
                active_here=self._serving(),
            )
        if kind == SNAPSHOT_DONE and knew:
            self._forget(str(snapshot_id))
            if message.get("error"):
                log.warning("snapshot failed", snapshot=snapshot_id, error=message["error"])
            else:
                log.info("snapshot done", snapshot=snapshot_id, rows=message.get("rows"))

    def _forget(self, snapshot_id: str) -> None:
        self._announced.pop(snapshot_id, None)
        self._heard.pop(snapshot_id, None)

    # the loop --------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one bad turn must not end every later snapshot
                log.error("snapshot loop error", error=repr(exc))

    async def _tick(self) -> None:
        engine = self.owner.engine
        if engine is None or not self.progress.snapshots:
            return
        now = time.time()
        group = engine.registry.group
        serving = self._serving()
        for snapshot in self.progress.snapshots.values():
            for p in range(self.partitions):
                owner = group.active_owner(p)
                if owner:
                    snapshot.owners[p] = owner
            for p in serving:
                snapshot.owners[p] = self.instance
        for snapshot_id, partition in self.progress.to_take(serving, self._takes):
            self._takes[partition] = snapshot_id
            self._spawn(self._take(self.progress.snapshots[snapshot_id], partition))
        coordinator = self.is_coordinator
        for snapshot in list(self.progress.snapshots.values()):
            if snapshot.id in self._coordinating:
                continue
            if coordinator and not snapshot.started:
                self._coordinate(snapshot, self._begin(snapshot))
            elif coordinator and snapshot.complete(self.partitions):
                self._coordinate(snapshot, self._finish(snapshot))
        for snapshot in self.progress.overdue(now, coordinator=coordinator):
            if snapshot.id not in self._coordinating and not snapshot.complete(self.partitions):
                self._coordinate(snapshot, self._fail(snapshot))
        clock = time.monotonic()
        for snapshot in list(self.progress.snapshots.values()):
            if clock - self._announced.get(snapshot.id, 0.0) >= ANNOUNCE_S:
                self._announced[snapshot.id] = clock
                await self._announce(snapshot)

    async def _announce(self, snapshot: Snapshot) -> None:
        """Say the snapshot again: whoever joined or took a partition since learns all of it."""
        with contextlib.suppress(Exception):  # said again at the next turn
            if snapshot.started:
                fields = snapshot.announcement()
                await self.send(SNAPSHOT_REQUEST, partitions=self.partitions, **fields)
            else:
                await self.send(SNAPSHOT_CREATE, id=snapshot.id, storage=snapshot.storage)

    def _coordinate(self, snapshot: Snapshot, step: Awaitable[None]) -> None:
        self._coordinating.add(snapshot.id)

        async def run() -> None:
            try:
                await step
            except Exception as exc:  # e.g. the broker did not take the message: next turn
                log.warning(
                    "snapshot step failed; tried again", snapshot=snapshot.id, error=repr(exc)
                )
            finally:
                self._coordinating.discard(snapshot.id)

        self._spawn(run())

    # instance side ---------------------------------------------------------------------------
    async def _take(self, snapshot: Snapshot, partition: int) -> None:
        engine = self.owner.engine
        assert engine is not None
        registry = engine.registry
        bound = self.owner.bound

        def still_ours() -> bool:
            return (
                engine is self.owner.engine
                and registry.access(partition).verdict is Verdict.SERVE
                and snapshot.id not in self.progress.finished
                and partition not in snapshot.parts
            )

        try:
            target = await engine.end_offset(partition)
            cut_at = engine.stop_at(partition, target)
            await self.send(
                SNAPSHOT_CLAIM,
                id=snapshot.id,
                partition=partition,
                instance=self.instance,
                cut=target,
            )
            while not cut_at.done():
                await asyncio.sleep(0.05)
                if not still_ours():
                    log.info(
                        "snapshot partition left before its cut",
                        snapshot=snapshot.id,
                        partition=partition,
                    )
                    return
            access = registry.access(partition)
            if cut_at.cancelled() or not still_ours() or access.store is None:
                return
            offset = cut_at.result()
            started = time.monotonic()
            report = {
                "id": snapshot.id,
                "partition": partition,
                "instance": self.instance,
                "cut": offset,
                "partitions": self.partitions,
                "store": bound.name,
                "commands_topic": bound.commands_topic,
                "fingerprint": self.fingerprint(),
            }
            try:
                written = await asyncio.to_thread(
                    self._export, snapshot, partition, access.store, report
                )
            except PartitionTaken:
                # Another owner placed it first. Its report says which file the manifest keeps;
                # if that owner died before sending it, the report it left on disk is sent.
                left = await asyncio.to_thread(self._left_report, snapshot, partition)
                if left is not None and partition not in snapshot.parts:
                    log.info(
                        "snapshot partition reported for its dead writer",
                        snapshot=snapshot.id,
                        partition=partition,
                        writer=left.get("instance"),
                    )
                    await self.send(SNAPSHOT_PART, **{**left, "adopted_by": self.instance})
                elif left is None and partition not in snapshot.parts:
                    snapshot.orphans[partition] = time.time()
                log.info(
                    "snapshot partition already written", snapshot=snapshot.id, partition=partition
                )
                return
            engine.release(partition)  # the input flows again before the report goes out
            log.info(
                "snapshot partition exported",
                snapshot=snapshot.id,
                partition=partition,
                cut=offset,
                rows=written.rows,
                seconds=round(time.monotonic() - started, 3),
            )
            await self.send(SNAPSHOT_PART, **report, file=asdict(written))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            snapshot.errors[partition] = f"{self.instance}: {_why(exc, snapshot.storage)}"
            log.error(
                "snapshot partition failed; it is tried again",
                snapshot=snapshot.id,
                partition=partition,
                error=repr(exc),
            )
        finally:
            with contextlib.suppress(Exception):
                engine.release(partition)
            if self._takes.get(partition) == snapshot.id:
                del self._takes[partition]

    def _export(
        self, snapshot: Snapshot, partition: int, store: PartitionStore, report: dict[str, Any]
    ) -> PartitionFile:
        storage = open_storage(snapshot.storage)
        local = storage.local_dir(snapshot.id)
        rows = store.items(bulk=True)
        name = str(report["store"])
        if local is not None:
            return _place_with_report(local, name, partition, rows, report)
        with tempfile.TemporaryDirectory(prefix="enhydra-export-") as tmp:
            written = write_partition_file(Path(tmp), name, partition, rows)
            storage.put_file(f"{snapshot.id}/{written.file}", Path(tmp) / written.file)
            return written

    def _left_report(self, snapshot: Snapshot, partition: int) -> dict[str, Any] | None:
        """The report its writer left next to the partition's placed file, if any."""
        local = open_storage(snapshot.storage).local_dir(snapshot.id)
        if local is None:
            return None  # object storage: no report is left (a known gap, docs/snapshots.md)
        return left_report(local, self.owner.bound.name, partition)

    def fingerprint(self) -> str:
        s, bound = self.owner.settings, self.owner.bound
        return store_fingerprint(
            app_id=s.app_id,
            store=bound.name,
            partitions=s.partitions,
            commands_topic=bound.commands_topic,
            changelog_topic=bound.changelog_topic,
        )

    # coordinator side ------------------------------------------------------------------------
    async def _begin(self, snapshot: Snapshot) -> None:
        """Run the "before" hooks, then ask every instance (raising in a hook cancels it)."""
        s = self.owner.settings
        try:
            store = open_storage(snapshot.storage)
            info = {"id": snapshot.id, "storage": store.url, "app_id": s.app_id}
            await self.owner.run_snapshot_hooks("before", info)
        except Exception as exc:
            await self._end(snapshot, error=f"{type(exc).__name__}: {exc}")
            return
        snapshot.started = True
        snapshot.deadline_at = time.time() + s.snapshot_timeout_s
        log.info(
            "snapshot started",
            snapshot=snapshot.id,
            coordinator=self.instance,
            timeout_s=s.snapshot_timeout_s,
        )
        self._announced[snapshot.id] = time.monotonic()
        await self._announce(snapshot)

    async def _finish(self, snapshot: Snapshot) -> None:
        """Every partition is in: write the manifest, say so, apply retention, run "after"."""
        s = self.owner.settings
        try:
            store = open_storage(snapshot.storage)
            manifest = self._manifest(snapshot)
            data = json.dumps(manifest.to_json(), indent=2).encode()
            await asyncio.to_thread(store.put_manifest, snapshot.id, data)
        except Exception as exc:
            await self._end(snapshot, error=f"{type(exc).__name__}: {exc}")
            return
        heard = self._heard.get(snapshot.id, time.monotonic())
        seconds = round(time.monotonic() - heard, 3)
        log.info(
            "snapshot written",
            snapshot=snapshot.id,
            rows=manifest.rows,
            cut=manifest.cut.offsets,
            seconds=seconds,
        )
        await self._end(
            snapshot,
            storage=store.url,
            rows=manifest.rows,
            cut=manifest.cut.to_json(),
            seconds=seconds,
        )
        await asyncio.to_thread(self._apply_retention, store)
        info = {"id": snapshot.id, "storage": store.url, "app_id": s.app_id}
        try:  # the snapshot is taken; a failing hook cannot undo it
            await self.owner.run_snapshot_hooks(
                "after", {**info, "rows": manifest.rows, "cut": manifest.cut.to_json()}
            )
        except Exception as exc:
            log.error("snapshot after hook failed", snapshot=snapshot.id, error=repr(exc))

    async def _fail(self, snapshot: Snapshot) -> None:
        why = snapshot.why_missing(self.partitions)
        if not snapshot.orphans:
            why += f" within {self.progress.timeout_s:g} s"
        await self._end(snapshot, error=f"SnapshotError: {why}")

    async def _end(self, snapshot: Snapshot, **fields: Any) -> None:
        """Tell everyone the snapshot is over (until someone hears it, it is said again)."""
        if fields.get("error"):
            log.error("snapshot failed", snapshot=snapshot.id, error=fields["error"])
        await self.send(SNAPSHOT_DONE, id=snapshot.id, **fields)
        await self.on_message({"type": SNAPSHOT_DONE, "id": snapshot.id, **fields})

    def _manifest(self, snapshot: Snapshot) -> Manifest:
        parts = [snapshot.parts[p] for p in sorted(snapshot.parts)]
        first = parts[0]
        for part in parts:
            expected = partition_file(first["store"], part["partition"])
            if part["file"]["file"] != expected or part["fingerprint"] != first["fingerprint"]:
                raise SnapshotError(f"partition {part['partition']} does not match the others")
        return Manifest(
            format_version=FORMAT_VERSION,
            app_id=self.owner.settings.app_id,
            store=first["store"],
            fingerprint=first["fingerprint"],
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            source="live",
            cut=Cut(first["commands_topic"], {p["partition"]: p["cut"] for p in parts}),
            partitions=[PartitionFile(**p["file"]) for p in parts],
        )

    def _apply_retention(self, store: Any) -> None:
        """Delete this app's oldest snapshots beyond the newest N, before the "after" hook, so
        the hook sees the storage as it stays. The new snapshot is complete whatever happens
        here: a failed deletion is logged and retried with the next snapshot."""
        keep = self.owner.settings.snapshot_retention
        if keep <= 0:
            return
        prefix = f"{self.owner.settings.app_id}-"
        try:
            ours = [i for i in store.list_snapshots() if i.startswith(prefix)]
            for old in ours[:-keep]:
                store.delete(old)
                log.info("snapshot deleted by retention", snapshot=old, keep=keep)
        except Exception as exc:
            log.warning("retention could not delete old snapshots", keep=keep, error=repr(exc))

    async def periodic(self) -> None:
        """Every snapshot_interval_s, the coordinator asks for a snapshot (as the CLI does)."""
        s = self.owner.settings
        interval = s.snapshot_interval_s
        while interval > 0:
            await asyncio.sleep(interval)
            engine = self.owner.engine
            busy = bool(self.progress.snapshots or self._coordinating)  # one at a time
            if self.is_coordinator and engine is not None and engine.registry.ready and not busy:
                with contextlib.suppress(Exception):  # tried again at the next interval
                    await self.send(
                        SNAPSHOT_CREATE, id=new_snapshot_id(s.app_id), storage=s.snapshot_storage
                    )
