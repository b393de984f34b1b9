"""The shop's build and deploy files: linted, schema-checked, and held to what reactions need.

Each service's Dockerfile and Kubernetes manifests are the ones `enhydra new` made for it
(their own properties are tested in every generated service and in examples/ledger); what is
checked here is the whole: every service in compose and in the shop's kustomization, each
under its own app id, and all with the same partition count, which a reaction requires of its
upstream's events topic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.examples_shop.conftest import SHOP

SERVICES = ("orders", "stock", "payments")
STATE_DIR = "/var/lib/enhydra"


def tool(name: str) -> str:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(name, path=path)
    if found is None:
        pytest.fail(f"{name} is not installed; run: make setup")
    return found


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("service", SERVICES)
def test_each_image_is_its_own_service(service: str) -> None:
    folder = SHOP / service
    lint = [tool("hadolint"), "--config", ".hadolint.yaml", "Dockerfile"]
    done = subprocess.run(lint, cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (folder / "Dockerfile").read_text()
    assert f"COPY {service}/ {service}/" in text
    assert f'CMD ["python", "-m", "{service}"]' in text
    assert f"!{service}/" in (folder / ".dockerignore").read_text().splitlines()


def test_compose_matches_the_compose_spec_schema() -> None:
    check = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec"]
    done = subprocess.run(
        [*check, "docker-compose.yml"], cwd=SHOP, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_runs_kafka_and_each_service_under_its_name() -> None:
    (compose,) = load_yaml(SHOP / "docker-compose.yml")
    services = compose["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    ports, volumes = set(), set()
    for name in SERVICES:
        spec = services[name]
        env = spec["environment"]
        assert env["ENHYDRA_APP_ID"] == name
        assert env["ENHYDRA_BOOTSTRAP_SERVERS"] == "kafka:9092"
        assert env["ENHYDRA_PARTITIONS"] == "4"
        assert spec["build"]["context"] == f"./{name}"
        assert (SHOP / name / "Dockerfile").is_file()
        assert spec["depends_on"]["kafka"]["condition"] == "service_healthy"
        source, target = spec["volumes"][0].split(":")
        assert target == STATE_DIR and source in compose["volumes"]
        volumes.add(source)
        ports.add(spec["ports"][0].split(":")[0])
    assert len(ports) == len(volumes) == len(SERVICES)


def test_kubernetes_deploys_every_service_with_one_partition_count() -> None:
    (kustomization,) = load_yaml(SHOP / "k8s" / "kustomization.yaml")
    assert kustomization["resources"] == [f"../{name}/k8s" for name in SERVICES]
    partitions = set()
    for name in SERVICES:
        (own,) = load_yaml(SHOP / name / "k8s" / "kustomization.yaml")
        listed = sorted(own["resources"])
        assert listed == sorted(
            p.name for p in (SHOP / name / "k8s").glob("*.yaml") if p.name != "kustomization.yaml"
        )
        (sts,) = load_yaml(SHOP / name / "k8s" / "statefulset.yaml")
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        env = env_of(container)
        assert env["ENHYDRA_APP_ID"] == name
        assert container["image"].startswith(f"{name}:")
        partitions.add(env["ENHYDRA_PARTITIONS"])
    assert partitions == {"4"}


def test_the_unpaid_deadline_is_set_where_orders_runs() -> None:
    """The checkout saga's deadline is a setting; both deployments spell out its default."""
    (compose,) = load_yaml(SHOP / "docker-compose.yml")
    (sts,) = load_yaml(SHOP / "orders" / "k8s" / "statefulset.yaml")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert compose["services"]["orders"]["environment"]["SHOP_UNPAID_AFTER_S"] == "900"
    assert env_of(container)["SHOP_UNPAID_AFTER_S"] == "900"
