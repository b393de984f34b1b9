"""A plain faust-streaming app doing the ledger: an agent, a RocksDB Table, one send per command.

    BENCH_APP=... BENCH_BOOTSTRAP=... python -m bench.throughput.faust_app worker -l warn

This is how a faust user writes the ledger, with faust's documented tuning applied so the
comparison is fair: the same delivery settings as Enhydra (acks=all, producer linger 5 ms,
256 KiB producer batches, at-least-once), a larger `stream_buffer_maxsize`, a RocksDB store
(rocksdict), raw serializers with orjson instead of faust's stdlib-json codec, no standbys, no
web server. Configured through environment variables because faust's CLI owns argv.

The agent iterates event by event, the only way faust lets an agent update a Table: inside
`take()`/`take_events()` batches faust refuses ("Cannot modify table key from outside of stream
iteration"), and forcing the current-event context per event made it lose and duplicate
records (9 of 20k in a trial), so batching is not available to a faust ledger.
"""

from __future__ import annotations

import os

import faust

from bench.throughput.workload import (
    COMMANDS_TOPIC,
    PARTITIONS,
    decode_entry,
    encode_entry,
    events_topic,
    rejections_topic,
    step,
)

APP = os.environ.get("BENCH_APP", "bench-faust")

app = faust.App(
    APP,
    broker=f"kafka://{os.environ.get('BENCH_BOOTSTRAP', '127.0.0.1:9092')}",
    store="rocksdb://",
    datadir=os.environ.get("BENCH_STATE_DIR", "faust-state"),
    topic_partitions=PARTITIONS,
    processing_guarantee="at_least_once",
    producer_acks=-1,
    producer_linger=int(os.environ.get("BENCH_LINGER_MS", "5")) / 1000,
    producer_max_batch_size=256 * 1024,
    stream_buffer_maxsize=16384,
    table_standby_replicas=0,
    consumer_auto_offset_reset="earliest",
    web_enabled=False,
    key_serializer="raw",  # tables and topics: bytes in, bytes out; orjson does the JSON
    value_serializer="raw",
)

commands = app.topic(os.environ.get("BENCH_TOPIC", COMMANDS_TOPIC))
events = app.topic(events_topic(APP))
rejections = app.topic(rejections_topic(APP))
accounts = app.Table("accounts", partitions=PARTITIONS, key_type=bytes, value_type=bytes)


@app.agent(commands)
async def ledger(stream: faust.StreamT) -> None:
    """The shared ledger step per event: read the table, update it, send the one output."""
    async for event in stream.events():
        raw_key = event.key
        message = event.message
        raw = accounts.get(raw_key)
        new, out, is_event = step(
            decode_entry(raw) if raw is not None else None,
            raw_key.decode(),
            event.value,
            message.offset,
        )
        if new is not None:
            accounts[raw_key] = encode_entry(new)
        if out is not None:
            topic = events if is_event else rejections
            await topic.send(key=raw_key, value=out, partition=message.partition)


if __name__ == "__main__":
    app.main()
