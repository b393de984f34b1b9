"""Live snapshots: a consistent cut of a running application, taken over the control topic.

    snapshot_create   anyone -> the coordinator: please take a snapshot into this storage
    snapshot_request  coordinator -> every instance: export your active partitions at the cut
    snapshot_part     instance -> coordinator: partition p is written, cut at offset o
    snapshot_done     coordinator -> everyone: the manifest is written (or `error` says why not)

The coordinator is the instance running partition 0 (any instance could be; one must be). The
cut of a partition is its input end offset when the request reaches its owner, unless the
request fixes it: the owner processes exactly up to the cut, pauses the partition, writes its
store to the snapshot, and resumes. Other partitions keep flowing meanwhile. Every instance
remembers the requests it saw, so when a partition moves during a snapshot its new owner takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from enhydra.contracts.fingerprint import store_fingerprint
from enhydra.logs import get_logger
from enhydra.snapshots.format import (
    FORMAT_VERSION,
    Cut,
    Manifest,
    PartitionFile,
    PartitionTaken,
    SnapshotError,
    partition_file,
    write_partition_file,
)
from enhydra.snapshots.storage import open_storage

if TYPE_CHECKING:
    from enhydra.aggregate import BoundAggregate
    from enhydra.runner.runner import TaskRunner
    from enhydra.settings import Settings
    from enhydra.stores.partition import PartitionStore

log = get_logger("enhydra.snapshots")

SNAPSHOT_CREATE = "snapshot_create"
SNAPSHOT_REQUEST = "snapshot_request"
SNAPSHOT_PART = "snapshot_part"
SNAPSHOT_DONE = "snapshot_done"

Send = Callable[..., Awaitable[None]]
Hook = Callable[[str, dict[str, Any]], Any]  # (phase "before"/"after", info) -> None


def new_snapshot_id(app_id: str) -> str:
    return f"{app_id}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S%fZ}"


@dataclass
class _Request:
    id: str
    storage: str
    cut: dict[int, int] | None
    taken: set[int] = field(default_factory=set)  # partitions someone reported


@dataclass
class _Collecting:
    id: str
    storage: str
    parts: dict[int, dict[str, Any]] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class SnapshotHost(Protocol):
    """What live snapshots need from the instance they run in (the runtime)."""

    settings: Settings

    @property
    def bound(self) -> BoundAggregate: ...

    @property
    def engine(self) -> TaskRunner | None: ...  # the current one: it is replaced after a crash

    async def run_snapshot_hooks(self, phase: str, info: dict[str, Any]) -> None: ...


class LiveSnapshots:
    """One per instance: takes its partitions' share and, on the coordinator, the whole."""

    def __init__(self, owner: SnapshotHost, send: Send) -> None:
        self.owner = owner
        self.send = send
        self._requests: dict[str, _Request] = {}
        self._collecting: dict[str, _Collecting] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._busy: set[tuple[str, int]] = set()  # (snapshot id, partition) being taken here
        self._loop_task: asyncio.Task[None] | None = None

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
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
    def is_coordinator(self) -> bool:
        engine = self.owner.engine
        return engine is not None and engine.active_store(0) is not None

    # messages --------------------------------------------------------------------------------
    async def on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == SNAPSHOT_CREATE and self.is_coordinator:
            self._spawn(self.create(message["id"], message.get("storage") or None))
        elif kind == SNAPSHOT_REQUEST:
            cut = message.get("cut")
            self._requests.setdefault(
                message["id"],
                _Request(
                    message["id"],
                    message["storage"],
                    {int(p): o for p, o in cut.items()} if cut else None,
                ),
            )
        elif kind == SNAPSHOT_PART:
            request = self._requests.get(message["id"])
            if request is not None:
                request.taken.add(message["partition"])
            collecting = self._collecting.get(message["id"])
            if collecting is not None:
                # the first report stands: it describes the file that was kept
                collecting.parts.setdefault(message["partition"], message)
                if len(collecting.parts) >= message["partitions"]:
                    collecting.done.set()
        elif kind == SNAPSHOT_DONE:
            request = self._requests.pop(message["id"], None)
            engine = self.owner.engine
            if request is not None and engine is not None:
                for partition in list(engine.registry.tasks):
                    if partition not in request.taken:
                        engine.release(partition)

    # instance side ---------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            engine = self.owner.engine
            if engine is None:
                continue
            for request in list(self._requests.values()):
                for partition in engine.registry.active_partitions():
                    key = (request.id, partition)
                    if partition in request.taken or key in self._busy:
                        continue
                    self._busy.add(key)
                    self._spawn(self._take(request, partition, key))

    async def _take(self, request: _Request, partition: int, key: tuple[str, int]) -> None:
        engine = self.owner.engine
        settings = self.owner.settings
        bound = self.owner.bound
        try:
            if request.cut is not None and partition in request.cut:
                target = request.cut[partition]
            else:
                target = await engine.end_offset(partition)
            cut_at = engine.stop_at(partition, target)
            while not cut_at.done():
                await asyncio.sleep(0.05)
                if engine is not self.owner.engine or engine.active_store(partition) is None:
                    engine.release(partition)  # moved away: its new owner takes it
                    return
            offset = cut_at.result()
            store = engine.active_store(partition)
            if store is None:
                engine.release(partition)
                return
            started = time.monotonic()
            try:
                written = await asyncio.to_thread(
                    self._export, request, partition, store, bound.name
                )
            except PartitionTaken:
                # moved during the snapshot and exported by its other owner too: that copy is
                # the one in the snapshot, and it reports it
                engine.release(partition)
                log.info(
                    "snapshot partition already written", snapshot=request.id, partition=partition
                )
                return
            engine.release(partition)
            log.info(
                "snapshot partition written",
                snapshot=request.id,
                partition=partition,
                cut=offset,
                rows=written.rows,
                seconds=round(time.monotonic() - started, 3),
            )
            await self.send(
                SNAPSHOT_PART,
                id=request.id,
                partition=partition,
                cut=offset,
                partitions=settings.partitions,
                store=bound.name,
                commands_topic=bound.commands_topic,
                fingerprint=self.fingerprint(),
                file=asdict(written),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error(
                "snapshot partition failed",
                snapshot=request.id,
                partition=partition,
                error=repr(exc),
            )
            with contextlib.suppress(Exception):
                engine.release(partition)
        finally:
            self._busy.discard(key)

    def _export(
        self, request: _Request, partition: int, store: PartitionStore, name: str
    ) -> PartitionFile:
        storage = open_storage(request.storage)
        local = storage.local_dir(request.id)
        rows = store.items(bulk=True)
        if local is not None:
            return write_partition_file(local, name, partition, rows, exclusive=True)
        with tempfile.TemporaryDirectory(prefix="enhydra-export-") as tmp:
            written = write_partition_file(Path(tmp), name, partition, rows)
            storage.put_file(f"{request.id}/{written.file}", Path(tmp) / written.file)
            return written

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
    async def create(self, snapshot_id: str | None = None, storage: str | None = None) -> str:
        """Take a snapshot of the whole application; returns its id (raises on failure)."""
        s = self.owner.settings
        snapshot_id = snapshot_id or new_snapshot_id(s.app_id)
        storage_url = storage or s.snapshot_storage
        try:
            store = open_storage(storage_url)
            info = {"id": snapshot_id, "storage": store.url, "app_id": s.app_id}
            await self.owner.run_snapshot_hooks("before", info)
            collecting = self._collecting[snapshot_id] = _Collecting(snapshot_id, storage_url)
            started = time.monotonic()
            await self.send(SNAPSHOT_REQUEST, id=snapshot_id, storage=storage_url, cut=None)
            deadline = started + s.snapshot_timeout_s
            while not collecting.done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(collecting.done.wait(), 10)
                if time.monotonic() > deadline:
                    missing = sorted(set(range(s.partitions)) - set(collecting.parts))
                    raise SnapshotError(f"partitions {missing} not written in time")
                if not collecting.done.is_set():  # a partition may have moved: ask again
                    await self.send(SNAPSHOT_REQUEST, id=snapshot_id, storage=storage_url, cut=None)
            manifest = self._manifest(snapshot_id, collecting)
            store.put_manifest(snapshot_id, json.dumps(manifest.to_json(), indent=2).encode())
            seconds = round(time.monotonic() - started, 3)
            log.info(
                "snapshot written",
                snapshot=snapshot_id,
                rows=manifest.rows,
                cut=manifest.cut.offsets,
                seconds=seconds,
            )
            await self.send(
                SNAPSHOT_DONE,
                id=snapshot_id,
                storage=store.url,
                rows=manifest.rows,
                cut=manifest.cut.to_json(),
                seconds=seconds,
            )
            await asyncio.to_thread(self._apply_retention, store)
            await self.owner.run_snapshot_hooks(
                "after", {**info, "rows": manifest.rows, "cut": manifest.cut.to_json()}
            )
            return snapshot_id
        except Exception as exc:
            log.error("snapshot failed", snapshot=snapshot_id, error=repr(exc))
            with contextlib.suppress(Exception):
                await self.send(SNAPSHOT_DONE, id=snapshot_id, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._collecting.pop(snapshot_id, None)

    def _manifest(self, snapshot_id: str, collecting: _Collecting) -> Manifest:
        parts = [collecting.parts[p] for p in sorted(collecting.parts)]
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
        """Every snapshot_interval_s, the coordinator takes a snapshot."""
        interval = self.owner.settings.snapshot_interval_s
        while interval > 0:
            await asyncio.sleep(interval)
            if self.is_coordinator and self.owner.engine.registry.ready:
                with contextlib.suppress(Exception):  # logged in create()
                    await self.create()
