"""The ceiling: a hand-written aiokafka loop running the ledger logic, with no framework.

    python -m bench.throughput.raw_aiokafka --bootstrap HOST:PORT --app APP --state dict

getmany batches, the shared ledger `step` per record, one output per command sent without
awaiting its delivery, offsets committed every 200 ms after the producer has flushed
(at-least-once, the same as Enhydra's default). `--state dict` keeps state in a Python dict
(what Python can do at best); `--state rocksdb` keeps it in one rocksdict DB per partition and
sends a changelog record per update, the cost a durable store adds before any framework.
`--offset-header` adds Enhydra's `enhydra.command_offset` header to events, so the latency
benchmark can run this loop as a reference under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from rocksdict import Options, Rdict

from bench.throughput.workload import (
    COMMANDS_TOPIC,
    decode_entry,
    encode_entry,
    events_topic,
    rejections_topic,
    step,
)

COMMIT_INTERVAL_S = 0.2
COMMAND_OFFSET_HEADER = "enhydra.command_offset"  # the header Enhydra puts on every event
MAX_RECORDS = 2000


def changelog_topic(app: str) -> str:
    return f"{app}-accounts-changelog"


async def run(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.app,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        fetch_max_wait_ms=100,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=args.bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=args.linger_ms,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    await consumer.start()
    events, rejections, changelog = events_topic(args.app), rejections_topic(args.app), None
    memory: dict[str, list] = {}
    dbs: dict[int, Rdict] = {}
    if args.state == "rocksdb":
        changelog = changelog_topic(args.app)
    send = producer.send
    last_commit = time.monotonic()
    ready = Path(args.ready_file) if args.ready_file else None
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=MAX_RECORDS)
            if ready is not None and consumer.assignment():
                ready.touch()
                ready = None
            for tp, records in batch.items():
                p = tp.partition
                if changelog is None:
                    for r in records:
                        key = r.key.decode()
                        new, out, is_event = step(memory.get(key), key, r.value, r.offset)
                        if new is not None:
                            memory[key] = new
                        if out is not None:
                            await send(
                                events if is_event else rejections, out, key=r.key, partition=p
                            )
                    continue
                if args.offset_header:
                    await process_traced(args, db_for(dbs, p, args), records, p, producer)
                    continue
                db = db_for(dbs, p, args)
                for r in records:
                    key = r.key.decode()
                    raw = db.get(r.key)
                    entry = decode_entry(raw) if raw is not None else None
                    new, out, is_event = step(entry, key, r.value, r.offset)
                    if new is not None:
                        value = encode_entry(new)
                        db[r.key] = value
                        await send(changelog, value, key=r.key, partition=p)
                    if out is not None:
                        await send(events if is_event else rejections, out, key=r.key, partition=p)
            if batch and time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                await producer.flush()  # at-least-once: outputs are acknowledged before commit
                await consumer.commit()
                last_commit = time.monotonic()
    finally:
        await producer.flush()
        await consumer.commit()
        await consumer.stop()
        await producer.stop()
        for db in dbs.values():
            db.close()


def db_for(dbs: dict[int, Rdict], partition: int, args: argparse.Namespace) -> Rdict:
    db = dbs.get(partition)
    if db is None:
        db = dbs[partition] = Rdict(str(Path(args.state_dir) / str(partition)), Options())
    return db


async def process_traced(
    args: argparse.Namespace, db: Rdict, records: list, p: int, producer: AIOKafkaProducer
) -> None:
    """The rocksdict loop body, with each event carrying its command's offset (latency runs)."""
    events, rejections = events_topic(args.app), rejections_topic(args.app)
    changelog = changelog_topic(args.app)
    for r in records:
        key = r.key.decode()
        raw = db.get(r.key)
        new, out, is_event = step(
            decode_entry(raw) if raw is not None else None, key, r.value, r.offset
        )
        if new is not None:
            value = encode_entry(new)
            db[r.key] = value
            await producer.send(changelog, value, key=r.key, partition=p)
        if out is not None:
            headers = [(COMMAND_OFFSET_HEADER, str(r.offset).encode())] if is_event else None
            topic = events if is_event else rejections
            await producer.send(topic, out, key=r.key, partition=p, headers=headers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app", required=True, help="consumer group and output topic prefix")
    parser.add_argument("--topic", default=COMMANDS_TOPIC)
    parser.add_argument("--state", choices=("dict", "rocksdb"), default="dict")
    parser.add_argument("--state-dir", default="raw-state")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--offset-header", action="store_true", help="for latency runs")
    parser.add_argument("--ready-file", help="touched once partitions are assigned")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
