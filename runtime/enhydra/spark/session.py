"""A SparkSession for laptops and tests: small shuffles, no UI, no console bars, UTC.

On a cluster, `spark-submit` builds the session and these settings do not apply; the job only
reads what it was given.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from enhydra.logs import get_logger

log = get_logger("enhydra.spark")

LAPTOP_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "1g",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    "spark.python.worker.reuse": "true",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

# A cluster retries a failed task (spark.task.maxFailures, default 4); local mode does not
# unless the master says so. One transient read error from the broker should not fail a job.
LOCAL_TASK_ATTEMPTS = 4
_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)\])?$")


def with_task_retries(master: str, attempts: int = LOCAL_TASK_ATTEMPTS) -> str:
    """`local[N]` -> `local[N,attempts]`; other masters (and explicit local[N,F]) unchanged."""
    match = _LOCAL_MASTER.match(master.strip())
    if match is None:
        return master
    return f"local[{match.group(1) or 1},{attempts}]"


def local_session(
    app_name: str = "enhydra",
    *,
    master: str = "local[*]",
    kafka: bool = True,
    pythonpath: Iterable[str | Path] = (),
    conf: Mapping[str, Any] | None = None,
):
    """Create (or return) the local SparkSession with the laptop settings.

    `kafka` puts Spark's own Kafka connector on the classpath when its jars can be had (fetched
    once with Maven); without them `read_events` uses the Python data source. `pythonpath`
    lets Python workers import the service package the job runs (they do not share sys.path).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    extra = [str(Path(p).resolve()) for p in pythonpath]
    if extra:
        current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*extra, *current]))
    builder = SparkSession.builder.master(with_task_retries(master)).appName(app_name)
    for key, value in {**LAPTOP_CONF, **(conf or {})}.items():
        builder = builder.config(key, str(value))
    if kafka:
        jars = _kafka_jars()
        if jars:
            builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # connection chatter at INFO
    return spark


def _kafka_jars() -> list[Path]:
    from enhydra.spark.jars import SparkJarsError, cached_kafka_jars, kafka_jars

    found = cached_kafka_jars()
    if found is not None:
        return found
    try:
        return kafka_jars(quiet=True)
    except SparkJarsError as exc:
        log.warning("spark kafka connector unavailable; using the python source", error=str(exc))
        return []
