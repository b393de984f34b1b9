"""The backfill on a Spark standalone cluster whose workers have a bare Python.

A master and two workers run as separate JVMs, started with pyspark's own `spark-class`, the
way an operator starts them. The executors' Python is a venv this test makes with pyspark,
pyarrow and orjson only: no enhydra, no service package, no faust, aiokafka or rocksdict.
`enhydra backfill --master spark://...` must ship everything else (ship.py). The job runs
twice, with Spark's Kafka connector and with the Python reader (whose aiokafka is shipped
too); both times every balance equals the ledger model and both workers ran fold tasks.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pyspark
import pytest

from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.snapshots import open_snapshot
from enhydra.sql.config import PASSWORD_FILE_VAR, URL_VAR, DatabaseSettings
from enhydra.testing.processes import free_port, http_get, produce_json, wait_for_committed
from enhydra.testing.sql import database, postgres
from enhydra.toolcache import cache_root, file_lock
from ledger.workload import generate, model
from tests.sql import accounts
from tests.sql.test_sql_projection import table

__all__ = ["database", "postgres"]

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(600),
]

LEDGER = Path(__file__).resolve().parents[2] / "examples" / "ledger"
WORKER_PACKAGES = (f"pyspark=={pyspark.__version__}", "pyarrow", "orjson")
NOT_ON_WORKERS = ("enhydra", "ledger", "faust", "aiokafka", "rocksdict", "structlog")
SQL_WORKER_PACKAGE = "psycopg[binary]>=3.2,<4"  # what a SQL backfill's executors need besides


def worker_python(extra: tuple[str, ...] = ()) -> Path:
    """A venv with only pyspark, pyarrow and orjson, and `extra` (made once, then reused from
    the cache)."""
    version = f"py{sys.version_info.major}.{sys.version_info.minor}-spark{pyspark.__version__}"
    if extra:
        version += "-" + "-".join(re.sub(r"[^a-z0-9]+", "", p.split("[")[0]) for p in extra)
    packages = (*WORKER_PACKAGES, *extra)
    home = cache_root() / f"spark-worker-python-{version}"
    python = home / "bin" / "python"
    with file_lock(cache_root() / f".spark-worker-python-{version}.lock"):
        if not (home / "complete").exists():
            # a venv made from this venv's interpreter gets the base Python, none of our packages
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", *packages],
                check=True,
                timeout=600,
            )
            (home / "complete").write_text("\n".join(packages) + "\n")
    return python


def assert_bare(python: Path) -> None:
    """The workers' Python really has none of the runtime, the service or their packages."""
    for module in NOT_ON_WORKERS:
        probe = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, env=clean_env()
        )
        assert probe.returncode != 0, f"{module} is importable on the workers"


