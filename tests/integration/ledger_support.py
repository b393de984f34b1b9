"""Helpers shared by the ledger's integration tests."""

from __future__ import annotations

import asyncio
import time

from enhydra.testing.processes import ServiceProcess, produce_json, wait_for_committed


def ask_all(instances: list[ServiceProcess], path: str, timeout: float = 30.0) -> list:
    """GET `path` from every instance, retrying while any answers 503 (rebalance, restore)."""
    deadline = time.monotonic() + timeout
    while True:
        answers = [inst.get(path) for inst in instances]
        if all(status != 503 for status, _ in answers) or time.monotonic() > deadline:
            return answers
        time.sleep(0.2)


def read_accounts(instances: list[ServiceProcess], accounts: list[str]) -> dict[str, dict]:
    """Read every account from whichever instance hosts it (421 means 'ask another one')."""
    found: dict[str, dict] = {}
    for account in accounts:
        answers = ask_all(instances, f"/v1/stores/accounts/keys/{account}")
        hits = [body for status, body in answers if status == 200]
        assert len(hits) <= 1, f"{account} served by more than one instance: {answers}"
        if hits:
            found[account] = hits[0]
        else:
            assert all(status in (404, 421) for status, _ in answers), answers
    return found


def feed(bootstrap: str, app_id: str, commands: list) -> None:
    asyncio.run(produce_json(bootstrap, f"{app_id}-commands", commands))
    asyncio.run(wait_for_committed(bootstrap, app_id, f"{app_id}-commands", timeout=120))
