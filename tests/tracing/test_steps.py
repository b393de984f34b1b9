"""The steps continue the trace a record carries: a span when sampled, a copy when not.

The aggregate's and the reaction's own steps over records in memory (a dict stands in for the
task's RocksDB partition), with the SDK's in-memory exporter.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, StatusCode

from enhydra import Aggregate, Rejection, tracing
from enhydra.cli.main import main
from enhydra.contracts.headers import TRACEPARENT_HEADER, TRACESTATE_HEADER, header
from enhydra.errors.policies import ErrorPolicies
from enhydra.processing.core import InputRecord
from enhydra.processing.step import AggregateStep
from enhydra.reactions import Emit, Reaction
from enhydra.reactions.engine import ReactionStep
from enhydra.runner.tasks import Task
from enhydra.settings import Settings
from enhydra.tracing.context import format_traceparent, parse
from enhydra.tracing.spans import Tracing

SETTINGS = Settings.from_env({}, app_id="app", partitions=1)
SAMPLED = format_traceparent(0x1234, 0x5678, 1)
UNSAMPLED = format_traceparent(0x1234, 0x5678, 0)


class DictStore:
    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.values.get(key)


def decide(state, command):
    if command.get("amount", 0) < 0:
        raise Rejection("amount must not be negative")
    return [{"type": "added", "amount": command.get("amount", 0)}]


def apply(state, event):
    return (state or 0) + event["amount"]


AGGREGATE = Aggregate("sums", decide, apply).bind("app")


def command(offset: int, headers=(), amount: int = 1) -> InputRecord:
    value = b'{"command_id": "c%d", "amount": %d}' % (offset, amount)
    return InputRecord(offset, b"k", value, headers=tuple(headers))


def traced(sampler=None) -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use(Tracing(provider))
    yield spans
    tracing.reset()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield from traced()


def run(records: list[InputRecord]):
    step = AggregateStep(SETTINGS, AGGREGATE, ErrorPolicies(), ())
    task = Task(0, DictStore(), cache=step.new_cache())  # type: ignore[arg-type]
    return step(task, records, {})


def test_a_sampled_command_is_a_span_whose_context_its_events_carry(exporter) -> None:
    state = (TRACESTATE_HEADER, b"vendor=x")
    out = run([command(7, [(TRACEPARENT_HEADER, SAMPLED), state])])
    [span] = exporter.get_finished_spans()
    assert span.name == "decide sums" and span.kind is SpanKind.CONSUMER
    assert (span.parent.trace_id, span.parent.span_id) == (0x1234, 0x5678)
    assert dict(span.attributes) == {"enhydra.command_id": "c7"}  # one: each costs µs
    [(_, _, headers)] = out.outputs["app-events"]
    assert parse(header(headers, TRACEPARENT_HEADER)) == (0x1234, span.context.span_id, 1)
    assert header(headers, TRACESTATE_HEADER) == b"vendor=x"
    assert list(out.traced) == [span.context]  # the batch's span links to it


def test_a_rejected_command_is_a_failed_span_its_rejection_carries(exporter) -> None:
    out = run([command(3, [(TRACEPARENT_HEADER, SAMPLED)], amount=-1)])
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "amount must not be negative"
    [(_, _, headers)] = out.outputs["app-rejections"]
    assert parse(header(headers, TRACEPARENT_HEADER))[1] == span.context.span_id


def test_an_unsampled_context_is_copied_without_a_span(exporter) -> None:
    other = format_traceparent(0x99, 0x77, 0)
    state = (TRACESTATE_HEADER, b"vendor=x")
    out = run(
        [
            command(1, [(TRACEPARENT_HEADER, UNSAMPLED)]),
            command(2, [state, (TRACEPARENT_HEADER, other)]),
        ]
    )
    assert exporter.get_finished_spans() == ()
    [(_, _, first), (_, _, second)] = out.outputs["app-events"]
    assert header(first, TRACEPARENT_HEADER) == UNSAMPLED
    assert header(first, TRACESTATE_HEADER) is None
    assert header(second, TRACEPARENT_HEADER) == other
    assert header(second, TRACESTATE_HEADER) == b"vendor=x"


@pytest.mark.parametrize("value", [None, b"00-not-a-traceparent", b"x" * 53 + b"01"])
def test_a_command_without_a_valid_context_starts_no_trace(exporter, value) -> None:
    out = run([command(1, [(TRACEPARENT_HEADER, value)] if value else [])])
    assert exporter.get_finished_spans() == ()
    [(_, _, headers)] = out.outputs["app-events"]
    assert header(headers, TRACEPARENT_HEADER) is None


def test_a_sampler_that_ignores_the_parent_is_asked_for_every_command() -> None:
    for exporter in traced(ALWAYS_ON):
        out = run([command(1, [(TRACEPARENT_HEADER, UNSAMPLED)])])
        [span] = exporter.get_finished_spans()
        [(_, _, headers)] = out.outputs["app-events"]
        assert parse(header(headers, TRACEPARENT_HEADER))[1:] == (span.context.span_id, 1)


def spans_of_both_paths(sampler, records):
    """The spans a step exports made finished (the default), and made by the SDK's Span."""
    found = []
    for made in (True, False):
        for exporter in traced(sampler):
            tracer = tracing.current()
            assert tracer is not None and tracer.parts() is not None
            if not made:
                tracer.sdk_spans = True
            out = run(records)
            found.append((exporter.get_finished_spans(), out))
    return found


