"""The low-latency path keeps the batch order: overlapping batches publish and persist in order.

Commands arrive a few hundred at a time, so the runner computes a batch while the previous one
is still being made durable, in slices with the event loop let through between them
(runner.py). Whatever overlaps, each partition's events must come out in command order and
exactly once, the changelog's last record of each key must be its state, and /metrics must
count every command in the end-to-end latency histogram and every batch in each phase.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enhydra.contracts.codec import decode_entry
from enhydra.contracts.headers import COMMAND_OFFSET_HEADER, EVENT_INDEX_HEADER
from enhydra.testing.processes import read_topic, wait_for_committed
from ledger.workload import generate, model
from tests.integration.ledger_support import produce_in_chunks, read_accounts

pytestmark = [pytest.mark.integration, pytest.mark.timing]

TARGET = "ledger.service:service"


def test_overlapping_batches_keep_the_order_and_every_command_is_timed(
    service_factory, kafka_bootstrap, app_id
):
    one = service_factory(TARGET, "lat1")
    one.wait_ready()
    commands = generate(300, 20000, seed=5)
    topic = f"{app_id}-commands"
    asyncio.run(produce_in_chunks(kafka_bootstrap, topic, commands, chunk=400, pause=0.02))
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, topic, timeout=120))

    expected = model(commands)
    assert read_accounts([one], sorted(expected)) == expected

    # Events: per partition in command order, each (command, index) once.
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    assert len(events) == sum(state["version"] for state in expected.values())
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for event in events:
        headers = dict(event.headers)
        source = (int(headers[COMMAND_OFFSET_HEADER]), int(headers[EVENT_INDEX_HEADER]))
        by_partition.setdefault(event.partition, []).append(source)
    for partition, sources in by_partition.items():
        assert all(a < b for a, b in itertools.pairwise(sources)), partition

    # The changelog: its last record of each key is the key's state.
    last: dict[str, bytes] = {}
    for record in asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-accounts-changelog")):
        last[record.key.decode()] = record.value
    assert {key: decode_entry(value).state for key, value in last.items()} == expected

    status, stats = one.get("/v1/stats")
    assert status == 200 and stats["processed"] == len(commands)
    with urllib.request.urlopen(one.url + "/metrics", timeout=10) as answer:
        families = {f.name: f for f in text_string_to_metric_families(answer.read().decode())}
    latency = families["enhydra_command_event_latency_seconds"]
    counts = {s.name: s.value for s in latency.samples if not s.name.endswith("_bucket")}
    assert counts["enhydra_command_event_latency_seconds_count"] == len(commands)
    assert counts["enhydra_command_event_latency_seconds_sum"] > 0
    phases = {
        s.labels["phase"]: s.value
        for s in families["enhydra_batch_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert phases == dict.fromkeys(("process", "publish", "durable"), stats["batches"])
    print(
        f"{stats['batches']} batches; mean command->event latency "
        f"{1000 * counts['enhydra_command_event_latency_seconds_sum'] / len(commands):.1f} ms"
    )
