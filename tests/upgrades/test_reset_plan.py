"""The reset plan is a pure function of what the cluster says: every refusal and every choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from enhydra.admin.reset import (
    ClusterFacts,
    ResetError,
    ResetPoint,
    internal_topics,
    parse_datetime,
    parse_offsets,
    plan_reset,
)

TOPICS = {
    "bank-commands": 3,
    "bank-events": 3,
    "bank-rejections": 3,
    "bank-accounts-changelog": 3,
    "bank-activity-changelog": 3,
    "bank-dlq": 3,
    "bank-control": 1,
    "bank-v2-commands": 3,
    "bank-v2-accounts-changelog": 3,
    "other-accounts-changelog": 3,
}


def facts(**kw) -> ClusterFacts:
    base = {
        "topics": dict(TOPICS),
        "members": {"bank": [], "bank-projection-activity": []},
        "projection_groups": ["bank-projection-activity"],
        "beginning": {0: 0, 1: 5, 2: 0},
        "end": {0: 100, 1: 80, 2: 0},
        "by_time": {0: 40, 1: None, 2: None},
        "events_end": {0: 230, 1: 190, 2: 0},
    }
    base.update(kw)
    return ClusterFacts(**base)


def test_earliest_moves_offsets_recreates_changelogs_and_moves_projections() -> None:
    plan = plan_reset("bank", facts(), ResetPoint("earliest"), state_dir=Path("/data"))
    assert plan.offsets == {0: 0, 1: 5, 2: 0}
    assert [(s.name, s.partitions, s.compacted) for s in plan.recreate] == [
        ("bank-accounts-changelog", 3, True),
        ("bank-activity-changelog", 3, True),
    ]
    assert plan.projection_groups == ["bank-projection-activity"]
    assert plan.events_offsets == {0: 230, 1: 190, 2: 0}
    assert plan.state_dir == Path("/data/bank")
    text = "\n".join(plan.describe())
    assert "group bank: offsets on bank-commands -> 0=0, 1=5, 2=0" in text
    assert "delete and recreate bank-accounts-changelog (compacted, 3 partitions)" in text


def test_the_dlq_is_recreated_only_on_request() -> None:
    plan = plan_reset("bank", facts(), ResetPoint("earliest"), include_dlq=True)
    assert [s.name for s in plan.recreate][-1] == "bank-dlq"
    assert not plan.recreate[-1].compacted


def test_topics_of_an_app_whose_id_extends_this_one_are_left_alone() -> None:
    assert internal_topics("bank", TOPICS, include_dlq=False) == [
        "bank-accounts-changelog",
        "bank-activity-changelog",
    ]
    assert internal_topics("bank-v2", TOPICS, include_dlq=False) == ["bank-v2-accounts-changelog"]


def test_datetime_takes_the_first_offset_at_or_after_it_else_the_end() -> None:
    point = parse_datetime("2026-11-22T10:00:00Z")
    assert point.timestamp_ms == 1795341600000
    assert plan_reset("bank", facts(), point).offsets == {0: 40, 1: 80, 2: 0}
    assert parse_datetime("1795341600000").timestamp_ms == 1795341600000
    assert parse_datetime("2026-11-22T10:00:00").timestamp_ms == 1795341600000


def test_offsets_of_a_snapshot_cut() -> None:
    plan = plan_reset("bank", facts(), parse_offsets("0=60, 1=5,2=0"))
    assert plan.offsets == {0: 60, 1: 5, 2: 0}
    assert plan.point.describe() == "offsets 0=60,1=5,2=0"


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ("0=60,1=5", r"must give every partition of bank-commands \(0..2\); missing: \[2\]"),
        ("0=60,1=5,2=0,7=1", r"unknown: \[7\]"),
        ("0=101,1=5,2=0", r"0=101 is outside bank-commands-0's offsets 0..100"),
        ("0=0,1=4,2=0", r"1=4 is outside bank-commands-1's offsets 5..80"),
    ],
)
def test_bad_offsets_are_refused(offsets: str, message: str) -> None:
    with pytest.raises(ResetError, match=message):
        plan_reset("bank", facts(), parse_offsets(offsets))


@pytest.mark.parametrize(
    ("text", "message"),
    [("0:1", "item '0:1'"), ("a=1", "item 'a=1'"), ("0=1,0=2", "partition 0 twice"), ("", "empty")],
)
def test_offsets_syntax_errors_name_the_item(text: str, message: str) -> None:
    with pytest.raises(ResetError, match=message):
        parse_offsets(text)


def test_bad_datetime_is_refused() -> None:
    with pytest.raises(ResetError, match="--to-datetime 'yesterday'"):
        parse_datetime("yesterday")


def test_a_running_application_is_refused() -> None:
    busy = facts(members={"bank": ["i1", "i2"], "bank-projection-activity": ["i1-activity"]})
    with pytest.raises(ResetError, match=r"the application is running \(bank: i1, i2; "):
        plan_reset("bank", busy, ResetPoint("earliest"))


def test_an_unknown_app_is_refused() -> None:
    with pytest.raises(ResetError, match="no topic 'nope-commands'"):
        plan_reset("nope", facts(), ResetPoint("earliest"))
