"""A reproducible stream of ledger commands and an independent model of its outcome.

The model is written separately from `domain.py` on purpose: tests compare the service against
it, so a bug in decide/apply cannot hide by agreeing with itself.
"""

from __future__ import annotations

import random
from typing import Any

Command = dict[str, Any]


def generate(
    accounts: int, commands: int, *, seed: int = 7, prefix: str = "acct"
) -> list[tuple[str, Command]]:
    """`commands` commands over `accounts` accounts: opens first, then a realistic mix.

    About 2% are retries of an earlier command id, some withdrawals overdraw, a few accounts
    drain and close, and some commands target accounts that were never opened.
    """
    rng = random.Random(seed)
    names = [f"{prefix}-{i:06d}" for i in range(accounts)]
    out: list[tuple[str, Command]] = []
    counter = 0

    def command(account: str, kind: str, amount: int = 0) -> tuple[str, Command]:
        nonlocal counter
        counter += 1
        body: Command = {"command_id": f"c{seed}-{counter}", "type": kind, "account": account}
        if kind in ("deposit", "withdraw"):
            body["amount"] = amount
        return account, body

    for name in names[: max(1, accounts * 95 // 100)]:
        out.append(command(name, "open"))
    while len(out) < commands:
        roll = rng.random()
        name = rng.choice(names)
        if roll < 0.02 and out:
            out.append(rng.choice(out))  # a client retry: same command id again
        elif roll < 0.55:
            out.append(command(name, "deposit", rng.randint(1, 500)))
        elif roll < 0.97:
            out.append(command(name, "withdraw", rng.randint(1, 400)))
        else:
            out.append(command(name, "close"))
    return out[:commands]


def model(commands: list[tuple[str, Command]]) -> dict[str, dict[str, Any]]:
    """The final state of every account, computed by the rules written out plainly."""
    accounts: dict[str, dict[str, Any]] = {}
    seen: dict[str, set[str]] = {}
    for account, cmd in commands:
        ids = seen.setdefault(account, set())
        if cmd["command_id"] in ids:
            continue
        state = accounts.get(account)
        kind, amount = cmd["type"], cmd.get("amount", 0)
        if kind == "open":
            if state is not None:
                continue
            accounts[account] = {"balance": 0, "status": "open", "version": 1}
        elif state is None or state["status"] != "open":
            continue
        elif kind == "deposit":
            state["balance"] += amount
            state["version"] += 1
        elif kind == "withdraw":
            if amount > state["balance"]:
                continue
            state["balance"] -= amount
            state["version"] += 1
        elif kind == "close":
            if state["balance"] != 0:
                continue
            state["status"] = "closed"
            state["version"] += 1
        ids.add(cmd["command_id"])
    return accounts
