"""A batch pass over the events topic (added by `enhydra generate job`):

    jobs/{{ name }}.py

It reads the service's events topic once, from the beginning to its current end, folds them
with the pure `summarize` below and prints the result as JSON (or writes it with --output):

    python jobs/{{ name }}.py --bootstrap 127.0.0.1:9092 [--app ID] [--output summary.json]

For histories too large for one process, run the same `summarize` logic in a PySpark job like
jobs/backfill.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def summarize(events: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Events by type and the busiest keys: pure, so tests call it directly."""
    by_type: dict[str, int] = {}
    by_key: dict[str, int] = {}
    for key, event in events:
        kind = str(event.get("type"))
        by_type[kind] = by_type.get(kind, 0) + 1
        by_key[key] = by_key.get(key, 0) + 1
    busiest = sorted(by_key.items(), key=lambda item: (-item[1], item[0]))[:10]
    return {
        "events": sum(by_type.values()),
        "keys": len(by_key),
        "by_type": by_type,
        "busiest": [{"key": k, "events": n} for k, n in busiest],
    }


async def read_events(bootstrap: str, topic: str) -> list[tuple[str, dict[str, Any]]]:
    """Every event in `topic` up to the end offsets seen at the start (committed ones only)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise SystemExit(f"no topic {topic!r}: is the application id (--app) right?")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        events: list[tuple[str, dict[str, Any]]] = []
        while any(await consumer.position(tp) < ends[tp] for tp in tps):
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for tp, records in batch.items():
                events.extend(
                    (r.key.decode(), json.loads(r.value))
                    for r in records
                    if r.offset < ends[tp] and r.key is not None and r.value is not None
                )
        return events
    finally:
        await consumer.stop()


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(PROJECT_ROOT))
    from {{ package }}.service import service

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("ENHYDRA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument(
        "--app", default=service.settings.app_id, help="the application id (topic prefix)"
    )
    parser.add_argument("--output", type=Path, help="write the summary here instead of stdout")
    args = parser.parse_args(argv)
    topic = service.aggregate.bind(args.app).events_topic
    summary = summarize(asyncio.run(read_events(args.bootstrap, topic)))
    text = json.dumps(summary, indent=2)
    if args.output is None:
        print(text)
    else:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
