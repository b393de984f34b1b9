"""The ledger against a real broker, as real processes: the model decides what is correct."""

from __future__ import annotations

import asyncio

import pytest

from enhydra.testing.processes import end_offsets, read_topic
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, read_accounts

pytestmark = pytest.mark.integration

TARGET = "ledger.service:service"


def test_two_instances_match_the_model(service_factory, kafka_bootstrap, app_id):
    one = service_factory(TARGET, "i1", extra_env={"ENHYDRA_CLIENT_TAGS": "zone=a"})
    two = service_factory(TARGET, "i2", extra_env={"ENHYDRA_CLIENT_TAGS": "zone=b"})
    one.wait_ready()
    two.wait_ready()
    commands = generate(800, 6000, seed=11)
    feed(kafka_bootstrap, app_id, commands)

    expected = model(commands)
    actual = read_accounts([one, two], sorted({key for key, _ in commands}))
    assert actual == expected

    # Each accepted command produced exactly one event, and every other one a rejection.
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    rejections = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-rejections"))
    assert len(events) == sum(state["version"] for state in expected.values())
    assert len(events) + len(rejections) == len(commands)
    # Both instances did real work.
    for inst in (one, two):
        status, stats = inst.get("/v1/stats")
        assert status == 200 and stats["processed"] > 0, stats


def test_restart_restores_full_changelog_when_wiped_and_only_the_tail_when_kept(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    changelog = f"{app_id}-accounts-changelog"
    first_batch = generate(300, 2500, seed=1, prefix="a")
    second_batch = generate(300, 2500, seed=2, prefix="a")
    third_batch = generate(300, 1500, seed=3, prefix="a")

    one = service_factory(TARGET, "i1", state_dir=tmp_path / "one")
    one.wait_ready()
    feed(kafka_bootstrap, app_id, first_batch)
    assert one.stop() == 0
    after_first = sum(asyncio.run(end_offsets(kafka_bootstrap, changelog)).values())

    # A fresh instance (empty state dir) must rebuild everything from the changelog.
    two = service_factory(TARGET, "i2", state_dir=tmp_path / "two")
    two.wait_ready()
    _, stats = two.get("/v1/stats")
    assert sum(t["restore"]["restored"] for t in stats["tasks"].values()) == after_first
    feed(kafka_bootstrap, app_id, second_batch)
    assert two.stop() == 0
    after_second = sum(asyncio.run(end_offsets(kafka_bootstrap, changelog)).values())
    assert after_second > after_first

    # The first instance comes back with its state dir: only what i2 wrote is restored.
    again = service_factory(TARGET, "i1-again", state_dir=tmp_path / "one")
    again.wait_ready()
    _, stats = again.get("/v1/stats")
    assert sum(t["restore"]["restored"] for t in stats["tasks"].values()) == (
        after_second - after_first
    )
    feed(kafka_bootstrap, app_id, third_batch)

    expected = model(first_batch + second_batch + third_batch)
    assert read_accounts([again], sorted(expected)) == expected
