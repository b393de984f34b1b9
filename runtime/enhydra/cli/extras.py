"""The one line a development command prints when the `dev-tools` extra is not installed.

A production image installs Enhydra without it (no cookiecutter, no broker CA tooling), yet
`enhydra --help` there must still list and describe every command: so the commands that need
the extra import it only when they run, and say first which extra to install.
"""

from __future__ import annotations

import importlib
import sys

import click

EXTRA = "dev-tools"
# The import names of what the extra installs (pyproject.toml: [project.optional-dependencies]).
PROVIDES = ("cookiecutter", "cryptography", "jinja2")


def missing() -> list[str]:
    """The extra's packages this Python cannot import."""
    absent = []
    for name in PROVIDES:
        try:
            importlib.import_module(name)
        except ImportError:
            absent.append(name)
    return absent


def require_dev_tools(command: str) -> None:
    """Exit 2 with one line naming the extra when `enhydra COMMAND` cannot run here."""
    absent = missing()
    if absent:
        click.echo(
            f"Error: `enhydra {command}` is development tooling: pip install 'enhydra[{EXTRA}]' "
            f"(missing here: {', '.join(absent)})",
            err=True,
        )
        sys.exit(2)
