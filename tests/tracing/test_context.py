"""W3C traceparent in record headers (pure) and when tracing is on at all (the switch)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enhydra import tracing
from enhydra.contracts.headers import TRACEPARENT_HEADER, TRACESTATE_HEADER
from enhydra.errors.uncaught import EXIT_CANNOT_START
from enhydra.tracing.context import (
    BadTraceParent,
    carried,
    carry,
    format_traceparent,
    parse,
    sampled,
)

VALID = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_is_read() -> None:
    assert parse(VALID) == (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)
    assert parse(VALID.decode()) == parse(VALID)
    assert sampled(VALID)
    assert not sampled(VALID[:-2] + b"00")


@given(
    st.integers(1, 2**128 - 1),
    st.integers(1, 2**64 - 1),
    st.integers(0, 255),
)
def test_format_and_parse_are_inverse(trace_id: int, span_id: int, flags: int) -> None:
    value = format_traceparent(trace_id, span_id, flags)
    assert len(value) == 55
    assert parse(value) == (trace_id, span_id, flags)
    assert sampled(value) == bool(flags & 1)


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"garbage",
        VALID.upper(),  # upper-case hex
        VALID[:-1],  # too short
        VALID + b"0",  # version 00 has exactly 55 characters
        b"ff" + VALID[2:],  # version ff is invalid
        b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        b"00-4bf92f3577b34da6a3ce929d0e0e47-3600f067aa0ba902b7-01",  # misplaced dash
    ],
)
def test_a_bad_traceparent_is_refused_with_the_reason(value: bytes) -> None:
    with pytest.raises(BadTraceParent):
        parse(value)


def test_a_later_version_may_add_fields() -> None:
    assert parse(b"01" + VALID[2:] + b"-what-comes-next")[2] == 1
    with pytest.raises(BadTraceParent):
        parse(b"01" + VALID[2:] + b"x")


def test_headers_are_found_and_carried() -> None:
    headers = [("enhydra.command_id", b"c1"), (TRACEPARENT_HEADER, VALID)]
    assert carried(headers) == (VALID, None)
    assert carried([*headers, (TRACESTATE_HEADER, b"k=v")]) == (VALID, b"k=v")
    assert carried(None) == (None, None)
    assert carry(VALID) == [(TRACEPARENT_HEADER, VALID)]
    assert carry(VALID, b"k=v") == [(TRACEPARENT_HEADER, VALID), (TRACESTATE_HEADER, b"k=v")]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ()),
        ({"OTEL_TRACES_EXPORTER": "none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": " OTLP , console,otlp"}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, ()),
    ],
)
def test_tracing_is_off_unless_an_exporter_is_named(env, expected) -> None:
    assert tracing.exporters(env) == expected


def test_an_unknown_exporter_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(tracing.TracingError, match="zipkin is not one of them") as caught:
        tracing.exporters({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert "otlp or console" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_off_by_default_imports_nothing_of_opentelemetry() -> None:
    """A service without OTEL_TRACES_EXPORTER loads its engines and never imports the SDK."""
    code = (
        "import os, sys\n"
        "os.environ.pop('OTEL_TRACES_EXPORTER', None)\n"
        "from enhydra import tracing\n"
        "import enhydra.processing.engine, enhydra.reactions.engine, enhydra.cli.send\n"
        "import enhydra.runner.runner, enhydra.service\n"
        "assert tracing.current('x') is None\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_service_asked_for_an_unknown_exporter_stops_at_start_in_one_line(tmp_path) -> None:
    """Before it touches Kafka: no broker is needed to see the refusal."""
    env = {
        **os.environ,
        "ENHYDRA_APP_ID": "traced",
        "ENHYDRA_STATE_DIR": str(tmp_path),
        "OTEL_TRACES_EXPORTER": "zipkin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", "run", "ledger.service:service"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_CANNOT_START, done.stdout + done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines() if "zipkin" in line]
    assert len(said) == 1 and "tracing cannot start" in said[0], said
    assert "Traceback" not in done.stdout + done.stderr
