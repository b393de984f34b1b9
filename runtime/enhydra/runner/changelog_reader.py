"""Read a changelog into store partitions: restore actives to the end, keep standbys following.

One group-less consumer serves every local copy of a store, so an instance with many standbys
still holds one connection. Raw bytes go straight into RocksDB write batches: reading a
changelog never decodes values. The same reader keeps the changelog end offsets fresh, which is
what an instance reports as its lag when it joins the group.

A store opened from disk is checked once against the changelog before anything is read into
it: a copy of another history of the changelog (deleted and recreated by a reset or a snapshot
restore while this volume was kept) is wiped and restored from scratch, whether the new
changelog is shorter than its checkpoint or has grown past it.

Under at-least-once, a record a cut-off previous owner wrote after a newer owner's records
(a lower owner epoch, runner/fencing.py) is skipped, by restores and standbys alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from enhydra.kafka.clients import close, new_consumer, start
from enhydra.kafka.errors import transient
from enhydra.kafka.reading import partitions_of
from enhydra.logs import get_logger
from enhydra.runner.fencing import admit
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore, record_digest

log = get_logger("enhydra.changelog")

PROGRESS_EVERY_S = 2.0
END_OFFSETS_EVERY_S = 2.0
PROBE_TIMEOUT_S = 5.0
WAIT_FOR_KAFKA_S = 1.0
WAIT_REPORT_EVERY_S = 60.0


class Copy(Protocol):
    """A local copy of a store partition (the engine's Task)."""

    partition: int
    store: PartitionStore
    restore: dict[str, float]


@dataclass
class _Restore:
    target: int | None = None  # changelog end when the restore began; None until fetched
    start: int = 0
    restored: int = 0
    started: float = field(default_factory=time.monotonic)


def other_history(
    checkpoint: int,
    last_record: tuple[int, str] | None,
    end: int,
    found: tuple[int, str] | None,
) -> str | None:
    """Why a local store cannot be a copy of this changelog's history, or None if it can be.

    `found` is the (offset, digest) of the first changelog record at or after the store's last
    record. A different record there proves another history; a later offset (compaction removed
    that record) or no answer proves nothing, so the store is kept.
    """
    if checkpoint + 1 > end:
        return "store ahead of changelog"
    same_offset = last_record is not None and found is not None and found[0] == last_record[0]
    if same_offset and found[1] != last_record[1]:  # type: ignore[index]
        return "store holds another history of the changelog"
    return None


class ChangelogReader:
    """Restores some copies (then reports them done) and follows others indefinitely."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        on_restored: Callable[[Copy], None],
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.on_restored = on_restored
        self.end_offsets: dict[int, int] = {}
        self._restoring: dict[int, tuple[Copy, _Restore]] = {}
        self._following: dict[int, Copy] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_ends = 0.0
        self._last_report = 0.0
        self._last_wait_report = 0.0
        self.failure: BaseException | None = None
        self._checked: weakref.WeakSet[PartitionStore] = weakref.WeakSet()
        self._consumer = new_consumer(
            settings.connection,
            client_id=f"{settings.instance_id}-changelog",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            # Short long-polls: end-offset lookups queue behind an in-flight fetch on the same
            # connection, and they sit on the path of a standby's promotion.
            fetch_max_wait_ms=50,
        )

    async def start(self) -> None:
        await start(self._consumer, self.settings.connection)
        await self.refresh_end_offsets()
        self._task = asyncio.create_task(self._run(), name="enhydra-changelog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await close(self._consumer)

    # what to read ----------------------------------------------------------------------------
    def set_copies(self, restoring: dict[int, Copy], following: dict[int, Copy]) -> None:
        """Replace what is read. Takes effect before the next write: no await in between."""
        kept = {p: pair for p, pair in self._restoring.items() if restoring.get(p) is pair[0]}
        self._restoring = {p: kept.get(p) or (c, _Restore()) for p, c in restoring.items()}
        self._following = dict(following)
        wanted = [TopicPartition(self.topic, p) for p in sorted({*restoring, *following})]
        self._consumer.assign(wanted)
        for tp in wanted:
            copy = restoring.get(tp.partition) or following[tp.partition]
            self._consumer.seek(tp, copy.store.changelog_offset + 1)
        self._changed.set()

    def lag(self, partition: int, checkpoint: int) -> int | None:
        """Changelog records a copy at `checkpoint` is missing; None when the end is unknown."""
        end = self.end_offsets.get(partition)
        return None if end is None else max(0, end - (checkpoint + 1))

    @property
    def restoring(self) -> list[int]:
        return sorted(self._restoring)

    async def refresh_end_offsets(self) -> None:
        partitions = await partitions_of(self._consumer, self.topic)
        tps = [TopicPartition(self.topic, p) for p in partitions]
        if tps:
            ends = await self._consumer.end_offsets(tps)
            self.end_offsets.update({tp.partition: offset for tp, offset in ends.items()})
        self._last_ends = time.monotonic()

    # the loop --------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while True:
                try:
                    await self._step()
                except KafkaError as exc:
                    if not transient(exc):
                        raise
                    self._waiting(exc)  # the broker is away: wait for it, as the clients do
                    await asyncio.sleep(WAIT_FOR_KAFKA_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced to the engine, which stops the service
            self.failure = exc
            log.error("changelog reader failed", error=repr(exc), exc_info=exc)
            raise

    def _waiting(self, exc: KafkaError) -> None:
        now = time.monotonic()
        if now - self._last_wait_report >= WAIT_REPORT_EVERY_S:
            self._last_wait_report = now
            log.warning("changelog reader waiting for Kafka", error=repr(exc))

    async def _step(self) -> None:
        """One round: refresh ends, check and start restores, read, finish restores."""
        if time.monotonic() - self._last_ends >= END_OFFSETS_EVERY_S:
            await self.refresh_end_offsets()
        if not self._restoring and not self._following:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), END_OFFSETS_EVERY_S)
            return
        await self._check_histories()
        await self._start_pending_restores()
        # A copy already at the end (a caught-up standby becoming active) finishes now,
        # not after a fetch that has nothing to return.
        await self._finish_restores()
        if not self._restoring and not self._following:
            return
        batch = await self._consumer.getmany(timeout_ms=200, max_records=20_000)
        self._write(batch)
        await self._finish_restores()
        self._report_progress()

    def _current(self, partition: int) -> Copy | None:
        pair = self._restoring.get(partition)
        return pair[0] if pair is not None else self._following.get(partition)

    async def _check_histories(self) -> None:
        """Wipe the copies, each checked once, that hold another history of the changelog."""
        copies = [
            c
            for c in (*(pair[0] for pair in self._restoring.values()), *self._following.values())
            if c.store not in self._checked
        ]
        if not copies:
            return
        tps = {c.partition: TopicPartition(self.topic, c.partition) for c in copies}
        ends = await self._consumer.end_offsets(list(tps.values()))
        marks = {c.partition: c.store.last_record for c in copies}
        probe = {p: m[0] for p, m in marks.items() if m is not None and m[0] < ends[tps[p]]}
        found = await self._records_at(probe)
        for copy in copies:
            tp = tps[copy.partition]
            if self._current(copy.partition) is not copy:
                continue  # replaced during the awaits: its replacement is checked next pass
            checkpoint = copy.store.changelog_offset
            reason = other_history(
                checkpoint, marks[copy.partition], ends[tp], found.get(tp.partition)
            )
            if reason is not None:
                log.warning(
                    f"{reason}; wiping it",
                    partition=copy.partition,
                    checkpoint=checkpoint,
                    changelog_end=ends[tp],
                )
                copy.store.reset()  # in place: the task keeps the same store object
            self._checked.add(copy.store)
            self._consumer.seek(tp, copy.store.changelog_offset + 1)

    async def _records_at(self, offsets: dict[int, int]) -> dict[int, tuple[int, str]]:
        """(offset, digest) of the first record at or after each offset, within a few seconds.

        Unchecked copies are not written (`_write` skips them), so reading ahead here loses
        nothing: the caller seeks each back to its checkpoint.
        """
        tps = {partition: TopicPartition(self.topic, partition) for partition in offsets}
        for partition, offset in offsets.items():
            self._consumer.seek(tps[partition], offset)
        found: dict[int, tuple[int, str]] = {}
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while len(found) < len(offsets) and time.monotonic() < deadline:
            waiting = [tps[p] for p in offsets if p not in found]
            batch = await self._consumer.getmany(*waiting, timeout_ms=200)
            for tp, records in batch.items():
                if records and tp.partition not in found:
                    found[tp.partition] = (
                        records[0].offset,
                        record_digest(records[0].key, records[0].value),
                    )
        return found

    async def _start_pending_restores(self) -> None:
        pending = [
            p
            for p, (copy, r) in self._restoring.items()
            if r.target is None and copy.store in self._checked
        ]
        if not pending:
            return
        tps = [TopicPartition(self.topic, p) for p in pending]
        ends = await self._consumer.end_offsets(tps)
        begins = await self._consumer.beginning_offsets(tps)
        for tp in tps:
            pair = self._restoring.get(tp.partition)
            if pair is None:
                continue  # reassigned while we were asking
            copy, progress = pair
            self.end_offsets[tp.partition] = ends[tp]
            start = max(copy.store.changelog_offset + 1, begins[tp])
            self._consumer.seek(tp, start)
            progress.start, progress.target = start, ends[tp]
            if ends[tp] > start:
                log.info(
                    "restore started",
                    changelog=self.topic,
                    partition=tp.partition,
                    records=ends[tp] - start,
                )

    def _write(self, batch: dict[TopicPartition, list]) -> None:
        for tp, records in batch.items():
            pair = self._restoring.get(tp.partition)
            copy = pair[0] if pair is not None else self._following.get(tp.partition)
            if copy is None or not records:
                continue  # no longer ours: its new owner reads it
            if copy.store not in self._checked:
                continue  # read again from its checkpoint once checked
            if pair is not None and pair[1].target is not None:
                records = [r for r in records if r.offset < pair[1].target]
                if not records:
                    continue
            self._apply(copy, tp.partition, records)
            highwater = self._consumer.highwater(tp)
            if highwater is not None:
                self.end_offsets[tp.partition] = max(
                    highwater, self.end_offsets.get(tp.partition, 0)
                )
            if pair is not None:
                pair[1].restored += len(records)

    def _apply(self, copy: Copy, partition: int, records: list) -> None:
        """Write the records to the copy, skipping a cut-off previous owner's late writes."""
        store = copy.store
        admitted = admit(records, store.owner_epoch)
        puts, last = admitted.puts, records[-1].offset
        epoch = admitted.epoch if admitted.epoch >= 0 else None
        if admitted.skipped:
            log.warning(
                "skipped changelog records a previous owner wrote after a newer owner's",
                changelog=self.topic,
                partition=partition,
                records=admitted.skipped,
                epoch=admitted.epoch,
            )
        if admitted.last is not None and admitted.last != last:
            # The store marks its last record by offset and content: the last applied one.
            store.write(puts, changelog_offset=admitted.last, owner_epoch=epoch)
            puts = []
        store.write(puts, changelog_offset=last, owner_epoch=epoch)

    async def _finish_restores(self) -> None:
        for partition, (copy, progress) in list(self._restoring.items()):
            if progress.target is None:
                continue
            tp = TopicPartition(self.topic, partition)
            position = await self._consumer.position(tp)
            if self._restoring.get(partition, (None,))[0] is not copy:
                continue  # reassigned during the await
            copy.restore = _progress(progress, position)
            if position < progress.target:
                continue
            if copy.store.changelog_offset < progress.target - 1:
                # Trailing transaction markers or compacted gaps: the copy is current anyway.
                copy.store.write((), changelog_offset=progress.target - 1)
            del self._restoring[partition]
            # Pause rather than re-assign: a new assignment would forget the other positions.
            self._consumer.pause(tp)
            if progress.restored:
                log.info(
                    "restore finished", changelog=self.topic, partition=partition, **copy.restore
                )
            self.on_restored(copy)

    def _report_progress(self) -> None:
        """One line for the whole changelog: a store with many partitions stays readable."""
        now = time.monotonic()
        if now - self._last_report < PROGRESS_EVERY_S:
            return
        self._last_report = now
        going = [
            (partition, copy.restore)
            for partition, (copy, progress) in sorted(self._restoring.items())
            if progress.target is not None and copy.restore
        ]
        restored = sum(int(r["restored"]) for _, r in going)
        if not restored:
            return
        remaining = sum(int(r["remaining"]) for _, r in going)
        rate = sum(r["rate"] for _, r in going)
        log.info(
            "restoring",
            changelog=self.topic,
            partitions=[p for p, _ in going],
            restored=restored,
            remaining=remaining,
            rate=round(rate, 1),
            eta_s=round(remaining / rate, 1) if rate > 0 else 0.0,
        )


def _progress(progress: _Restore, position: int) -> dict[str, float]:
    elapsed = max(time.monotonic() - progress.started, 1e-6)
    remaining = max(0, (progress.target or 0) - position)
    rate = progress.restored / elapsed
    return {
        "restored": progress.restored,
        "remaining": remaining,
        "rate": round(rate, 1),
        "eta_s": round(remaining / rate, 1) if rate > 0 else 0.0,
    }
