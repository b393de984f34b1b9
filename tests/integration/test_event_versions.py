"""A history written by the ledger's first version, read by its second, on a real broker.

v1 publishes `deposited` without a currency (version header 1); the upgraded ledger publishes
v2 with one (version header 2) and declares the upcaster. After the upgrade every path that
reads the whole events topic must equal the independent model of all the commands: the live
service, a projection, time travel, a Spark backfill and a clone of the backfill's snapshot
run by the typed ledger (ledger.typed). The v1 code, pointed at the upgraded history, refuses
it instead of guessing.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import orjson
import pytest

from enhydra.contracts.codec import decode_entry
from enhydra.contracts.headers import EVENT_VERSION_HEADER, header
from enhydra.snapshots.format import open_snapshot
from enhydra.testing.processes import read_topic, wait_for_committed
from ledger.workload import generate, model
from tests.integration.ledger_support import feed, read_accounts
from tests.snapshots.support import cli

pytestmark = [pytest.mark.integration, pytest.mark.spark]

V1 = "tests.integration.ledger_versions:v1_service"
V2 = "tests.integration.ledger_versions:v2_service"
TARGET = "ledger.service:service"  # the ledger as released: v2
TYPED = "ledger.typed:service"  # the same ledger, declared with types


def snapshot_states(path) -> dict[str, dict]:
    snap = open_snapshot(path)
    return {
        key.decode(): decode_entry(value).state
        for partition in snap.partitions
        for key, value in snap.iter_partition(partition)
    }


def test_a_v1_history_reads_as_v2_on_every_path(service_factory, kafka_bootstrap, app_id, tmp_path):
    early, late = generate(100, 1500, seed=181), generate(100, 1500, seed=182)
    v1 = service_factory(V1, "v1")
    v1.wait_ready()
    feed(kafka_bootstrap, app_id, early)
    assert v1.stop() == 0

    v2 = service_factory(V2, "v2")  # a new instance: its store comes from the changelog
    v2.wait_ready()
    feed(kafka_bootstrap, app_id, late)
    expected = model(early + late)

    events = asyncio.run(read_topic(kafka_bootstrap, f"{app_id}-events"))
    deposits = [
        (header(r.headers, EVENT_VERSION_HEADER), orjson.loads(r.value))
        for r in events
        if orjson.loads(r.value)["type"] == "deposited"
    ]
    assert {version for version, _ in deposits} == {b"1", b"2"}
    assert all(("currency" in event) == (version == b"2") for version, event in deposits)

    # the live service continued from the state v1 left
    assert read_accounts([v2], sorted(expected)) == expected

    # a projection folded every event, v1 ones through the upcaster (it reads the currency)
    asyncio.run(
        wait_for_committed(
            kafka_bootstrap, f"{app_id}-projection-balances", f"{app_id}-events", timeout=120
        )
    )
    balances = {}
    for account in sorted(expected):
        status, body = v2.get(f"/v1/stores/balances/keys/{account}")
        assert status == 200, (account, status, body)
        balances[account] = body
    assert balances == {k: {"EUR": s["balance"]} for k, s in expected.items()}
    assert v2.stop() == 0

    # time travel folds the whole history through the released ledger
    now = dt.datetime.now(dt.UTC).isoformat()
    asof = tmp_path / "asof"
    cli(
        *("snapshot", "at", TARGET, "--app", app_id, "--time", now),
        *("--output", str(asof), "--bootstrap", kafka_bootstrap),
    )
    assert snapshot_states(asof) == expected

    # the v1 code refuses the history a newer deployment wrote, in one line
    refused = cli(
        *("snapshot", "at", V1, "--app", app_id, "--time", now),
        *("--output", str(tmp_path / "v1-asof"), "--bootstrap", kafka_bootstrap),
        check=False,
    )
    assert refused.returncode != 0
    assert "'deposited' at version 2" in refused.stderr and "newer deployment" in refused.stderr
    assert "Traceback" not in refused.stderr

    # a Spark backfill (the Python reader) folds it the same way
    job = cli(
        *("backfill", TARGET, "--master", "local[2]", "--method", "python"),
        *("--bootstrap", kafka_bootstrap, "--app", app_id),
        *("--snapshot", str(tmp_path / "backfill")),
        check=False,
    )
    assert job.returncode == 0, job.stderr[-4000:]
    assert snapshot_states(tmp_path / "backfill") == expected

    # the backfill's snapshot cloned into a new app, run by the typed ledger: it reads the
    # cloned states (written as JSON) and goes on deciding on them
    clone_app = f"{app_id}-typed"
    cloned = cli(
        *("snapshot", "clone", str(tmp_path / "backfill"), TARGET, "--to-app", clone_app),
        *("--commands-topic", f"{clone_app}-commands", "--bootstrap", kafka_bootstrap),
    )
    assert "cloned" in cloned.stdout
    typed = service_factory(
        TYPED,
        "typed",
        extra_env={"ENHYDRA_APP_ID": clone_app, "ENHYDRA_COMMANDS_TOPIC": f"{clone_app}-commands"},
    )
    typed.wait_ready()
    assert read_accounts([typed], sorted(expected)) == expected
    account = next(k for k, s in sorted(expected.items()) if s["status"] == "open")
    deposit = {"command_id": "after-clone", "type": "deposit", "account": account, "amount": 7}
    feed(kafka_bootstrap, clone_app, [(account, deposit)])
    status, body = typed.get(f"/v1/stores/accounts/keys/{account}")
    assert status == 200 and body["balance"] == expected[account]["balance"] + 7, body
    # a command that does not fit its declared type goes to the DLQ, the field named
    bad = {**deposit, "command_id": "bad-amount", "amount": "7"}
    feed(kafka_bootstrap, clone_app, [(account, bad)])
    letters = asyncio.run(read_topic(kafka_bootstrap, f"{clone_app}-dlq"))
    assert [orjson.loads(r.value)["command_id"] for r in letters] == ["bad-amount"]
    reason = header(letters[0].headers, "enhydra.dlq.error.message").decode()
    assert "Expected `int`, got `str` - at `$.amount`" in reason, reason
    assert typed.get(f"/v1/stores/accounts/keys/{account}")[1] == body  # unchanged
    assert typed.stop() == 0
