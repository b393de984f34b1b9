"""What tracing costs the aggregate engine: off, 1 % of commands sampled, every command sampled.

    .venv/bin/python -m bench.tracing_cost [--commands 100000] [--keys 5000] [--rounds 3]
        [--sdk-spans]

On a fresh broker, the ledger's own engine (the task runner with decide/apply, RocksDB, the
changelog, at-least-once) processes the same commands four ways, interleaved round by round:

- off: no OTEL_TRACES_EXPORTER; the commands carry no trace context (what `enhydra send`
  writes with tracing off);
- off, context carried: the commands of `1 %`, the engine with tracing off: what the header
  alone costs (Kafka reads and writes it; the engine drops it);
- 1 %: every command carries a traceparent, 1 % of them sampled (what `enhydra send` writes
  with OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0.01), and the
  engine runs with the same sampler;
- all: every command carries a sampled traceparent (parentbased_always_on).

Traced runs export through the SDK's BatchSpanProcessor (default settings) to an exporter that
encodes each batch of spans as OTLP protobuf and drops it: the CPU of a real OTLP exporter,
without the network. The commands are produced before the engine starts; a run's throughput
is counted from its first processed command to its last. Also printed: the process CPU per
command (engine and exporter thread), steadier than wall time on a busy machine, and the
spans exported. Targets (issue #28): <= 3 % throughput cost at 1 %, <= 15 % at every command.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "ledger"))

import orjson  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import (  # noqa: E402
    ALWAYS_ON,
    ParentBased,
    TraceIdRatioBased,
)

from bench.common import (  # noqa: E402
    Record,
    create_topics,
    fresh_broker,
    load_average,
    machine,
    median,
    produce_fast,
    progress,
    table,
)
from enhydra import tracing  # noqa: E402
from enhydra.contracts.headers import TRACEPARENT_HEADER  # noqa: E402
from enhydra.kafka.topics import TopicSpec  # noqa: E402
from enhydra.logs import configure_logging  # noqa: E402
from enhydra.processing.engine import Engine  # noqa: E402
from enhydra.runtime import settle_heap  # noqa: E402
from enhydra.settings import Settings  # noqa: E402
from enhydra.tracing.context import format_traceparent  # noqa: E402
from enhydra.tracing.spans import Tracing  # noqa: E402
from ledger.domain import accounts  # noqa: E402
from ledger.workload import generate  # noqa: E402

PARTITIONS = 4
# name -> (the share of commands sampled, or None: no context on them; tracing on in the engine)
VARIANTS = {
    "off": (None, False),
    "off, context carried": (0.01, False),
    "1 %": (0.01, True),
    "all": (1.0, True),
}
# --sdk-spans: the same sampled runs with the steps' spans made by the SDK's Span (the way
# before spans.py made them finished), side by side
SDK_SPANS = " (SDK's Span)"


class EncodeOnly(SpanExporter):
    """Encodes spans as an OTLP exporter does, then drops them; counts what it saw."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def commands(keys: int, count: int, share: float | None, seed: int) -> list[Record]:
    """The ledger's commands as records; with `share`, each with a traceparent, that share
    sampled (a trace id below the ratio's bound, as TraceIdRatioBased decides)."""
    rng = random.Random(seed)
    out: list[Record] = []
    for key, body in generate(keys, count, seed=seed):
        headers: list[tuple[str, bytes]] = []
        if share is not None:
            trace_id = rng.getrandbits(128) or 1
            flags = 1 if rng.random() < share else 0
            headers.append(
                (TRACEPARENT_HEADER, format_traceparent(trace_id, 1 + trace_id % 997, flags))
            )
        out.append((key.encode(), orjson.dumps(body), headers))
    return out


