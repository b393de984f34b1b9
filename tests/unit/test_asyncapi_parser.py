"""`enhydra asyncapi` writes documents the reference AsyncAPI parser accepts with no error.

The parser is npm's @asyncapi/parser, pinned in tools/asyncapi and installed by `make setup`
(`npm ci`); tools/asyncapi/validate.mjs prints its diagnostics. Without it this test fails:
it is the CI check that the documents other teams' tools read are valid.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "asyncapi"
SECURED = {
    "ENHYDRA_BOOTSTRAP_SERVERS": "b-1.kafka.example:9096,b-2.kafka.example:9096",
    "ENHYDRA_SECURITY_PROTOCOL": "SASL_SSL",
    "ENHYDRA_SASL_MECHANISM": "SCRAM-SHA-512",
    "ENHYDRA_SASL_USERNAME": "ledger-svc",
    "ENHYDRA_SASL_PASSWORD": "pw-never-shown",
}
DOCUMENTS = {
    "untyped": ("ledger.service:service", {}),
    "typed": ("ledger.typed:service", {}),
    "secured": ("ledger.typed:service", SECURED),
}


def write_document(target: str, env: dict[str, str], path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ENHYDRA_")}
    done = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", "asyncapi", target, "-o", str(path)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def parse(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """The parser's verdict and diagnostics for each file."""
    node = shutil.which("node")
    assert node, "node is missing: apt-get install nodejs npm"
    assert (TOOLS / "node_modules" / "@asyncapi" / "parser").is_dir(), (
        "the AsyncAPI parser is not installed: run `make setup` (npm ci in tools/asyncapi)"
    )
    done = subprocess.run(
        [node, str(TOOLS / "validate.mjs"), "--json", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return {Path(r["file"]).stem: r for r in map(json.loads, done.stdout.splitlines())}


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("asyncapi")
    docs = {}
    for name, (target, env) in DOCUMENTS.items():
        write_document(target, env, folder / f"{name}.json")
        docs[name] = json.loads((folder / f"{name}.json").read_text())
    return docs, parse([folder / f"{name}.json" for name in DOCUMENTS])


@pytest.mark.parametrize("name", list(DOCUMENTS))
def test_the_reference_parser_finds_no_error(documents, name: str) -> None:
    _, verdicts = documents
    verdict = verdicts[name]
    errors = [d for d in verdict["diagnostics"] if d["severity"] == "error"]
    assert verdict["valid"] and errors == [], json.dumps(errors, indent=2)


def test_the_parser_rejects_a_broken_document(documents, tmp_path) -> None:
    """The check has teeth: an operation naming a message its channel lacks is an error."""
    docs, _ = documents
    broken = json.loads(json.dumps(docs["typed"]))
    broken["operations"]["sendEvents"]["messages"].append(
        {"$ref": "#/channels/ledger-events/messages/refunded"}
    )
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    verdict = parse([path])["broken"]
    assert not verdict["valid"]
    assert any("refunded" in d["message"] for d in verdict["diagnostics"])


def test_what_a_consumer_relies_on_is_in_the_documents(documents) -> None:
    docs, _ = documents
    topics = {"ledger-commands", "ledger-events", "ledger-rejections", "ledger-dlq"}
    for doc in docs.values():
        assert {c["address"] for c in doc["channels"].values()} == topics
        assert set(doc["channels"]) == topics
    typed = docs["typed"]
    deposit = typed["channels"]["ledger-commands"]["messages"]["deposit"]
    assert "amount" in deposit["payload"]["required"]
    assert deposit["payload"]["properties"]["amount"]["type"] == "integer"
    deposited = typed["channels"]["ledger-events"]["messages"]["deposited"]
    assert deposited["headers"]["properties"]["enhydra.event_version"]["enum"] == ["2"]
    assert deposited["x-enhydra-versions"]["1"]["upcaster"] is True
    untyped = docs["untyped"]
    assert set(untyped["channels"]["ledger-events"]["messages"]) == {"deposited", "event"}


def test_the_secured_document_names_the_scheme_and_no_secret(documents) -> None:
    docs, _ = documents
    secured = docs["secured"]
    hosts = [s["host"] for s in secured["servers"].values()]
    assert hosts == ["b-1.kafka.example:9096", "b-2.kafka.example:9096"]
    assert {s["protocol"] for s in secured["servers"].values()} == {"kafka-secure"}
    schemes = secured["components"]["securitySchemes"]
    assert [s["type"] for s in schemes.values()] == ["scramSha512"]
    text = json.dumps(secured)
    assert "pw-never-shown" not in text and "ledger-svc" not in text
