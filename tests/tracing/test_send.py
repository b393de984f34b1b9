"""`enhydra send` with and without tracing: the same records, acknowledged window by window."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from enhydra.cli.send import WINDOW, produce
from enhydra.contracts.headers import TRACEPARENT_HEADER, header
from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.testing.processes import read_topic
from enhydra.tracing.context import format_traceparent, parse
from enhydra.tracing.spans import Tracing

pytestmark = [pytest.mark.integration]


@pytest.mark.parametrize("traced", [False, True], ids=["off", "on"])
async def test_records_are_acknowledged_window_by_window(kafka_bootstrap, app_id, traced) -> None:
    topic = f"{app_id}-commands"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)], client_id="test")
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    parent = format_traceparent(0xAB, 0xCD, 1)
    records = [(b"k%d" % i, b'{"n": %d}' % i) for i in range(WINDOW + 1)]
    seen: list[int] = []
    options = (Tracing(provider), parent, None) if traced else None
    assert await produce(kafka_bootstrap, topic, records, seen.append, options) == WINDOW + 1
    assert seen == [WINDOW, WINDOW + 1]
    written = await read_topic(kafka_bootstrap, topic)
    assert len(written) == WINDOW + 1
    if not traced:
        assert all(not r.headers for r in written)
        return
    sent = {s.context.span_id: s for s in spans.get_finished_spans()}
    assert len(sent) == WINDOW + 1  # each ended once Kafka acknowledged its record
    for record in written:
        trace_id, span_id, _ = parse(header(record.headers, TRACEPARENT_HEADER))
        assert trace_id == 0xAB and sent[span_id].parent.span_id == 0xCD
