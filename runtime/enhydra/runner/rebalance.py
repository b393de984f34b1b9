"""The consumer-group callbacks every engine needs, forwarded to the engine's own handlers."""

from __future__ import annotations

from typing import Protocol

from aiokafka import ConsumerRebalanceListener, TopicPartition


class RebalanceHandler(Protocol):
    async def _on_revoked(self, revoked: set[TopicPartition]) -> None: ...

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None: ...


class ForwardingListener(ConsumerRebalanceListener):
    """aiokafka wants a listener object; engines keep their handlers as methods."""

    def __init__(self, engine: RebalanceHandler) -> None:
        self.engine = engine

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.engine._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.engine._on_assigned(assigned)
