"""W3C Trace Context in record headers, without OpenTelemetry: find, parse, format.

Pure and cheap, so the hot path can pass an unsampled context along (copy its header) without
asking the SDK, and `enhydra send` can check a TRACEPARENT it was given before sending.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from enhydra.contracts.headers import TRACEPARENT_HEADER, TRACESTATE_HEADER

Header = tuple[str, bytes]
# (trace id, parent span id, flags) of a valid traceparent
TraceParent = tuple[int, int, int]

_HEX = frozenset(b"0123456789abcdef")
_VERSION_00 = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
SAMPLED = 0x01  # the one flag W3C defines: the caller may have recorded its span


class BadTraceParent(ValueError):
    """A traceparent that is not `00-<32 hex>-<16 hex>-<2 hex>` (lower case, ids not zero)."""


def _hex(part: bytes, size: int) -> int | None:
    if len(part) != size or not _HEX.issuperset(part):
        return None
    return int(part, 16)


def parse(value: bytes | str) -> TraceParent:
    """(trace id, span id, flags) of a traceparent; BadTraceParent says what is wrong.

    Version 00 is exactly 55 characters; a later version may append fields after a '-', which
    are ignored, as the W3C asks of readers of an older version. Version ff is invalid.
    """
    raw = value.encode("ascii", "replace") if isinstance(value, str) else value
    exact = _VERSION_00.fullmatch(raw)  # what every valid context here is: one regex, no split
    if exact is not None:
        trace_id, span_id = int(exact[1], 16), int(exact[2], 16)
        if trace_id and span_id:
            return trace_id, span_id, int(exact[3], 16)
    parts = raw[:55].split(b"-")
    version = _hex(parts[0], 2) if parts else None
    if len(parts) != 4 or version is None or version == 0xFF:
        raise BadTraceParent(f"{_shown(raw)} is not version-traceid-spanid-flags")
    if (version == 0 and len(raw) != 55) or (len(raw) > 55 and raw[55:56] != b"-"):
        raise BadTraceParent(f"{_shown(raw)} has the wrong length for version {parts[0].decode()}")
    trace_id, span_id, flags = _hex(parts[1], 32), _hex(parts[2], 16), _hex(parts[3], 2)
    if trace_id is None or span_id is None or flags is None:
        raise BadTraceParent(f"{_shown(raw)}: ids and flags are lower-case hex (32, 16, 2 digits)")
    if trace_id == 0 or span_id == 0:
        raise BadTraceParent(f"{_shown(raw)}: an all-zero trace id or span id is invalid")
    return trace_id, span_id, flags


def _shown(raw: bytes) -> str:
    return repr(raw[:80].decode("ascii", "replace"))


def format_traceparent(trace_id: int, span_id: int, flags: int) -> bytes:
    """The version-00 traceparent of a span."""
    return b"00-%032x-%016x-%02x" % (trace_id, span_id, flags & 0xFF)


def sampled(traceparent: bytes) -> bool:
    """Whether a traceparent (already found valid, or about to be) has the sampled flag."""
    return traceparent[53:55] in SAMPLED_FLAGS


# The flags field (characters 53-54 of a traceparent) of every context with the sampled flag.
SAMPLED_FLAGS = frozenset(b"%02x" % flags for flags in range(256) if flags & SAMPLED)


def carried(headers: Iterable[Header] | None) -> tuple[bytes | None, bytes | None]:
    """(traceparent, tracestate) of a record's headers; None where absent."""
    parent = state = None
    for name, value in headers or ():
        if name == TRACEPARENT_HEADER:
            parent = value
        elif name == TRACESTATE_HEADER:
            state = value
    return parent, state


def carry(traceparent: bytes, tracestate: bytes | None = None) -> list[Header]:
    """The headers that pass a context on: a record made from a record carrying it."""
    if tracestate:
        return [(TRACEPARENT_HEADER, traceparent), (TRACESTATE_HEADER, tracestate)]
    return [(TRACEPARENT_HEADER, traceparent)]