def clean_env(**extra: str) -> dict[str, str]:
    """An environment that shows nothing of this project's virtualenv."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "JAVA_HOME", "LANG", "TMPDIR")}
    return {**keep, "PATH": path, "SPARK_LOCAL_IP": "127.0.0.1", **extra}


class StandaloneCluster:
    """A standalone master and workers, each its own JVM from pyspark's spark-class."""

    def __init__(self, root: Path, workers: int = 2) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port, self.ui = free_port(), free_port()
        self.worker_uis = [free_port() for _ in range(workers)]
        self.work_dirs = [root / f"worker-{n}" for n in range(workers)]
        self.procs: list[subprocess.Popen] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args: str) -> None:
        spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        log = (self.root / f"{name}.log").open("ab")
        self.procs.append(
            subprocess.Popen(
                [str(spark_class), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=clean_env(SPARK_HOME=str(Path(pyspark.__file__).parent)),
            )
        )

    def start(self) -> StandaloneCluster:
        master = f"--host 127.0.0.1 --port {self.port} --webui-port {self.ui}"
        self._start("master", "org.apache.spark.deploy.master.Master", *master.split())
        for n, (ui, work) in enumerate(zip(self.worker_uis, self.work_dirs, strict=True)):
            work.mkdir(parents=True)
            worker = f"--host 127.0.0.1 --cores 1 --memory 1G --webui-port {ui} --work-dir {work}"
            self._start(
                f"worker-{n}", "org.apache.spark.deploy.worker.Worker", *worker.split(), self.master
            )
        return self

    def wait_for_workers(self, timeout: float = 90.0) -> dict:
        deadline = time.monotonic() + timeout
        state: dict = {}
        while time.monotonic() < deadline:
            try:
                status, state = http_get(f"http://127.0.0.1:{self.ui}/json/")
            except OSError:
                status = 0
            if status == 200 and state.get("aliveworkers") == len(self.work_dirs):
                return state
            time.sleep(0.5)
        logs = {p.name: p.read_text()[-2000:] for p in self.root.glob("*.log")}
        raise TimeoutError(f"workers did not register with the master: {state} {logs}")

    def applications(self) -> set[str]:
        """Ids of the applications that ran on this cluster and finished."""
        _, state = http_get(f"http://127.0.0.1:{self.ui}/json/")
        return {app["id"] for app in state["completedapps"]}

    def fold_tasks_per_worker(self, app_id: str) -> list[int]:
        """Tasks of the application's first stage (read and fold) each worker finished."""
        counts = []
        for work in self.work_dirs:
            lines = [
                line
                for path in (work / app_id).glob("*/stderr")
                for line in path.read_text().splitlines()
            ]
            counts.append(sum("Finished task" in x and " in stage 0.0 " in x for x in lines))
        return counts

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    running = StandaloneCluster(tmp_path / "cluster").start()
    try:
        yield running
    finally:
        running.stop()


def test_the_backfill_runs_on_workers_with_only_pyspark_pyarrow_and_orjson(
    cluster: StandaloneCluster,
    service_factory,
    kafka_bootstrap: str,
    app_id: str,
    tmp_path: Path,
) -> None:
    service = service_factory("ledger.service:service", cwd=LEDGER)
    python = worker_python()
    assert_bare(python)
    service.wait_ready()
    commands = generate(300, 3000, seed=41)

    async def produce_and_wait() -> None:
        await produce_json(kafka_bootstrap, f"{app_id}-commands", commands)
        await wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=120)

    asyncio.run(produce_and_wait())
    expected = model(commands)
    cluster.wait_for_workers()

    seen: set[str] = set()
    for method in ("kafka", "python"):
        out = tmp_path / method
        args = (
            f"backfill ledger.service:service --master {cluster.master} "
            f"--bootstrap {kafka_bootstrap} --app {app_id} --method {method} "
            f"--snapshot {out / 'snapshot'} --output {out / 'state.parquet'} "
            "--conf spark.cores.max=2 --conf spark.executor.memory=512m "
            # start the fold only when both executors are up, so both get tasks
            "--conf spark.scheduler.minRegisteredResourcesRatio=1.0"
        ).split()
        job = subprocess.run(
            [sys.executable, "-m", "enhydra.cli.main", *args],
            cwd=tmp_path,  # not the project: the driver imports the installed service
            env={**os.environ, "PYSPARK_PYTHON": str(python), "SPARK_LOCAL_IP": "127.0.0.1"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]
        assert f"backfill: {len(expected)} keys" in job.stdout

        snapshot = open_snapshot(out / "snapshot")
        rebuilt = {
            key.decode(): entry.state
            for partition in snapshot.partitions
            for key, entry in snapshot.entries(partition)
        }
        assert rebuilt == expected, method
        table = pq.read_table(out / "state.parquet", columns=["key_text", "state"])
        states = dict(zip(table["key_text"].to_pylist(), table["state"].to_pylist(), strict=True))
        assert {k: orjson.loads(v) for k, v in states.items()} == expected, method

        (app,) = cluster.applications() - seen
        seen.add(app)
        per_worker = cluster.fold_tasks_per_worker(app)
        assert sum(per_worker) == 4 and min(per_worker) > 0, f"{method}: {per_worker}"


def test_a_sql_projection_backfills_on_workers_with_psycopg_and_no_runtime(
    cluster: StandaloneCluster,
    kafka_bootstrap: str,
    app_id: str,
    tmp_path: Path,
    database: DatabaseSettings,
) -> None:
    """`enhydra backfill --sql-projection` on the cluster: the executors fold with the
    projection's own step and write its rows, with psycopg their only package beyond the bare
    workers' (the step once came from the runner's module: "No module named 'aiokafka'")."""
    python = worker_python(extra=(SQL_WORKER_PACKAGE,))
    assert_bare(python)
    # a project's layout (the generators'): the projection and the aggregate's functions in
    # modules of their own, `Service(...)` in service.py, which the executors never import
    package = tmp_path / "sqlshop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = Path(accounts.__file__).read_text()
    reads, _, _ = source.partition("# A service with the accounts SQL projection")
    reads = reads.replace("from enhydra import Aggregate, Service\n", "")
    assert "Service" not in reads
    (package / "reads.py").write_text(reads)
    (package / "service.py").write_text(
        "from enhydra import Aggregate, Service\n"
        "from sqlshop.reads import PROJECTION, _apply, _decide\n"
        "SERVICE = Service('sql-accounts', Aggregate('ledger', _decide, _apply),"
        " projections=[PROJECTION])\n"
    )
    topic = f"{app_id}-events"
    events = accounts.history(60, 10, seed=31, bad=2)

    async def produce() -> None:
        await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 4, history=True)])
        await accounts.produce(kafka_bootstrap, topic, events)

    asyncio.run(produce())
    cluster.wait_for_workers()
    args = (
        f"backfill sqlshop.service:SERVICE --sql-projection accounts --master {cluster.master} "
        f"--bootstrap {kafka_bootstrap} --app {app_id} --method kafka "
        "--conf spark.cores.max=2 --conf spark.executor.memory=512m "
        "--conf spark.scheduler.minRegisteredResourcesRatio=1.0"
    ).split()
    job = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", *args],
        cwd=tmp_path,  # the driver imports sqlshop from here; executors from the shipped zip
        env={
            **os.environ,
            "PYTHONPATH": str(tmp_path),
            "PYSPARK_PYTHON": str(python),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "ENHYDRA_PARTITIONS": "4",
            URL_VAR: database.url,
            PASSWORD_FILE_VAR: str(database.password_file),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]
    assert asyncio.run(table(database)) == accounts.model(events)
    [app] = cluster.applications()
    assert sum(cluster.fold_tasks_per_worker(app)) == 4  # the four partitions, on the workers
