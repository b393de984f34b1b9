"""What a projection's key read answers while its group is still settling.

A read-model key must not be reported as hosted elsewhere (421) while this instance's group
is joining or rebalancing: with eager rebalancing every instance holds no partition for a
moment, and a client that believed two 421s would report the key as missing.
"""

from __future__ import annotations

from pathlib import Path

from enhydra.projections import Projection
from enhydra.projections.engine import ProjectionEngine
from enhydra.settings import Settings


def engine(tmp_path: Path) -> ProjectionEngine:
    settings = Settings.from_env({}, app_id="reads", state_dir=tmp_path, partitions=4)
    projection = Projection("activity", lambda state, event: state)
    return ProjectionEngine(settings, projection, "reads-events")


def test_a_key_is_unavailable_not_elsewhere_until_the_group_has_settled(tmp_path: Path) -> None:
    read_model = engine(tmp_path)
    assert read_model.read("acct-1")[0] == "unavailable"  # not joined yet
    read_model.registry.joined = True
    read_model.registry.rebalancing = True
    assert read_model.read("acct-1")[0] == "unavailable"  # partitions being handed out
    read_model.registry.rebalancing = False
    status, partition, _ = read_model.read("acct-1")
    assert status == "not_hosted" and 0 <= partition < 4  # settled, and the partition is not ours
