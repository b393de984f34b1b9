"""The OpenAPI document describes what the instances serve, and fuzzing it finds no 5xx."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.query.conftest import PARTITIONS, QUERY_TOKEN, Cluster, call
from tests.unit.test_asyncapi_parser import parse

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("query-cluster")]

PATHS = {
    "/",
    "/v1/stores/{store}/keys/{key}",
    "/v1/stores/{store}/scan",
    "/v1/stores/{store}/count",
    "/v1/metadata",
    "/v1/metadata/stores/{store}/keys/{key}",
    "/v1/stats",
    "/health/live",
    "/health/ready",
    "/metrics",
    "/v1/openapi.json",
    "/v1/asyncapi.json",
    "/v1/admin/shutdown",
    "/v1/admin/rebalance",
    "/v1/admin/snapshots",  # added by the service: the snapshot trigger
    "/v1/admin/leave",  # added by the service: leave the group and stop (a scale-down)
}


def test_the_document_lists_every_route_with_auth_and_errors(cluster: Cluster):
    answer = call(cluster.instances[0].url + "/v1/openapi.json", token=None)
    assert answer.status == 200
    doc = answer.body
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == PATHS
    key = doc["paths"]["/v1/stores/{store}/keys/{key}"]["get"]
    assert {"200", "400", "401", "403", "404", "421", "503"} <= set(key["responses"])
    assert "X-Enhydra-Lag" in key["responses"]["200"]["headers"]
    assert {p["name"] for p in key["parameters"]} == {"store", "key", "allow_stale", "forward"}
    shutdown = doc["paths"]["/v1/admin/shutdown"]["post"]
    assert shutdown["security"] == [{"adminToken": []}]
    scan = doc["paths"]["/v1/stores/{store}/scan"]["get"]
    limit = next(p for p in scan["parameters"] if p["name"] == "limit")
    assert limit["schema"]["maximum"] == 1000
    # Every documented route answers (not a 404 from the router) on a live instance.
    for path, operations in doc["paths"].items():
        if "get" in operations and "{" not in path:
            assert call(cluster.instances[0].url + path).status in (200, 503), path


def test_every_instance_serves_the_asyncapi_document_of_its_topics(cluster: Cluster, tmp_path):
    answer = call(cluster.instances[0].url + "/v1/asyncapi.json", token=None)
    assert answer.status == 200, answer.body
    doc = answer.body
    app = cluster.app_id
    topics = {f"{app}-commands", f"{app}-events", f"{app}-rejections", f"{app}-dlq"}
    assert set(doc["channels"]) == topics
    for channel in doc["channels"].values():
        assert channel["bindings"]["kafka"]["partitions"] == PARTITIONS
    assert doc["info"]["title"] == app
    assert doc["servers"]["kafka"]["host"] == cluster.bootstrap.split(",")[0]
    assert doc["operations"]["receiveCommands"]["bindings"]["kafka"]["groupId"]["enum"] == [app]
    for other in cluster.instances[1:]:
        assert call(other.url + "/v1/asyncapi.json", token=None).body == doc
    path = tmp_path / "served.json"
    path.write_bytes(answer.raw)
    assert parse([path])["served"]["valid"]


def test_schemathesis_finds_no_server_errors(cluster: Cluster, tmp_path):
    """Fuzz every operation of i1 with the query token (the admin calls answer 403)."""
    target = cluster.by_id("i1")
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        target.url + "/v1/openapi.json",
        "--header",
        f"Authorization: Bearer {QUERY_TOKEN}",
        "--checks",
        "not_a_server_error",
        "--max-examples",
        "30",
        "--seed",
        "20261122",
        "--generation-database",
        "none",
        "--no-color",
        "--workers",
        "1",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    operations = re.search(r"(\d+) selected / (\d+) total", output)
    assert operations and operations[1] == operations[2] and int(operations[1]) >= 12, output
    cases = re.search(r"(\d+) generated, (\d+) passed\n", output)
    assert cases and cases[1] == cases[2] and int(cases[1]) > 300, output[-2000:]
    assert "Server error" not in output, output[-4000:]
    assert all(inst.alive() for inst in cluster.instances)
