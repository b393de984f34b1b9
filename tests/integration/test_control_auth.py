"""A foreign writer on the control topic changes nothing (control/signing.py), on the real broker.

The writer may write `<app>-control` (a prefix ACL on `<app id>-` lets it) but does not hold
the app's secret. It tries every message type unsigned and signed with a guess, replays a
real beacon, and, as if it held the secret, asks for what no request may ask for: a foreign
storage, an id from the future, a cut below the position. Each is counted in /metrics and
none acts: the instance keeps running and no snapshot is written anywhere. A signed request
from `enhydra snapshot create` and a signed shutdown still act, so nothing was missed.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request

import pytest

from enhydra.control.channel import SHUTDOWN_APPLICATION
from enhydra.control.signing import SIGNATURE_HEADER, seal, signature
from enhydra.errors.uncaught import EXIT_SHUTDOWN_APPLICATION
from enhydra.failover.beacon import BEACON
from enhydra.kafka.clients import as_connection, open_producer
from enhydra.snapshots.format import SnapshotError
from enhydra.snapshots.live import new_snapshot_id
from enhydra.snapshots.offline import request_snapshot
from enhydra.snapshots.progress import SNAPSHOT_MESSAGES
from enhydra.testing.processes import read_topic, wait_for_committed
from ledger.workload import generate
from tests.integration.ledger_support import feed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGET = "ledger.service:service"
KEY = b"the-apps-shared-secret"


def rejected(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.findall(r'enhydra_control_messages_rejected_total\{reason="(\w+)"\} (\d+)', text)
    return {reason: int(count) for reason, count in found}


async def write(bootstrap: str, topic: str, records: list[tuple[bytes, list]]) -> None:
    async with open_producer(as_connection(bootstrap), acks="all") as producer:
        for value, headers in records:
            await producer.send_and_wait(topic, value, headers=headers)


def test_a_foreign_writer_on_the_control_topic_changes_nothing(
    service_factory, kafka_bootstrap, app_id, tmp_path
) -> None:
    storage, elsewhere = tmp_path / "snapshots", tmp_path / "elsewhere"
    env = {"ENHYDRA_CONTROL_SECRET": KEY.decode(), "ENHYDRA_SNAPSHOT_STORAGE": str(storage)}
    one = service_factory(TARGET, "c1", extra_env=env)
    one.wait_ready()
    feed(kafka_bootstrap, app_id, generate(40, 200, seed=8))
    asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands"))
    topic = f"{app_id}-control"
    beacon = next(r for r in asyncio.run(read_topic(kafka_bootstrap, topic)) if r.headers)

    snapshot_id = new_snapshot_id(app_id)
    every_type = [
        {"type": "shutdown_application", "reason": "bye"},
        {"type": "snapshot_create", "id": snapshot_id, "storage": str(elsewhere)},
        {"type": "snapshot_request", "id": snapshot_id, "storage": str(elsewhere), "cut": None},
        {"type": "snapshot_claim", "id": snapshot_id, "partition": 0, "instance": "ghost"},
        {"type": "snapshot_part", "id": snapshot_id, "partition": 0, "cut": 0, "partitions": 4},
        {"type": "snapshot_done", "id": snapshot_id, "error": "forged"},
        {"type": "liveness", "seq": 0, "member": None, "origin": "ghost"},
    ]
    known = {SHUTDOWN_APPLICATION, BEACON, *SNAPSHOT_MESSAGES}
    assert {m["type"] for m in every_type} == known, "a control message type is not tried here"
    records = []
    for message in every_type:
        message = {"origin": "intruder", **message}
        value, _ = seal(message, None)
        records.append((value, []))  # unsigned
        records.append((value, [(SIGNATURE_HEADER, signature(b"a guess", value))]))
    records.append((beacon.value, list(beacon.headers)))  # a real beacon, copied
    # With the secret, still refused: a foreign storage, an id from the future, a cut rewind.
    future = f"{app_id}-29991231T235959999999Z"
    cut = {str(p): 0 for p in range(4)}
    for message in (
        {"type": "snapshot_create", "id": new_snapshot_id(app_id), "storage": str(elsewhere)},
        {"type": "snapshot_create", "id": future, "storage": str(storage)},
        {"type": "snapshot_request", "id": snapshot_id, "storage": str(storage), "cut": cut},
    ):
        records.append(seal({"origin": "insider", **message}, KEY))
    # Signed with the shared secret for another app (copied from its control topic): refused.
    neighbour = {"type": "shutdown_application", "origin": "neighbour"}
    records.append(seal(neighbour, KEY, app=f"{app_id}-neighbour"))
    asyncio.run(write(kafka_bootstrap, topic, records))

    expected = {
        "unsigned": 7,
        "bad_signature": 7,
        "replayed": 1,
        "storage_not_configured": 1,
        "bad_snapshot_id": 1,
        "cut_below_position": 1,
        "other_app": 1,
    }
    deadline = time.monotonic() + 20
    while rejected(one.url) != expected:
        assert time.monotonic() < deadline, rejected(one.url)
        time.sleep(0.3)
    time.sleep(1.5)  # anything that acted would have by now
    assert one.alive(), one.log_tail(40)
    assert rejected(one.url) == expected  # its own beacons keep being accepted
    assert not elsewhere.exists()
    assert not storage.exists() or list(storage.iterdir()) == []
    ignored = [line for line in one.log_tail(400).splitlines() if "control message ignored" in line]
    assert len(ignored) == 5, ignored  # once per origin: intruder, ghost, c1, insider, neighbour
    assert KEY.decode() not in one.log_tail(400)

    # A signed request for another storage is answered at once, and changes nothing either.
    with pytest.raises(SnapshotError, match="refused: storage_not_configured"):
        asyncio.run(request_snapshot(kafka_bootstrap, app_id, str(elsewhere), secret=KEY))
    assert not elsewhere.exists()

    # The channel acts on a signed request for the configured storage.
    done = asyncio.run(
        request_snapshot(kafka_bootstrap, app_id, str(storage), timeout=60, secret=KEY)
    )
    assert done["rows"] == 40 * 95 // 100 and (storage / done["id"] / "manifest.json").is_file()
    # ...and on a signed shutdown_application, as on one written by a peer that failed.
    shutdown = seal({"type": "shutdown_application"}, KEY, app=app_id)
    asyncio.run(write(kafka_bootstrap, topic, [shutdown]))
    assert one.process is not None and one.process.wait(30) == EXIT_SHUTDOWN_APPLICATION
