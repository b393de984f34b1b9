"""The spans Enhydra makes, over an OpenTelemetry TracerProvider (imported only when on).

Three kinds, each the smallest that keeps one trace across services:

- `send`: a record `enhydra send` (or an HTTP command) writes; a root, or a child of the
  context the caller was given;
- `decide <aggregate>` / `react <reaction>`: a sampled record continued by a step, a child of
  the context on the record; the records it makes (events, a rejection, commands) carry its
  context. It starts when the batch's step starts and ends when the step ends: decide/apply
  of one command takes microseconds, the batch is what takes time;
- `batch <runner>`: one per batch of the task runner, with a child per phase (decide, publish,
  commit), made once the batch is durable from the times the runner took anyway. It is a root
  of its own trace, sampled like any root, and links to the spans of the sampled records it
  handled: a batch holds hundreds of commands of as many traces, so it cannot be a child of
  each; the link leads from a slow batch to the commands it held.

A record whose context is not sampled is passed on as it is (its traceparent copied onto the
records it makes) without asking the SDK, when the sampler respects the parent's decision
(the `parentbased_*` samplers, the SDK's default): with 1 % sampling, 99 % of the records cost
a header lookup and a copy.

A sampled record's span is made already finished: the sampler is asked as the SDK asks it,
and a ReadableSpan with the step's start and end times goes to the span processors' `on_end`,
without the SDK's mutable Span (its lock, bounded attributes and `on_start`): about 4 µs of
CPU instead of about 23 (docs/tracing.md). Nothing reads a step's span while it is open, so
nothing is lost; an SDK without the parts this needs gets the SDK's own spans.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import TraceState
from opentelemetry.trace.status import Status, StatusCode

from enhydra.contracts.headers import TRACEPARENT_HEADER, TRACESTATE_HEADER
from enhydra.tracing.context import (
    SAMPLED_FLAGS,
    BadTraceParent,
    Header,
    carried,
    carry,
    format_traceparent,
    parse,
)

KAFKA = "kafka"


class Tracing:
    """Spans of one process, made by its tracer provider's tracer."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("enhydra")
        # Only a sampler that follows the parent lets an unsampled context pass untouched.
        self.follows_parent = isinstance(provider.sampler, ParentBased)
        # the SDK's default limit (OTEL_SPAN_LINK_COUNT_LIMIT; None: no limit)
        self.max_links = SpanLimits().max_links
        self.sdk_spans = False  # True: the steps' spans are the SDK's Spans (tests, a bench)
        self._parts: _SpanParts | None = None
        self._parts_for: object = None  # the span processors `_parts` was made for
        self._batch_names: dict[str, str] = {}

    def parts(self) -> _SpanParts | None:
        """How a step makes its spans finished; None: with the SDK's Span (asked, or a span
        processor or SDK setting that needs it). Checked once per batch."""
        if self.sdk_spans:
            return None
        processors = getattr(self.tracer.span_processor, "_span_processors", None)
        if processors is not self._parts_for:  # a processor added since
            self._parts, self._parts_for = _SpanParts.of(self.tracer), processors
        return self._parts

    # records written by a client -----------------------------------------------------------
    def start_send(
        self, topic: str, parent: bytes | None = None, tracestate: bytes | None = None
    ) -> tuple[Any, list[Header]]:
        """A span for one record written to `topic`, and the headers that carry it.

        `parent`: a traceparent the caller was given (TRACEPARENT, an HTTP request's header);
        BadTraceParent when it is not one. End the span with `end_send` once acknowledged.
        """
        context = self.context_of(parent, tracestate) if parent is not None else None
        span = self.tracer.start_span(
            f"send {topic}",
            context,
            SpanKind.PRODUCER,
            {"messaging.system": KAFKA, "messaging.destination.name": topic},
        )
        return span, headers_of(span)

    @staticmethod
    def end_send(span: Any, error: BaseException | None = None) -> None:
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()

    def context_of(self, traceparent: bytes, tracestate: bytes | None = None) -> Any:
        """The OpenTelemetry context of a remote parent; BadTraceParent if it is not one."""
        return trace.set_span_in_context(NonRecordingSpan(remote_parent(traceparent, tracestate)))

    # records continued by a step ---------------------------------------------------------------
    def batch(self, name: str, partition: int) -> BatchTrace:
        """The spans of one partition's batch, for the records that carry a context."""
        return BatchTrace(self, name, partition)

    # batches -----------------------------------------------------------------------------------
    def record_batch(
        self,
        runner: str,
        *,
        topic: str,
        records: int,
        partitions: Sequence[int],
        started: float,
        process_s: float,
        sent_at: float,
        published_at: float,
        done_at: float,
        links: Iterable[Any] = (),
    ) -> None:
        """One durable batch of `topic` and its phases, from the runner's wall-clock times (s).

        The span is started bare and its attributes and links are added only once the sampler
        has recorded it: at 1 % sampling, 99 % of the batches cost one sampling decision
        (`links` is not even iterated). A sampler that decides on attributes does not see them.
        """
        span = self.tracer.start_span(
            self._batch_names.get(runner) or self._batch_name(runner),
            kind=SpanKind.INTERNAL,
            start_time=_ns(started),
        )
        if not span.is_recording():
            return  # not sampled: nothing to end or export
        span.set_attributes(
            {
                "enhydra.batch.records": records,
                "enhydra.batch.partitions": list(partitions),
                "messaging.system": KAFKA,
                "messaging.destination.name": topic,
                "messaging.batch.message_count": records,
            }
        )
        # The SDK keeps at most max_links (128 unless OTEL_SPAN_LINK_COUNT_LIMIT says): a batch
        # of every command sampled holds hundreds, so no Link is made only to be dropped.
        for context in itertools.islice(links, self.max_links):
            span.add_link(context)
        context = trace.set_span_in_context(span)
        decided = started + process_s
        for phase, begin, end in (
            ("decide", started, decided),
            ("publish", max(sent_at, decided), published_at),
            ("commit", published_at, done_at),
        ):
            child = self.tracer.start_span(phase, context, start_time=_ns(begin))
            child.end(end_time=_ns(max(begin, end)))
        span.end(end_time=_ns(max(done_at, started)))

    def _batch_name(self, runner: str) -> str:
        name = self._batch_names[runner] = f"batch {runner}"
        return name


