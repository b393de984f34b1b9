"""A generated project stands on its own: committed with git, cloned where this repository is out
of sight, `make test` installs it and passes (and `make lint`, as CI runs them), `make demo`
runs it, and its image builds and runs.

The clone's environment cannot reach this checkout: no PYTHONPATH, no PATH entry into this
repository, a fresh virtualenv made by the project's Makefile, no PIP_FIND_LINKS, and pip's
index limited to PyPI, where there is no Enhydra, so the runtime can only come from the
clone's vendor/. The Kafka jars' cache (~/.cache/enhydra) and pip's download cache are shared,
as they would be on a developer's machine; the session's broker is reused through
ENHYDRA_TEST_BOOTSTRAP / BOOTSTRAP. The image is built with `enhydra image` (podman, a host-made
wheelhouse, no network inside the build) from the clone's own Dockerfile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from enhydra.devtools import image
from enhydra.testing.processes import free_port, http_get
from tests.template.support import REPO, enhydra_new, outcomes

pytestmark = [
    pytest.mark.template,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(1500),
]

ANSWERS = (
    "project_name=Depot",
    "aggregate=parcels",
    "key_field=parcel",
    "command_types=register, load, deliver",
)
# Prints where pip installed Enhydra from (PEP 610's direct_url.json).
DIRECT_URL = (
    "import importlib.metadata as m; print(m.distribution('enhydra').read_text('direct_url.json'))"
)
# pip settings of this machine that do not point at packages (certificates, timeouts) stay.
KEPT_PIP = {"PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK"}


def isolated_env(bootstrap: str) -> dict[str, str]:
    """The environment of a machine that has never seen this repository."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "ENHYDRA_", "PYTEST_", "COOKIECUTTER"))
        and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env.update({k: os.environ[k] for k in KEPT_PIP if k in os.environ})
    env["PATH"] = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if p and not Path(p).is_relative_to(REPO)
    )
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf with extra indexes or find-links
    env["PIP_INDEX_URL"] = "https://pypi.org/simple"
    env["ENHYDRA_TEST_BOOTSTRAP"] = bootstrap
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    started = time.monotonic()
    result = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    print(f"{' '.join(cmd)}: exit {result.returncode} in {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    return result.stdout


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    identity = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]
    return run(["git", *identity, *args], cwd, env)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project as `enhydra new` made it, committed, and cloned into another folder."""
    made = tmp_path_factory.mktemp("made")
    result = enhydra_new(made, *ANSWERS)
    assert result.returncode == 0, result.stdout + result.stderr
    project = made / "depot"
    git(project, "init", "--quiet", "--initial-branch=main")
    git(project, "add", "--all")
    git(project, "commit", "--quiet", "--message", "enhydra new")
    tracked = git(project, "ls-files").split()
    assert any(name.startswith("vendor/enhydra-") for name in tracked), tracked
    target = tmp_path_factory.mktemp("elsewhere") / "depot"
    git(made, "clone", "--quiet", str(project), str(target))
    return target


def test_a_clone_installs_and_passes_make_test_without_this_repository(
    clone: Path, kafka_bootstrap: str
) -> None:
    env = isolated_env(kafka_bootstrap)
    report = clone / ".venv-report.xml"
    run(["make", "test", f"PYTEST_ARGS=--junitxml={report}"], clone, env, timeout=900)
    results = outcomes(report)
    report.unlink()
    run(["make", "lint"], clone, env)  # what CI runs first
    assert set(results.values()) == {"passed"}, results
    assert len(results) >= 25, results
    for test in (
        "tests.test_integration::test_final_state_matches_the_model",
        "tests.test_backfill::test_backfill_rebuilds_the_service_state",
        "tests.test_topology::test_changes_since_the_baseline_are_compatible",
        "tests.test_domain::test_every_command_type_is_applied_in_order",
    ):
        assert results[test] == "passed", test

    # The runtime is the clone's vendored wheel, installed into the clone's own .venv.
    python = clone / ".venv" / "bin" / "python"
    where = run([str(python), "-c", "import enhydra; print(enhydra.__file__)"], clone, env)
    assert Path(where.strip()).is_relative_to(clone / ".venv")
    url = json.loads(run([str(python), "-c", DIRECT_URL], clone, env))["url"]
    assert url.startswith(f"file://{clone}/vendor/enhydra-"), url
    # An Enhydra installed from that wheel vendors the very same wheel back.
    again = run([str(clone / ".venv" / "bin" / "enhydra"), "upgrade-runtime"], clone, env)
    assert again.strip().endswith("nothing to do"), again

    # `make demo`: the service, `enhydra send`, `enhydra query`.
    port = free_port()
    demo = run(
        ["make", "demo", f"BOOTSTRAP={kafka_bootstrap}", f"WEB_PORT={port}"], clone, env, 300
    )
    assert "sent 9 records to depot-commands, keyed by parcel" in demo, demo
    assert '"note": "deliver #2"' in demo and '"version": 3' in demo, demo

    # Tests and demo leave nothing git would pick up.
    assert git(clone, "status", "--porcelain") == ""


@pytest.fixture(scope="module")
def depot_image(clone: Path) -> image.Built:
    image.prepare()
    return image.build(clone, tag="localhost/depot:clone-test")


@pytest.mark.containers
def test_the_clone_builds_an_image_that_runs_its_vendored_runtime(
    clone: Path, depot_image: image.Built, kafka_bootstrap: str, app_id: str
) -> None:
    origin = image.podman(
        "run", "--rm", "--network", "none", "--entrypoint", "python", depot_image.tag,
        "-c", DIRECT_URL,
    ).stdout  # fmt: skip
    assert json.loads(origin)["url"].startswith("file:///src/vendor/enhydra-"), origin

    name = f"depot-{uuid.uuid4().hex[:6]}"
    container = image.Container(name, name, "a", free_port(), f"{name}-state", depot_image.tag)
    env = image.container_env(
        bootstrap=kafka_bootstrap,
        instance_id=name,
        zone="a",
        port=container.port,
        app_id=app_id,
        extra={"ENHYDRA_PARTITIONS": "4"},
    )
    try:
        image.start_container(
            depot_image.tag, name=name, group=name, volume=container.volume, env=env
        )
        print(f"{name} ready in {image.wait_ready(container):.1f}s")
        send = [
            sys.executable,
            "-m",
            "enhydra.cli.main",
            "send",
            f"{app_id}-commands",
            "--bootstrap",
            kafka_bootstrap,
            "--key-field",
            "parcel",
            "demo/commands.jsonl",
        ]
        run(send, clone, dict(os.environ))
        deadline = time.monotonic() + 60
        while True:
            status, body = http_get(f"{container.url}/v1/stores/parcels/keys/parcel-3")
            if (status == 200 and body.get("version") == 3) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert (status, body) == (200, {"name": "demo 3", "note": "deliver #2", "version": 3})
        stopped = image.stop(name)
        assert stopped.exit_code == 0, image.logs(name, tail=20)
    finally:
        image.remove([name], volumes=[container.volume])
