"""The `{{ name }}` saga: its deadline fires once, is cancelled by the event it waits for, and
runs in the service (topology entry)."""

from __future__ import annotations

from enhydra.testing import Driver
from enhydra.topology import topology_of

from {{ package }}.domain import CREATE, KEY_FIELD
from {{ package }}.sagas.{{ name }} import AFTER_S, DONE, FOLLOW_UP, STARTED, saga
from {{ package }}.service import service

APP = "{{ app_id }}"


def started(driver: Driver, key: str) -> None:
    created = driver.send(key, {"type": CREATE, KEY_FIELD: key, "command_id": f"c-{key}"})
    assert created.accepted, created
    driver.feed_saga("{{ name }}", APP, key, {"type": STARTED, "name": "", "note": ""})


def test_the_deadline_fires_once_when_its_time_comes() -> None:
    driver = Driver(service)
    started(driver, "k1")
    assert driver.deadlines("{{ name }}", "k1") == {"follow_up": AFTER_S}
    assert driver.advance(AFTER_S - 1) == []
    [outcome] = driver.advance(1)
    assert outcome.accepted or FOLLOW_UP == CREATE, outcome
    assert driver.deadlines("{{ name }}", "k1") == {}
    assert driver.advance(10 * AFTER_S) == []


def test_the_event_it_waits_for_cancels_the_deadline() -> None:
    driver = Driver(service)
    started(driver, "k1")
    driver.feed_saga("{{ name }}", APP, "k1", {"type": DONE, "note": ""})
    assert driver.deadlines("{{ name }}", "k1") == {}
    assert driver.saga_state("{{ name }}", "k1") is None  # the saga ended
    assert driver.advance(10 * AFTER_S) == []


def test_a_redelivered_event_is_handled_once() -> None:
    driver = Driver(service)
    started(driver, "k1")
    driver.advance(AFTER_S / 2)
    event = {"type": STARTED, "name": "", "note": ""}
    driver.feed_saga("{{ name }}", APP, "k1", event, offset=0)  # Kafka delivers it again
    assert driver.deadlines("{{ name }}", "k1") == {"follow_up": AFTER_S}


def test_the_service_runs_it() -> None:
    assert saga in service.sagas
    [entry] = [s for s in topology_of(service)["sagas"] if s["name"] == "{{ name }}"]
    assert entry["inbox"] == f"{APP}-{{ name }}-saga-inbox"
    assert entry["sources"] == sorted(saga.sources)
