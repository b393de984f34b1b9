"""Snapshot cuts: process a partition exactly up to an offset, then hold it for an export.

A live snapshot asks each owner to stop its partition at a cut. The runner's loop only asks
`hold` to trim a fetched batch while a cut is pending; everything else happens here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition

from enhydra.kafka.clients import Consumer


class Cuts:
    """Pending cuts of one runner: partition -> (offset to stop at, future of the actual cut)."""

    def __init__(self) -> None:
        self._stops: dict[int, tuple[int, asyncio.Future[int]]] = {}

    @property
    def pending(self) -> bool:
        return bool(self._stops)

    def holds(self, partition: int) -> bool:
        """A cut is pending or held on `partition`: its input stops on purpose."""
        return partition in self._stops

    def stop_at(self, partition: int, offset: int) -> asyncio.Future[int]:
        """Process `partition` up to `offset` (exclusive), then hold it.

        The future resolves with the actual cut: `offset`, or the position already reached if
        the partition had processed further before the request arrived.
        """
        previous = self._stops.get(partition)
        if previous is not None and not previous[1].done():
            return previous[1]
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._stops[partition] = (offset, future)
        return future

    def release(self, partition: int) -> None:
        """The export is done (or abandoned): forget the cut; the caller resumes the input."""
        stop = self._stops.pop(partition, None)
        if stop is not None and not stop[1].done():
            stop[1].cancel()

    def hold(self, consumer: Consumer, tp: TopicPartition, records: list[Any]) -> list[Any]:
        """The records of a fetched batch before the partition's cut; the rest is read again."""
        stop = self._stops.get(tp.partition)
        if stop is None or not records or records[-1].offset < stop[0]:
            return records
        consumer.seek(tp, stop[0])
        consumer.pause(tp)
        return [r for r in records if r.offset < stop[0]]

    async def settle(self, consumer: Consumer, topic: str, serving: set[int]) -> None:
        """Resolve the cuts whose partition has processed up to its offset (no batch in flight)."""
        assigned = consumer.assignment()
        for partition, (offset, future) in list(self._stops.items()):
            tp = TopicPartition(topic, partition)
            if future.done() or partition not in serving or tp not in assigned:
                continue
            position = await consumer.position(tp)
            if position >= offset:
                consumer.pause(tp)
                future.set_result(position)
