"""`enhydra new`: generate a service from the template (a thin layer over cookiecutter).

The answers are settled first (KEY=VALUE arguments, then cookiecutter's prompts), and checked
where cookiecutter would fail obscurely: an answer the template does not ask for, a choice it
does not offer, a project name that yields no folder name, a folder that already exists. The
template's own pre_gen hook checks the rest (names, ports, partitions) before anything is
written, and its post_gen hook vendors the runtime and writes the topology baseline.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from enhydra.cli.extras import require_dev_tools
from enhydra.scaffold import service_template


class NewError(click.ClickException):
    """A one-line refusal; exit 2 for answers the template does not take, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def parse_context(pairs: tuple[str, ...]) -> dict[str, str]:
    """Turn `key=value` arguments into cookiecutter's extra context."""
    context: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise NewError(f"{pair!r}: expected KEY=VALUE, e.g. project_name='Billing'", 2)
        context[key] = value
    return context


def template_questions(template: Path) -> dict[str, Any]:
    """The template's questions (cookiecutter.json without private and prompt entries)."""
    raw = json.loads((template / "cookiecutter.json").read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def check_answers(answers: dict[str, str], questions: dict[str, Any]) -> None:
    """Refuse an answer to a question the template does not ask, or a choice it does not offer."""
    for key, value in answers.items():
        if key not in questions:
            close = difflib.get_close_matches(key, list(questions), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise NewError(
                f"the template has no question {key!r}: {hint}it asks for " + ", ".join(questions),
                2,
            )
        choices = questions[key]
        if isinstance(choices, list) and value not in choices:
            raise NewError(f"{key}={value!r}: choose one of {', '.join(map(str, choices))}", 2)


@contextlib.contextmanager
def _importable(folder: Path) -> Iterator[None]:
    """The template's Jinja extension (enhydra_filters) importable, as cookiecutter does it."""
    sys.path.append(str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))


def settle(template: Path, extra: dict[str, str], no_input: bool) -> dict[str, Any]:
    """Every answer, from KEY=VALUE, the user's cookiecutter defaults and the prompts."""
    from cookiecutter.config import get_user_config
    from cookiecutter.generate import generate_context
    from cookiecutter.prompt import prompt_for_config

    with _importable(template):
        context = generate_context(
            context_file=str(template / "cookiecutter.json"),
            default_context=get_user_config()["default_context"],
            extra_context=extra,
        )
        questions = context["cookiecutter"]
        prompts = dict(questions.get("__prompts__", {}))  # prompt_for_config pops them
        # Asked after the others, and only when the answer they hang on needs them.
        later = {k: questions.pop(k) for k in ASKED_WHEN if k in questions}
        answers = prompt_for_config(context, no_input)
        for key, default in later.items():
            answers[key] = _ask_when(key, default, answers, prompts, no_input)
    return {k: v for k, v in answers.items() if not k.startswith("_")}


# question -> (the question it depends on, the answer that makes it asked)
ASKED_WHEN = {"enhydra_requirement": ("enhydra_source", "index")}


def _ask_when(
    key: str, default: Any, answers: dict[str, Any], prompts: dict[str, Any], no_input: bool
) -> Any:
    """The answer to a conditional question: asked when it matters, else its default."""
    from cookiecutter.prompt import read_user_variable

    on, value = ASKED_WHEN[key]
    if no_input or answers.get(on) != value:
        return default
    return read_user_variable(key, default, prompts, prefix="  ")


def target_folder(answers: dict[str, Any], output_dir: Path, overwrite: bool) -> Path:
    """The project folder the answers make, refused when it is unusable or already there."""
    slug = str(answers.get("project_slug", ""))
    if not slug or slug in (".", "..") or "/" in slug or "\\" in slug:
        name = answers.get("project_name", "")
        raise NewError(
            f"project_name {name!r} gives no folder name (project_slug {slug!r}): use letters "
            "or digits, e.g. project_name='Billing', or pass project_slug=billing"
        )
    folder = output_dir / slug
    if folder.exists() and not overwrite:
        raise NewError(
            f"{folder} already exists: choose another project_name or --output-dir, "
            "or pass --overwrite to write the template over it"
        )
    return folder


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
@click.argument("context", nargs=-1, metavar="[KEY=VALUE]...")
def new(no_input: bool, output_dir: Path, overwrite: bool, context: tuple[str, ...]) -> None:
    """Generate a new service: a folder with its code, tests, Makefile, Dockerfile and CI.

    KEY=VALUE pairs answer the template's questions (the rest are asked, or take their
    defaults with --no-input): project_name, aggregate, key_field, command_types, and
    enhydra_source=vendor (default: the running Enhydra's wheel is committed in vendor/)
    or index (your team's package index serves Enhydra; see enhydra_requirement).

    \b
    Examples:
      enhydra new
      enhydra new --no-input project_name=Billing aggregate=invoices key_field=invoice \\
        command_types='issue, pay, cancel'
    """
    require_dev_tools("new")
    from cookiecutter.exceptions import CookiecutterException, FailedHookException
    from cookiecutter.main import cookiecutter

    template = service_template()
    extra = parse_context(context)
    check_answers(extra, template_questions(template))
    answers = settle(template, extra, no_input)
    target_folder(answers, output_dir, overwrite)
    # cookiecutter logs a hook's refusal with a traceback; our message below says it plainly.
    logging.getLogger("cookiecutter").setLevel(logging.CRITICAL)
    try:
        project = cookiecutter(
            str(template),
            no_input=True,
            extra_context=answers,
            output_dir=str(output_dir),
            overwrite_if_exists=overwrite,
        )
    except FailedHookException as exc:
        raise NewError("nothing was generated: the template's checks above say why") from exc
    except CookiecutterException as exc:
        raise NewError(str(exc).removeprefix("Error: ")) from exc
    click.echo(f"created {project}")
    click.echo(f"next: cd {project} && make test   (make run starts it on a local Kafka broker)")