async def one_run(
    bootstrap: str,
    state: Path,
    run: str,
    name: str,
    records: list[Record],
    share: float | None,
    on: bool,
) -> tuple[float, float, int]:
    """(commands/s, CPU µs per command, spans exported) of one engine over `records`."""
    app_id = f"tc-{run}"
    exporter = EncodeOnly()
    provider = None
    if share is None or not on:
        tracing.use(None)
    else:
        sampler = ParentBased(ALWAYS_ON if share >= 1 else TraceIdRatioBased(share))
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        traced = Tracing(provider)
        if name.endswith(SDK_SPANS):
            traced.sdk_spans = True
        tracing.use(traced)
    settings = Settings.from_env(
        {},
        app_id=app_id,
        bootstrap_servers=bootstrap,
        state_dir=state,
        partitions=PARTITIONS,
        instance_id="bench",
    )
    aggregate = accounts.bind(app_id)
    await create_topics(bootstrap, [TopicSpec(aggregate.commands_topic, PARTITIONS)])
    await produce_fast(bootstrap, aggregate.commands_topic, records, PARTITIONS)
    engine = Engine(settings, aggregate)
    total = len(records)
    try:
        await engine.start()
        settle_heap()  # as the runtime does once started: the heap is a service's, not a script's
        while engine.stats["processed"] == 0:
            await asyncio.sleep(0.005)
        wall, cpu, first = time.perf_counter(), time.process_time(), engine.stats["processed"]
        while engine.stats["processed"] < total:
            await asyncio.sleep(0.005)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await engine.stop()
        if provider is not None:
            provider.shutdown()  # exports what is still queued (counted, not timed)
        tracing.reset()
    done = total - first
    return done / wall, cpu / done * 1e6, exporter.spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sdk-spans", action="store_true", help="also run the sampled ones with the SDK's Span"
    )
    args = parser.parse_args()
    if args.rounds < 3:
        raise SystemExit("--rounds must be at least 3: the ratios are medians")
    variants = dict(VARIANTS)
    if args.sdk_spans:
        variants.update({f"{n}{SDK_SPANS}": VARIANTS[n] for n in ("1 %", "all")})
    configure_logging(fmt="console", level="warning")  # each run's start and stop would drown it
    work = {name: commands(args.keys, args.commands, v[0], 28) for name, v in variants.items()}
    rate: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    spans: dict[str, list[int]] = {name: [] for name in variants}
    before = load_average()
    with fresh_broker() as (bootstrap, root), tempfile.TemporaryDirectory(dir=root) as state:
        for round_ in range(args.rounds):
            for i, (name, (share, on)) in enumerate(variants.items()):
                run_name = f"{round_}-{i}"
                r, c, s = asyncio.run(
                    one_run(bootstrap, Path(state), run_name, name, work[name], share, on)
                )
                progress(f"round {round_ + 1} {name}: {r:,.0f} commands/s, {c:.1f} µs CPU each")
                rate[name].append(r)
                cpu[name].append(c)
                spans[name].append(s)
    off_rate, off_cpu = median(rate["off"]), median(cpu["off"])
    print(f"tracing cost, ledger engine, {args.commands:,} commands over {args.keys:,} keys, ")
    print(f"{PARTITIONS} partitions, at-least-once; {machine()}")
    print(f"medians of {args.rounds} interleaved rounds; 1-min load {before} -> {load_average()}")
    rows = []
    for name in variants:
        rows.append(
            [
                name,
                f"{median(rate[name]):,.0f}",
                f"{median(rate[name]) / off_rate:.3f}",
                f"{median(cpu[name]):.1f}",
                f"{median(cpu[name]) / off_cpu:.3f}",
                f"{median(spans[name]):,.0f}",
                " ".join(f"{x:,.0f}" for x in rate[name]),
            ]
        )
    print(
        table(
            ["sampled", "commands/s", "vs off", "CPU µs/cmd", "vs off", "spans", "rounds (cmd/s)"],
            rows,
        )
    )
    for name, target in (("1 %", 0.03), ("all", 0.15)):
        cost = 1 - median(rate[name]) / off_rate
        verdict = "within" if cost <= target else "OVER"
        print(f"throughput cost at {name}: {cost:+.1%} ({verdict} the {target:.0%} target)")


if __name__ == "__main__":
    main()
