"""The ledger with two planted faults, for the robustness tests.

- decide raises RuntimeError for the account "cursed" (a bug in a handler);
- a command with a "memo" puts it into its event, so a big memo makes an output too large.
- the account "flaky" fails with ConnectionError (declared transient) on its first three
  attempts, and the account "down" always does.
"Fixing" them means running the real `ledger.service:service` again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from enhydra import Service
from ledger.domain import accounts
from ledger.domain import decide as ledger_decide

CURSED = "cursed"
_flaky_attempts = 0


def decide(state: Any, command: dict[str, Any]) -> list[dict[str, Any]]:
    global _flaky_attempts
    if command["account"] == CURSED:
        raise RuntimeError(f"handler bug for account {CURSED!r}")
    if command["account"] == "down":
        raise ConnectionError("ledger backend unreachable")
    if command["account"] == "flaky" and _flaky_attempts < 3:
        _flaky_attempts += 1
        raise ConnectionError(f"ledger backend hiccup #{_flaky_attempts}")
    events = ledger_decide(state, command)
    if "memo" in command:
        events = [{**event, "memo": command["memo"]} for event in events]
    return events


service = Service(
    "ledger",
    replace(accounts, decide=decide),
    partitions=4,
    deserialization_exception_handler="dlq",
    processing_exception_handler="dlq",
    production_exception_handler="dlq",
    max_output_bytes=2048,
    transient_errors=(ConnectionError,),
)
