"""How big a record is to a broker: one estimate wherever a record is checked against the limit.

The pure step checks every record a batch will write against the limit before anything of the
batch is published (processing/core.py, errors/dlq.py), and the checkpoint keeps its record
batches within it (runner/checkpoint.py, which also learns the limit): one estimate for all.
"""

from __future__ import annotations

# What a record adds to its key, value and headers on the wire, at most: its record batch's
# header when it travels alone (61 bytes), its own lengths and deltas (21), and room for a
# header the runtime may add later (an epoch on a changelog record).
RECORD_OVERHEAD = 256
HEADER_OVERHEAD = 10  # a header's two length varints
# The producers' max_request_size (aiokafka's default), said once: no record may exceed it.
MAX_REQUEST_SIZE = 1_048_576


def record_size(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None = None
) -> int:
    """An upper bound of the bytes a broker counts for this record against max.message.bytes."""
    size = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
    for name, data in headers or ():
        size += len(name) + HEADER_OVERHEAD + (len(data) if data else 0)
    return size
