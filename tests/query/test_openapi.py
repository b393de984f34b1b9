"""The OpenAPI document describes what the instances serve, and fuzzing it finds no 5xx."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.query.conftest import QUERY_TOKEN, Cluster, call

pytestmark = pytest.mark.integration

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
