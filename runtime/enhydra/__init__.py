"""Enhydra: event-sourced microservices on Kafka, in Python.

Write `decide` and `apply`, wrap them in an `Aggregate`, hand it to a `Service`.
"""

from enhydra.aggregate import Aggregate, InvalidCommand, Rejection, replay
from enhydra.service import Service
from enhydra.settings import Settings, SettingsError

__all__ = [
    "Aggregate",
    "InvalidCommand",
    "Rejection",
    "Service",
    "Settings",
    "SettingsError",
    "replay",
]
