"""Snapshot storage on a real S3 server (moto, on loopback), hooks, periodic snapshots."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from enhydra.contracts.codec import decode_entry
from enhydra.snapshots.format import PartitionTaken, open_snapshot
from enhydra.snapshots.storage import open_snapshot_at, open_storage
from enhydra.testing.processes import free_port
from ledger.workload import generate, model
from tests.integration.ledger_support import feed
from tests.snapshots.support import create_snapshot

pytestmark = pytest.mark.integration

TARGET = "ledger.service:service"
HOOKED = "tests.snapshots.hooked_ledger:service"


@pytest.fixture(scope="module")
def s3_url():
    """A moto S3 server as a separate process, with one bucket."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.2)
    import boto3

    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ).create_bucket(Bucket="snapshots")
    yield f"s3://snapshots/ledger?endpoint_url={endpoint}"
    server.terminate()
    server.wait(10)


@pytest.fixture(autouse=True)
def fake_aws_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


def test_snapshot_to_s3_and_back(service_factory, kafka_bootstrap, app_id, s3_url):
    env = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "ENHYDRA_SNAPSHOT_STORAGE": s3_url,  # the only storage the instances write to
    }
    one = service_factory(TARGET, "s3", extra_env=env)
    one.wait_ready()
    commands = generate(120, 900, seed=111)
    feed(kafka_bootstrap, app_id, commands)
    info = create_snapshot(app_id, kafka_bootstrap, s3_url)
    storage = open_storage(s3_url)
    assert info["id"] in storage.list_snapshots()
    snap = open_snapshot(open_snapshot_at(storage, info["id"]))
    got = {
        k.decode(): decode_entry(v).state
        for p in snap.partitions
        for k, v in snap.iter_partition(p)
    }
    assert got == model(commands)
    shown = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", "snapshot", "verify", f"{s3_url}#{info['id']}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert shown.stdout.startswith("ok:")


def test_hooks_run_around_periodic_snapshots_and_retention_keeps_the_newest(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    storage = tmp_path / "snaps"
    hooks_log = tmp_path / "hooks.jsonl"
    one = service_factory(
        HOOKED,
        "p",
        extra_env={
            "ENHYDRA_SNAPSHOT_STORAGE": str(storage),
            "ENHYDRA_SNAPSHOT_INTERVAL_S": "2",
            "ENHYDRA_SNAPSHOT_RETENTION": "2",
            "HOOKS_LOG": str(hooks_log),
        },
    )
    one.wait_ready()
    feed(kafka_bootstrap, app_id, generate(50, 400, seed=5))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        calls = (
            [json.loads(x) for x in hooks_log.read_text().splitlines()]
            if (hooks_log.exists())
            else []
        )
        if sum(1 for c in calls if c["phase"] == "after") >= 3:
            break
        time.sleep(0.5)
    phases = [c["phase"] for c in calls]
    assert phases[:2] == ["before", "after"] and phases.count("after") >= 3
    after = [c for c in calls if c["phase"] == "after"]
    assert all(c["rows"] == 50 * 95 // 100 for c in after)  # every account that was opened
    kept = open_storage(str(storage)).list_snapshots()
    assert len(kept) == 2, kept  # retention: only the newest two
    assert all(Path(storage / k / "manifest.json").is_file() for k in kept)


def test_admin_api_triggers_a_snapshot(service_factory, kafka_bootstrap, app_id, tmp_path):
    import urllib.error
    import urllib.request

    storage = tmp_path / "admin-snaps"
    one = service_factory(
        TARGET,
        "adm",
        extra_env={"ENHYDRA_SNAPSHOT_STORAGE": str(storage), "ENHYDRA_ADMIN_TOKEN": "s3cret"},
    )
    one.wait_ready()
    feed(kafka_bootstrap, app_id, generate(40, 200, seed=8))

    def post(token: str | None) -> tuple[int, dict]:
        request = urllib.request.Request(
            one.url + "/v1/admin/snapshots",
            data=b"{}",
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    assert post(None)[0] == 401
    assert post("wrong")[0] == 403
    status, body = post("s3cret")
    assert status == 202 and body["id"].startswith(app_id)
    deadline = time.monotonic() + 60
    while body["id"] not in open_storage(str(storage)).list_snapshots():
        assert time.monotonic() < deadline, "the snapshot was not written"
        time.sleep(0.3)
    snap = open_snapshot(storage / body["id"])
    assert snap.manifest.rows == 40 * 95 // 100


@pytest.mark.parametrize("kind", ["s3", "file"])
def test_a_partition_file_placed_first_is_never_replaced(kind, s3_url, tmp_path):
    """Two owners of a partition that moved during a live snapshot may both export it; the
    manifest describes the first copy, so a second must not overwrite it."""
    url = s3_url.replace("/ledger?", f"/first-{kind}?") if kind == "s3" else str(tmp_path / "s")
    storage = open_storage(url)
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    first.write_bytes(b"the copy the manifest describes")
    second.write_bytes(b"a later copy of the same partition")
    storage.put_file("snap-1/accounts/partition-0000.parquet", first)
    with pytest.raises(PartitionTaken, match="written by another instance first"):
        storage.put_file("snap-1/accounts/partition-0000.parquet", second)
    storage.put_manifest("snap-1", b"{}")
    fetched = storage.fetch("snap-1", tmp_path / "fetched")
    placed = fetched / "accounts" / "partition-0000.parquet"
    assert placed.read_bytes() == b"the copy the manifest describes"
    assert sorted(p.name for p in placed.parent.iterdir()) == ["partition-0000.parquet"]
