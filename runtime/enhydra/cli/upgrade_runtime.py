"""`enhydra upgrade-runtime`: put this Enhydra's wheel into a project's vendor/ folder."""

from __future__ import annotations

from pathlib import Path

import click

from enhydra.cli.generate import find_project
from enhydra.scaffold import ScaffoldError, vendor_runtime


@click.command("upgrade-runtime")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=Path("."),
    help="The service project [default: the current folder or one above it].",
)
def upgrade_runtime(project: Path) -> None:
    """Vendor the Enhydra that runs this command into the project, replacing its runtime.

    The wheel goes into vendor/ (the previous one is removed) and pyproject.toml is pointed at
    it; the Dockerfile and CI install whatever vendor/ holds. Run it with the Enhydra you want
    the project on; `make test` then reinstalls, and vendor/ and pyproject.toml are the change
    to commit. Projects that install Enhydra from a package index upgrade with pip instead.

    \b
    Example:
      ~/enhydra-next/.venv/bin/enhydra upgrade-runtime --project ~/src/billing
    """
    found = find_project(project.resolve())
    try:
        done = vendor_runtime(found.root)
    except ScaffoldError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(done.describe(found.root))
