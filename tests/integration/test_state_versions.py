"""A store written by the ledger whose state has no currency, read by the one whose state has.

State v2 adds `currency` to every account. The upgraded service restores the v1 entries from
the changelog as they are; each is migrated when loaded (a command for the key, or a query),
and what it writes back records version 2. A new instance restoring the mixed changelog ends
with the same states.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from enhydra.testing.processes import read_topic
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, read_accounts

pytestmark = pytest.mark.integration

V1 = "ledger.service:service"
V2 = "tests.integration.ledger_versions:state_v2_service"


def with_currency(states: dict[str, dict]) -> dict[str, dict]:
    return {k: {**s, "currency": "EUR"} for k, s in states.items()}


def test_entries_of_an_older_state_version_are_migrated_when_loaded(
    service_factory, kafka_bootstrap, app_id
):
    early = generate(60, 800, seed=301)
    v1 = service_factory(V1, "v1")
    v1.wait_ready()
    feed(kafka_bootstrap, app_id, early)
    assert v1.stop() == 0
    touched_later = sorted(model(early))[:20]
    late = [c for c in generate(60, 1200, seed=302) if c[0] in touched_later]

    v2 = service_factory(V2, "v2")  # a new instance: its store comes from the changelog (v1)
    v2.wait_ready()
    untouched = sorted(set(model(early)) - set(touched_later))
    # a query shows a v1 entry as this code reads it
    assert read_accounts([v2], untouched) == with_currency(
        {k: s for k, s in model(early).items() if k in untouched}
    )
    feed(kafka_bootstrap, app_id, late)
    expected = with_currency(model(early + late))
    assert read_accounts([v2], sorted(expected)) == expected
    assert v2.stop() == 0

    # the changelog's latest entry per key: v2 for the keys changed since, v1 (as v1 code
    # wrote it, three elements) for the others
    changelog = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-accounts-changelog"))
    latest = {r.key.decode(): orjson.loads(r.value) for r in changelog if r.value is not None}
    before, after = model(early), model(early + late)
    changed = {k for k in after if before.get(k) != after[k]}  # rejected commands write nothing
    assert changed
    assert {k for k, raw in latest.items() if len(raw) == 4 and raw[3] == 2} == changed
    unchanged = [raw for k, raw in latest.items() if k not in changed]
    assert all(len(raw) == 3 and "currency" not in raw[2] for raw in unchanged)

    # a new instance restores the mixed changelog and reads every key the same
    fresh = service_factory(V2, "fresh")
    fresh.wait_ready()
    assert read_accounts([fresh], sorted(expected)) == expected
    assert fresh.stop() == 0
