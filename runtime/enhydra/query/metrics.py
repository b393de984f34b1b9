"""Prometheus metrics in the text exposition format (0.0.4), written by hand.

Engine numbers are read at scrape time from the engine that runs now (it is replaced after a
crash, so its counters restart at 0, which Prometheus' rate() treats as a counter reset). Only
the request histogram lives here, because nothing else sees the requests.

Latency, as Kafka Streams reports it (KIP-613), comes from the engine's own histograms:
`enhydra_command_event_latency_seconds` is end-to-end, from a command record's timestamp until
Kafka acknowledged its batch's outputs (its events, or its rejection), and
`enhydra_batch_duration_seconds` splits a batch by phase: `process` (decide/apply, the pure
step), `publish` (outputs sent until acknowledged), `durable` (then the changelog acknowledged
and the store written).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from enhydra.runner import histogram
from enhydra.runner.tasks import Role
from enhydra.stores.partition import memory_usage as store_memory_usage

if TYPE_CHECKING:
    from enhydra.processing.engine import Engine
    from enhydra.reactions.engine import ReactionEngine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, object]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{name}="{_escape(str(value))}"' for name, value in labels.items())
    return "{" + inner + "}"


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


class Exposition:
    """Collects families and renders them; each family's HELP and TYPE appear once."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def add(
        self, name: str, kind: str, help_text: str, value: float, **labels: object
    ) -> Exposition:
        family = self._families.setdefault(name, (kind, help_text, []))
        family[2].append(f"{name}{_labels(labels)} {_number(value)}")
        return self

    def family(self, name: str, kind: str, help_text: str) -> list[str]:
        return self._families.setdefault(name, (kind, help_text, []))[2]

    def render(self) -> str:
        lines: list[str] = []
        for name, (kind, help_text, samples) in self._families.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)
        return "\n".join(lines) + "\n"


class Histogram(histogram.Histogram):
    """A named histogram per label set (route, method, code), ready for /metrics."""

    def __init__(self, name: str, help_text: str, buckets: Iterable[float] = BUCKETS) -> None:
        super().__init__(tuple(buckets))
        self.name = name
        self.help_text = help_text

    def write(self, out: Exposition) -> None:
        write_histogram(out, self.name, self.help_text, self)


def write_histogram(
    out: Exposition, name: str, help_text: str, hist: histogram.Histogram, **extra: object
) -> None:
    """A histogram's buckets, sum and count per label set; `extra` labels go on every sample."""
    samples = out.family(name, "histogram", help_text)
    for labels, cumulative, total, count in hist.series():
        labels = {**extra, **labels}
        for bound, running in zip(hist.buckets, cumulative, strict=True):
            samples.append(f"{name}_bucket{_labels({**labels, 'le': bound})} {running}")
        samples.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {count}")
        samples.append(f"{name}_sum{_labels(labels)} {float(total)!r}")
        samples.append(f"{name}_count{_labels(labels)} {count}")


def engine_metrics(out: Exposition, engine: Engine | None, store: str) -> None:
    """Processing, lag, restore, standby, failure and rebalance numbers of the engine."""
    out.add(
        "enhydra_up", "gauge", "1 while a stream worker runs in this instance", int(bool(engine))
    )
    if engine is None:
        return
    registry = engine.registry
    out.add("enhydra_ready", "gauge", "1 when every active task is restored", int(registry.ready))
    out.add(
        "enhydra_rebalancing",
        "gauge",
        "1 while a group rebalance is in progress",
        int(registry.rebalancing),
    )
    out.add(
        "enhydra_rebalances_total",
        "counter",
        "rebalances this stream worker took part in",
        registry.rebalances,
    )
    stats = engine.stats
    for name, text in (
        ("processed", "input records processed"),
        ("events", "events published"),
        ("rejections", "commands rejected by decide"),
        ("skipped", "redelivered records skipped (already in the state)"),
        ("batches", "batches processed"),
    ):
        out.add(f"enhydra_{name}_total", "counter", text, stats.get(name, 0), store=store)
    out.family("enhydra_failed_records_total", "counter", "records that failed, by stage and error")
    for key, count in sorted(engine.failures.items()):
        stage, _, error = key.partition(":")
        out.add(
            "enhydra_failed_records_total", "counter", "", count, stage=stage, error_class=error
        )
    out.family("enhydra_task", "gauge", "1 per task this instance holds, by role and status")
    out.family("enhydra_task_processed_total", "counter", "input records processed per active task")
    out.family(
        "enhydra_changelog_lag_records",
        "gauge",
        "changelog records a local copy is behind (standby and warm-up lag; 0: current)",
    )
    out.family("enhydra_restore_remaining_records", "gauge", "changelog records left to restore")
    out.family("enhydra_restore_restored_records", "gauge", "changelog records restored so far")
    out.family(
        "enhydra_restore_rate_records_per_second", "gauge", "restore speed of an active task"
    )
    stuck = registry.stuck
    out.add(
        "enhydra_tasks_stuck",
        "gauge",
        "tasks with work waiting and no progress for task_watchdog_ms (liveness fails)",
        len(stuck),
        store=store,
    )
    out.add(
        "enhydra_task_watchdog_trips_total",
        "counter",
        "times a task became stuck",
        registry.watchdog.trips,
        store=store,
    )
    for partition, task in sorted(registry.tasks.items()):
        labels = {"store": store, "partition": partition}
        out.add(
            "enhydra_task",
            "gauge",
            "",
            1,
            **labels,
            role=task.role.value,
            status=task.status.value,
        )
        if task.role is Role.ACTIVE:
            out.add("enhydra_task_processed_total", "counter", "", task.processed, **labels)
        lag = registry.task_lag(task)
        if lag is not None:
            out.add(
                "enhydra_changelog_lag_records", "gauge", "", lag, **labels, role=task.role.value
            )
        if task.restore:
            out.add(
                "enhydra_restore_remaining_records",
                "gauge",
                "",
                task.restore.get("remaining", 0),
                **labels,
            )
            out.add(
                "enhydra_restore_restored_records",
                "gauge",
                "",
                task.restore.get("restored", 0),
                **labels,
            )
            out.add(
                "enhydra_restore_rate_records_per_second",
                "gauge",
                "",
                task.restore.get("rate", 0.0),
                **labels,
            )
    out.family(
        "enhydra_consumer_lag_records",
        "gauge",
        "input records on the broker not yet processed, per active partition",
    )
    for partition, lag in sorted(engine.input_lag().items()):
        out.add("enhydra_consumer_lag_records", "gauge", "", lag, store=store, partition=partition)
    write_histogram(
        out,
        "enhydra_command_event_latency_seconds",
        "from a command's record timestamp until its outputs are acknowledged (KIP-613 e2e)",
        engine.latency,
        store=store,
    )
    write_histogram(
        out,
        "enhydra_batch_duration_seconds",
        "time per batch by phase: process (decide/apply), publish (outputs), durable",
        engine.batch_time,
        store=store,
    )
    used, limit = store_memory_usage()
    out.add(
        "enhydra_store_memory_bytes",
        "gauge",
        "RocksDB memtables and block cache, all store partitions of this instance",
        used,
    )
    out.add("enhydra_store_memory_limit_bytes", "gauge", "ENHYDRA_STORE_MEMORY_MB", limit)


