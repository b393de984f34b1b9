"""Topology model, fingerprint and compatibility check: every rule of the upgrade table.

Each incompatible change the issue lists is detected with its upgrade path, and each compatible
one passes. The check is pure, so these tests build topologies in memory.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from enhydra import Aggregate
from enhydra.cli.main import main
from enhydra.projections import Projection
from enhydra.topology import (
    Path as UpgradePath,
)
from enhydra.topology import (
    TopologyError,
    build_topology,
    compare,
    fingerprint,
    render,
    to_mermaid,
    topology_of,
    validate,
    verdict,
)
from ledger.service import service as ledger_service

REPO = Path(__file__).resolve().parents[2]


def decide(state: Any, command: dict) -> list[dict]:
    return [{"type": "added", "n": command.get("n", 1)}]


def apply(state: Any, event: dict) -> Any:
    return (state or 0) + event["n"]


def apply_doubled(state: Any, event: dict) -> Any:
    return (state or 0) + 2 * event["n"]


def count_events(state: Any, event: dict) -> Any:
    return (state or 0) + 1


COUNTERS = Aggregate("counters", decide=decide, apply=apply)
STATE_V1 = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def topo(aggregate: Aggregate = COUNTERS, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"partitions": 4, "dlq_topic": None, "schemas": {"state": STATE_V1}}
    args.update(kw)
    built = build_topology("shop", aggregate, **args)
    return json.loads(json.dumps(built))  # what a file round trip gives


def verdicts(old: dict, new: dict) -> list[tuple[str, bool, UpgradePath]]:
    return [(c.subject, c.compatible, c.path) for c in compare(old, new)]


# --------------------------------------------------------------------------- incompatible


def test_unchanged_topology_has_no_changes() -> None:
    assert compare(topo(), topo()) == []
    assert verdict([]) is None


def test_partition_count_change_needs_a_repartition() -> None:
    changes = compare(topo(), topo(partitions=8))
    assert ("input topic shop-commands", False, UpgradePath.REPARTITION) in verdicts(
        topo(), topo(partitions=8)
    )
    assert ("store counters", False, UpgradePath.REPARTITION) in [
        (c.subject, c.compatible, c.path) for c in changes
    ]
    assert verdict(changes) is UpgradePath.REPARTITION


def test_store_renamed_is_incompatible() -> None:
    renamed = Aggregate("tallies", decide=decide, apply=apply)
    changes = compare(topo(), topo(renamed))
    store = [c for c in changes if c.subject.startswith("store")]
    assert len(store) == 1 and not store[0].compatible
    assert "store renamed 'counters' -> 'tallies'" in store[0].detail
    assert store[0].path is UpgradePath.OFFLINE_RESET


def test_store_removed_is_incompatible() -> None:
    old = topo()
    extra = copy.deepcopy(old["stores"][0])
    extra.update(name="audit", changelog="shop-audit-changelog")
    old["stores"].append(extra)
    assert ("store audit", False, UpgradePath.OFFLINE_RESET) in verdicts(old, topo())


@pytest.mark.parametrize("kind", ["integer", "number"])
def test_key_type_change_needs_a_repartition(kind: str) -> None:
    new = topo(schemas={"key": kind, "state": STATE_V1})
    changes = [c for c in compare(topo(), new) if "key type" in c.detail]
    assert changes and all(not c.compatible for c in changes)
    assert {c.path for c in changes} == {UpgradePath.REPARTITION}
    assert f"key type changed: string -> {kind}" in changes[0].detail


def test_key_serde_change_needs_a_repartition() -> None:
    old = topo()
    for section in ("input_topics", "output_topics", "stores"):
        for item in old[section]:
            item["key"]["serde"] = "avro"
    changes = [c for c in compare(old, topo()) if "key serde" in c.detail]
    assert changes and {(c.compatible, c.path) for c in changes} == {
        (False, UpgradePath.REPARTITION)
    }


def test_store_value_serde_change_needs_a_reset() -> None:
    old = topo()
    old["stores"][0]["value"]["serde"] = "enhydra.entry/0+msgpack"
    assert ("store counters", False, UpgradePath.OFFLINE_RESET) in verdicts(old, topo())


def test_input_topic_added_or_removed_is_incompatible() -> None:
    new = topo()
    new["input_topics"].append({**new["input_topics"][0], "name": "shop-imports"})
    assert verdicts(topo(), new) == [("input topic shop-imports", False, UpgradePath.OFFLINE_RESET)]
    assert verdicts(new, topo()) == [("input topic shop-imports", False, UpgradePath.OFFLINE_RESET)]


def test_input_topic_renamed_is_removed_plus_added() -> None:
    moved = Aggregate("counters", decide=decide, apply=apply, commands_topic="orders")
    found = {(s, ok) for s, ok, _ in verdicts(topo(), topo(moved))}
    assert found == {("input topic shop-commands", False), ("input topic orders", False)}


def test_app_id_change_is_incompatible() -> None:
    new = build_topology("shop-v2", COUNTERS, partitions=4, schemas={"state": STATE_V1})
    changes = compare(topo(), json.loads(json.dumps(new)))
    assert changes[0].subject == "application" and not changes[0].compatible


@pytest.mark.parametrize(
    ("new_schema", "reason"),
    [
        (
            {
                **STATE_V1,
                "properties": {**STATE_V1["properties"], "c": {"type": "string"}},
                "required": ["n", "c"],
            },
            "$.c: new required field",
        ),
        ({**STATE_V1, "properties": {"n": {"type": "string"}}}, "$.n: type"),
        (
            {
                "type": "object",
                "properties": {"n": {"type": "integer"}, "m": {}},
                "required": ["n", "m"],
            },
            "$.m: new required field",
        ),
        ({"type": "array"}, "$: type ['object'] -> ['array']"),
    ],
)
def test_value_schema_not_backward_compatible(new_schema: dict, reason: str) -> None:
    changes = compare(topo(), topo(schemas={"state": new_schema}))
    bad = [c for c in changes if not c.compatible]
    assert bad and all(c.path is UpgradePath.OFFLINE_RESET for c in bad)
    assert any(reason in c.detail for c in bad), [c.detail for c in bad]


def test_enum_that_drops_a_value_is_incompatible() -> None:
    old = {"type": "object", "properties": {"s": {"enum": ["open", "closed"]}}}
    new = {"type": "object", "properties": {"s": {"enum": ["open"]}}}
    changes = compare(topo(schemas={"state": old}), topo(schemas={"state": new}))
    assert [c.compatible for c in changes] == [False]
    assert "enum no longer accepts ['closed']" in changes[0].detail


# --------------------------------------------------------------------------- compatible


def test_changed_handler_logic_is_a_rolling_bounce() -> None:
    changed = Aggregate("counters", decide=decide, apply=apply_doubled)
    changes = compare(topo(), topo(changed))
    assert changes and all(c.compatible for c in changes)
    assert {c.path for c in changes} == {UpgradePath.ROLLING_BOUNCE}
    assert any("handler logic changed" in c.detail for c in changes)
    assert any(
        f"apply changed: {__name__}:apply -> {__name__}:apply_doubled" in c.detail for c in changes
    )


@pytest.mark.parametrize(
    "new_schema",
    [
        {**STATE_V1, "properties": {**STATE_V1["properties"], "note": {"type": "string"}}},
        {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]},
        {"type": "object", "properties": {"n": {"type": "integer"}}},
        {"type": "object", "properties": {}, "required": []},
    ],
)
def test_backward_compatible_value_schema_is_a_rolling_bounce(new_schema: dict) -> None:
    changes = compare(topo(), topo(schemas={"state": new_schema}))
    assert changes and all(c.compatible for c in changes), [c.detail for c in changes]
    assert all("backward-compatible value schema change" in c.detail for c in changes)


def test_added_projection_is_an_independent_branch() -> None:
    projection = Projection("event-counts", count_events)
    new = topo(projections=[(projection, "audit-plugin")])
    changes = compare(topo(), new)
    assert [(c.subject, c.compatible) for c in changes] == [("projection event-counts", True)]
    assert verdict(changes) is UpgradePath.ROLLING_BOUNCE
    assert fingerprint(new) == fingerprint(topo())  # a snapshot still fits
    removed = compare(new, topo())
    assert removed and all(c.compatible for c in removed)


def test_projection_source_change_is_incompatible() -> None:
    projection = Projection("event-counts", count_events)
    old = topo(projections=[(projection, None)])
    new = copy.deepcopy(old)
    new["projections"][0]["source"] = "shop-other-events"
    assert ("projection event-counts", False, UpgradePath.OFFLINE_RESET) in verdicts(old, new)


def test_dead_letter_queue_on_and_off_is_compatible() -> None:
    changes = compare(topo(), topo(dlq_topic="shop-dlq"))
    assert [(c.detail, c.compatible) for c in changes] == [("dlq topic added", True)]


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_covers_layout_not_logic() -> None:
    base = fingerprint(topo())
    assert base.startswith("sha256:") and len(base) == len("sha256:") + 64
    assert fingerprint(topo(Aggregate("counters", decide=decide, apply=apply_doubled))) == base
    assert fingerprint(topo(schemas={})) == base
    assert fingerprint(topo(partitions=8)) != base
    assert fingerprint(topo(Aggregate("tallies", decide=decide, apply=apply))) != base
    assert fingerprint(topo(schemas={"key": "integer"})) != base


@given(
    st.integers(1, 64),
    st.integers(1, 64),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["a", "b"]),
)
def test_incompatible_exactly_when_the_fingerprint_changes(
    p1: int, p2: int, name1: str, name2: str
) -> None:
    old = build_topology("app", Aggregate(name1, decide=decide, apply=apply), partitions=p1)
    new = build_topology("app", Aggregate(name2, decide=decide, apply=apply), partitions=p2)
    incompatible = any(not c.compatible for c in compare(old, new))
    assert incompatible == (fingerprint(old) != fingerprint(new))


def test_service_fingerprint_is_the_topology_fingerprint() -> None:
    shown = topology_of(ledger_service)
    assert topology_of(ledger_service)["fingerprint"] == shown["fingerprint"] == fingerprint(shown)
    assert shown["handlers"][0]["decide"] == "ledger.domain:decide"
    assert shown["stores"][0]["changelog"] == "ledger-accounts-changelog"
    roles = {t["role"] for t in shown["internal_topics"]}
    assert roles == {"changelog", "dlq", "control"}


# --------------------------------------------------------------------------- files, CLI


def test_validate_names_the_file_and_the_problem() -> None:
    with pytest.raises(TopologyError, match=r"old\.json: format None is not"):
        validate({}, "old.json")
    broken = topo()
    del broken["stores"]
    with pytest.raises(TopologyError, match=r"old\.json: 'stores' is missing"):
        validate(broken, "old.json")


def test_mermaid_shows_topics_stores_and_projections() -> None:
    projection = Projection("event-counts", count_events)
    diagram = to_mermaid(topo(projections=[(projection, "audit")], dlq_topic="shop-dlq"))
    assert diagram.startswith("flowchart LR\n")
    for text in (
        '"shop-commands · 4p"',
        '"counters store"',
        '"shop-dlq (dead letters)"',
        '"projection event-counts (plugin audit)"',
        "topic_shop_events --> projection_event_counts",
    ):
        assert text in diagram


def test_render_names_each_change_and_the_path() -> None:
    text = render(compare(topo(), topo(partitions=2)), app_id="shop", against="old.json")
    assert "INCOMPATIBLE  input topic shop-commands: partition count changed: 4 -> 2" in text
    assert "upgrade path: repartition" in text
    assert text.endswith("incompatible change(s)")


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_show_and_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO / "examples" / "ledger")
    deployed = tmp_path / "topology.json"
    shown = run_cli("topology", "show", "ledger.service:service", "-o", str(deployed))
    assert shown.exit_code == 0, shown.output
    assert (
        json.loads(deployed.read_text())["fingerprint"]
        == topology_of(ledger_service)["fingerprint"]
    )
    same = run_cli("topology", "check", "--against", str(deployed), "ledger.service:service")
    assert same.exit_code == 0 and "no changes" in same.output

    old = json.loads(deployed.read_text())
    old["partitions"] = old["input_topics"][0]["partitions"] = 6
    deployed.write_text(json.dumps(old))
    bad = run_cli(
        "topology",
        "check",
        "--against",
        str(deployed),
        "ledger.service:service",
        "--format",
        "json",
    )
    assert bad.exit_code == 1
    report = json.loads(bad.output)
    assert report["compatible"] is False and report["upgrade"] == "repartition"
    assert report["changes"][0]["subject"] == "input topic ledger-commands"

    mermaid = run_cli("topology", "show", "ledger.service:service", "--format", "mermaid")
    assert mermaid.output.startswith("flowchart LR")


def test_cli_check_explains_a_missing_or_broken_file(tmp_path: Path) -> None:
    missing = run_cli(
        "topology", "check", "--against", str(tmp_path / "x.json"), "ledger.service:service"
    )
    assert missing.exit_code == 1 and "no such file" in missing.output
    (tmp_path / "bad.json").write_text("{not json")
    broken = run_cli(
        "topology", "check", "--against", str(tmp_path / "bad.json"), "ledger.service:service"
    )
    assert broken.exit_code == 1 and "bad.json: not valid JSON" in broken.output
