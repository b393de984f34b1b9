"""What fencing a cut-off owner costs under at-least-once, per candidate (issue #25).

    .venv/bin/python -m bench.fencing_cost [--records 40000] [--repeat 3]

On a fresh broker, the changelog publish of the at-least-once commit unit (send a batch's
records per partition, wait for the acknowledgements), interleaved, one variant after another:

- idempotent: one idempotent producer, no header (the code before owner epochs);
- epoch header: the same with the owner epoch header on every record (what at-least-once does);
- transactional: one transactional producer per task, one transaction per task and batch
  (fencing by init_transactions, as exactly-once does, without the offsets in the transaction).

Then the restore side, without Kafka: records applied to a RocksDB partition as before, and
through `admit` (the epoch check) as the changelog reader now does. Prints medians.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import namedtuple
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench.common import create_topics, fresh_broker, load_average, machine, median, progress
from enhydra.contracts.headers import epoch_headers
from enhydra.kafka.topics import TopicSpec
from enhydra.runner.checkpoint import send_in_batches
from enhydra.runner.fencing import admit
from enhydra.stores.partition import PartitionStore

PARTITIONS = 4
BATCH = 1000  # records per commit-unit batch, spread over the partitions
VALUE = b'[1234,["c7-1","c7-2"],{"balance":1234,"status":"open","version":12}]'
Record = namedtuple("Record", "offset key value headers")


def batches(records: int, headers) -> list[dict[tuple[str, int], list]]:
    out = []
    for start in range(0, records, BATCH):
        per: dict[tuple[str, int], list] = {}
        for i in range(start, min(records, start + BATCH)):
            key = b"acct-%06d" % (i % 5000)
            per.setdefault(("changelog", i % PARTITIONS), []).append((key, VALUE, headers))
        out.append(per)
    return out


async def idempotent(bootstrap: str, work: list) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=0,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    try:
        started = time.perf_counter()
        for per in work:
            for _, future, _ in await send_in_batches(producer, per):
                await future
        return time.perf_counter() - started
    finally:
        await producer.stop()


async def transactional(bootstrap: str, work: list, run: int) -> float:
    producers = {
        p: AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=0,
            max_batch_size=256 * 1024,
            transactional_id=f"bench-{run}-{p}",
        )
        for p in range(PARTITIONS)
    }
    for producer in producers.values():
        await producer.start()  # init_transactions: fences an earlier producer of the id
    try:

        async def one(partition: int, records: list) -> None:
            producer = producers[partition]
            async with producer.transaction():
                sent = await send_in_batches(producer, {("changelog", partition): records})
                for _, future, _ in sent:
                    await future

        started = time.perf_counter()
        for per in work:
            await asyncio.gather(*(one(p, records) for (_, p), records in per.items()))
        return time.perf_counter() - started
    finally:
        for producer in producers.values():
            await producer.stop()


def restore(records: int, fenced: bool) -> float:
    headers = epoch_headers(7)
    chunk = [
        Record(i, b"acct-%06d" % (i % 5000), VALUE, list(headers) if fenced else [])
        for i in range(10_000)
    ]
    with tempfile.TemporaryDirectory() as root:
        store = PartitionStore(Path(root) / "0")
        started = time.perf_counter()
        for _ in range(records // len(chunk)):
            if fenced:
                admitted = admit(chunk, store.owner_epoch)
                store.write(admitted.puts, changelog_offset=admitted.last, owner_epoch=7)
            else:
                store.write(((r.key, r.value) for r in chunk), changelog_offset=chunk[-1].offset)
        took = time.perf_counter() - started
        store.close()
    return took


async def main(args: argparse.Namespace) -> None:
    print(machine(), "| load average", load_average())
    plain, stamped = batches(args.records, None), batches(args.records, epoch_headers(7))
    times: dict[str, list[float]] = {"idempotent": [], "epoch header": [], "transactional": []}
    with fresh_broker() as (bootstrap, _):
        await create_topics(bootstrap, [TopicSpec("changelog", PARTITIONS, compacted=True)])
        await idempotent(bootstrap, plain[:5])  # warm the broker and the page cache
        for run in range(args.repeat):
            times["idempotent"].append(await idempotent(bootstrap, plain))
            times["epoch header"].append(await idempotent(bootstrap, stamped))
            times["transactional"].append(await transactional(bootstrap, plain, run))
            progress(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()))
    base = median(times["idempotent"])
    print(f"changelog publish, {args.records} records in batches of {BATCH}, medians:")
    for name, values in times.items():
        rate = args.records / median(values)
        print(f"  {name:14} {rate:9.0f} records/s  x{base / median(values):.2f} of idempotent")
    old, new = [], []
    for _ in range(args.repeat):
        old.append(restore(args.records * 5, fenced=False))
        new.append(restore(args.records * 5, fenced=True))
    print(f"restore apply, {args.records * 5} records, medians:")
    print(f"  before epochs  {args.records * 5 / median(old):9.0f} records/s")
    print(f"  with admit     {args.records * 5 / median(new):9.0f} records/s")
    print("load average after:", load_average())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
