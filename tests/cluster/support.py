"""The production-cluster tests' harness: the fault tests' scenario with no replication setting.

`BrokerDefaults` starts the ledger instances without ENHYDRA_REPLICATION_FACTOR or
ENHYDRA_MIN_INSYNC_REPLICAS, so every topic gets what the cluster's brokers default to (RF 3,
min ISR 2 in the `kafka_cluster` fixture). `GrowthWatch` samples the events topic's end
offsets while a fault runs and keeps the longest stretch in which they did not move.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from enhydra.kafka.clients import as_connection, open_admin, open_consumer
from enhydra.kafka.reading import partitions_of
from tests.faults.support import Scenario

DURABLE = (3, 2)  # (replicas, min.insync.replicas) the cluster's brokers default to
SAMPLE_EVERY = 0.2  # s between two looks at the events topic's end offsets


class BrokerDefaults(Scenario):
    """A Scenario whose instances carry no replication setting at all."""

    def instance_env(self, lane: str) -> dict[str, str]:
        assert not any("REPLICATION" in k or "INSYNC" in k for k in self.extra_env)
        env = super().instance_env(lane)
        del env["ENHYDRA_REPLICATION_FACTOR"]
        return env


async def durability(bootstrap: str, prefix: str) -> dict[str, tuple[int, int]]:
    """(fewest replicas of any partition, effective min.insync.replicas) of each prefix* topic.

    The effective value, wherever it comes from (topic or broker): a topic left to the
    broker's default is as durable as one that states it.
    """
    async with open_admin(as_connection(bootstrap)) as admin:
        names = sorted(t for t in await admin.list_topics() if t.startswith(prefix))
        if not names:
            return {}
        described = {t["topic"]: t for t in await admin.describe_topics(names)}
        wanted = {"min.insync.replicas": None}
        resources = [ConfigResource(ConfigResourceType.TOPIC, n, wanted) for n in names]
        found: dict[str, tuple[int, int]] = {}
        for response in await admin.describe_configs(resources):
            for _code, _msg, _type, name, entries in response.resources:
                [entry] = entries
                replicas = min(len(p["replicas"]) for p in described[name]["partitions"])
                found[name] = (replicas, int(entry[1]))
        return found


async def out_of_isr(bootstrap: str, node: int) -> list[str]:
    """Partitions (topic-partition) that have `node` as a replica but not in their ISR."""
    async with open_admin(as_connection(bootstrap)) as admin:
        topics = await admin.describe_topics(list(await admin.list_topics()))
    return [
        f"{t['topic']}-{p['partition']}"
        for t in topics
        for p in t["partitions"]
        if node in p["replicas"] and node not in p["isr"]
    ]


async def wait_in_isr(bootstrap: str, node: int, timeout: float = 90.0) -> float:
    """Wait until `node` is back in the ISR of every partition it replicates; seconds taken."""
    started = time.monotonic()
    behind: list[str] = ["(not looked yet)"]
    while time.monotonic() - started < timeout:
        with contextlib.suppress(Exception):  # a node still starting: look again
            behind = await out_of_isr(bootstrap, node)
            if not behind:
                return time.monotonic() - started
        await asyncio.sleep(0.5)
    raise TimeoutError(f"node {node} not back in the ISR after {timeout:.0f} s: {behind[:5]}")


@dataclass
class GrowthWatch:
    """The events topic's end offsets, sampled every SAMPLE_EVERY s until stopped.

    `longest_pause` is the longest time between two samples in which some partition grew.
    Each partition is asked on its own with a 1 s limit, so a partition whose leader is gone
    does not hide the others' growth (nor stretch the pause by the sampler's own wait).
    """

    bootstrap: str
    topic: str
    samples: int = 0
    longest_pause: float = 0.0
    paused_until: float = 0.0  # when the longest pause ended, seconds after start
    slowest_sample: float = 0.0
    marks: list[tuple[float, str]] = field(default_factory=list)  # (s after start, what)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _started: float = 0.0

    def mark(self, what: str) -> None:
        self.marks.append((round(time.monotonic() - self._started, 1), what))

    async def run(self) -> None:
        self._started = time.monotonic()
        async with open_consumer(as_connection(self.bootstrap)) as consumer:
            tps = [TopicPartition(self.topic, p) for p in await partitions_of(consumer, self.topic)]

            async def end_of(tp: TopicPartition) -> int | None:
                """One partition at a time: a dead leader delays its own sample only."""
                try:
                    return (await asyncio.wait_for(consumer.end_offsets([tp]), 1.0))[tp]
                except Exception:  # no answer now: this partition did not visibly grow
                    return None

            known: dict[TopicPartition, int] = {}
            grew = now = time.monotonic()
            while not self._stop.is_set():
                before = time.monotonic()
                ends = await asyncio.gather(*(end_of(tp) for tp in tps))
                now = time.monotonic()
                self.slowest_sample = max(self.slowest_sample, now - before)
                self.samples += 1
                fresh = {tp: end for tp, end in zip(tps, ends, strict=True) if end is not None}
                if any(end > known.get(tp, end) for tp, end in fresh.items()):
                    if now - grew > self.longest_pause:
                        self.longest_pause, self.paused_until = now - grew, now - self._started
                    grew = now
                known.update(fresh)
                await asyncio.sleep(max(0.0, SAMPLE_EVERY - (time.monotonic() - before)))
            if now - grew > self.longest_pause:  # a pause that never ended
                self.longest_pause, self.paused_until = now - grew, now - self._started

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> str:
        return (
            f"events end offsets: longest pause {self.longest_pause:.1f}s "
            f"(ended at +{self.paused_until:.1f}s), {self.samples} samples, slowest sample "
            f"{self.slowest_sample:.1f}s; marks {self.marks}"
        )
