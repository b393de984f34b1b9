"""The PySpark companion: rebuild a service's state from its events with its own `apply`.

    spark = local_session()                                   # or spark-submit's session
    events = read_events(spark, "ledger-events", "kafka:9092", until_time=...)
    state = fold_events(events, "ledger.service:service", shuffle=False)   # one Entry per key
    run_backfill(spark, "ledger.service:service", snapshot="snap/")   # all of it, plus a cut

Names are imported lazily: `enhydra.spark.fold`'s pure core needs only pyarrow, the rest pyspark;
executors import only what ship.py sends them (docs/backfill.md).
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "read_events": "enhydra.spark.source",
    "resolve_ranges": "enhydra.spark.source",
    "OffsetRange": "enhydra.spark.source",
    "KafkaEventsDataSource": "enhydra.spark.source",
    "SourceError": "enhydra.spark.source",
    "fold_events": "enhydra.spark.fold",
    "fold_batches": "enhydra.spark.fold",
    "EventFold": "enhydra.spark.fold",
    "FoldError": "enhydra.spark.fold",
    "run_backfill": "enhydra.spark.job",
    "plan_backfill": "enhydra.spark.job",
    "execute_backfill": "enhydra.spark.job",
    "BackfillError": "enhydra.spark.job",
    "BackfillResult": "enhydra.spark.job",
    "local_session": "enhydra.spark.session",
    "cluster_session": "enhydra.spark.session",
    "ship": "enhydra.spark.ship",
    "kafka_jars": "enhydra.spark.jars",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'enhydra.spark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
