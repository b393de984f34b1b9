"""Two services on the real broker: the ledger, and a tally that reacts to its events.

The faults, while the ledger's events flow: kill -9 of the reacting service once its reaction
has made commands, then kill -9 of the ledger, which may publish some events again at new
offsets when it restarts (the same source, so the same command ids). Afterwards every
account's tally equals an independent model of the ledger's commands: nothing lost, nothing
applied twice. The first tally commits its offsets once a minute (its first batch at once) and
is killed after its third batch: the commands published since its first commit are made again
from the events read again, and the copies show up in the commands topic, skipped by their ids.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from enhydra.testing.processes import read_topic, wait_for_committed
from ledger.workload import generate, model
from tests.integration.ledger_support import ask_all, produce_in_chunks

LEDGER = "ledger.service:service"
TALLY = "tests.reactions.tally_service:service"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def read_tallies(instance, accounts: list[str]) -> dict[str, dict]:
    found = {}
    for account in accounts:
        [(status, body)] = ask_all([instance], f"/v1/stores/tallies/keys/{account}")
        if status == 200:
            found[account] = body
        else:
            assert status == 404, (account, status, body)
    return found


def test_each_service_killed_mid_flow_loses_no_command_and_applies_none_twice(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    tally_id = f"{app_id}-tally"
    env = {"ENHYDRA_APP_ID": tally_id, "TALLY_UPSTREAM": app_id}
    rarely = {**env, "ENHYDRA_COMMIT_INTERVAL_MS": "60000"}  # the first tally only
    commands = generate(300, 12000, seed=28)
    ledger = service_factory(LEDGER, "l1", state_dir=tmp_path / "l1")
    tally = service_factory(TALLY, "t1", state_dir=tmp_path / "t1", extra_env=rarely)
    ledger.wait_ready()
    tally.wait_ready()
    killed: dict[str, int] = {}
    restarted = {}

    async def kill_when(name, instance, count, at_least: int):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, stats = await asyncio.to_thread(instance.get, "/v1/stats")
            done = count(stats) if status == 200 else 0
            if done >= at_least:
                instance.kill()
                killed[name] = done
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{name} did not reach {at_least} within 120 s")

    def reaction_batches(stats) -> int:
        return (stats.get("reactions") or {}).get("tally", {}).get("batches", 0)

    async def faults() -> None:
        # the reaction, past its first commit; then the upstream, which may publish
        # events again at new offsets when it restarts (same source, so the same command ids)
        await kill_when("tally", tally, reaction_batches, 3)
        restarted["tally"] = service_factory(
            TALLY, "t1-again", state_dir=tmp_path / "t1", extra_env=env
        )
        await kill_when("ledger", ledger, lambda stats: stats.get("processed", 0), 7000)
        restarted["ledger"] = service_factory(LEDGER, "l1-again", state_dir=tmp_path / "l1")

    async def flow() -> None:
        produce = produce_in_chunks(kafka_bootstrap, f"{app_id}-commands", commands, chunk=300)
        await asyncio.gather(produce, faults())

    asyncio.run(flow())
    again = restarted["tally"]
    again.wait_ready()
    restarted["ledger"].wait_ready()

    async def settled() -> None:
        await wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=180)
        group = f"{tally_id}-reaction-tally"
        await wait_for_committed(kafka_bootstrap, group, f"{app_id}-events", timeout=180)
        await wait_for_committed(kafka_bootstrap, tally_id, f"{tally_id}-commands", timeout=180)

    asyncio.run(settled())
    ledger_model = model(commands)
    expected = {a: {"events": s["version"], "net": s["balance"]} for a, s in ledger_model.items()}
    assert read_tallies(again, sorted(expected)) == expected
    # Every command's id is unique per upstream event; copies (redelivered events) were skipped.
    written = asyncio.run(read_topic(kafka_bootstrap, f"{tally_id}-commands"))
    ids = [json.loads(record.value)["command_id"] for record in written]
    assert len(set(ids)) == sum(state["events"] for state in expected.values())
    assert len(ids) > len(set(ids)), "the kill left no copy: the dedup path was not exercised"
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    copies = len(ids) - len(set(ids))
    print(f"killed at {killed}; {len(events)} ledger events; {copies} command copies skipped")
    _, stats = again.get("/v1/stats")
    reaction = stats["reactions"]["tally"]
    assert reaction["input"] == f"{app_id}-events" and reaction["commands"] > 0
    assert reaction["failures"] == {}
