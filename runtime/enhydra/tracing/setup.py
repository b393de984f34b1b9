"""The OpenTelemetry SDK, configured from the standard OTEL_* variables (imported only when on).

The SDK reads its own settings: the sampler (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG),
the OTLP endpoint, headers and timeout (OTEL_EXPORTER_OTLP_*), the batch processor
(OTEL_BSP_*), the resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES). Here: which
exporters, and a service name when none is set.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence

from enhydra.tracing import TracingError
from enhydra.tracing.spans import Tracing

HINT = "pip install 'enhydra[tracing]'"


def from_environment(names: Sequence[str], service: str) -> Tracing:
    """A Tracing that exports to `names` (otlp, console) through batch processors."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise TracingError(
            f"OTEL_TRACES_EXPORTER asks for tracing, but the OpenTelemetry SDK is not "
            f"installed: {HINT}"
        ) from None
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": service}))
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    atexit.register(provider.shutdown)  # what is still batched is exported at exit
    return Tracing(provider)


def _exporter(name: str):
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    try:
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        elif protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            raise TracingError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use http/protobuf (the default) or grpc"
            )
    except ImportError:
        extra = "pip install opentelemetry-exporter-otlp-proto-grpc" if protocol == "grpc" else HINT
        raise TracingError(f"the OTLP exporter for {protocol} is not installed: {extra}") from None
    return OTLPSpanExporter()
