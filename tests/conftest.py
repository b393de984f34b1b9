"""The fast lane's guard: `make test-fast` never starts a broker, Spark, podman or a service.

`make test-fast` sets ENHYDRA_TEST_LANE=fast and deselects the tests marked integration, slow,
template, spark and containers. A marker that lies would quietly make the lane slow again (a
Spark JVM is a minute on a loaded machine), so in that lane:
- a selected test that asks for a fixture which starts one of them fails before its set-up;
- starting the real `java` (a broker, Spark), `spark-submit`, `podman` or `docker`, from the test
  or from any process it starts, or a service process, fails the test with a line naming the
  marker to add. `java` and the container tools are shims on PATH and JAVA_HOME for that lane,
  so a grandchild (a script that starts Spark) is caught as well.
The lane also runs property tests with a quarter of their examples (CI runs them all).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

LANE = os.environ.get("ENHYDRA_TEST_LANE", "")

# Fixtures that start something the fast lane must not: what they start, and the marker to add.
HEAVY_FIXTURES = {
    "kafka_bootstrap": ("a Kafka broker", "integration"),
    "_local_broker": ("a Kafka broker", "integration"),
    "secured_kafka": ("a Kafka broker", "integration"),
    "service_factory": ("a broker and service processes", "integration"),
    "cluster": ("a broker and three ledger instances", "integration"),
    "spark": ("a local Spark", "spark"),
}
SHIMMED = {"java": "spark or integration", "podman": "containers", "docker": "containers"}
REFUSED = {"spark-submit": "spark", "spark-class": "spark", **SHIMMED}
EXIT_REFUSED = 97
FAST_EXAMPLES_SHARE, FAST_MIN_EXAMPLES = 4, 10  # hypothesis in the fast lane: a quarter
REFUSED_LOG = "refused.log"  # what the shims refused, read after each test
_SHIMS = pytest.StashKey[Path]()


class FastLaneViolation(RuntimeError):
    """A test in the fast lane tried to start something heavy; its marker is missing."""


def refusal(what: str, markers: str) -> str:
    """One line: what was started, and the marker(s) that keep the test out of the lane."""
    marks = " or ".join(f"@pytest.mark.{name}" for name in markers.split(" or "))
    return f"test-fast does not start {what}: mark this test {marks} (it still runs in `make test`)"


def _install_shims(folder: Path) -> None:
    """`java`, `podman` and `docker` that refuse to run, first on PATH and as JAVA_HOME."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name, marker in SHIMMED.items():
        shim = bin_dir / name
        line = refusal(f"`{name}` (from a process this test started)", marker)
        shim.write_text(
            f"#!/bin/sh\necho '{line}' | tee -a '{folder / REFUSED_LOG}' >&2\nexit {EXIT_REFUSED}\n"
        )
        shim.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["JAVA_HOME"] = str(folder)


def _refused_program(args, kwargs, shims: Path) -> str | None:
    """The name of the refused program this Popen would start, or None."""
    first = args if isinstance(args, str | bytes | os.PathLike) else (args[0] if args else "")
    if kwargs.get("shell") and isinstance(first, str):
        first = first.split()[0] if first.split() else ""
    program = os.fsdecode(kwargs.get("executable") or first)
    env = kwargs.get("env") or os.environ
    found = shutil.which(program, path=env.get("PATH")) if os.sep not in program else program
    resolved = Path(os.path.realpath(found or program))
    if resolved.is_relative_to(shims) or resolved.name in ("spark-submit", "spark-class"):
        return resolved.name
    return None


def _guard_processes(shims: Path) -> None:
    original_init = subprocess.Popen.__init__

    def guarded_init(self, args, *rest, **kwargs):
        name = _refused_program(args, kwargs, shims)
        if name is not None:
            raise FastLaneViolation(refusal(f"`{name}`", REFUSED[name]))
        original_init(self, args, *rest, **kwargs)

    def refused_start(self, *args, **kwargs):
        raise FastLaneViolation(refusal(f"service process ({self.target})", "integration"))

    from enhydra.testing.processes import ServiceProcess

    subprocess.Popen.__init__ = guarded_init
    ServiceProcess.start = refused_start


def pytest_configure(config: pytest.Config) -> None:
    if LANE != "fast":
        return
    shims = Path(tempfile.mkdtemp(prefix="enhydra-fast-lane-")).resolve()
    config.stash[_SHIMS] = shims
    _install_shims(shims)
    _guard_processes(shims)


def pytest_unconfigure(config: pytest.Config) -> None:
    shims = config.stash.get(_SHIMS, None)
    if shims is not None:
        shutil.rmtree(shims, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A shim refused a grandchild (its own error may be vague): the test fails with that line."""
    shims = item.config.stash.get(_SHIMS, None)
    if shims is None:
        return (yield)
    log = shims / REFUSED_LOG
    log.unlink(missing_ok=True)
    try:
        return (yield)
    finally:
        if log.exists():
            pytest.fail(log.read_text().splitlines()[0], pytrace=False)


def _fewer_examples(items: list[pytest.Item]) -> None:
    """Property tests draw a quarter of their examples in the fast lane; `make test` keeps all.

    Hypothesis reads a test's settings when it runs, from the attribute @settings sets; where
    a future Hypothesis stores them elsewhere this does nothing and the lane is only slower.
    """
    from hypothesis import settings

    done = set()
    for item in items:
        test = getattr(item, "obj", None)
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if not isinstance(current, settings) or id(test) in done:
            continue
        done.add(id(test))
        fewer = max(FAST_MIN_EXAMPLES, current.max_examples // FAST_EXAMPLES_SHARE)
        test._hypothesis_internal_use_settings = settings(current, max_examples=fewer)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if LANE == "fast":
        _fewer_examples(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A fast-lane test that asks for a heavy fixture fails before the fixture starts anything."""
    if LANE != "fast":
        return
    for name in getattr(item, "fixturenames", ()):
        if name in HEAVY_FIXTURES:
            what, marker = HEAVY_FIXTURES[name]
            pytest.fail(refusal(f"{what} (fixture `{name}`)", marker), pytrace=False)
