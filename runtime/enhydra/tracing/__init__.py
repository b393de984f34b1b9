"""One trace across services: W3C trace context in record headers, spans for each batch.

Off unless OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`); the other standard
OTEL_* variables (endpoint, headers, sampler and its argument, service name, batch processor)
are read by the OpenTelemetry SDK itself. Off, nothing of OpenTelemetry is imported and every
hot path pays one `is None` check per batch. On, the SDK comes from `enhydra[tracing]`.

What is traced (docs/tracing.md): `enhydra send` starts a span per record and puts its
context on the command; the aggregate's step continues it in a `decide` span whose context
goes on the command's events (and rejection); a reaction continues an event's context in a
`react` span whose context goes on the commands it writes; every batch of the task runner is
a `batch` span with its phases (decide, publish, commit) as children, linked to the spans of
the sampled records it handled.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from enhydra.tracing.spans import Tracing

__all__ = ["TracingError", "current", "exporters", "use"]

EXPORTERS = ("otlp", "console")


class TracingError(ValueError):
    """Tracing is asked for but cannot run: an unknown exporter, or the SDK is missing."""


def exporters(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The exporters OTEL_TRACES_EXPORTER names; () when tracing is off.

    Unset (unlike the SDK's own default, otlp) or `none` is off, so a service pays nothing
    unless asked; OTEL_SDK_DISABLED=true turns it off whatever else is set.
    """
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    raw = env.get("OTEL_TRACES_EXPORTER", "")
    names = tuple(dict.fromkeys(n.strip().lower() for n in raw.split(",") if n.strip()))
    names = tuple(n for n in names if n != "none")
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise TracingError(
            f"OTEL_TRACES_EXPORTER={raw!r}: Enhydra exports spans with "
            f"{' or '.join(EXPORTERS)} (or none); {', '.join(unknown)} is not one of them"
        )
    return names


_unset = object()
_current: object = _unset


def current(service: str | None = None) -> Tracing | None:
    """The process's tracing, configured from the environment on first use; None when off.

    `service` is the service.name spans are reported under unless OTEL_SERVICE_NAME (or
    OTEL_RESOURCE_ATTRIBUTES) says; the first call decides. TracingError: asked for, but
    cannot run (one line to show as it is).
    """
    global _current
    if _current is _unset:
        names = exporters()
        if not names:
            _current = None
        else:
            from enhydra.tracing.setup import from_environment

            _current = from_environment(names, service or "enhydra")
    return _current  # type: ignore[return-value]


def use(tracing: Tracing | None) -> None:
    """Make `tracing` the process's (tests and benchmarks: an in-memory exporter, or off).

    Engines read it when they are built: call this before starting them.
    """
    global _current
    _current = tracing


def reset() -> None:
    """Forget the configured tracing; the next `current()` reads the environment again."""
    global _current
    _current = _unset