@pytest.mark.parametrize("sampler", [None, ALWAYS_ON, ParentBased(TraceIdRatioBased(0.0))])
def test_a_span_made_finished_is_the_one_the_sdk_makes(sampler) -> None:
    """The step's spans skip the SDK's Span (23 µs each); what is exported must not differ."""
    state = (TRACESTATE_HEADER, b"vendor=x")
    random_flag = format_traceparent(0x1234, 0x5678, 3)  # sampled, random trace id (level 2)
    records = [
        command(1, [(TRACEPARENT_HEADER, SAMPLED), state]),
        command(2, [(TRACEPARENT_HEADER, random_flag)], amount=-1),
        command(3, [(TRACEPARENT_HEADER, UNSAMPLED)]),
    ]
    (made, made_out), (sdk, sdk_out) = spans_of_both_paths(sampler, records)
    assert len(made) == len(sdk) >= 2

    def shown(span):
        return (
            span.name,
            span.kind,
            (span.parent.trace_id, span.parent.span_id, span.parent.is_remote),
            (span.context.trace_id, int(span.context.trace_flags), span.context.is_remote),
            span.context.trace_state,
            dict(span.attributes),
            (span.status.status_code, span.status.description),
            span.resource.attributes,
            span.instrumentation_scope,
            span.start_time <= span.end_time,
            (span.dropped_attributes, len(span.events), len(span.links)),
        )

    assert [shown(s) for s in made] == [shown(s) for s in sdk]
    for spans, out in ((made, made_out), (sdk, sdk_out)):  # events carry the span's context
        [_, _, first] = out.outputs["app-events"][0]
        assert parse(header(first, TRACEPARENT_HEADER))[1] == spans[0].context.span_id
        assert list(out.traced) == [span.context for span in spans]  # the batch links to them


@pytest.mark.parametrize(
    "limits", [SpanLimits(max_span_attribute_length=4), SpanLimits(max_span_attributes=0)]
)
def test_a_span_made_finished_keeps_the_sdks_attribute_limits(limits) -> None:
    records = [command(123456, [(TRACEPARENT_HEADER, SAMPLED)])]
    found = []
    for made in (True, False):
        spans = InMemorySpanExporter()
        provider = TracerProvider(span_limits=limits)
        provider.add_span_processor(SimpleSpanProcessor(spans))
        traced = Tracing(provider)
        if not made:
            traced.sdk_spans = True
        tracing.use(traced)
        try:
            run(records)
        finally:
            tracing.reset()
        [span] = spans.get_finished_spans()
        found.append((dict(span.attributes), span.dropped_attributes))
    assert found[0] == found[1]
    assert found[0] in (({"enhydra.command_id": "c123"}, 0), ({}, 1))


