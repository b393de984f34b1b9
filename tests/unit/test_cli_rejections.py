"""Rejections are readable: what a rejection record says (query/rejections.py) and
`enhydra rejections` as a user runs it (no broker: the reading is replaced where the test is
about the shell's output; tests/integration/test_rejections.py reads a real topic)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from click.testing import CliRunner

from enhydra.cli import rejections as cli
from enhydra.cli.main import main
from enhydra.kafka.reading import TopicMissing
from enhydra.query import rejections


def rejection_value(key: str, command_id: str, kind: str, reason: str) -> bytes:
    body = {"command_id": command_id, "type": kind, "book": key}
    return orjson.dumps(
        {"command_id": command_id, "key": key, "reason": reason, "offset": 7, "command": body}
    )


def record(partition: int, offset: int, ts: int, key: str, command_id: str, reason: str):
    value = rejection_value(key, command_id, "borrow", reason)
    return SimpleNamespace(
        partition=partition, offset=offset, timestamp=ts, key=key.encode(), value=value
    )


def test_a_rejection_says_its_key_command_id_type_and_reason() -> None:
    row = rejections.summary(
        rejection_value("a1", "c-9", "borrow", "book already borrowed by alice")
    )
    assert row == {
        "key": "a1",
        "command_id": "c-9",
        "type": "borrow",
        "reason": "book already borrowed by alice",
        "command_offset": 7,
    }
    assert rejections.line(row) == "a1  c-9  borrow  book already borrowed by alice"


def test_a_record_that_is_not_a_rejection_says_so_instead_of_failing() -> None:
    row = rejections.summary(b"\xffnot json", b"k1")
    assert row["key"] == "k1" and row["reason"].startswith("(not a rejection record")
    assert rejections.line(row).startswith("k1  -  -  (not a rejection record")
    assert rejections.summary(None)["reason"] == "(not a rejection record: no value)"


def test_the_last_n_of_several_partitions_are_the_last_written() -> None:
    records = [record(0, 0, 10, "a", "c1", "r"), record(1, 0, 30, "b", "c3", "r")]
    records += [record(0, 1, 20, "a", "c2", "r")]
    assert [r.value for r in cli._last(records, 2)] == [records[2].value, records[1].value]
    assert cli._last(records, 0) == []
    assert cli._tail_ranges({0: 3, 1: 0}, {0: 10, 1: 2}, 5) == {0: (5, 10), 1: (0, 2)}
    assert cli._tail_ranges({0: 3}, {0: 10}, None) == {0: (3, 10)}


@pytest.fixture
def runner(monkeypatch, tmp_path: Path) -> CliRunner:
    """Outside any project, without ENHYDRA_* settings."""
    for name in list(os.environ):
        if name.startswith("ENHYDRA_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return CliRunner()


def test_list_prints_one_line_per_rejection_and_json_on_request(runner, monkeypatch) -> None:
    records = [
        record(0, 0, 10, "a1", "c-1", "book already borrowed by alice"),
        record(1, 0, 20, "b2", "c-2", "book is lost"),
    ]

    async def read_last(conn, topic, last):
        assert topic == "library-rejections" and last is None
        return records

    monkeypatch.setattr(cli, "read_last", read_last)
    done = runner.invoke(main, ["rejections", "list", "--app", "library"])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [
        "a1  c-1  borrow  book already borrowed by alice",
        "b2  c-2  borrow  book is lost",
    ]
    assert "2 rejection(s) in library-rejections" in done.stderr

    done = runner.invoke(main, ["rejections", "list", "--app", "library", "--json", "--key", "a1"])
    (only,) = [json.loads(text) for text in done.stdout.splitlines()]
    assert only["reason"] == "book already borrowed by alice" and only["type"] == "borrow"
    assert (only["partition"], only["offset"], only["command_id"]) == (0, 0, "c-1")


def test_without_an_app_id_outside_a_project_one_line_says_what_to_give(runner) -> None:
    done = runner.invoke(main, ["rejections", "list"])
    assert done.exit_code == 2
    assert "no application id: give --app (or ENHYDRA_APP_ID)" in done.stderr
    assert "Traceback" not in done.output


def test_a_missing_topic_is_one_line_and_exit_code_1(runner, monkeypatch) -> None:
    async def read_last(conn, topic, last):
        raise TopicMissing(topic)

    monkeypatch.setattr(cli, "read_last", read_last)
    done = runner.invoke(main, ["rejections", "list", "--app", "library"])
    assert done.exit_code == 1
    assert done.stderr.strip().splitlines() == [
        "Error: no topic 'library-rejections': has the service run yet? (or give --topic; "
        "`enhydra topology show` lists the service's topics)"
    ]


SERVICE = """
from enhydra import Aggregate, Service

books = Aggregate("books", decide=lambda s, c: [], apply=lambda s, e: s,
                  rejections_topic="library-refusals")
service = Service("library", books)
"""


def test_inside_a_project_its_app_id_and_rejections_topic_are_used(runner, monkeypatch, tmp_path):
    root = tmp_path / "library"
    (root / "librejects").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "librejects"\nversion = "0.1.0"\n')
    (root / "librejects" / "__init__.py").write_text("")
    (root / "librejects" / "service.py").write_text(SERVICE)
    monkeypatch.chdir(root / "librejects")
    monkeypatch.setattr(sys, "path", [*sys.path])  # the project's root is put on it
    asked: list[str] = []

    async def read_last(conn, topic, last):
        asked.append(topic)
        return []

    monkeypatch.setattr(cli, "read_last", read_last)
    assert runner.invoke(main, ["rejections", "list"]).exit_code == 0
    assert runner.invoke(main, ["rejections", "list", "--app", "other"]).exit_code == 0
    assert asked == ["library-refusals", "other-rejections"]
