"""`enhydra new`: generate a service from the template (a thin layer over cookiecutter)."""

from __future__ import annotations

import logging
from pathlib import Path

import click
from cookiecutter.exceptions import CookiecutterException, FailedHookException
from cookiecutter.main import cookiecutter

from enhydra.scaffold import service_template


def parse_context(pairs: tuple[str, ...]) -> dict[str, str]:
    """Turn `key=value` arguments into cookiecutter's extra context."""
    context: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected key=value, e.g. project_name='Billing'")
        context[key] = value
    return context


@click.command()
@click.option("--no-input", is_flag=True, help="Use defaults and KEY=VALUE, ask nothing.")
@click.option(
    "--output-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Where the project folder goes.",
)
@click.option("--overwrite", is_flag=True, help="Overwrite an existing project folder.")
@click.argument("context", nargs=-1)
def new(no_input: bool, output_dir: Path, overwrite: bool, context: tuple[str, ...]) -> None:
    """Generate a new service. CONTEXT is KEY=VALUE pairs, e.g. project_name='Billing'."""
    extra = parse_context(context)
    # cookiecutter logs a hook's refusal with a traceback; our message below says it plainly.
    logging.getLogger("cookiecutter").setLevel(logging.CRITICAL)
    try:
        project = cookiecutter(
            str(service_template()),
            no_input=no_input,
            extra_context=extra,
            output_dir=str(output_dir),
            overwrite_if_exists=overwrite,
        )
    except FailedHookException as exc:
        raise click.ClickException(f"the template refused the input: {exc}") from exc
    except CookiecutterException as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"created {project}")
