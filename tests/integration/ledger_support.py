"""Helpers shared by the ledger's integration tests."""

from __future__ import annotations

import asyncio

from enhydra.testing.processes import ServiceProcess, produce_json, wait_for_committed


def read_accounts(instances: list[ServiceProcess], accounts: list[str]) -> dict[str, dict]:
    """Read every account from whichever instance hosts it (421 means 'ask another one')."""
    found: dict[str, dict] = {}
    for account in accounts:
        answers = [inst.get(f"/v1/stores/accounts/keys/{account}") for inst in instances]
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
