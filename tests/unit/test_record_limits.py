"""Every record a batch will write fits the broker's limit, checked in the pure step.

A record too large found only when published (a changelog entry, a rejection) would fail the
batch after its events went out, and every restart would publish them again. The step turns
such a command into a dead letter instead, before anything of the batch is published.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from enhydra.aggregate import Aggregate, BoundAggregate, Rejection
from enhydra.contracts.codec import decode_entry
from enhydra.contracts.sizes import record_size
from enhydra.errors.dlq import TRUNCATED_FROM, within
from enhydra.errors.policies import ErrorPolicies
from enhydra.processing.core import InputRecord
from enhydra.processing.step import AggregateStep
from enhydra.runner.tasks import Task
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore

LIMIT = 3000


def decide(state, command):
    if command["type"] == "refuse":
        raise Rejection("refused")
    return [{"type": "noted", "text": command["text"]}]


def apply(state, event):
    return (state or "") + event["text"]


notes = Aggregate("notes", decide, apply)
BOUND = BoundAggregate(notes, "n-commands", "n-events", "n-rejections", "n-changelog")


@pytest.fixture
def task(tmp_path: Path):
    store = PartitionStore(tmp_path / "0")
    yield Task(0, store)
    store.close()


def step_for(tmp_path: Path, task: Task, limit: int = LIMIT) -> AggregateStep:
    settings = Settings.from_env(
        {}, app_id="n", instance_id="i1", state_dir=tmp_path, max_output_bytes=limit, partitions=1
    )
    step = AggregateStep(settings, BOUND, ErrorPolicies("dlq", "dlq", "dlq"), ())
    step.max_record_bytes = limit  # what the runner learns from the broker at start
    task.cache = step.new_cache()
    return step


def command(offset: int, key: str, kind: str, text: str) -> InputRecord:
    value = orjson.dumps({"command_id": f"c{offset}", "type": kind, "text": text})
    return InputRecord(offset, key.encode(), value)


def dlq_headers(out) -> list[dict[str, str]]:
    return [{k: v.decode() for k, v in headers} for _, _, headers in out.outputs.get("n-dlq", [])]


def test_a_state_that_grows_past_the_limit_dead_letters_the_commands_that_grow_it(
    tmp_path, task
) -> None:
    step = step_for(tmp_path, task)
    records = []
    for i in range(12):  # "big" grows by 400 bytes a command; "small" stays small
        records.append(command(2 * i, "big", "note", "x" * 400))
        records.append(command(2 * i + 1, "small", "note", "y"))
    out = step(task, records, {})

    entries = {key: decode_entry(value) for key, value in out.puts}
    kept = len(entries[b"big"].state) // 400
    assert 0 < kept < 12
    assert all(record_size(key, value) <= LIMIT for key, value in out.puts)
    assert entries[b"small"].state == "y" * 12
    # The commands that would have grown it past the limit are dead letters, with no event.
    letters = dlq_headers(out)
    assert len(letters) == 12 - kept
    assert {h["enhydra.dlq.stage"] for h in letters} == {"produce"}
    message = letters[0]["enhydra.dlq.error.message"]
    assert message.startswith("state entry of ") and f"exceeds the {LIMIT}-byte limit" in message
    big_events = [e for e in out.outputs["n-events"] if e[0] == b"big"]
    assert len(big_events) == kept
    assert entries[b"big"].offset == 2 * (kept - 1)  # the last command that fit
    assert out.last_offset == 23
    assert task.cache.get("big").state == entries[b"big"].state  # staged: what is written


def test_a_rejection_echoing_a_huge_command_is_dead_lettered_and_cut_to_fit(tmp_path, task) -> None:
    step = step_for(tmp_path, task)
    huge = command(0, "k", "refuse", "z" * 5000)
    out = step(task, [huge, command(1, "k", "refuse", "short")], {})

    assert [orjson.loads(v)["command_id"] for _, v, _ in out.outputs["n-rejections"]] == ["c1"]
    assert out.puts == []  # no state changed
    [(key, value, headers)] = out.outputs["n-dlq"]
    h = {k: v.decode() for k, v in headers}
    assert h["enhydra.dlq.error.message"].startswith("rejection of ")
    assert h["enhydra.dlq.offset"] == "0"
    # The dead letter, a copy of the command, is itself too large: cut, with its size said.
    assert h[TRUNCATED_FROM] == str(len(huge.value))
    assert huge.value.startswith(value) and record_size(key, value, headers) <= LIMIT


def test_an_event_too_large_is_dead_lettered_with_its_size(tmp_path, task) -> None:
    step = step_for(tmp_path, task)
    out = step(task, [command(0, "k", "note", "e" * 4000), command(1, "k", "note", "ok")], {})
    [letter] = dlq_headers(out)
    assert letter["enhydra.dlq.error.message"].startswith("event of ")
    assert letter["enhydra.dlq.error.class"] == "enhydra.processing.core.OutputTooLarge"
    assert [decode_entry(v).state for _, v in out.puts] == ["ok"]


def test_a_dead_letter_that_fits_is_kept_whole() -> None:
    headers = [("enhydra.dlq.stage", b"process")]
    assert within(b"k", b"v" * 100, headers, LIMIT) == (b"k", b"v" * 100, headers)