class Starts(SpanProcessor):
    """A processor that acts when a span starts (as a baggage processor adds attributes)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def on_start(self, span, parent_context=None) -> None:
        self.started.append(span.name)


def test_a_processor_that_acts_on_start_sees_every_steps_span_start() -> None:
    """A span made finished never starts: with a processor other than the SDK's exporting
    ones, the steps use the SDK's Span, so that processor sees them as before."""
    spans, starts = InMemorySpanExporter(), Starts()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    traced = Tracing(provider)
    tracing.use(traced)
    try:
        assert traced.parts() is not None
        provider.add_span_processor(starts)  # added later: noticed at the next batch
        run([command(1, [(TRACEPARENT_HEADER, SAMPLED)])])
    finally:
        tracing.reset()
    assert traced.parts() is None and starts.started == ["decide sums"]
    assert [s.name for s in spans.get_finished_spans()] == ["decide sums"]


def test_the_sdks_own_metrics_keep_the_sdks_spans(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    assert Tracing(TracerProvider()).parts() is None


class ReadsLinks(Sampler):
    """A sampler that looks at the links, as the SDK lets it: they are a sequence."""

    def should_sample(
        self,
        parent_context,
        trace_id,
        name,
        kind=None,
        attributes=None,
        links=None,
        trace_state=None,
    ) -> SamplingResult:
        assert len(links) == 0
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "ReadsLinks"


def test_a_sampler_is_given_links_as_the_sdk_gives_them() -> None:
    for exporter in traced(ReadsLinks()):
        run([command(1, [(TRACEPARENT_HEADER, SAMPLED)])])
        assert [s.name for s in exporter.get_finished_spans()] == ["decide sums"]


def test_off_the_events_carry_only_the_contract_headers() -> None:
    tracing.use(None)
    try:
        out = run([command(1, [(TRACEPARENT_HEADER, SAMPLED)])])
    finally:
        tracing.reset()
    [(_, _, headers)] = out.outputs["app-events"]
    assert [name for name, _ in headers] == [
        "enhydra.command_id",
        "enhydra.command_offset",
        "enhydra.event_index",
        "enhydra.event_version",
    ]


def test_a_reaction_continues_an_events_context_on_its_commands(exporter) -> None:
    reaction = Reaction("copy", "up", lambda u: [Emit(u.key, {"type": "c"}), Emit("z", {})])
    step = ReactionStep(SETTINGS, reaction, "app-commands", ErrorPolicies(), ())
    event = InputRecord(4, b"k", b'{"type": "e"}', headers=((TRACEPARENT_HEADER, SAMPLED),))
    out = step(Task(0, DictStore()), [event], {})  # type: ignore[arg-type]
    [span] = exporter.get_finished_spans()
    assert span.name == "react copy" and span.parent.span_id == 0x5678
    assert dict(span.attributes) == {
        "messaging.destination.partition.id": "0",
        "messaging.kafka.offset": 4,
    }
    [commands] = out.outputs.values()
    assert len(commands) == 2
    for _, _, headers in commands:
        assert parse(header(headers, TRACEPARENT_HEADER))[1] == span.context.span_id


def test_a_batch_is_a_span_with_its_phases_in_order(exporter) -> None:
    tracer = tracing.current()
    assert tracer is not None
    linked = run([command(1, [(TRACEPARENT_HEADER, SAMPLED)])]).traced
    tracer.record_batch(
        "sums",
        topic="app-commands",
        records=1,
        partitions=[0],
        started=100.0,
        process_s=0.25,
        sent_at=100.3,
        published_at=100.5,
        done_at=101.0,
        links=linked,
    )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    batch = spans["batch sums"]
    assert batch.attributes["messaging.destination.name"] == "app-commands"
    assert batch.attributes["enhydra.batch.records"] == 1
    assert [link.context for link in batch.links] == list(linked)
    phases = [(spans[n].start_time, spans[n].end_time) for n in ("decide", "publish", "commit")]
    assert phases == [(100.0e9, 100.25e9), (100.3e9, 100.5e9), (100.5e9, 101.0e9)]
    assert (batch.start_time, batch.end_time) == (100.0e9, 101.0e9)
    assert all(spans[n].parent.span_id == batch.context.span_id for n in ("decide", "publish"))


def test_a_batch_the_sampler_leaves_out_exports_nothing() -> None:
    for exporter in traced(ParentBased(TraceIdRatioBased(0.0))):
        tracer = tracing.current()
        assert tracer is not None
        tracer.record_batch(
            "sums",
            topic="app-commands",
            records=1,
            partitions=[0],
            started=1.0,
            process_s=0.1,
            sent_at=1.1,
            published_at=1.2,
            done_at=1.3,
        )
        assert exporter.get_finished_spans() == ()


def test_a_batch_the_sampler_leaves_out_does_not_look_at_its_links() -> None:
    def links():
        raise AssertionError("the links of an unsampled batch were read")
        yield

    for exporter in traced(ParentBased(TraceIdRatioBased(0.0))):
        tracer = tracing.current()
        assert tracer is not None
        tracer.record_batch(
            "sums",
            topic="app-commands",
            records=1,
            partitions=[0],
            started=1.0,
            process_s=0.1,
            sent_at=1.1,
            published_at=1.2,
            done_at=1.3,
            links=links(),
        )
        assert exporter.get_finished_spans() == ()


def test_a_batch_links_to_no_more_commands_than_the_sdk_keeps(exporter) -> None:
    tracer = tracing.current()
    assert tracer is not None and tracer.max_links == 128  # the SDK's default limit
    contexts = run([command(n, [(TRACEPARENT_HEADER, SAMPLED)]) for n in range(200)]).traced
    left = iter(contexts)
    tracer.record_batch(
        "sums",
        topic="app-commands",
        records=200,
        partitions=[0],
        started=1.0,
        process_s=0.1,
        sent_at=1.1,
        published_at=1.2,
        done_at=1.3,
        links=left,
    )
    batch = next(s for s in exporter.get_finished_spans() if s.name == "batch sums")
    assert [link.context for link in batch.links] == list(contexts[:128])
    assert len(list(left)) == 72  # never taken: no Link made only to be dropped


def test_an_unsampled_context_alone_is_passed_on_in_its_own_headers(exporter) -> None:
    tracer = tracing.current()
    assert tracer is not None
    alone = command(1, [(TRACEPARENT_HEADER, UNSAMPLED)])
    among = command(2, [(TRACESTATE_HEADER, b"v=1"), (TRACEPARENT_HEADER, UNSAMPLED)])
    passed, asked = tracer.batch("decide sums", 0).split([alone, among])
    assert asked == {}
    assert passed[1] is alone.headers  # no copy for what 99 % of records take at 1 %
    assert list(passed[2]) == [(TRACEPARENT_HEADER, UNSAMPLED), (TRACESTATE_HEADER, b"v=1")]


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"TRACEPARENT": "00-abc-def-01"}, "expected 00-<32 hex>-<16 hex>-<2 hex>"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin is not one of them"),
    ],
)
def test_enhydra_send_refuses_a_bad_trace_setting_in_one_line(exporter, env, said) -> None:
    if "OTEL_TRACES_EXPORTER" in env:
        tracing.reset()  # read the environment, as a fresh `enhydra send` does
    result = CliRunner().invoke(main, ["send", "t", "-"], input="{}\n", env=env)
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert said in line, line
