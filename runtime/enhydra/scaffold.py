"""Where the cookiecutter templates live: inside the wheel, or in the source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def scaffold_root() -> Path:
    """The folder holding cookiecutter.json, template/ and generators/."""
    bundled = _PACKAGE / "_scaffold"
    if (bundled / "template").is_dir():
        return bundled
    checkout = _PACKAGE.parent.parent
    if (checkout / "template" / "cookiecutter.json").is_file():
        return checkout
    raise FileNotFoundError("enhydra's templates are missing from this installation")


def service_template() -> Path:
    return scaffold_root() / "template"
