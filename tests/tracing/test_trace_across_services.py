"""One trace across two services on the real broker, read from the SDK's in-memory exporter.

Service A (orders) decides on commands `enhydra send` wrote; service B (stock) reacts to A's
events with commands for its own aggregate. The chain each span and record must keep:

    send -> decide orders (A) -> A's event -> react reserve (B) -> B's command
         -> decide stock (B) -> B's event

Both services' engines run in this process (their Kafka clients, RocksDB stores and consumer
groups are the real ones), so one in-memory exporter sees every span.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from enhydra import Aggregate, tracing
from enhydra.cli.send import produce
from enhydra.contracts.headers import TRACEPARENT_HEADER, header
from enhydra.errors.policies import ErrorPolicies
from enhydra.processing.engine import Engine
from enhydra.reactions import Emit, Reaction, Upstream
from enhydra.reactions.engine import ReactionEngine
from enhydra.settings import Settings
from enhydra.testing.processes import read_topic, service_env
from enhydra.tracing.context import format_traceparent, parse, sampled
from enhydra.tracing.spans import Tracing

pytestmark = [pytest.mark.integration]


def decide_order(state, command):
    return [{"type": "placed", "item": command["item"]}]


def decide_stock(state, command):
    return [{"type": "reserved", "order": command["order"]}]


def apply(state, event):
    return {"events": (state or {}).get("events", 0) + 1}


def reserve(upstream: Upstream) -> list[Emit]:
    return [Emit(upstream.event["item"], {"type": "reserve", "order": upstream.key})]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()  # the default sampler: parentbased_always_on
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use(Tracing(provider))
    yield spans
    tracing.reset()
    provider.shutdown()


def settings(app_id: str, bootstrap: str, state: Path) -> Settings:
    env = service_env(
        app_id=app_id, bootstrap=bootstrap, instance_id="i1", state_dir=state, partitions=2
    )
    return Settings.from_env({**env, "ENHYDRA_COMMIT_INTERVAL_MS": "100"})


def quiet(sent: int) -> None:
    """No progress line from `produce` in a test."""


async def wait_for(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout:g} s")


async def test_a_command_is_one_trace_through_both_services(
    exporter, kafka_bootstrap, app_id, tmp_path
):
    a = Aggregate("orders", decide_order, apply).bind(app_id)
    b_id = f"{app_id}-b"
    b = Aggregate("stock", decide_stock, apply).bind(b_id)
    a_settings = settings(app_id, kafka_bootstrap, tmp_path / "a")
    b_settings = settings(b_id, kafka_bootstrap, tmp_path / "b")
    engines = [
        Engine(a_settings, a),
        Engine(b_settings, b),
        ReactionEngine(
            b_settings,
            Reaction("reserve", app_id, reserve),
            b.commands_topic,
            policies=ErrorPolicies(),
        ),
    ]
    try:
        for engine in engines:
            await engine.start()
        tracer = tracing.current()
        assert tracer is not None
        placed = [(b"o1", b'{"command_id": "c1", "type": "place", "item": "apple"}')]
        await produce(kafka_bootstrap, a.commands_topic, placed, quiet, (tracer, None, None))
        # A context its caller did not sample (1 % sampling, the other 99 %): passed along as
        # it is, and no span anywhere.
        unsampled = format_traceparent(0xABC, 0xDEF, 0)
        other = [(b"o2", b'{"command_id": "c2", "type": "place", "item": "pear"}')]
        await produce(kafka_bootstrap, a.commands_topic, other, quiet, (tracer, unsampled, None))

        def finished(name: str):
            return [s for s in exporter.get_finished_spans() if s.name == name]

        [stock] = await wait_for(lambda: finished("decide stock"), "decide span in B")
        [send] = finished(f"send {a.commands_topic}")
        [order] = finished("decide orders")
        [react] = finished("react reserve")

        # one trace, each span the child of the one before it
        assert {s.context.trace_id for s in (send, order, react, stock)} == {send.context.trace_id}
        assert send.parent is None
        assert order.parent.span_id == send.context.span_id
        assert react.parent.span_id == order.context.span_id
        assert stock.parent.span_id == react.context.span_id

        # and the records between them carry the span that made them
        async def records(topic: str, count: int) -> dict:
            async def read():
                found = await read_topic(kafka_bootstrap, topic)
                return found if len(found) == count else None

            deadline = time.monotonic() + 30
            while (found := await read()) is None:
                assert time.monotonic() < deadline, f"{topic} has not {count} records"
                await asyncio.sleep(0.2)
            return {r.key: header(r.headers, TRACEPARENT_HEADER) for r in found}

        a_commands = await records(a.commands_topic, 2)
        a_events = await records(a.events_topic, 2)
        b_commands = await records(b.commands_topic, 2)
        b_events = await records(b.events_topic, 2)
        assert parse(a_commands[b"o1"])[1] == send.context.span_id
        assert parse(a_events[b"o1"])[1] == order.context.span_id
        assert parse(b_commands[b"apple"])[1] == react.context.span_id
        assert parse(b_events[b"apple"])[1] == stock.context.span_id

        passed = a_commands[b"o2"]
        assert parse(passed)[0] == 0xABC and not sampled(passed)
        assert a_events[b"o2"] == b_commands[b"pear"] == b_events[b"pear"] == passed
        assert all(s.context.trace_id != 0xABC for s in exporter.get_finished_spans())

        # every batch is a span with its phases, linked to the commands it held
        batches = [s for s in exporter.get_finished_spans() if s.name.startswith("batch ")]
        held = [s for s in batches if any(link.context == order.context for link in s.links)]
        assert len(held) == 1 and held[0].name == "batch orders"
        phases = [
            s
            for s in exporter.get_finished_spans()
            if s.parent is not None and s.parent.span_id == held[0].context.span_id
        ]
        assert sorted(s.name for s in phases) == ["commit", "decide", "publish"]
        assert all(
            held[0].start_time <= s.start_time <= s.end_time <= held[0].end_time for s in phases
        )
    finally:
        for engine in reversed(engines):
            await engine.stop()
