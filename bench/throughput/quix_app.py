"""Quix Streams doing the ledger: a stateful `apply` (RocksDB + changelog) and one output each.

    python -m bench.throughput.quix_app --bootstrap HOST:PORT --app APP --state-dir DIR

Quix runs with its defaults (5 s commit interval, at-least-once, RocksDB state with changelog
topics, confluent-kafka clients with idempotence) plus the delivery settings every system in
this benchmark shares: acks=all and linger.ms=5. Keys and values are read as bytes and parsed by
the shared ledger step with orjson, exactly like the other systems; the step's entry lives in
Quix's per-key state. One `to_topic` with a topic callback routes events and rejections (three
dataframe operations per record; two filtered branches would cost Quix eight).
"""

from __future__ import annotations

import argparse
import logging

from quixstreams import Application, State, message_context

from bench.throughput.workload import COMMANDS_TOPIC, events_topic, rejections_topic, step

ENTRY = "entry"
REJECTION_PREFIX = b'{"command_id"'


def ledger(value: bytes, key: bytes, _timestamp: int, _headers: object, state: State):
    """The shared ledger step on Quix's per-key state: the output, or None for a redelivery."""
    new, out, _ = step(state.get(ENTRY), key.decode(), value, message_context().offset)
    if new is not None:
        state.set(ENTRY, new)
    return out


def is_rejection(value: bytes) -> bool:
    """Rejections are the step's JSON objects that start with their command id."""
    return value.startswith(REJECTION_PREFIX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app", required=True, help="consumer group and output topic prefix")
    parser.add_argument("--topic", default=COMMANDS_TOPIC)
    parser.add_argument("--state-dir", default="quix-state")
    parser.add_argument("--linger-ms", type=int, default=5)
    args = parser.parse_args()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.app,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        processing_guarantee="at-least-once",
        producer_extra_config={"acks": "all", "linger.ms": args.linger_ms},
        loglevel=logging.WARNING,
    )
    source = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")
    events = app.topic(events_topic(args.app), key_serializer="bytes", value_serializer="bytes")
    rejections = app.topic(
        rejections_topic(args.app), key_serializer="bytes", value_serializer="bytes"
    )
    sdf = app.dataframe(source)
    sdf = sdf.apply(ledger, stateful=True, metadata=True).filter(lambda v: v is not None)
    sdf.to_topic(lambda value, *_: rejections if is_rejection(value) else events)
    app.run()


if __name__ == "__main__":
    main()
