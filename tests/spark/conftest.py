"""One local SparkSession for the whole test session (a JVM start costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """local[2] with the laptop settings and Spark's Kafka connector on the classpath."""
    from enhydra.spark.session import local_session

    session = local_session("enhydra-tests", master="local[2]")
    try:
        yield session
    finally:
        session.stop()
