"""Snapshots from the outside: ask a running app for one, clone, restore, time travel.

These run from the `enhydra snapshot` command (or a test), not inside an instance:

- `request_snapshot` asks the running application over its control topic and waits;
- `clone` starts a new application Y from a snapshot: Y's changelog holds the snapshot's state
  and Y's consumer group starts at the cut, so Y continues exactly from there;
- `restore` brings an application back to a snapshot (disaster recovery; instances stopped);
- `snapshot_at` rebuilds the state as of a time by folding the events topic through `apply`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from enhydra.aggregate import BoundAggregate
from enhydra.contracts.fingerprint import store_fingerprint
from enhydra.contracts.fold_input import kafka_events_batch
from enhydra.contracts.names import control_topic_name
from enhydra.control.signing import Verifier, seal
from enhydra.kafka.clients import as_connection, open_admin, open_consumer, open_producer
from enhydra.kafka.groups import commit_offsets, group_members
from enhydra.kafka.reading import TopicMissing, end_offsets, partitions_of, read_to_end
from enhydra.kafka.topics import TopicError, TopicSpec, ensure_topics, recreate_topics
from enhydra.runner.checkpoint import send_in_batches
from enhydra.settings import Connection
from enhydra.snapshots.format import (
    Cut,
    Manifest,
    Snapshot,
    SnapshotError,
    SnapshotWriter,
    read_ahead,
    reset_input_offsets,
)
from enhydra.snapshots.live import new_snapshot_id
from enhydra.snapshots.progress import SNAPSHOT_CREATE, SNAPSHOT_DONE
from enhydra.snapshots.progress import Progress as SnapshotProgress

Progress = Callable[[int], None]  # advance by n
_FOLD_BATCH = 10_000  # events per Arrow batch of the time-travel fold
ORIGIN = "enhydra-cli"
ASK_AGAIN_S = 5.0  # a create nobody answered is sent again (instances know it by its id)


# ---------------------------------------------------------------------------- live request
async def request_snapshot(
    conn: Connection | str,
    app_id: str,
    storage: str,
    *,
    timeout: float = 300.0,
    progress: Callable[[dict[str, Any]], None] | None = None,
    secret: bytes | None = None,
) -> dict[str, Any]:
    """Ask the running application for a snapshot; returns the coordinator's done message.

    `progress` gets the snapshot's state per partition (progress.py) whenever it changes. On
    timeout the error names the partitions still missing and who was last seen on them. With
    the app's control secret the request is signed and only signed replies count.
    """
    topic = control_topic_name(app_id)
    snapshot_id = new_snapshot_id(app_id)
    conn = as_connection(conn)
    state = SnapshotProgress(0, timeout)  # the partition count comes with the first announcement
    async with open_consumer(conn) as consumer, open_producer(conn, acks="all") as producer:
        if not await partitions_of(consumer, topic):
            raise SnapshotError(f"no control topic {topic!r}: is {app_id!r} running?")
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)
        message = {
            "type": SNAPSHOT_CREATE,
            "id": snapshot_id,
            "storage": storage,
            "origin": ORIGIN,
        }
        verifier = Verifier(secret, app=app_id)
        value, headers = seal(message, secret, app=app_id)
        await producer.send_and_wait(topic, value, headers=headers)
        deadline = time.monotonic() + timeout
        last_ask = time.monotonic()
        heard = False
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            changed = False
            for records in batch.values():
                for record in records:
                    reply, refused = verifier.check(record.value, record.headers or ())
                    if reply is None or refused or reply.get("id") != snapshot_id:
                        continue
                    if reply.get("type") != SNAPSHOT_CREATE or reply.get("origin") != ORIGIN:
                        heard = True  # not just our own request coming back
                    if reply.get("type") == SNAPSHOT_DONE:
                        if reply.get("error"):
                            raise SnapshotError(f"snapshot {snapshot_id} failed: {reply['error']}")
                        return reply
                    if isinstance(reply.get("partitions"), int):
                        state.partitions = reply["partitions"]
                    state.on_message(reply, time.time())
                    changed = True
            snapshot = state.snapshots.get(snapshot_id)
            if changed and progress is not None and snapshot is not None and state.partitions:
                progress(snapshot.describe(state.partitions, time.time()))
            if not heard and time.monotonic() - last_ask > ASK_AGAIN_S:
                # Nobody answered (no instance read it yet, e.g. all were restarting): again.
                value, headers = seal(message, secret, app=app_id)  # a fresh nonce
                await producer.send_and_wait(topic, value, headers=headers)
                last_ask = time.monotonic()
        snapshot = state.snapshots.get(snapshot_id)
        if snapshot is None or not state.partitions:
            raise SnapshotError(
                f"no answer for snapshot {snapshot_id} within {timeout:g}s: is {app_id!r} "
                "running, with the same ENHYDRA_CONTROL_SECRET and ENHYDRA_SNAPSHOT_STORAGE?"
            )
        raise SnapshotError(
            f"snapshot {snapshot_id} not done within {timeout:g}s: "
            f"{snapshot.why_missing(state.partitions)}"
        )


# ---------------------------------------------------------------------------- clone, restore
@dataclass(frozen=True)
class CloneResult:
    app_id: str
    commands_topic: str
    changelog_topic: str
    rows: int
    offsets: dict[int, int]
    resumes_at_cut: bool


async def _refuse_running(conn: Connection, app_id: str) -> None:
    async with open_admin(conn) as admin:
        if await group_members(admin, app_id):
            raise SnapshotError(f"application {app_id!r} has running instances: stop them first")


async def _load_changelog(
    conn: Connection,
    snapshot: Snapshot,
    changelog: str,
    *,
    reset_offsets: bool,
    progress: Progress | None,
) -> int:
    producer_settings = {
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 20,
        "max_batch_size": 512 * 1024,
    }
    rows = 0
    async with open_producer(conn, **producer_settings) as producer:
        # Whole record batches per call (send_in_batches), a batch of the file at a time; the
        # acknowledgements of one are awaited while the next is sent, so memory stays bounded.
        waiting: list[tuple[asyncio.Future, int]] = []
        for partition in sorted(snapshot.partitions):
            batches = snapshot.iter_batches(partition, ["key", "value"])
            for batch in read_ahead(batches):
                values = batch.column(1)
                if reset_offsets:
                    # The clone reads another commands topic: the source's input offsets
                    # mean nothing there and would make it skip its first commands.
                    values = reset_input_offsets(values)
                records = list(zip(batch.column(0).to_pylist(), values.to_pylist(), repeat(None)))
                sent = await send_in_batches(producer, {(changelog, partition): records})
                rows += len(records)
                await _acknowledged(waiting, progress)
                waiting = [(future, count) for _, future, count in sent]
        await _acknowledged(waiting, progress)
    return rows


async def _acknowledged(sent: list[tuple[asyncio.Future, int]], progress: Progress | None) -> None:
    """Wait for sent batches; progress advances by each batch's records once it is acked."""
    await asyncio.gather(*(future for future, _ in sent))
    if progress is not None:
        for _, count in sent:
            progress(count)


