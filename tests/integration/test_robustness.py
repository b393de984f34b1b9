"""Poison records, the dead-letter queue and its replay, uncaught-exception policies, SIGTERM.

Every valid command must be reflected exactly once; every poison record must be in the DLQ
exactly once with its origin; the counts must add up.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from enhydra.testing.processes import produce_json, read_topic, wait_for_committed
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, produce_in_chunks, read_accounts

pytestmark = pytest.mark.integration

FAULTY = "tests.integration.faulty_ledger:service"
FIXED = "ledger.service:service"


def poison(n: int) -> list[tuple[str, object, str, str]]:
    """(key, value, stage, error class) of records that cannot be processed as they are."""
    big_memo = "x" * 5000
    return [
        ("acct-000001", b"{this is not json", "deserialize", "enhydra.aggregate.InvalidCommand"),
        (
            "acct-000002",
            {"type": "deposit", "amount": 5},
            "deserialize",
            "enhydra.aggregate.InvalidCommand",
        ),  # no command_id
        (
            "acct-000003",
            {"command_id": f"p{n}-1", "type": "deposit", "account": "acct-000003", "amount": -40},
            "deserialize",
            "enhydra.aggregate.InvalidCommand",
        ),
        (
            "acct-000004",
            {"command_id": f"p{n}-2", "type": "deposit", "account": "acct-000004", "amount": "12"},
            "deserialize",
            "enhydra.aggregate.InvalidCommand",
        ),
        (
            "acct-000005",
            {"command_id": f"p{n}-3", "type": "refund", "account": "acct-000005", "amount": 3},
            "deserialize",
            "enhydra.aggregate.InvalidCommand",
        ),
        (
            "acct-000006",
            {
                "command_id": f"p{n}-4",
                "type": "deposit",
                "account": "acct-000006",
                "amount": 7,
                "memo": big_memo,
            },
            "produce",
            "enhydra.processing.core.OutputTooLarge",
        ),
        (
            "cursed",
            {"command_id": f"p{n}-5", "type": "open", "account": "cursed"},
            "process",
            "RuntimeError",
        ),
        (
            "cursed",
            {"command_id": f"p{n}-6", "type": "deposit", "account": "cursed", "amount": 9},
            "process",
            "RuntimeError",
        ),
    ]


def dlq_records(bootstrap: str, app_id: str) -> list:
    return asyncio.run(read_topic(bootstrap, f"{app_id}-dlq"))


def headers(record) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers}


def test_poison_records_go_to_the_dlq_once_and_replay_brings_the_fixable_ones_back(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    faulty = service_factory(FAULTY, "faulty", state_dir=tmp_path / "s")
    faulty.wait_ready()
    valid = generate(200, 3000, seed=61)
    bad = poison(1)
    mixed: list[tuple[str, object]] = []
    for i, command in enumerate(valid):  # spread the poison through the stream
        mixed.append(command)
        if i % 350 == 0 and i // 350 < len(bad):
            key, value, *_ = bad[i // 350]
            mixed.append((key, value))
    assert len(mixed) == len(valid) + len(bad)
    feed(kafka_bootstrap, app_id, mixed)

    expected = model(valid)
    assert read_accounts([faulty], sorted(expected)) == expected
    letters = dlq_records(kafka_bootstrap, app_id)
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    rejections = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-rejections"))
    assert len(letters) == len(bad), [headers(r)["enhydra.dlq.error.message"] for r in letters]
    assert len(events) + len(rejections) + len(letters) == len(mixed)
    assert len(events) == sum(s["version"] for s in expected.values())

    commands = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-commands"))
    by_origin = {(r.partition, r.offset): r for r in commands}
    seen = set()
    for letter in letters:
        h = headers(letter)
        origin = by_origin[(int(h["enhydra.dlq.partition"]), int(h["enhydra.dlq.offset"]))]
        assert h["enhydra.dlq.topic"] == f"{app_id}-commands"
        assert (letter.key, letter.value) == (origin.key, origin.value)  # the original record
        assert h["enhydra.dlq.timestamp"] == str(origin.timestamp)
        assert h["enhydra.dlq.app"] == app_id and h["enhydra.dlq.instance"] == "faulty"
        assert h["enhydra.dlq.attempts"] == "1" and h["enhydra.dlq.failed_at"]
        assert "Traceback" in h["enhydra.dlq.error.stacktrace"]
        expected_kind = [
            (s, c)
            for k, v, s, c in bad
            if k.encode() == letter.key
            and (v if isinstance(v, bytes) else json.dumps(v).encode()) == letter.value
        ]
        assert (h["enhydra.dlq.stage"], h["enhydra.dlq.error.class"]) == expected_kind[0]
        seen.add((origin.partition, origin.offset))
    assert len(seen) == len(bad), "each poison record is in the DLQ exactly once"

    # The CLI lists them.
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "enhydra.cli.main",
            "dlq",
            "list",
            "--app",
            app_id,
            "--bootstrap",
            kafka_bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f"{len(bad)} dead letter(s)" in listed.stdout
    assert "OutputTooLarge" in listed.stdout and "RuntimeError" in listed.stdout

    # Fix the cause (the real ledger), then replay what failed in processing and producing.
    assert faulty.stop() == 0
    fixed = service_factory(FIXED, "fixed", state_dir=tmp_path / "s")
    fixed.wait_ready()
    for stage in ("process", "produce"):
        dry = subprocess.run(
            [
                sys.executable,
                "-m",
                "enhydra.cli.main",
                "dlq",
                "replay",
                "--app",
                app_id,
                "--bootstrap",
                kafka_bootstrap,
                "--stage",
                stage,
                "--dry-run",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "would be replayed" in dry.stdout
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "enhydra.cli.main",
                "dlq",
                "replay",
                "--app",
                app_id,
                "--bootstrap",
                kafka_bootstrap,
                "--stage",
                stage,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "replayed" in done.stdout
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=60))
    replayed = [(k, v) for k, v, stage, _ in bad if stage in ("process", "produce")]
    expected = model(valid + [(k, v) for k, v in replayed if isinstance(v, dict)])
    assert read_accounts([fixed], sorted(expected)) == expected
    assert expected["cursed"] == {"balance": 9, "status": "open", "version": 2}
    # Nothing replayed failed again: the DLQ did not grow.
    assert len(dlq_records(kafka_bootstrap, app_id)) == len(bad)


def test_transient_errors_are_retried_then_dead_lettered_after_task_timeout(
    service_factory, kafka_bootstrap, app_id
):
    one = service_factory(FAULTY, "tr", extra_env={"ENHYDRA_TASK_TIMEOUT_MS": "1500"})
    one.wait_ready()
    feed(
        kafka_bootstrap,
        app_id,
        [
            ("flaky", {"command_id": "f1", "type": "open", "account": "flaky"}),
            ("down", {"command_id": "d1", "type": "open", "account": "down"}),
            ("flaky", {"command_id": "f2", "type": "deposit", "account": "flaky", "amount": 4}),
        ],
    )
    assert one.get("/v1/stores/accounts/keys/flaky") == (
        200,
        {"balance": 4, "status": "open", "version": 2},
    )
    assert one.get("/v1/stores/accounts/keys/down")[0] == 404
    (letter,) = dlq_records(kafka_bootstrap, app_id)
    h = headers(letter)
    assert h["enhydra.dlq.error.class"] == "ConnectionError" and int(h["enhydra.dlq.attempts"]) > 1
    log = [json.loads(line) for line in one.log_path.read_text().splitlines() if line.strip()]
    retries = [r for r in log if r["event"] == "transient error; retrying after backoff"]
    assert len([r for r in retries if "hiccup" in r["error"]]) == 3


def test_replace_worker_restarts_at_most_n_times_then_shuts_the_client_down(
    service_factory, kafka_bootstrap, app_id
):
    env = {
        "ENHYDRA_PROCESSING_EXCEPTION_HANDLER": "fail",
        "ENHYDRA_UNCAUGHT_EXCEPTION_HANDLER": "replace_worker",
        "ENHYDRA_MAX_WORKER_REPLACEMENTS": "2",
        "ENHYDRA_WORKER_REPLACEMENT_WINDOW_S": "300",
    }
    one = service_factory(FAULTY, "r1", extra_env=env)
    one.wait_ready()
    asyncio.run(
        produce_json(
            kafka_bootstrap,
            f"{app_id}-commands",
            [("cursed", {"command_id": "c1", "type": "open", "account": "cursed"})],
        )
    )
    assert one.process is not None
    code = one.process.wait(90)
    log = [json.loads(line) for line in one.log_path.read_text().splitlines() if line.strip()]
    deaths = [r for r in log if r["event"] == "stream worker died"]
    replaced = [r for r in log if r["event"] == "stream worker replaced"]
    assert [r["policy"] for r in deaths] == ["REPLACE_WORKER", "REPLACE_WORKER", "SHUTDOWN_CLIENT"]
    assert len(replaced) == 2
    assert code == 1 and log[-1]["event"] == "stopped" and log[-1]["exit_code"] == 1


def test_shutdown_application_stops_every_instance(service_factory, kafka_bootstrap, app_id):
    env = {
        "ENHYDRA_PROCESSING_EXCEPTION_HANDLER": "fail",
        "ENHYDRA_UNCAUGHT_EXCEPTION_HANDLER": "shutdown_application",
    }
    instances = [service_factory(FAULTY, name, extra_env=env) for name in ("s1", "s2")]
    for inst in instances:
        inst.wait_ready()
    asyncio.run(
        produce_json(
            kafka_bootstrap,
            f"{app_id}-commands",
            [("cursed", {"command_id": "c1", "type": "open", "account": "cursed"})],
        )
    )
    codes = [inst.process.wait(60) for inst in instances if inst.process is not None]
    assert codes == [2, 2]
    for inst in instances:
        log = [json.loads(line) for line in inst.log_path.read_text().splitlines() if line.strip()]
        assert any(r["event"] == "application shutdown requested" for r in log) or any(
            r["event"] == "shutting down the whole application" for r in log
        )
        assert log[-1]["event"] == "stopped" and log[-1]["exit_code"] == 2


@pytest.mark.slow
def test_sigterm_under_load_then_restart_loses_nothing_and_applies_nothing_twice(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    commands = generate(500, 12000, seed=71)
    one = service_factory(FIXED, "t1", state_dir=tmp_path / "t")
    one.wait_ready()

    def produce_slowly():
        return produce_in_chunks(kafka_bootstrap, f"{app_id}-commands", commands)

    async def stop_midway() -> float:
        await asyncio.sleep(0.8)
        started = time.monotonic()
        code = await asyncio.to_thread(one.stop, 30)
        assert code == 0
        return time.monotonic() - started

    async def both() -> float:
        _, took = await asyncio.gather(produce_slowly(), stop_midway())
        return took

    took = asyncio.run(both())
    print(f"graceful stop under load took {took:.2f}s")
    again = service_factory(FIXED, "t1-again", state_dir=tmp_path / "t")
    again.wait_ready()
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=120))
    expected = model(commands)
    assert read_accounts([again], sorted(expected)) == expected
    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    # A graceful stop finishes and commits what it started: not even an event is duplicated.
    assert len(events) == sum(s["version"] for s in expected.values())
