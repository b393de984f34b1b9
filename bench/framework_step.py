"""Per-record CPU of Enhydra's pure step against the raw loop's step, in one process, no Kafka.

    .venv/bin/python bench/framework_step.py [--commands 120000] [--keys 10000] [--rounds 5]

The end-to-end benchmark (`python -m bench.throughput`) compares whole processes; its raw dict
ceiling keeps no store and writes no changelog. This one isolates what the framework adds
around the user's functions: the same ledger commands, cut into the same batches per
partition, go through
- **raw step**: the ceiling's own loop body (bench.throughput.workload.step) with dict state;
- **enhydra step**: the engine's own step (`AggregateStep`: parse, dedup, decide/apply,
  entries, the events with their contract headers, rejections, the changelog values, the
  entry cache), then what persisting does, with a dict standing in for RocksDB.
Neither produces to Kafka nor writes RocksDB, so the difference is the framework's own work.
Rounds alternate the two; CPU time of this process; medians.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "ledger"))

from bench.common import cpu_rounds, cpu_table, load_average, machine, median  # noqa: E402
from bench.throughput.workload import PARTITIONS, command_records  # noqa: E402
from bench.throughput.workload import step as raw_step  # noqa: E402
from enhydra.contracts.partitioner import partition_for  # noqa: E402
from enhydra.errors.policies import ErrorPolicies  # noqa: E402
from enhydra.processing.core import InputRecord  # noqa: E402
from enhydra.processing.step import AggregateStep  # noqa: E402
from enhydra.runner.tasks import Task  # noqa: E402
from enhydra.settings import Settings  # noqa: E402
from ledger.domain import accounts  # noqa: E402

Batch = tuple[int, list[InputRecord]]


def batches(keys: int, commands: int, size: int) -> list[Batch]:
    """The workload's commands per partition, in offset order, cut into batches of `size`."""
    per_partition: dict[int, list[InputRecord]] = {p: [] for p in range(PARTITIONS)}
    for key, value, _ in command_records(keys, commands):
        records = per_partition[partition_for(key, PARTITIONS)]
        records.append(InputRecord(len(records), key, value))
    return [
        (partition, records[at : at + size])
        for partition, records in per_partition.items()
        for at in range(0, len(records), size)
    ]


def raw(work: list[Batch]) -> int:
    state: dict[str, Any] = {}
    outputs = []
    for _, records in work:
        for record in records:
            key = record.key.decode()
            new, out, _ = raw_step(state.get(key), key, record.value, record.offset)
            if new is not None:
                state[key] = new
            if out is not None:
                outputs.append((record.key, out))
    return sum(len(records) for _, records in work)


class DictStore:
    """Stands in for the task's RocksDB partition: what the step reads, what persisting writes."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.values.get(key)


def enhydra(work: list[Batch], events: dict[int, list[InputRecord]] | None = None) -> int:
    """The engine's own step (AggregateStep), then what persisting does to store and cache.

    With `events`, the events it made are kept per partition as the events topic holds them.
    """
    settings = Settings.from_env({}, app_id="bench", dedup_window=100)
    step = AggregateStep(settings, accounts.bind("bench"), ErrorPolicies(), ())
    tasks: dict[int, Task] = {}
    for partition, records in work:
        task = tasks.get(partition)
        if task is None:
            store: Any = DictStore()  # the step only calls store.get
            task = tasks[partition] = Task(partition, store, cache=step.new_cache())
        out = step(task, records, {})
        task.store.values.update(out.puts)  # type: ignore[attr-defined]
        assert out.persisted is not None
        out.persisted()
        if events is not None:
            made = events.setdefault(partition, [])
            for key, value, headers in out.outputs.get("bench-events", []):
                made.append(InputRecord(len(made), key, value, headers=tuple(headers or ())))
    return sum(len(records) for _, records in work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=120_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500, help="records per partition batch")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = batches(args.keys, args.commands, args.batch)
    before = load_average()
    runs = cpu_rounds(
        {"raw step": lambda: raw(work), "enhydra step": lambda: enhydra(work)}, args.rounds
    )
    print(f"pure step per record, {args.commands:,} ledger commands, {args.keys:,} keys, ", end="")
    print(f"batches of {args.batch}; {machine()}")
    print(f"medians of {args.rounds} alternating rounds; 1-min load {before} -> {load_average()}")
    print(cpu_table(runs))
    ratio = median(runs["raw step"]) / median(runs["enhydra step"])
    print(f"ratio raw step / enhydra step, CPU per record: {ratio:.2f}")


if __name__ == "__main__":
    main()
