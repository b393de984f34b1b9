"""Per-account activity of the ledger, as a projection added by a plugin.

State per account: how many deposits and withdrawals it saw, their totals, and the last event
type. Built from the ledger's events only, so it can be added to a running ledger (it reads the
events topic from the beginning) and removed again without touching the accounts store.
"""

from __future__ import annotations

from typing import Any

from enhydra.plugins import Plugin
from enhydra.projections import Projection

EMPTY = {"deposits": 0, "withdrawals": 0, "deposited": 0, "withdrawn": 0, "last": None}


def project(state: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any]:
    """Fold one ledger event into the account's activity (pure)."""
    state = dict(state or EMPTY)
    kind = event.get("type")
    if kind == "deposited":
        state["deposits"] += 1
        state["deposited"] += event["amount"]
    elif kind == "withdrawn":
        state["withdrawals"] += 1
        state["withdrawn"] += event["amount"]
    state["last"] = kind
    return state


activity = Projection(
    "activity", project, description="Per-account deposit and withdrawal counts and totals."
)

plugin = Plugin(
    "ledger-audit",
    projections=[activity],
    aggregates=("accounts",),
    description="Per-account activity of the ledger.",
)
