"""Error policies, dead-letter headers, retry bookkeeping and the restart budget."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

from enhydra.errors.dlq import DeadLetter, Selection, dead_letter_headers
from enhydra.errors.failure import Failure, Stage
from enhydra.errors.policies import ErrorAction, ErrorPolicies, PolicyError, UncaughtPolicy
from enhydra.errors.uncaught import RestartBudget, UncaughtDecider
from enhydra.processing.core import InputRecord, process_batch
from enhydra.runner.retries import RetryTracker
from ledger.domain import accounts


def failure(stage: Stage, error: BaseException | None = None) -> Failure:
    record = InputRecord(41, b"k", b"{}", 1700000000000, (("trace", b"abc"),))
    return Failure(record, stage, error or ValueError("boom"), "k")


def test_fixed_and_callable_policies() -> None:
    policies = ErrorPolicies("dlq", lambda f: "fail", "continue")
    assert policies.action(failure(Stage.DESERIALIZE)) is ErrorAction.DLQ
    assert policies.action(failure(Stage.PROCESS)) is ErrorAction.FAIL
    assert policies.action(failure(Stage.PRODUCE)) is ErrorAction.CONTINUE
    assert policies.uses_dlq()
    assert not ErrorPolicies("log_and_fail", "fail", "fail").uses_dlq()


def test_a_policy_not_allowed_for_its_stage_is_refused() -> None:
    with pytest.raises(PolicyError, match="process error handler returned 'continue'"):
        ErrorPolicies(processing="continue").action(failure(Stage.PROCESS))


def test_dead_letter_headers_keep_the_original_and_say_where_and_why() -> None:
    now = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    try:
        raise RuntimeError("handler bug")
    except RuntimeError as exc:
        error = exc
    h = dict(
        dead_letter_headers(
            failure(Stage.PROCESS, error),
            topic="t",
            partition=3,
            app_id="ledger",
            instance_id="i1",
            now=now,
        )
    )
    assert h["trace"] == b"abc"
    assert h["enhydra.dlq.topic"] == b"t" and h["enhydra.dlq.partition"] == b"3"
    assert h["enhydra.dlq.offset"] == b"41" and h["enhydra.dlq.timestamp"] == b"1700000000000"
    assert h["enhydra.dlq.error.class"] == b"RuntimeError"
    assert h["enhydra.dlq.stage"] == b"process" and h["enhydra.dlq.attempts"] == b"1"
    assert b"handler bug" in h["enhydra.dlq.error.stacktrace"]


def test_a_replayed_letter_counts_its_trips_and_a_second_failure_shows_it() -> None:
    letter = DeadLetter(
        0,
        7,
        b"k",
        b"{}",
        (("trace", b"abc"), ("enhydra.dlq.stage", b"process"), ("enhydra.dlq.topic", b"t")),
    )
    replay = dict(letter.replay_headers("app-dlq"))
    assert replay["enhydra.dlq.replays"] == b"1"
    assert replay["enhydra.dlq.replayed_from"] == b"app-dlq/0/7"
    assert "enhydra.dlq.stage" not in replay
    again = failure(Stage.PROCESS)
    again.record.headers = tuple(replay.items())
    h = dict(dead_letter_headers(again, topic="t", partition=0, app_id="a", instance_id="i"))
    assert h["enhydra.dlq.replays"] == b"1"


def test_selection_filters() -> None:
    def letter(cls: str, partition: int, offset: int) -> DeadLetter:
        return DeadLetter(
            0,
            offset,
            None,
            None,
            (
                ("enhydra.dlq.error.class", cls.encode()),
                ("enhydra.dlq.partition", str(partition).encode()),
                ("enhydra.dlq.offset", str(offset).encode()),
            ),
        )

    letters = [letter("RuntimeError", 0, 5), letter("x.y.InvalidCommand", 1, 9)]
    assert Selection(error_class="InvalidCommand").select(letters) == [letters[1]]
    assert Selection(origin_partition=0).select(letters) == [letters[0]]
    assert Selection(min_offset=6, max_offset=10).select(letters) == [letters[1]]


def test_restart_budget_and_escalation() -> None:
    decider = UncaughtDecider("replace_worker", RestartBudget(2, 60.0))
    assert decider.decide(RuntimeError(), now=0) is UncaughtPolicy.REPLACE_WORKER
    assert decider.decide(RuntimeError(), now=1) is UncaughtPolicy.REPLACE_WORKER
    assert decider.decide(RuntimeError(), now=2) is UncaughtPolicy.SHUTDOWN_CLIENT
    assert decider.decide(RuntimeError(), now=70) is UncaughtPolicy.REPLACE_WORKER  # window moved


def test_retry_tracker_backs_off_then_gives_up() -> None:
    tracker = RetryTracker(backoff_s=0.1, timeout_s=10)
    assert tracker.record(0, 5, now=0) == (1, 0.1)
    assert tracker.record(0, 5, now=1) == (2, 0.2)
    assert tracker.give_up(0, now=5) == {}
    assert tracker.give_up(0, now=10) == {5: 2}


def test_transient_error_interrupts_the_batch_and_gives_up_later() -> None:
    class Flaky(ConnectionError):
        pass

    def decide(state, command):
        if command["account"] == "flaky":
            raise Flaky("backend down")
        return accounts.decide(state, command)

    from dataclasses import replace

    agg = replace(accounts, decide=decide)
    records = [
        InputRecord(
            i, k.encode(), orjson.dumps({"command_id": str(i), "type": "open", "account": k})
        )
        for i, k in enumerate(["a", "flaky", "b"])
    ]
    first = process_batch(agg, records, {}.get, transient=(Flaky,))
    assert first.interrupted is not None and first.interrupted.record.offset == 1
    assert first.last_offset == 0 and list(first.changed) == ["a"]
    later = process_batch(agg, records[1:], {}.get, transient=(Flaky,), give_up={1: 4})
    assert later.failures[0].attempts == 5 and later.failures[0].stage == Stage.PROCESS
    assert list(later.changed) == ["b"]
