"""The ledger workload and the ledger logic every competitor runs, shared so the work is equal.

The commands come from `ledger.workload.generate` (opens first, then deposits, withdrawals,
closes, ~2% client retries). The competitors run the ledger's own `parse`/`decide`/`apply`
(ledger.domain) with the same bookkeeping Enhydra keeps per key: the offset of the last applied
command (to skip redeliveries) and the last 100 command ids (to reject client retries), stored
with the same orjson encoding. Each command yields exactly one output: its event, or a
rejection. Without this, a competitor would be measured doing less work than Enhydra.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import orjson


def _light_enhydra() -> None:
    """Make `import ledger.domain` cost only enhydra.aggregate, not Enhydra's whole runtime.

    `enhydra/__init__` imports the Service (faust, aiohttp, pyarrow...): ~1 s and ~70 MB that a
    competitor's process would otherwise carry into its peak RSS. The package is registered
    without running its __init__; submodules still import normally.
    """
    if "enhydra" in sys.modules:
        return
    spec = importlib.util.find_spec("enhydra")
    if spec is None or spec.submodule_search_locations is None:
        return
    package = types.ModuleType("enhydra")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules["enhydra"] = package
    from enhydra import aggregate

    package.Aggregate = aggregate.Aggregate
    package.InvalidCommand = aggregate.InvalidCommand
    package.Rejection = aggregate.Rejection


_light_enhydra()

from enhydra import InvalidCommand, Rejection  # noqa: E402
from ledger.domain import apply, decide, parse  # noqa: E402
from ledger.workload import generate  # noqa: E402

PARTITIONS = 4
DEDUP_WINDOW = 100
COMMANDS_TOPIC = "bench-commands"

# A decoded state entry, as Enhydra stores it: [last applied offset, recent command ids, state].
Entry = list[Any]


def command_records(keys: int, count: int, seed: int = 7) -> list[tuple[bytes, bytes, list]]:
    """(key, JSON value, headers) of `count` ledger commands over `keys` accounts."""
    dumps = orjson.dumps
    return [(k.encode(), dumps(v), []) for k, v in generate(keys, count, seed=seed)]


def events_topic(app: str) -> str:
    return f"{app}-events"


def rejections_topic(app: str) -> str:
    return f"{app}-rejections"


def _rejection(key: str, command_id: Any, offset: int, reason: str, command: Any) -> bytes:
    return orjson.dumps(
        {
            "command_id": command_id,
            "key": key,
            "reason": reason,
            "offset": offset,
            "command": command,
        }
    )


def step(
    entry: Entry | None, key: str, value: bytes, offset: int
) -> tuple[Entry | None, bytes | None, bool]:
    """One command against its key's entry: (new entry or None if unchanged, output, is_event).

    The output is None only for a redelivered command (offset at or below the entry's), which
    Enhydra skips silently too; on a clean run that never happens.
    """
    if entry is not None and offset <= entry[0]:
        return None, None, False
    try:
        command = parse(orjson.loads(value))
    except (InvalidCommand, orjson.JSONDecodeError) as exc:
        return None, _rejection(key, None, offset, f"invalid: {exc}", None), False
    command_id = command.get("command_id")
    if entry is not None and command_id in entry[1]:
        return None, _rejection(key, command_id, offset, "duplicate command_id", command), False
    state = entry[2] if entry is not None else None
    try:
        events = decide(state, command)
        for event in events:
            state = apply(state, event)
    except Rejection as rejection:
        return None, _rejection(key, command_id, offset, rejection.reason, command), False
    ids = entry[1] if entry is not None else []
    ids = [*ids[-(DEDUP_WINDOW - 1) :], command_id]
    # The ledger emits exactly one event per accepted command.
    return [offset, ids, state], orjson.dumps(events[0]), True


encode_entry = orjson.dumps
decode_entry = orjson.loads
