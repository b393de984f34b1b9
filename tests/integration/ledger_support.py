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
    """Read every account through every instance: each answers (forwarding to the owner).

    All instances must agree; a key none of them has is absent from the result.
    """
    found: dict[str, dict] = {}
    for account in accounts:
        answers = ask_all(instances, f"/v1/stores/accounts/keys/{account}")
        statuses = {status for status, _ in answers}
        if statuses == {404}:
            continue
        assert statuses == {200}, f"{account}: {answers}"
        bodies = [body for _, body in answers]
        assert all(body == bodies[0] for body in bodies), f"{account}: instances disagree"
        found[account] = bodies[0]
    return found


def feed(bootstrap: str, app_id: str, commands: list) -> None:
    asyncio.run(produce_json(bootstrap, f"{app_id}-commands", commands))
    asyncio.run(wait_for_committed(bootstrap, app_id, f"{app_id}-commands", timeout=120))


async def produce_in_chunks(
    bootstrap: str, topic: str, commands: list, *, chunk: int = 1000, pause: float = 0.15
) -> None:
    """Produce commands a chunk at a time with a pause: load that is still arriving."""
    for start in range(0, len(commands), chunk):
        await produce_json(bootstrap, topic, commands[start : start + chunk])
        await asyncio.sleep(pause)
