"""Enhydra: event-sourced microservices on Kafka, in Python.

Write `decide` and `apply`, wrap them in an `Aggregate`, hand it to a `Service`.

`from enhydra import Aggregate` loads the pure programming model only: a Spark executor or a
test imports a service's domain module without faust, aiokafka, rocksdict or pyarrow. The
runtime (`Service`, `Settings`) is imported the first time it is touched (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from enhydra.aggregate import Aggregate, InvalidCommand, Rejection, replay

if TYPE_CHECKING:
    from enhydra.service import Service
    from enhydra.settings import Settings, SettingsError

_LAZY = {
    "Service": "enhydra.service",
    "Settings": "enhydra.settings",
    "SettingsError": "enhydra.settings",
}

__all__ = [
    "Aggregate",
    "InvalidCommand",
    "Rejection",
    "Service",
    "Settings",
    "SettingsError",
    "replay",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'enhydra' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once; later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
