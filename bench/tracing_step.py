"""What tracing costs the aggregate's step alone, without Kafka: where the 1 % cost comes from.

    .venv/bin/python -m bench.tracing_step [--commands 20000] [--rounds 9]

The ledger's commands in memory go through the aggregate's step (decide/apply, the events and
their headers, as `enhydra run` makes them) in batches of 500, five ways alternating round by
round: tracing off; off with every command carrying a traceparent; on without contexts; on with
every context unsampled (passed on as it is); on with 1 % sampled (spans made and queued to a
batch processor whose exporter drops them). CPU µs per command, medians. bench/tracing_cost.py
is the same question on the real engine and broker; this one separates the step's share.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "ledger"))

import orjson  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased  # noqa: E402

from bench.common import cpu_rounds, cpu_table, load_average, machine  # noqa: E402
from enhydra import tracing  # noqa: E402
from enhydra.contracts.headers import TRACEPARENT_HEADER  # noqa: E402
from enhydra.contracts.records import InputRecord  # noqa: E402
from enhydra.errors.policies import ErrorPolicies  # noqa: E402
from enhydra.processing.step import AggregateStep  # noqa: E402
from enhydra.runner.tasks import Task  # noqa: E402
from enhydra.settings import Settings  # noqa: E402
from enhydra.tracing.context import format_traceparent  # noqa: E402
from enhydra.tracing.spans import Tracing  # noqa: E402
from ledger.domain import accounts  # noqa: E402
from ledger.workload import generate  # noqa: E402

BATCH = 500


class Dropped(SpanExporter):
    def export(self, spans) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class Nothing:
    """A store partition that holds nothing: every key starts from the initial state."""

    def get(self, key: bytes) -> None:
        return None


def commands(count: int, share: float | None) -> list[InputRecord]:
    """The ledger's commands; with `share`, each carries a traceparent, that share sampled."""
    rng = random.Random(7)
    out = []
    for offset, (key, body) in enumerate(generate(2000, count, seed=3)):
        headers: tuple = ()
        if share is not None:
            flags = 1 if rng.random() < share else 0
            traceparent = format_traceparent(rng.getrandbits(128) | 1, 5, flags)
            headers = ((TRACEPARENT_HEADER, traceparent),)
        out.append(InputRecord(offset, key.encode(), orjson.dumps(body), headers=headers))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    settings = Settings.from_env({}, app_id="bench", partitions=1)
    aggregate = accounts.bind("bench")
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    on = Tracing(provider)
    plain, carried, unsampled = (
        commands(args.commands, None),
        commands(args.commands, 0.01),
        commands(args.commands, 0.0),
    )

    def stepping(records: list[InputRecord], traced: Tracing | None):
        def run() -> int:
            tracing.use(traced)  # the step reads it when it is built
            step = AggregateStep(settings, aggregate, ErrorPolicies(), ())
            task = Task(0, Nothing(), cache=step.new_cache())  # type: ignore[arg-type]
            for at in range(0, len(records), BATCH):
                step(task, records[at : at + BATCH], {})
            return len(records)

        return run

    before = load_average()
    runs = cpu_rounds(
        {
            "off": stepping(plain, None),
            "off, context carried": stepping(carried, None),
            "on, no context": stepping(plain, on),
            "on, every context unsampled": stepping(unsampled, on),
            "on, 1 % sampled": stepping(carried, on),
        },
        args.rounds,
    )
    provider.shutdown()
    tracing.reset()
    print(f"tracing in the aggregate's step alone, {args.commands:,} ledger commands; {machine()}")
    print(f"medians of {args.rounds} alternating rounds; 1-min load {before} -> {load_average()}")
    print(cpu_table(runs))


if __name__ == "__main__":
    main()
