"""The `{{ name }}` reaction to {{ source }}'s events: its rule, its dedup, its topology entry."""

from __future__ import annotations

from enhydra.testing import Driver
from enhydra.topology import topology_of

from {{ package }}.reactions.{{ name }} import reaction
from {{ package }}.service import service

TRIGGER = {"type": "{{ name }}_trigger", "name": "from {{ source }}"}


def test_an_upstream_event_becomes_a_command_of_this_service() -> None:
    driver = Driver(service)
    [outcome] = driver.feed("{{ name }}", "k1", TRIGGER)
    assert outcome.accepted, outcome
    assert driver.state("k1") is not None


def test_a_redelivered_event_changes_nothing() -> None:
    driver = Driver(service)
    driver.feed("{{ name }}", "k1", TRIGGER)
    before = driver.state("k1")
    [again] = driver.feed("{{ name }}", "k1", TRIGGER, offset=0)  # Kafka delivers it again
    assert again.rejection == "duplicate command_id"
    assert driver.state("k1") == before


def test_other_event_types_are_not_read() -> None:
    driver = Driver(service)
    assert driver.feed("{{ name }}", "k1", {"type": "something_else"}) == []


def test_the_service_runs_it() -> None:
    assert reaction in service.reactions
    [entry] = [r for r in topology_of(service)["reactions"] if r["name"] == "{{ name }}"]
    assert entry["input"] == "{{ source }}-events"
    assert list(entry["reads"]) == ["{{ name }}_trigger"]
