"""SparkSessions for the backfill: laptops and tests (small shuffles, no UI, UTC) and clusters.

Under `spark-submit` the session already exists and none of this applies; `enhydra backfill
--master spark://...|k8s://...|yarn` starts a cluster session itself (`cluster_session`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from enhydra.kafka.spark_options import REDACTION_REGEX
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
    # Kafka credentials travel as data source options: keep them out of plans and the UI.
    "spark.sql.redaction.options.regex": REDACTION_REGEX,
}

# On a cluster the cluster's defaults apply; only what the job's output relies on is set.
CLUSTER_CONF: dict[str, str] = {
    "spark.ui.showConsoleProgress": "false",  # the job prints its own progress
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    "spark.sql.redaction.options.regex": REDACTION_REGEX,  # Kafka credentials in options
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
    jvm_log: Path | None = None,
):
    """Create (or return) the local SparkSession with the laptop settings.

    `kafka` puts Spark's own Kafka connector on the classpath when its jars can be had (fetched
    once with Maven); without them `read_events` uses the Python data source. `pythonpath`
    lets Python workers import the service package the job runs (they do not share sys.path).
    `jvm_log` sends the JVM's own output (log4j, launcher warnings) to a file instead of the
    terminal.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    extra = [str(Path(p).resolve()) for p in pythonpath]
    if extra:
        current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*extra, *current]))
    settings = {**LAPTOP_CONF, **(conf or {})}
    return _session(app_name, with_task_retries(master), settings, kafka=kafka, jvm_log=jvm_log)


def cluster_session(
    app_name: str,
    *,
    master: str,
    kafka: bool = True,
    conf: Mapping[str, Any] | None = None,
    jvm_log: Path | None = None,
):
    """A SparkSession on a cluster master (spark://, k8s://, yarn), started from this process.

    Unlike `local_session` it neither pins the driver to 127.0.0.1 nor points executors at
    this interpreter: they run the cluster's Python (PYSPARK_PYTHON, or the
    `spark.pyspark.python` setting, as with spark-submit), which needs pyspark, pyarrow and
    orjson only; the job ships its own code (ship.py). The Kafka connector's jars, when
    cached here, travel with the job (`spark.jars`).
    """
    settings = {**CLUSTER_CONF, **(conf or {})}
    if settings.get("spark.pyspark.python"):
        os.environ["PYSPARK_PYTHON"] = str(settings["spark.pyspark.python"])
    return _session(app_name, master, settings, kafka=kafka, jvm_log=jvm_log)


def is_local(master: str) -> bool:
    return master.strip().startswith("local")


def _session(
    app_name: str, master: str, settings: Mapping[str, Any], *, kafka: bool, jvm_log: Path | None
):
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in settings.items():
        conf.set(key, str(value))
    if kafka and not conf.contains("spark.jars"):
        jars = _kafka_jars()
        if jars:
            conf.set("spark.jars", ",".join(str(j) for j in jars))
    # pyspark keeps its first gateway JVM for every later context and ignores one passed in,
    # so a new one is launched only when there is none (each extra one stayed alive, idle).
    if SparkContext._gateway is None and jvm_log is not None:
        from pyspark.java_gateway import launch_gateway

        jvm_log.parent.mkdir(parents=True, exist_ok=True)
        with open(jvm_log, "ab") as out:  # the JVM keeps its own copy of the descriptor
            gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})
        SparkContext(conf=conf, gateway=gateway)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
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