async def clone(
    snapshot: Snapshot,
    *,
    conn: Connection | str,
    to_app: str,
    commands_topic: str | None = None,
    progress: Progress | None = None,
) -> CloneResult:
    """Make application `to_app` start from `snapshot` (its instances must not be running)."""
    manifest = snapshot.manifest
    partitions = len(manifest.partitions)
    source_topic = manifest.cut.topic
    commands = commands_topic or source_topic
    same_input = commands == source_topic
    changelog = f"{to_app}-{manifest.store}-changelog"
    conn = as_connection(conn)
    await _refuse_running(conn, to_app)
    specs = [TopicSpec(changelog, partitions, compacted=True)]
    if not same_input:
        specs.append(TopicSpec(commands, partitions))
    try:
        await ensure_topics(conn, specs)
    except TopicError as exc:  # e.g. a replication factor the cluster cannot meet
        raise SnapshotError(str(exc)) from exc
    if any((await end_offsets(conn, changelog)).values()):
        raise SnapshotError(f"{changelog} already holds records: clone into a new app id")
    rows = await _load_changelog(
        conn, snapshot, changelog, reset_offsets=not same_input, progress=progress
    )
    offsets = dict(manifest.cut.offsets) if same_input else {}
    if offsets:
        await commit_offsets(conn, to_app, commands, offsets)
    return CloneResult(to_app, commands, changelog, rows, offsets, same_input)


