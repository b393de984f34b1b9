"""`enhydra run MODULE:ATTR`: run a worker of a service defined in user code."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from enhydra.service import Service
from enhydra.settings import SettingsError


def load_service(target: str) -> Service:
    """Import `package.module:attribute` and check that it is a Service."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(f"{target!r}: expected MODULE:ATTR, e.g. ledger.service:service")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from exc
    service = getattr(module, attr, None)
    if not isinstance(service, Service):
        found = type(service).__name__ if service is not None else "nothing"
        raise click.BadParameter(f"{target!r} is {found}, not an enhydra.Service")
    return service


@click.command()
@click.argument("target")
def run(target: str) -> None:
    """Run a worker of TARGET (MODULE:ATTR) until SIGTERM or SIGINT."""
    service = load_service(target)
    try:
        service.settings  # noqa: B018 - validate before anything starts
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc
    service.run()
