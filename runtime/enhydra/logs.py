"""Logging as data: structlog events, JSON in containers, readable in a terminal.

Standard-library loggers (faust, mode, aiokafka) go through the same processors, so one line
format covers the whole process and a log shipper needs no special cases.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import structlog

_configured: dict[str, Any] = {}


def _shared_processors(static: dict[str, Any]) -> list[Any]:
    def add_static(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        for key, value in static.items():
            event.setdefault(key, value)
        return event

    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_static,
    ]


def configure_logging(
    *,
    fmt: str = "auto",
    level: str = "info",
    static: dict[str, Any] | None = None,
    filters: Sequence[logging.Filter] = (),
) -> None:
    """Route structlog and stdlib logging to stderr as JSON ('json') or colours ('console').

    'auto' picks console for a terminal and JSON otherwise (containers, CI, files). `filters`
    see every line before it is written (e.g. enhydra.kafka.noise's rate limit).
    """
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    shared = _shared_processors(static or {})
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    for line_filter in filters:
        handler.addFilter(line_filter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Kafka clients are chatty at INFO about routine group coordination, and faust's and
    # mode's INFO lines describe their own start-up, not the service's.
    for noisy in ("aiokafka", "kafka", "faust", "mode"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    _configured.update(fmt=fmt, level=level)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
