"""The AsyncAPI document of this service (asyncapi.json), for the teams that use its topics.

It is what `enhydra asyncapi` prints and every instance serves at /v1/asyncapi.json: the
topics as channels, one message per command and event type, the headers of the events and
the Kafka servers (the code's defaults: no ENHYDRA_* variable of the shell counts here).
Until the first deploy (topology.json marked `"deployed": false`) this test rewrites it from
the code: commit it with your change. After the first deploy a stale asyncapi.json fails
here, so a review sees every change of the contract: run `enhydra asyncapi -o asyncapi.json`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from enhydra.topology import is_deployed

from stock.service import service

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "asyncapi.json"
TOPOLOGY = ROOT / "topology.json"


def document_of_the_code() -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENHYDRA_")}
    command = [sys.executable, "-m", "enhydra.cli.main", "asyncapi"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_asyncapi_json_is_the_document_of_this_code() -> None:
    text = document_of_the_code()
    if not DOCUMENT.exists() or DOCUMENT.read_text() != text:
        assert not is_deployed(json.loads(TOPOLOGY.read_text())), (
            "asyncapi.json is not the document of this code: run "
            "`enhydra asyncapi -o asyncapi.json` and commit it"
        )
        DOCUMENT.write_text(text)
    document = json.loads(DOCUMENT.read_text())
    app_id = service.settings.app_id
    addresses = {channel["address"] for channel in document["channels"].values()}
    assert {f"{app_id}-commands", f"{app_id}-events", f"{app_id}-rejections"} <= addresses
    assert document["operations"]["receiveCommands"]["action"] == "receive"
