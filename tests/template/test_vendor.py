"""The runtime a generated project carries: vendor/ holds the running Enhydra's wheel, made from
the source tree or put back together from an installed wheel, and `enhydra upgrade-runtime`
replaces it and points pyproject.toml at the new file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from enhydra.scaffold import runtime_wheel, wheel_digest
from tests.template.support import enhydra, enhydra_new

pytestmark = pytest.mark.template


@pytest.fixture
def project(tmp_path: Path) -> Path:
    result = enhydra_new(tmp_path / "out", "project_name=Crates")
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "out" / "crates"


def vendored(project: Path) -> list[Path]:
    return sorted((project / "vendor").glob("*.whl"))


def test_upgrade_runtime_with_the_same_runtime_changes_nothing(project: Path) -> None:
    (wheel,) = vendored(project)
    before = (wheel.read_bytes(), (project / "pyproject.toml").read_text())
    result = enhydra(project, "upgrade-runtime")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("nothing to do")
    assert (wheel.read_bytes(), (project / "pyproject.toml").read_text()) == before


def test_upgrade_runtime_replaces_another_version_and_repoints_pyproject(project: Path) -> None:
    (current,) = vendored(project)
    old = current.with_name("enhydra-0.0.9-py3-none-any.whl")
    current.rename(old)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(current.name, old.name))

    result = enhydra(project / "crates", "upgrade-runtime")  # from a folder inside the project
    assert result.returncode == 0, result.stderr
    version = current.name.split("-")[1]
    assert result.stdout.strip() == f"vendor/{current.name}: Enhydra 0.0.9 -> {version}"
    assert vendored(project) == [current]
    assert f'"enhydra @ {{root:uri}}/vendor/{current.name}"' in pyproject.read_text()
    assert old.name not in pyproject.read_text()


def test_upgrade_runtime_refuses_a_project_on_an_index(tmp_path: Path) -> None:
    made = enhydra_new(tmp_path / "out", "project_name=Bins", "enhydra_source=index")
    assert made.returncode == 0, made.stderr
    project = tmp_path / "out" / "bins"
    result = enhydra(project, "upgrade-runtime")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert "has 'enhydra>=0.1,<0.2' from a package index, not a vendored wheel" in line
    assert not (project / "vendor").exists()


def test_upgrade_runtime_outside_a_project(tmp_path: Path) -> None:
    result = enhydra(tmp_path, "upgrade-runtime")
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: no pyproject.toml in {tmp_path} or above")


def test_a_wheel_install_gives_back_the_same_wheel(tmp_path: Path) -> None:
    """Enhydra installed from its wheel (as in a generated project) vendors that very wheel."""
    original = runtime_wheel(tmp_path / "built")
    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run([*install, "--target", str(site), str(original)], check=True, timeout=120)
    code = (
        "import sys; from pathlib import Path; from enhydra import scaffold; "
        "assert scaffold.source_checkout() is None, scaffold.__file__; "
        "print(scaffold.runtime_wheel(Path(sys.argv[1])))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "again")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rebuilt = Path(result.stdout.strip())
    assert rebuilt.name == original.name
    assert wheel_digest(rebuilt) == wheel_digest(original)


def test_a_changed_installation_is_not_vendored(tmp_path: Path) -> None:
    original = runtime_wheel(tmp_path / "built")
    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run([*install, "--target", str(site), str(original)], check=True, timeout=120)
    (site / "enhydra" / "scaffold.py").write_text(
        (site / "enhydra" / "scaffold.py").read_text() + "\n# edited\n"
    )
    code = "import sys; from pathlib import Path; from enhydra import scaffold; "
    code += "scaffold.runtime_wheel(Path(sys.argv[1]))"
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "again")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "scaffold.py was changed after enhydra was installed" in result.stderr
