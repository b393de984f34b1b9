"""Rejections and the DLQ are readable, on a real broker: `enhydra rejections list|tail` prints
each refused command with its reason; /v1/stats counts the DLQ from the topic, so a restart
does not reset it to "none"; the status page in headless Chromium shows both, and the
projections with their lag."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from enhydra.testing.processes import ServiceProcess, read_topic
from tests.integration.ledger_support import feed
from tests.query.test_status_page import browse, chromium

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGET = "tests.integration.ledger_versions:v2_service"  # the ledger and a `balances` projection
DLQ_ON = {"ENHYDRA_DESERIALIZATION_EXCEPTION_HANDLER": "dlq"}
POISON = [(f"p{n}", b"not json") for n in range(3)]


def opened(n: int) -> tuple[str, dict]:
    return ("a1", {"command_id": f"c{n}", "type": "open", "account": "a1"})


def withdrawn(n: int, amount: int) -> tuple[str, dict]:
    return ("a1", {"command_id": f"c{n}", "type": "withdraw", "account": "a1", "amount": amount})


def enhydra(cwd: Path, *args: str, **kw) -> subprocess.Popen:
    """The CLI as a user runs it: its own process, no ENHYDRA_* from the test's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENHYDRA_")}
    return subprocess.Popen(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def read_line(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """The process's next line of output, within `timeout`."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout}s"
    return proc.stdout.readline()


def stats_until(instance: ServiceProcess, check, timeout: float = 60.0) -> dict:
    """/v1/stats once `check(body)` holds (the DLQ count is refreshed every few seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = instance.get("/v1/stats")
        if status == 200 and check(body):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"/v1/stats never matched: {status} {body}")
        time.sleep(0.5)


def test_rejections_and_the_dlq_count_are_readable_and_survive_a_restart(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    state = tmp_path / "state"
    first = service_factory(TARGET, "i1", state_dir=state, extra_env=DLQ_ON, partitions=2)
    first.wait_ready(90)
    # c1 opens a1; c2 opens it again and c3 withdraws from an empty account: both refused
    feed(kafka_bootstrap, app_id, [opened(1), opened(2), withdrawn(3, 50), *POISON])

    cli = ("--app", app_id, "--bootstrap", kafka_bootstrap)
    listing = enhydra(tmp_path, "rejections", "list", *cli)
    out, err = listing.communicate(timeout=60)
    assert listing.returncode == 0, err
    assert out.splitlines() == [
        "a1  c2  open  account already exists",
        "a1  c3  withdraw  insufficient funds: balance 0, asked 50",
    ]
    assert f"2 rejection(s) in {app_id}-rejections" in err

    # tail: the last one first (then it is following), then a new one as it comes
    tail = enhydra(tmp_path, "rejections", "tail", *cli, "--last", "1", "--max", "1", "--json")
    try:
        assert json.loads(read_line(tail))["command_id"] == "c3"
        feed(kafka_bootstrap, app_id, [withdrawn(4, 500)])
        row = json.loads(read_line(tail))
        assert tail.wait(30) == 0
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait(10)
    assert (row["key"], row["command_id"], row["type"]) == ("a1", "c4", "withdraw")
    assert row["reason"] == "insufficient funds: balance 0, asked 500"

    body = stats_until(first, lambda b: (b.get("dlq") or {}).get("records") == len(POISON))
    assert [r["command_id"] for r in body["recent_rejections"]] == ["c4", "c3", "c2"]

    # after a restart the count still comes from the topic, not from this process's counters
    first.stop()
    again = service_factory(TARGET, "i1", state_dir=state, extra_env=DLQ_ON, partitions=2)
    again.wait_ready(90)
    letters = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-dlq"))
    assert len(letters) == len(POISON)
    body = stats_until(
        again,
        lambda b: (
            (b.get("dlq") or {}).get("records") is not None
            and b["projections"]["balances"]["ready"]
        ),
    )
    assert body["dlq"] == {"topic": f"{app_id}-dlq", "records": len(letters), "exact": True}
    assert body["failures"] == {} and body["recent_rejections"] == []
    assert body["projections"]["balances"]["lag"] == 0

    # the status page: a rejection's reason, the DLQ count, the projection with its lag
    feed(kafka_bootstrap, app_id, [withdrawn(5, 700)])
    stats_until(again, lambda b: len(b["recent_rejections"]) == 1)
    dom = browse(chromium(), tmp_path / "profile", again.url + "/", "--dump-dom")
    html = dom.stdout
    assert 'data-loaded="true"' in html, (dom.stderr[-2000:], html[-2000:])
    assert f'<div id="dlq" data-records="{len(letters)}">' in html
    row = re.search(r'<tr data-command-id="c5">(.*?)</tr>', html, re.S)
    assert row and "insufficient funds: balance 0, asked 700" in row.group(1), html[-3000:]
    projection = re.search(r'<tr data-projection="balances" data-instance="i1">(.*?)</tr>', html)
    assert projection and '<td class="lag">0</td>' in projection.group(1)