async def restore(
    snapshot: Snapshot,
    *,
    conn: Connection | str,
    app_id: str,
    progress: Progress | None = None,
) -> CloneResult:
    """Put `app_id` back to `snapshot`: its changelog replaced, its group rewound to the cut."""
    manifest = snapshot.manifest
    changelog = f"{app_id}-{manifest.store}-changelog"
    conn = as_connection(conn)
    await _refuse_running(conn, app_id)
    try:
        await recreate_topics(
            conn, [TopicSpec(changelog, len(manifest.partitions), compacted=True)]
        )
    except TopicError as exc:
        raise SnapshotError(str(exc)) from exc
    rows = await _load_changelog(conn, snapshot, changelog, reset_offsets=False, progress=progress)
    await commit_offsets(conn, app_id, manifest.cut.topic, dict(manifest.cut.offsets))
    return CloneResult(
        app_id, manifest.cut.topic, changelog, rows, dict(manifest.cut.offsets), True
    )


# ---------------------------------------------------------------------------- time travel
async def _read_events_until(
    conn: Connection, topic: str, until_ms: int, progress: Progress | None
) -> tuple[list[tuple[bytes, int, int, bytes, list]], list[int]]:
    rows: list[tuple[bytes, int, int, bytes, list]] = []
    async with open_consumer(conn, isolation_level="read_committed") as consumer:
        partitions = await partitions_of(consumer, topic)
        try:
            async for partition, records in read_to_end(consumer, topic, max_records=20000):
                rows.extend(
                    (r.key, partition, r.offset, r.value, list(r.headers or ()))
                    for r in records
                    if r.timestamp <= until_ms
                )
                if progress is not None:
                    progress(len(records))
        except TopicMissing:
            raise SnapshotError(f"no events topic {topic!r}") from None
    return rows, partitions


async def snapshot_at(
    bound: BoundAggregate,
    *,
    conn: Connection | str,
    app_id: str,
    until: dt.datetime,
    output: Path,
    dedup_window: int = 100,
    progress: Progress | None = None,
) -> Manifest:
    """The state as of `until`: the events up to then, folded through the service's `apply`.

    For data that fits one process; the PySpark backfill job does the same fold at scale. An
    event the fold cannot read (not JSON, a version newer than this code) is a SnapshotError
    naming it.
    """
    from enhydra.spark.fold import FoldError, fold_batches

    until_ms = int(until.timestamp() * 1000)
    events, partitions = await _read_events_until(
        as_connection(conn), bound.events_topic, until_ms, progress
    )
    events.sort(key=lambda row: (row[0], row[1], row[2]))
    batches = [
        kafka_events_batch(events[i : i + _FOLD_BATCH]) for i in range(0, len(events), _FOLD_BATCH)
    ]
    per_partition: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in partitions}
    last: dict[int, int] = dict.fromkeys(partitions, -1)
    try:
        for batch in fold_batches(batches, bound.aggregate, dedup_window=dedup_window):
            for key, partition, value, offset in zip(
                batch.column("key").to_pylist(),
                batch.column("partition").to_pylist(),
                batch.column("value").to_pylist(),
                batch.column("last_offset").to_pylist(),
                strict=True,
            ):
                per_partition[partition].append((key, value))
                last[partition] = max(last[partition], offset)
    except FoldError as exc:
        raise SnapshotError(f"cannot fold {bound.events_topic}: {exc}") from exc
    writer = SnapshotWriter(
        output,
        app_id=app_id,
        store=bound.name,
        fingerprint=store_fingerprint(
            app_id=app_id,
            store=bound.name,
            partitions=len(partitions),
            commands_topic=bound.commands_topic,
            changelog_topic=bound.changelog_topic,
        ),
        source=f"time-travel:{until.isoformat()}",
    )
    for partition, rows in per_partition.items():
        writer.write_partition(partition, sorted(rows))
    cut = Cut(bound.commands_topic, {p: last[p] + 1 for p in partitions})
    return writer.finish(cut, partitions=len(partitions))
