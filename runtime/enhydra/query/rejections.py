"""What a rejection says: its key, command id, command type and reason, from its JSON value.

A rejection record (processing/core.py `Rejected.to_value`) carries the command id, the key,
the reason decide gave, the command's offset and the command itself. The CLI
(`enhydra rejections`) and the status page (the recent ones this instance published) both show
it through `summary`, so they agree on what a rejection looks like.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from enhydra.processing.engine import Engine

FIELDS = ("key", "command_id", "type", "reason")


def _text(raw: bytes | None) -> str | None:
    return raw.decode("utf-8", "replace") if raw is not None else None


def summary(value: bytes | None, key: bytes | None = None) -> dict[str, Any]:
    """The rejection in `value` as plain fields; a record that is not one says so in `reason`."""
    try:
        body = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or "reason" not in body:
        shown = _text(value)
        return {
            "key": _text(key),
            "command_id": None,
            "type": None,
            "reason": f"(not a rejection record: {shown[:80] if shown else 'no value'})",
            "command_offset": None,
        }
    command = body.get("command")
    return {
        "key": body.get("key") if body.get("key") is not None else _text(key),
        "command_id": body.get("command_id"),
        "type": command.get("type") if isinstance(command, dict) else None,
        "reason": str(body.get("reason")),
        "command_offset": body.get("offset"),
    }


def line(row: dict[str, Any]) -> str:
    """One rejection on one line: `key  command id  type  reason`."""
    shown = [row.get(name) for name in FIELDS]
    return "  ".join("-" if value is None else str(value) for value in shown)


def recent(engine: Engine) -> list[dict[str, Any]]:
    """The rejections this instance published lately (the step's ring buffer), newest first."""
    buffer = getattr(engine.step, "recent_rejections", ())
    found = []
    for partition, at, rejected in reversed(list(buffer)):
        row = summary(rejected.payload)
        row["partition"] = partition
        row["at"] = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="milliseconds")
        found.append(row)
    return found