class BatchTrace:
    """The spans of the records of one partition's batch whose record carried a context."""

    __slots__ = (
        "made",
        "name",
        "partition",
        "parts",
        "spans",
        "started",
        "tracing",
        "unsampled_passes",
    )

    def __init__(self, tracing: Tracing, name: str, partition: int) -> None:
        self.tracing = tracing
        self.name = name
        self.started = time.time_ns()
        self.partition = str(partition)
        self.spans: list[Any] = []  # the SDK's spans (when `parts` is None)
        self.parts = tracing.parts()
        # (context, parent, attributes, status) of the spans made finished in `finish`
        self.made: list[tuple[SpanContext, SpanContext, dict[str, Any], Status]] = []
        self.unsampled_passes = tracing.follows_parent

    def follow(
        self,
        headers: Iterable[Header] | None,
        offset: int,
        command_id: str | None = None,
        error: str | None = None,
    ) -> list[Header] | None:
        """The headers that carry a record's context on to what it made; None: it has none.

        A sampled context gets a span (an `error`, e.g. the rejection's reason, marks it
        failed); an unsampled one is copied. A traceparent that is not valid is dropped.
        """
        parent = state = None
        for name, value in headers or ():  # carried(), inlined: this runs for every record
            if name == TRACEPARENT_HEADER:
                parent = value
            elif name == TRACESTATE_HEADER:
                state = value
        if parent is None:
            return None
        if self.unsampled_passes and parent[53:55] not in SAMPLED_FLAGS:
            if len(parent) != 55:
                return None
            if state is None:
                return [(TRACEPARENT_HEADER, parent)]
            return [(TRACEPARENT_HEADER, parent), (TRACESTATE_HEADER, state)]
        tracing = self.tracing
        made = self.parts
        try:
            remote = remote_parent(parent, state)
        except BadTraceParent:
            return None
        context = trace.set_span_in_context(NonRecordingSpan(remote))
        # Few attributes: with every command sampled, each costs the SDK about a microsecond
        # per span and the OTLP encoding several more. A decide span has the command id, which
        # names the command (its events carry it too); a react span, whose upstream event has
        # none, the event's partition and offset.
        if command_id is not None:
            attributes: dict[str, Any] = {"enhydra.command_id": command_id}
        else:
            attributes = {
                "messaging.destination.partition.id": self.partition,
                "messaging.kafka.offset": offset,
            }
        if made is not None:
            span_context, kept = made.decide(self.name, context, remote, attributes)
            if kept is not None:
                status = _UNSET if error is None else Status(StatusCode.ERROR, error)
                self.made.append((span_context, remote, kept, status))
            return headers_of_context(span_context)
        span = tracing.tracer.start_span(
            self.name, context, SpanKind.CONSUMER, attributes, start_time=self.started
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        self.spans.append(span)
        return headers_of(span)

    def split(
        self, records: Iterable[Any]
    ) -> tuple[dict[int, Sequence[Header]], dict[int, Sequence[Header]]]:
        """The records of a batch by what their context needs, before the step knows which
        made anything: offset -> the headers that pass an unsampled context on as it is, and
        offset -> the headers of a record whose context goes to `follow` (sampled, or any with
        a sampler that ignores the parent). Records without a traceparent are in neither.

        The first is what 99 % of the records take at 1 % sampling: a record whose only header
        is its traceparent (what `enhydra send` and OpenTelemetry's producers write) is passed
        on with its own header sequence, nothing copied; the others in one look at each.
        """
        passed: dict[int, Sequence[Header]] = {}
        asked: dict[int, Sequence[Header]] = {}
        passes = self.unsampled_passes
        for record in records:
            headers = record.headers
            if not headers:
                continue
            if len(headers) == 1:
                name, value = headers[0]
                if name != TRACEPARENT_HEADER:
                    continue
                if not passes or value[53:55] in SAMPLED_FLAGS:
                    asked[record.offset] = headers
                elif len(value) == 55:
                    passed[record.offset] = headers
                continue
            for found in headers:
                if found[0] != TRACEPARENT_HEADER:
                    continue
                value = found[1]
                if not passes or value[53:55] in SAMPLED_FLAGS:
                    asked[record.offset] = headers
                elif len(value) == 55:
                    passed[record.offset] = carry(*carried(headers))  # type: ignore[arg-type]
                break
        return passed, asked

    def finish(self) -> list[Any]:
        """End the spans (the step is done); the contexts of the recorded ones, to link to."""
        if not self.spans and not self.made:
            return []
        end = time.time_ns()
        recorded = []
        for span in self.spans:
            if span.is_recording():
                recorded.append(span.get_span_context())
            span.end(end_time=end)
        if self.made:
            parts = self.parts
            assert parts is not None
            for span_context, parent, attributes, status in self.made:
                parts.end(self.name, span_context, parent, attributes, status, self.started, end)
                recorded.append(span_context)
        return recorded


def headers_of(span: Any) -> list[Header]:
    """The headers that carry a span's context (its traceparent, and tracestate if any)."""
    return headers_of_context(span.get_span_context())


def headers_of_context(context: SpanContext) -> list[Header]:
    parent = format_traceparent(context.trace_id, context.span_id, context.trace_flags)
    state = context.trace_state
    return carry(parent, state.to_header().encode("ascii") if state else None)


_UNSET = Status(StatusCode.UNSET)
# Span processors that act in on_end only (their on_start does nothing): spans made finished
# reach them whole. Any other keeps the SDK's Span for the steps.
_EXPORTING = (BatchSpanProcessor, SimpleSpanProcessor)
INTERNAL_METRICS = "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"


def remote_parent(traceparent: bytes, tracestate: bytes | None = None) -> SpanContext:
    """The span context a record's headers carry; BadTraceParent if it is not one."""
    trace_id, span_id, flags = parse(traceparent)
    state = None
    if tracestate:
        state = TraceState.from_header([tracestate.decode("ascii", "replace")])
    return SpanContext(trace_id, span_id, True, TraceFlags(flags), state)


class _SpanParts:
    """What the SDK's tracer uses to make a span, to make a step's spans already finished.

    `decide` is the SDK's `start_span` for a remote parent: the same sampler call, span id,
    flags and trace state; `end` hands the finished span to the processors, as the SDK's
    `Span.end` does. Read from the tracer's attributes, so `of` is None on an SDK that has
    moved them (then the steps use the SDK's spans).
    """

    __slots__ = ("enabled", "ids", "limits", "processor", "resource", "sampler", "scope")

    def __init__(self, tracer: Any) -> None:
        self.sampler = tracer.sampler
        self.ids = tracer.id_generator
        self.processor = tracer.span_processor
        self.resource = tracer.resource
        self.scope = tracer._instrumentation_scope
        # the SDK bounds a span's attributes (OTEL_SPAN_ATTRIBUTE_*_LIMIT): so do these
        self.limits = tracer._span_limits
        # the SDK's tracer configurator may turn a tracer off (its spans then non-recording)
        self.enabled = getattr(tracer, "_is_enabled", lambda: True)

    @classmethod
    def of(cls, tracer: Any) -> _SpanParts | None:
        """The parts, or None where a finished span would be noticed: a span processor other
        than the SDK's exporting ones (it may act in `on_start`, which a finished span never
        sees), the SDK's own metrics on (they count spans started), an SDK that moved them."""
        processors = getattr(tracer.span_processor, "_span_processors", None)
        if processors is None or any(type(p) not in _EXPORTING for p in processors):
            return None
        if os.environ.get(INTERNAL_METRICS, "").strip().lower() == "true":
            return None
        try:
            return cls(tracer)
        except AttributeError:
            return None

    def decide(
        self, name: str, context: Any, parent: SpanContext, attributes: dict[str, Any]
    ) -> tuple[SpanContext, dict[str, Any] | None]:
        """The new span's context, and its attributes when it is recorded (None: it is not)."""
        if not self.enabled():
            return parent, None  # as the SDK's off tracer: the parent's context passes on
        trace_id = parent.trace_id
        result = self.sampler.should_sample(
            context, trace_id, name, SpanKind.CONSUMER, attributes, ()
        )
        decision = result.decision
        flags = TraceFlags.SAMPLED if decision.is_sampled() else TraceFlags.DEFAULT
        if parent.trace_flags & TraceFlags.RANDOM_TRACE_ID:
            flags |= TraceFlags.RANDOM_TRACE_ID
        span_context = SpanContext(
            trace_id,
            self.ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags),
            trace_state=result.trace_state,
        )
        if not decision.is_recording():
            return span_context, None
        kept = dict(result.attributes) if result.attributes else {}
        limits = self.limits
        count = limits.max_span_attributes
        too_many = count is not None and len(kept) > count
        if too_many or limits.max_span_attribute_length is not None:
            kept = BoundedAttributes(
                limits.max_span_attributes,
                kept,
                immutable=False,
                max_value_len=limits.max_span_attribute_length,
            )
        return span_context, kept

    def end(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext,
        attributes: dict[str, Any],
        status: Status,
        start: int,
        end: int,
    ) -> None:
        self.processor.on_end(
            ReadableSpan(
                name,
                context,
                parent,
                self.resource,
                attributes,
                kind=SpanKind.CONSUMER,
                status=status,
                start_time=start,
                end_time=end,
                instrumentation_scope=self.scope,
            )
        )


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
