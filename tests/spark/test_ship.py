"""What the job ships, and how it lays events out for the fold (pure parts, no Spark)."""

from __future__ import annotations

import os
import zipfile

import pytest

from enhydra.plugins import Handler, extend
from enhydra.spark.job import BackfillError, local_cores, plan_layout
from enhydra.spark.ship import (
    EXECUTOR_MODULES,
    job_archive,
    reader_archive,
    service_packages,
)
from enhydra.spark.source import OffsetRange
from ledger.domain import accounts


def names(path) -> set[str]:
    with zipfile.ZipFile(path) as archive:
        return set(archive.namelist())


def test_the_job_archive_holds_the_service_package_and_the_whole_runtime() -> None:
    path, packages = job_archive(accounts)
    assert packages == ["ledger"] == service_packages(accounts)
    inside = names(path)
    assert {"ledger/__init__.py", "ledger/domain.py"} <= inside
    for module in EXECUTOR_MODULES:
        parts = module.split(".")
        assert f"{'/'.join(parts)}/__init__.py" in inside or f"{'/'.join(parts)}.py" in inside
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in inside)
    # whole: a part of it in front of an installed copy would hide that copy's other modules
    assert {"enhydra/service.py", "enhydra/plugins.py", "enhydra/stores/__init__.py"} <= inside
    assert job_archive(accounts)[0] == path  # same code, same bytes, same file


def test_an_extended_aggregate_ships_the_packages_of_its_handlers() -> None:
    """A handler's functions (a plugin's, or a generated one's) live outside the service's
    package, behind the dispatcher `extend` puts in front of decide and apply."""
    handler = Handler("audit", audit_decide, {"audited": audit_apply})
    assert service_packages(extend(accounts, handler)) == ["ledger", "tests"]


def test_a_sql_projection_in_another_package_is_shipped_with_the_service() -> None:
    """The SQL backfill's executors unpickle the projection's `project`, which may live
    outside the aggregate's package (here: `tests`)."""
    assert service_packages(accounts, also=(audit_decide,)) == ["ledger", "tests"]
    assert "tests/spark/test_ship.py" in names(job_archive(accounts, also=(audit_decide,))[0])


def audit_decide(state, command):  # in this test module: the top-level package `tests`
    return [{"type": "audited"}]


def audit_apply(state, event):
    return state


def test_the_reader_archive_is_pure_python() -> None:
    inside = names(reader_archive())
    assert {"aiokafka/__init__.py", "async_timeout/__init__.py", "typing_extensions.py"} <= inside
    assert "packaging/version.py" in inside
    assert not any(n.endswith((".so", ".c", ".pyx")) for n in inside)


def ranges(*counts: int) -> list[OffsetRange]:
    return [OffsetRange(p, 0, n) for p, n in enumerate(counts)]


@pytest.mark.parametrize(
    ("counts", "cores", "shuffle", "tasks", "in_place"),
    [
        ((100, 100, 100, 100), 2, None, None, True),  # enough partitions: fold in place
        ((100, 100, 100, 100), 4, None, None, True),
        ((100, 0, 0, 0), 2, None, None, False),  # one partition with events, two cores
        ((100, 100), 8, None, None, False),
        ((100, 100, 100, 100), 2, True, None, False),  # asked for
        ((100,), 8, False, None, True),
        ((100, 100, 100, 100), 2, None, 6, False),  # --tasks implies a shuffle
        ((0, 0), 4, None, None, True),  # nothing to read
    ],
)
def test_the_layout_folds_in_place_unless_cores_would_idle(
    counts: tuple[int, ...], cores: int, shuffle: bool | None, tasks: int | None, in_place: bool
) -> None:
    layout = plan_layout(ranges(*counts), cores, shuffle=shuffle, tasks=tasks)
    assert layout.in_place is in_place
    if in_place:  # whole partitions in offset order: folded as they come, no sort
        assert layout.split_records is None and layout.tasks is None
        assert layout.fold == "hash"
    else:  # a shuffle mixes the offset order: sorted
        assert layout.split_records is not None and layout.tasks == tasks
        assert layout.fold == "sort"
    assert layout.reason
    in_place_sorted = plan_layout(ranges(*counts), cores, shuffle=shuffle, tasks=tasks, fold="sort")
    assert (in_place_sorted.in_place, in_place_sorted.fold) == (in_place, "sort")


def test_the_hash_fold_is_in_place_and_refuses_a_shuffle() -> None:
    layout = plan_layout(ranges(100, 0, 0, 0), 2, fold="hash")  # would shuffle by default
    assert (layout.in_place, layout.fold, layout.reason) == (True, "hash", "--fold hash")
    with pytest.raises(BackfillError, match="--fold hash folds Kafka partitions in place"):
        plan_layout(ranges(100, 100), 2, shuffle=True, fold="hash")
    with pytest.raises(BackfillError, match="--fold 'heap': expected one of hash, sort"):
        plan_layout(ranges(100, 100), 2, fold="heap")


def test_a_shuffled_layout_reads_in_pieces_for_every_core() -> None:
    layout = plan_layout(ranges(1_000_000), 8)
    assert not layout.in_place
    assert layout.split_records is not None
    assert 1_000_000 / layout.split_records >= 8


def test_local_masters_count_their_task_slots() -> None:
    assert local_cores("local") == 1
    assert local_cores("local[3]") == 3
    assert local_cores("local[2,4]") == 2
    assert local_cores("local[*]") == os.cpu_count()
    assert local_cores("spark://host:7077") is None
