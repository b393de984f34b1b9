"""The deployment files are checked like code: linted, schema-validated, and held to the few
properties a stateful Kafka service depends on (state volume, graceful stop, health probes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STATE_DIR = "/var/lib/enhydra"
WEB_PORT = 6066
SLUG = "ledger"


def tool(name: str) -> str:
    """A console script of the dev extras: next to this Python first, then on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(name, path=path)
    if found is None:
        pytest.fail(f"{name} is not installed; run: pip install -e '.[dev]'")
    return found


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def check_jsonschema(schema: str, path: str) -> subprocess.CompletedProcess[str]:
    """Validate with a schema vendored in check-jsonschema (no network needed)."""
    return run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, path])


def load_yaml(relative: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((ROOT / relative).read_text()) if doc]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# --- Dockerfile -------------------------------------------------------------------------------


def test_hadolint_finds_nothing() -> None:
    result = run([tool("hadolint"), "--config", ".hadolint.yaml", "Dockerfile"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_essentials() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert instructions[0].startswith("ARG BASE=python:")
    froms = [line for line in instructions if line.startswith("FROM ")]
    assert froms == ["FROM ${BASE} AS builder", "FROM ${BASE} AS runtime"]
    assert "pip wheel --wheel-dir /wheels --find-links /wheelhouse ." in text
    wheel = SLUG.replace("-", "_")
    assert f"pip install --no-index --find-links /wheels /wheels/{wheel}-*.whl" in text
    assert f"ENHYDRA_STATE_DIR={STATE_DIR}" in text
    assert f'VOLUME ["{STATE_DIR}"]' in text
    assert f"chown enhydra:enhydra {STATE_DIR}" in text
    user = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert f"EXPOSE {WEB_PORT}" in text
    assert "STOPSIGNAL SIGTERM" in text
    assert re.search(r"^HEALTHCHECK .*\n.*urllib.*/health/ready", text, flags=re.M)
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", text, flags=re.M)
    assert entrypoint and json.loads(entrypoint.group(1))[0].endswith("tini")
    assert (ROOT / "wheelhouse").is_dir()


def test_the_runtime_comes_from_an_index() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (runtime,) = [d for d in dependencies if d.startswith("enhydra")]
    assert "@" not in runtime, runtime
    assert "ARG PIP_INDEX_URL" in (ROOT / "Dockerfile").read_text()


# --- docker compose ---------------------------------------------------------------------------


def test_compose_matches_the_compose_spec_schema() -> None:
    result = check_jsonschema("vendor.compose-spec", "docker-compose.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_runs_kafka_and_two_replicas() -> None:
    (compose,) = load_yaml("docker-compose.yml")
    services = compose["services"]
    kafka = services["kafka"]
    assert kafka["image"] == "apache/kafka:4.4.0"
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]
    assert kafka["healthcheck"]["test"]

    replicas = [services[f"{SLUG}-1"], services[f"{SLUG}-2"]]
    envs = [r["environment"] for r in replicas]
    assert {e["ENHYDRA_INSTANCE_ID"] for e in envs} == {f"{SLUG}-1", f"{SLUG}-2"}
    assert [e["ENHYDRA_CLIENT_TAGS"] for e in envs] == ["zone=a", "zone=b"]
    assert {e["ENHYDRA_APP_ID"] for e in envs} == {"ledger"}
    assert all(e["ENHYDRA_BOOTSTRAP_SERVERS"] == "kafka:9092" for e in envs)
    volumes = [r["volumes"][0].split(":") for r in replicas]
    assert all(target == STATE_DIR for _, target in volumes)
    assert len({source for source, _ in volumes}) == 2
    assert all(source in compose["volumes"] for source, _ in volumes)
    host_ports = [r["ports"][0].split(":")[0] for r in replicas]
    assert len(set(host_ports)) == 2
    for replica in replicas:
        assert replica["build"]["context"] == "."
        assert replica["depends_on"]["kafka"]["condition"] == "service_healthy"
        assert replica["stop_grace_period"] == "30s"


# --- Kubernetes -------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = load_yaml("k8s/kustomization.yaml")
    manifests = sorted(p.name for p in (ROOT / "k8s").glob("*.yaml"))
    manifests.remove("kustomization.yaml")
    assert sorted(kustomization["resources"]) == manifests


def test_statefulset_keeps_state_and_stops_gracefully() -> None:
    (sts,) = load_yaml("k8s/statefulset.yaml")
    assert sts["kind"] == "StatefulSet"
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    assert spec["serviceName"] == f"{SLUG}-headless"
    assert pod["terminationGracePeriodSeconds"] >= 30
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0

    (claim,) = spec["volumeClaimTemplates"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == STATE_DIR

    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert container["ports"][0]["containerPort"] == WEB_PORT

    env = env_of(container)
    assert env["ENHYDRA_INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["ENHYDRA_ADVERTISED_URL"].startswith(f"http://$(POD_NAME).{SLUG}-headless.")
    assert env["ENHYDRA_STATE_DIR"] == STATE_DIR
    names = list(env)
    assert names.index("POD_NAME") < names.index("ENHYDRA_ADVERTISED_URL")


def test_kafka_credentials_come_from_optional_secrets() -> None:
    """Security settings from one Secret, credential files from another; neither is required."""
    (sts,) = load_yaml("k8s/statefulset.yaml")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (source,) = container["envFrom"]
    assert source["secretRef"] == {"name": f"{SLUG}-kafka", "optional": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = volumes["kafka-files"]["secret"]
    assert files["secretName"] == f"{SLUG}-kafka-files" and files["optional"] is True
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["kafka-files"]["mountPath"] == "/var/run/secrets/kafka"
    assert mounts["kafka-files"]["readOnly"] is True
    # No secret value is written into the manifests themselves.
    env = env_of(container)
    assert not {"ENHYDRA_SASL_PASSWORD", "ENHYDRA_SSL_KEY_PASSWORD"} & set(env)


def test_services_route_to_the_pods() -> None:
    (headless,) = load_yaml("k8s/service-headless.yaml")
    (service,) = load_yaml("k8s/service.yaml")
    (sts,) = load_yaml("k8s/statefulset.yaml")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["metadata"]["name"] == sts["spec"]["serviceName"]
    assert service["spec"]["type"] == "ClusterIP"
    for svc in (headless, service):
        assert svc["spec"]["selector"].items() <= labels.items()
        assert svc["spec"]["ports"][0]["targetPort"] == "http"


# --- CI -----------------------------------------------------------------------------------------


def test_ci_workflow_matches_the_github_schema() -> None:
    result = check_jsonschema("vendor.github-workflows", ".github/workflows/ci.yml")
    assert result.returncode == 0, result.stdout + result.stderr