def reaction_metrics(out: Exposition, reactions: Mapping[str, ReactionEngine]) -> None:
    """Per reaction: upstream events read, commands written, events it does not read, failures
    by stage, and its lag (upstream events on the broker not turned into commands yet).

    A command the receiving aggregate rejects is counted there (`enhydra_rejections_total` of
    the receiving service; its command id starts with the reaction's name).
    """
    for name, text in (
        ("processed", "upstream events a reaction read"),
        ("commands", "commands a reaction wrote"),
        ("ignored", "upstream events of types a reaction does not read"),
        ("batches", "batches a reaction processed"),
    ):
        out.family(f"enhydra_reaction_{name}_total", "counter", text)
    out.family(
        "enhydra_reaction_failed_records_total",
        "counter",
        "upstream events a reaction failed on, by stage and error (its error policies took them)",
    )
    out.family(
        "enhydra_reaction_lag_records",
        "gauge",
        "upstream events on the broker a reaction has not read yet, per active partition",
    )
    for reaction, engine in sorted(reactions.items()):
        labels = {"reaction": reaction, "source": engine.reaction.source}
        for name in ("processed", "commands", "ignored", "batches"):
            out.add(
                f"enhydra_reaction_{name}_total", "counter", "", engine.stats.get(name, 0), **labels
            )
        for key, count in sorted(engine.failures.items()):
            stage, _, error = key.partition(":")
            out.add(
                "enhydra_reaction_failed_records_total",
                "counter",
                "",
                count,
                **labels,
                stage=stage,
                error_class=error,
            )
        for partition, lag in sorted(engine.input_lag().items()):
            out.add("enhydra_reaction_lag_records", "gauge", "", lag, **labels, partition=partition)


def saga_metrics(out: Exposition, sagas: Mapping[str, Mapping[str, Any]]) -> None:
    """Per saga (its description, sagas/engine.py): deadlines pending here, fired, and more."""
    if not sagas:
        return
    out.family(
        "enhydra_saga_deadlines_pending",
        "gauge",
        "deadlines scheduled in this instance's saga partitions, not fired or cancelled yet",
    )
    for name, saga in sorted(sagas.items()):
        out.add(
            "enhydra_saga_deadlines_pending",
            "gauge",
            "",
            saga.get("deadlines_pending", 0),
            saga=name,
        )
    for stat, metric, text in (
        ("fired", "enhydra_saga_deadlines_fired_total", "deadlines fired (their commands sent)"),
        ("scheduled", "enhydra_saga_deadlines_scheduled_total", "deadlines scheduled"),
        ("cancelled", "enhydra_saga_deadlines_cancelled_total", "deadlines cancelled unfired"),
        ("handled", "enhydra_saga_events_total", "upstream events handled"),
        ("duplicates", "enhydra_saga_duplicates_total", "upstream events already handled"),
        ("commands", "enhydra_saga_commands_total", "commands sent by events and deadlines"),
    ):
        out.family(metric, "counter", text)
        for name, saga in sorted(sagas.items()):
            out.add(metric, "counter", "", saga.get(stat, 0), saga=name)
