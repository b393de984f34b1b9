"""Bring store partitions up to date with their changelog, in batches, with progress.

Reads from each store's checkpoint to the changelog's end as it was when the restore began;
anything written after that is this instance's own output once it becomes active. Raw bytes go
straight into RocksDB write batches: restoring never decodes values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from enhydra.logs import get_logger
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore

log = get_logger("enhydra.restore")

PROGRESS_EVERY_S = 2.0


class HasStore(Protocol):
    partition: int
    store: PartitionStore
    restore: dict[str, float]


@dataclass
class _Progress:
    start_offset: int
    end_offset: int
    restored: int = 0
    started: float = 0.0

    @property
    def total(self) -> int:
        return max(0, self.end_offset - self.start_offset)

    def as_dict(self, position: int) -> dict[str, float]:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        remaining = max(0, self.end_offset - position)
        rate = self.restored / elapsed
        return {
            "restored": self.restored,
            "remaining": remaining,
            "rate": round(rate, 1),
            "eta_s": round(remaining / rate, 1) if rate > 0 else 0.0,
        }


class Restorer:
    """A group-less consumer of one changelog topic that fills store partitions."""

    def __init__(self, settings: Settings, changelog_topic: str) -> None:
        self.settings = settings
        self.topic = changelog_topic
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            client_id=f"{settings.instance_id}-restore",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def restore(self, tasks: dict[int, HasStore]) -> None:
        consumer = self._consumer
        tps = {TopicPartition(self.topic, p): t for p, t in tasks.items()}
        consumer.assign(list(tps))
        ends = await consumer.end_offsets(list(tps))
        begins = await consumer.beginning_offsets(list(tps))
        pending: dict[TopicPartition, _Progress] = {}
        for tp, task in tps.items():
            start = task.store.changelog_offset + 1
            if start > ends[tp]:
                # The changelog is shorter than what we hold: it was deleted and recreated
                # (an application reset). Local state is from another history; drop it.
                log.warning(
                    "store ahead of changelog; wiping",
                    partition=tp.partition,
                    checkpoint=start - 1,
                    changelog_end=ends[tp],
                )
                path = task.store.path
                task.store.close()
                PartitionStore.wipe(path)
                task.store = PartitionStore(path)
                start = 0
            start = max(start, begins[tp])
            if start >= ends[tp]:
                task.restore = {"restored": 0, "remaining": 0, "rate": 0.0, "eta_s": 0.0}
                continue
            consumer.seek(tp, start)
            pending[tp] = _Progress(start, ends[tp], started=time.monotonic())
        if not pending:
            consumer.assign([])
            return
        log.info(
            "restore started",
            topic=self.topic,
            partitions={tp.partition: p.total for tp, p in pending.items()},
        )
        last_report = time.monotonic()
        while pending:
            batch = await consumer.getmany(*pending, timeout_ms=500, max_records=20000)
            for tp, records in batch.items():
                progress = pending.get(tp)
                if progress is None:
                    continue
                records = [r for r in records if r.offset < progress.end_offset]
                if not records:
                    continue
                task = tps[tp]
                task.store.write(
                    ((r.key, r.value) for r in records), changelog_offset=records[-1].offset
                )
                progress.restored += len(records)
            for tp in list(pending):
                position = await consumer.position(tp)
                progress = pending[tp]
                tps[tp].restore = progress.as_dict(position)
                if position >= progress.end_offset:
                    if tps[tp].store.changelog_offset < progress.end_offset - 1:
                        # Trailing transaction markers or compacted gaps: the store is current.
                        tps[tp].store.write((), changelog_offset=progress.end_offset - 1)
                    log.info("restore finished", partition=tp.partition, **tps[tp].restore)
                    del pending[tp]
            now = time.monotonic()
            if pending and now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                for tp in pending:
                    log.info("restoring", partition=tp.partition, **tps[tp].restore)
        consumer.assign([])
