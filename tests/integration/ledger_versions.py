"""The ledger as first deployed (events v1) and as upgraded (v2), for the event-version tests.

v1: `deposited` was {"type": "deposited", "amount": n}, and its code declared no versions
(so it wrote `enhydra.event_version: 1`, or no header at all before versions existed).
v2 is the ledger of examples/ledger: {"type": "deposited", "amount": n, "currency": "EUR"}
with an upcaster from v1. `v2_service` adds a projection whose `project` reads the currency,
so a v1 event reaching it without its upcaster would fail.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from enhydra import Service
from enhydra.projections.model import Projection
from ledger.domain import accounts
from ledger.domain import apply as ledger_apply
from ledger.domain import decide as ledger_decide

Event = dict[str, Any]


def decide_v1(state: Any, command: dict[str, Any]) -> list[Event]:
    """The first version's decide: deposits carried no currency."""
    return [
        {k: v for k, v in event.items() if k != "currency"}
        for event in ledger_decide(state, command)
    ]


def apply_v1(state: Any, event: Event) -> Any:
    """The first version's apply: it never saw a currency (every deposit was in euros)."""
    if event["type"] == "deposited":
        if "currency" in event:
            raise ValueError(f"v1 code cannot read {event!r}")
        event = {**event, "currency": "EUR"}
    return ledger_apply(state, event)


accounts_v1 = replace(accounts, decide=decide_v1, apply=apply_v1, event_versions={}, upcasters={})


def balances(state: Any, event: Event) -> Any:
    """A read model: each account's balance per currency, from the events alone."""
    kind = event["type"]
    if kind == "opened":
        return {"EUR": 0}
    if kind == "deposited":
        currency = event["currency"]  # v2's field: v1 events must arrive upcast
        return {**state, currency: state.get(currency, 0) + event["amount"]}
    if kind == "withdrawn":
        return {**state, "EUR": state["EUR"] - event["amount"]}
    return state


v1_service = Service("ledger", accounts_v1, partitions=4)
v2_service = Service(
    "ledger", accounts, partitions=4, projections=[Projection("balances", balances)]
)


# -- a stored-state version: the ledger whose state also names its currency ---------------


def state_v1_to_v2(state: Any) -> Any:
    """State v1 {balance, status, version} -> v2: the balance's currency, always euros then."""
    return {**state, "currency": "EUR"}


def apply_state_v2(state: Any, event: Event) -> Any:
    return {**ledger_apply(state, event), "currency": "EUR"}


accounts_state_v2 = replace(
    accounts, apply=apply_state_v2, state_version=2, state_migrations={1: state_v1_to_v2}
)
state_v2_service = Service("ledger", accounts_state_v2, partitions=4)
