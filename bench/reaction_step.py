"""Per-record CPU of a reaction's step against the aggregate's step, in one process, no Kafka.

    .venv/bin/python bench/reaction_step.py [--commands 60000] [--keys 5000] [--rounds 5]

The ledger's commands go through the aggregate's own step (`AggregateStep`); the events that
made, as the events topic holds them (contract headers included), go through a reaction's own
step (`ReactionStep`: read, react, derive the command id, encode, place by key, apply the
error policies) with a reaction that makes one command per event (the tally of the broker
test, reading the ledger's typed events). Same number of records, same batches per partition;
neither produces to Kafka nor writes RocksDB, so the difference is the steps' own work. The
issue's target is a reaction at >= 0.8x the aggregate engine's throughput. Rounds alternate
the two; CPU time; medians.
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
from bench.framework_step import DictStore, batches, enhydra  # noqa: E402
from enhydra.errors.policies import ErrorPolicies  # noqa: E402
from enhydra.processing.core import InputRecord  # noqa: E402
from enhydra.reactions.engine import ReactionStep  # noqa: E402
from enhydra.runner.tasks import Task  # noqa: E402
from enhydra.settings import Settings  # noqa: E402
from tests.reactions.tally_service import service as tally_service  # noqa: E402

Batch = tuple[int, list[Any]]
SETTINGS = Settings.from_env({}, app_id="bench", dedup_window=100)


def aggregate_run(work: list[Batch]) -> tuple[int, list[Batch]]:
    """The aggregate's step over the commands; returns the count and the events it made."""
    events: dict[int, list[InputRecord]] = {}
    count = enhydra(work, events)
    return count, list(events.items())


def reaction_run(work: list[Batch]) -> int:
    [tally] = tally_service.reactions  # reads the ledger's four event types, typed
    step = ReactionStep(SETTINGS, tally, "tally-commands", ErrorPolicies(), ())
    tasks: dict[int, Task] = {}
    for partition, records in work:
        task = tasks.get(partition)
        if task is None:
            task = tasks[partition] = Task(partition, DictStore(), cache=None)
        step(task, records, {})
    return sum(len(r) for _, r in work)


def cut(events: list[Batch], size: int, limit: int) -> list[Batch]:
    """The events per partition in batches of `size`, `limit` records in all."""
    out: list[Batch] = []
    left = limit
    for partition, records in events:
        for at in range(0, len(records), size):
            chunk = records[at : at + size][:left]
            if chunk:
                out.append((partition, chunk))
                left -= len(chunk)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=60_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=500, help="records per partition batch")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    commands = batches(args.keys, args.commands, args.batch)
    _, events = aggregate_run(commands)
    count = sum(len(r) for _, r in events)  # the same number of records on both sides
    commands = cut(commands, args.batch, count)
    events = cut(events, args.batch, count)
    before = load_average()
    runs = cpu_rounds(
        {
            "aggregate step": lambda: aggregate_run(commands)[0],
            "reaction step": lambda: reaction_run(events),
        },
        args.rounds,
    )
    print(f"pure step per record, {count:,} records each, {args.keys:,} keys, ", end="")
    print(f"batches of {args.batch}; {machine()}")
    print(f"medians of {args.rounds} alternating rounds; 1-min load {before} -> {load_average()}")
    print(cpu_table(runs))
    ratio = median(runs["aggregate step"]) / median(runs["reaction step"])
    print(f"reaction throughput / aggregate throughput (CPU per record): {ratio:.2f}")


if __name__ == "__main__":
    main()
