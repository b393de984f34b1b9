"""The `{{ name }}` job's fold, without a broker (the job's Kafka read is the only I/O)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "jobs" / "{{ name }}.py"


def load_job():
    spec = importlib.util.spec_from_file_location("job_{{ name }}", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summarize_counts_types_and_keys() -> None:
    job = load_job()
    events = [("a", {"type": "x"}), ("b", {"type": "x"}), ("a", {"type": "y"})]
    assert job.summarize(events) == {
        "events": 3,
        "keys": 2,
        "by_type": {"x": 2, "y": 1},
        "busiest": [{"key": "a", "events": 2}, {"key": "b", "events": 1}],
    }


def test_summarize_of_nothing() -> None:
    assert load_job().summarize([]) == {"events": 0, "keys": 0, "by_type": {}, "busiest": []}


def test_the_job_has_a_command_line() -> None:
    assert "--bootstrap" in JOB.read_text()
