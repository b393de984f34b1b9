"""A second service for the reactions' tests: it tallies the ledger's events per account.

The reaction turns each ledger event into a `count` command for the same account; the tally
keeps how many events it counted and their net amount. So, per account, the tally must equal
the ledger's own state: `events` its version (events applied), `net` its balance. A command
lost or applied twice shows up as a difference. TALLY_UPSTREAM names the ledger's app id.

The reaction reads the ledger's events as the typed ledger declares them (ledger.typed): they
are its side of the contract that `enhydra topology check` compares with the ledger's.
"""

from __future__ import annotations

import os
from typing import Any

from enhydra import Aggregate, Service
from enhydra.reactions import Emit, Reaction, Upstream
from ledger.typed import Closed, Deposited, Opened, Withdrawn

SIGN = {"opened": 0, "closed": 0, "deposited": 1, "withdrawn": -1}


def decide(state: dict[str, Any] | None, command: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "counted", "delta": command["delta"]}]


def apply(state: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any]:
    state = state or {"events": 0, "net": 0}
    return {"events": state["events"] + 1, "net": state["net"] + event["delta"]}


def tally(upstream: Upstream) -> list[Emit]:
    sign = SIGN.get(upstream.type or "")
    if sign is None or upstream.key is None:
        return []
    delta = sign * getattr(upstream.event, "amount", 0)
    return [Emit(upstream.key, {"type": "count", "delta": delta})]


service = Service(
    "tally",
    Aggregate("tallies", decide, apply),
    reactions=[
        Reaction(
            "tally",
            os.environ.get("TALLY_UPSTREAM", "ledger"),
            tally,
            reads=[Opened, Deposited, Withdrawn, Closed],
        )
    ],
)
