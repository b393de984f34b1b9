"""The one line `enhydra backfill` prints for a Spark job that failed on an executor."""

from __future__ import annotations

from enhydra.cli.backfill import _spark_failure


def test_a_module_missing_on_the_workers_names_it_and_what_they_need() -> None:
    trace = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/w/worker.py", line 1, in main\n'
        "ModuleNotFoundError: No module named 'psycopg'\n"
    )
    line = _spark_failure(RuntimeError(trace))
    assert line is not None and "\n" not in line
    assert line.startswith("ModuleNotFoundError: No module named 'psycopg' on an executor")
    assert "psycopg for --sql-projection" in line and "pyarrow and orjson" in line


def test_an_executors_own_error_is_its_message_alone() -> None:
    trace = "Caused by: ...\nenhydra.spark.fold.FoldError: events partition 2 out of order\n"
    assert _spark_failure(RuntimeError(trace)) == "events partition 2 out of order"
