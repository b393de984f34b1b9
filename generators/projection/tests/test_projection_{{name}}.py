"""The `{{ name }}` projection: its fold, and its place in the service's topology."""

from __future__ import annotations

from enhydra.projections import replay_projection
from enhydra.topology import topology_of

from {{ package }}.projections.{{ name }} import project, projection
from {{ package }}.service import service


def test_counts_events_per_key_and_type() -> None:
    events = [
        ("a", {"type": "x"}),
        ("a", {"type": "y"}),
        ("b", {"type": "x"}),
        ("a", {"type": "x"}),
    ]
    assert replay_projection(projection, events) == {
        "a": {"events": 3, "by_type": {"x": 2, "y": 1}},
        "b": {"events": 1, "by_type": {"x": 1}},
    }


def test_project_is_pure() -> None:
    state = {"events": 1, "by_type": {"x": 1}}
    project(state, {"type": "x"})
    assert state == {"events": 1, "by_type": {"x": 1}}


def test_the_service_runs_it() -> None:
    assert projection in service.projections
    names = [p["name"] for p in topology_of(service)["projections"]]
    assert "{{ name }}" in names
