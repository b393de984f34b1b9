"""The shop's contracts: each service's saved copies of its upstreams' documents, checked.

Every service keeps the AsyncAPI documents of the services it reacts to in contracts/, and
`enhydra topology check` compares them with the event types its reactions read. Here the
copies are the upstreams' documents as they stand, every check passes, and an upstream that
stops writing a field a downstream reads fails the downstream's check, naming both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.examples_shop.conftest import SHOP

READS = {"orders": ("stock", "payments"), "stock": ("orders",), "payments": ("stock",)}


def enhydra(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENHYDRA_", "SHOP_"))}
    command = [sys.executable, "-m", "enhydra.cli.main", *args]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_each_saved_contract_is_its_upstreams_document():
    for service, upstreams in READS.items():
        saved = sorted(p.stem for p in (SHOP / service / "contracts").glob("*.json"))
        assert saved == sorted(upstreams), service
        for upstream in upstreams:
            copy = SHOP / service / "contracts" / f"{upstream}.json"
            assert copy.read_text() == (SHOP / upstream / "asyncapi.json").read_text(), (
                f"{copy} is stale: cp examples/shop/{upstream}/asyncapi.json {copy}"
            )


def test_every_service_reads_what_its_upstreams_write():
    for service in READS:
        done = enhydra(SHOP / service, "topology", "check")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "every event a reaction reads still fits" in done.stdout, done.stdout


def test_an_upstream_that_drops_a_field_read_downstream_fails_the_check(tmp_path):
    """Stock stops writing `order` on out_of_stock: orders' reaction could no longer answer."""
    document = json.loads((SHOP / "stock" / "asyncapi.json").read_text())
    schema = document["channels"]["stock-events"]["messages"]["out_of_stock"]["payload"]
    del schema["properties"]["order"]
    schema["required"].remove("order")
    narrowed = tmp_path / "stock.json"
    narrowed.write_text(json.dumps(document))
    done = enhydra(
        SHOP / "orders",
        "topology",
        "check",
        "--upstream",
        str(narrowed),
        "--upstream",
        str(SHOP / "payments" / "asyncapi.json"),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "stock -> orders" in done.stdout and "'out_of_stock'" in done.stdout, done.stdout
