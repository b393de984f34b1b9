"""What executors import stays light: the package root and every shipped module.

Each check runs a fresh interpreter (sys.modules of this one already holds everything) and
lists the heavy packages the import pulled in. Executors of a cluster whose workers have only
pyspark, pyarrow and orjson import exactly these modules (tests/spark/test_cluster.py runs
one), so a heavy import here is a job that fails there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from enhydra.spark.ship import EXECUTOR_MODULES, READER_MODULES, SQL_MODULES

RUNTIME_ONLY = ("faust", "aiokafka", "rocksdict", "structlog", "aiohttp", "mode")


def loaded_after(code: str) -> list[str]:
    """Top-level packages in sys.modules after running `code` in a new interpreter."""
    listing = "import json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    probe = f"{code}\n{listing}"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_package_root_loads_the_programming_model_only() -> None:
    loaded = loaded_after("from enhydra import Aggregate, InvalidCommand, Rejection, replay")
    assert not set(loaded) & {*RUNTIME_ONLY, "pyarrow", "pyspark"}, loaded


def test_the_runtime_is_still_one_attribute_away() -> None:
    code = "import enhydra, sys\nassert enhydra.Service.__name__ == 'Service'\n"
    loaded_after(code + "assert 'enhydra.service' in sys.modules")


@pytest.mark.parametrize("module", EXECUTOR_MODULES)
def test_a_shipped_module_imports_without_the_runtime(module: str) -> None:
    loaded = loaded_after(f"import {module}")
    assert not set(loaded) & set(RUNTIME_ONLY), loaded


@pytest.mark.parametrize("module", READER_MODULES)
def test_the_python_readers_modules_need_aiokafka_only(module: str) -> None:
    loaded = loaded_after(f"import {module}")
    assert not set(loaded) & (set(RUNTIME_ONLY) - {"aiokafka"}), loaded


@pytest.mark.parametrize("module", SQL_MODULES)
def test_a_sql_backfills_modules_need_psycopg_only(module: str) -> None:
    """The executors of a backfill into PostgreSQL fold with the projection's step and write
    with the writer: with the runner imported (it once was, through sql.engine), a worker
    without the whole runtime failed with "No module named 'faust'"."""
    loaded = loaded_after(f"import {module}")
    assert not set(loaded) & set(RUNTIME_ONLY), loaded


def test_a_sql_projection_step_unpickles_without_the_runtime() -> None:
    """What the executors receive: the pickled step, its class imported by its module name."""
    code = (
        "import pickle\n"
        "from enhydra.sql.fold import SqlStep\n"
        "from enhydra.sql.model import SqlProjection, Table\n"
        "def project(key, event): return []\n"
        "table = Table('t', ('k',), 'CREATE TABLE {table} (k text primary key)')\n"
        "p = SqlProjection('t', project, (table,))\n"
        "step = pickle.loads(pickle.dumps(SqlStep(p)))\n"
        "assert step(None, [], {}).rows == []\n"
    )
    loaded = loaded_after(code)
    assert not set(loaded) & {*RUNTIME_ONLY, "psycopg"}, loaded


def test_a_service_domain_module_imports_without_the_runtime() -> None:
    loaded = loaded_after("import ledger.domain")
    assert not set(loaded) & {*RUNTIME_ONLY, "pyarrow"}, loaded
