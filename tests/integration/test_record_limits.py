"""A record above the broker's limit on the real broker: dead-lettered, never a crash loop.

The changelog topic is made with a small max.message.bytes. Deposits with long command ids
grow an account's entry (it keeps the last 100 ids) past it: before, the changelog publish
failed after the batch's events were out, the worker died, and each restart published the
events again. Now the step dead-letters each deposit whose entry would not fit.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from enhydra.contracts.headers import COMMAND_ID_HEADER
from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.testing.processes import read_topic, wait_for_committed
from tests.integration.ledger_support import feed, read_accounts

pytestmark = pytest.mark.integration

LEDGER = "ledger.service:service"
LIMIT = 8192


def test_an_entry_above_the_topics_limit_is_dead_lettered_and_the_worker_keeps_running(
    service_factory, kafka_bootstrap, app_id
) -> None:
    changelog = TopicSpec(
        f"{app_id}-accounts-changelog",
        4,
        compacted=True,
        config={"max.message.bytes": str(LIMIT)},
    )
    asyncio.run(ensure_topics(kafka_bootstrap, [changelog]))
    ledger = service_factory(LEDGER, extra_env={"ENHYDRA_PRODUCTION_EXCEPTION_HANDLER": "dlq"})
    ledger.wait_ready()

    pad = "c" * 250  # ~100 such ids make an entry of 25 kB
    deposits = 60
    commands: list[tuple[str, object]] = [
        ("big", {"command_id": f"{pad}-open", "type": "open", "account": "big"}),
        ("small", {"command_id": "s-open", "type": "open", "account": "small"}),
    ]
    for i in range(deposits):
        deposit = {"command_id": f"{pad}-{i}", "type": "deposit", "account": "big", "amount": 1}
        commands.append(("big", deposit))
    feed(kafka_bootstrap, app_id, commands)
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=60))

    accounts = read_accounts([ledger], ["big", "small"])
    kept = accounts["big"]["balance"]
    assert 0 < kept < deposits
    letters = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-dlq"))
    assert len(letters) == deposits - kept
    reasons = {dict(r.headers)["enhydra.dlq.error.message"].decode() for r in letters}
    assert all(
        r.startswith("state entry of ") and f"exceeds the {LIMIT}-byte limit" in r for r in reasons
    ), reasons
    # Each event once: nothing was published again by a restarted worker.
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    ids = Counter(dict(r.headers)[COMMAND_ID_HEADER] for r in events)
    assert set(ids.values()) == {1} and len(ids) == 2 + kept

    # The worker is still running: a later command is applied.
    feed(
        kafka_bootstrap,
        app_id,
        [("small", {"command_id": "s-1", "type": "deposit", "account": "small", "amount": 5})],
    )
    deadline = time.monotonic() + 30
    while read_accounts([ledger], ["small"])["small"]["balance"] != 5:
        assert time.monotonic() < deadline, ledger.log_tail()
        time.sleep(0.2)
    assert ledger.alive and "MessageSizeTooLarge" not in ledger.log_tail(1000)
