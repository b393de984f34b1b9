"""The service project around the current folder: what a command defaults to inside it.

A project made by `enhydra new` holds its service at `<package>.service:service`. Inside it
(any folder below its pyproject.toml) a command without TARGET, --app or --url takes them from
that service, read like `enhydra run` reads it (the code's values, then ENHYDRA_*), so
`enhydra query books a1` asks the port the project's service listens on. A flag or an ENHYDRA_*
variable given to the command still wins: click hands the fallback only what neither set.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from enhydra.cli.generate import GenerateError, Project, find_project

if TYPE_CHECKING:
    from enhydra.service import Service


def here() -> Project | None:
    """The project around the current folder, or None outside one."""
    try:
        return find_project(Path.cwd())
    except GenerateError:
        return None


def require_project(command: str) -> Project:
    """The project around the current folder, or one line saying to name the service."""
    try:
        return find_project(Path.cwd())
    except GenerateError as exc:
        raise click.ClickException(
            f"{exc.message}; or name the service: enhydra {command} MODULE:ATTR"
        ) from None


def target_of(project: Project) -> str:
    """The project's MODULE:ATTR, importable from any folder inside the project."""
    if str(project.root) not in sys.path:
        sys.path.insert(0, str(project.root))
    return f"{project.package}.service:service"


def project_target(command: str) -> str:
    return target_of(require_project(command))


@functools.cache
def _service(project: Project) -> Service:
    from enhydra.cli.common import load_service

    return load_service(target_of(project))


def project_service() -> Service | None:
    """The project's service (imported once), or None outside a project."""
    project = here()
    return None if project is None else _service(project)


def default_app_id() -> str | None:
    service = project_service()
    return None if service is None else service.settings.app_id


def default_query_url() -> str | None:
    """The URL the project's service answers on (its advertised URL: web host and port)."""
    service = project_service()
    return None if service is None else service.settings.advertised_url
