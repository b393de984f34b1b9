"""A generated project's integration tests build their commands from the declared command
types (tests/samples.py): a field the user adds to a command needs no edit in them, and a field
type they cannot sample stops them at once, naming the function to edit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.template.support import clean_env, enhydra_new, outcomes, run_pytest

pytestmark = pytest.mark.template

# The user's edit: required fields on both command types, one of them constrained.
BORROW = 'class Borrow(msgspec.Struct, tag="borrow"):\n    book: BookId\n'
GIVE_BACK = 'class GiveBack(msgspec.Struct, tag="give_back"):\n    book: BookId\n'
ADDED = {
    BORROW: BORROW + "    member: str\n    days: Annotated[int, msgspec.Meta(ge=7, le=28)]\n",
    GIVE_BACK: GIVE_BACK + '    condition: Literal["good", "damaged"]\n',
}


def edit_domain(domain: Path, changes: dict[str, str]) -> None:
    text = domain.read_text()
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace(
        "from typing import Annotated, Any", "from typing import Annotated, Any, Literal"
    )
    domain.write_text(text)


def sample(project: Path, kind: str) -> subprocess.CompletedProcess[str]:
    """tests/samples.py's command for one type, as the project's tests import it."""
    code = f"from samples import command; print(command({kind!r}, 'b1', 'c1'))"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=project / "tests",
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(project.parent, PYTHONPATH=str(project)),
        check=False,
    )


@pytest.fixture
def library(tmp_path: Path) -> Path:
    made = enhydra_new(
        tmp_path / "out",
        "project_name=Library",
        "aggregate=books",
        "key_field=book",
        "command_types=borrow, give_back",
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return tmp_path / "out" / "library"


@pytest.mark.integration
@pytest.mark.slow
def test_a_required_field_added_to_commands_keeps_the_integration_test_green(
    library: Path, kafka_bootstrap: str
) -> None:
    edit_domain(library / "library" / "domain.py", ADDED)
    borrow = sample(library, "borrow")
    assert borrow.returncode == 0, borrow.stderr
    assert "'member': 'x', 'days': 7" in borrow.stdout
    assert "'condition': 'damaged'" in sample(library, "give_back").stdout

    report = library.parent / "report.xml"
    run = run_pytest(library, report, "tests/test_integration.py", bootstrap=kafka_bootstrap)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert set(outcomes(report).values()) == {"passed"}, outcomes(report)


def test_a_field_type_without_a_sample_names_the_function_to_edit(library: Path) -> None:
    edit_domain(library / "library" / "domain.py", {GIVE_BACK: GIVE_BACK + "    receipt: bytes\n"})
    said = sample(library, "give_back")
    assert said.returncode == 1
    assert said.stderr.strip().splitlines()[-1] == (
        "TypeError: tests/samples.py: sample_value() cannot make a BytesType for "
        "GiveBack.receipt: teach it this type, or give the field a default"
    )
