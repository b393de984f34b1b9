"""The fold over a history written by three deployments of the ledger, without Spark.

1. before event versions existed: v1 shapes, no `enhydra.event_version` header;
2. v1 code that declares no versions: v1 shapes, version header 1;
3. the ledger of today: `deposited` v2 (with a currency), version header 2.

Each deployment runs the runtime's own batch core and event writer over its commands, on the
state its predecessor left. The fold of the whole log must equal the independent model.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pytest

from enhydra.aggregate import Aggregate
from enhydra.contracts.codec import Entry, decode_entry
from enhydra.contracts.fold_input import kafka_events_batch
from enhydra.contracts.headers import EVENT_VERSION_HEADER, header
from enhydra.evolution import version_headers
from enhydra.processing.core import InputRecord, process_batch
from enhydra.processing.step import event_outputs
from enhydra.snapshots.format import partition_for
from enhydra.spark.fold import FoldError, applied_events, fold_batches
from ledger.domain import accounts
from ledger.workload import generate, model
from tests.integration.ledger_versions import accounts_v1

PARTITIONS = 3
Record = tuple[bytes, int, int, bytes, list[tuple[str, bytes]]]


class Engine:
    """The partitions' stores, command offsets and events logs, kept across deployments."""

    def __init__(self) -> None:
        self.stores: dict[int, dict[str, Entry]] = {p: {} for p in range(PARTITIONS)}
        self.offsets = dict.fromkeys(range(PARTITIONS), 0)
        self.logs: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}

    def deploy(
        self,
        aggregate: Aggregate,
        commands: list[tuple[str, dict[str, Any]]],
        *,
        versioned: bool = True,
    ) -> None:
        """Run one deployment over its commands, 7 a batch, with the runtime's event writer."""
        for p, store in self.stores.items():
            mine = [(k, c) for k, c in commands if partition_for(k.encode(), PARTITIONS) == p]
            log = self.logs[p]
            for at in range(0, len(mine), 7):
                records = []
                for key, command in mine[at : at + 7]:
                    records.append(
                        InputRecord(self.offsets[p], key.encode(), orjson.dumps(command))
                    )
                    self.offsets[p] += 1
                result = process_batch(aggregate, records, store.get)
                for key, value, headers in event_outputs(result, version_headers(aggregate)):
                    if not versioned:  # written before versions existed
                        headers = [h for h in headers if h[0] != EVENT_VERSION_HEADER]
                    log.append((key, p, len(log), value, headers))
                store.update(result.changed)

    def records(self) -> list[Record]:
        return [r for p in sorted(self.logs) for r in self.logs[p]]


def history() -> tuple[list[tuple[str, dict[str, Any]]], list[Record]]:
    phases = [generate(40, 400, seed=s) for s in (1, 2, 3)]
    engine = Engine()
    engine.deploy(accounts_v1, phases[0], versioned=False)
    engine.deploy(accounts_v1, phases[1])
    engine.deploy(accounts, phases[2])
    return [c for phase in phases for c in phase], engine.records()


def batches(records: list[Record]) -> list:
    ordered = sorted(records, key=lambda r: (r[0], r[1], r[2]))
    return [kafka_events_batch(ordered[i : i + 50]) for i in range(0, len(ordered), 50)]


def folded(aggregate: Aggregate, records: list[Record]) -> dict[str, Any]:
    return {
        row["key_text"]: decode_entry(row["value"]).state
        for batch in fold_batches(batches(records), aggregate)
        for row in batch.to_pylist()
    }


def test_history_of_three_deployments_folds_to_the_model() -> None:
    commands, records = history()
    versions = {header(r[4], EVENT_VERSION_HEADER) for r in records}
    assert versions == {None, b"1", b"2"}  # the log really mixes them
    shapes = {tuple(sorted(orjson.loads(r[3]))) for r in records}
    assert ("amount", "type") in shapes and ("amount", "currency", "type") in shapes
    assert folded(accounts, records) == model(commands)


def test_old_code_refuses_events_of_a_newer_version() -> None:
    _, records = history()
    with pytest.raises(FoldError, match=r"'deposited' at version 2.*newer deployment"):
        folded(accounts_v1, records)


def test_a_version_header_that_is_not_a_number_names_the_event() -> None:
    record = (b"k", 0, 0, b'{"type":"opened"}', [(EVENT_VERSION_HEADER, b"two")])
    where, name = "key b'k' at partition 0 offset 0", EVENT_VERSION_HEADER
    for aggregate in (accounts, accounts_v1):
        with pytest.raises(FoldError, match=rf"{where}: header {name} = b'two' is not a number"):
            folded(aggregate, [record])


def test_corrected_events_keep_the_version_they_were_written_with() -> None:
    """A clone's events topic holds the original values and versions, read the same way."""
    commands, records = history()
    kept = [
        row for batch in applied_events(batches(records), accounts) for row in batch.to_pylist()
    ]
    assert len(kept) == len(records)
    again = [
        (
            row["key"],
            row["partition"],
            i,
            row["value"],
            [(h["key"], h["value"]) for h in row["headers"] or []],
        )
        for i, row in enumerate(kept)
    ]
    by_value = {(r[0], r[3], header(r[4], EVENT_VERSION_HEADER)) for r in records}
    assert {(r[0], r[3], header(r[4], EVENT_VERSION_HEADER)) for r in again} == by_value
    assert folded(accounts, again) == model(commands)


def test_the_typed_ledger_folds_the_same_history_to_the_same_entries() -> None:
    """Typed apply over JSON history (upcast first), after a trip through pickle as a Spark
    executor gets it; a fourth deployment of the typed ledger itself continues the log."""
    import pickle

    from pyspark import cloudpickle

    from ledger import typed

    commands, records = history()
    shipped = pickle.loads(cloudpickle.dumps(typed.accounts))
    assert folded(shipped, records) == model(commands)
    plain = {
        r["key"]: r["value"]
        for b in fold_batches(batches(records), accounts)
        for r in b.to_pylist()
    }
    typed_rows = {
        r["key"]: r["value"] for b in fold_batches(batches(records), shipped) for r in b.to_pylist()
    }
    assert typed_rows == plain  # the same entry bytes in the snapshot either way


def test_the_fold_writes_entries_at_the_aggregate_state_version() -> None:
    from tests.integration.ledger_versions import accounts_state_v2

    commands, records = history()
    rows = [r for b in fold_batches(batches(records), accounts_state_v2) for r in b.to_pylist()]
    entries = [decode_entry(r["value"]) for r in rows]
    assert {e.version for e in entries} == {2}
    expected = {k: {**s, "currency": "EUR"} for k, s in model(commands).items()}
    assert {r["key_text"]: e.state for r, e in zip(rows, entries, strict=True)} == expected


@pytest.mark.spark
def test_spark_folds_the_mixed_history_with_the_typed_ledger(spark) -> None:
    """The typed aggregate goes to Spark's Python workers (pickled) and folds there."""
    from enhydra.spark.fold import fold_events

    commands, records = history()
    table = pa.Table.from_batches([kafka_events_batch(records)])
    rows = fold_events(spark.createDataFrame(table), "ledger.typed:accounts").collect()
    states = {row["key_text"]: orjson.loads(row["state"]) for row in rows}
    assert states == model(commands)


def test_the_hash_fold_upcasts_and_records_the_state_version_as_the_sort_fold() -> None:
    """In log order (no sort), the three deployments' events give the sort fold's very bytes."""
    commands, records = history()
    in_log_order = [kafka_events_batch(records[i : i + 50]) for i in range(0, len(records), 50)]
    hashed = [r for b in fold_batches(in_log_order, accounts, hashed=True) for r in b.to_pylist()]
    by_sort = [r for b in fold_batches(batches(records), accounts) for r in b.to_pylist()]
    assert hashed == sorted(by_sort, key=lambda r: r["key"])
    entries = {r["key_text"]: decode_entry(r["value"]) for r in hashed}
    assert {k: e.state for k, e in entries.items()} == model(commands)
    assert {e.version for e in entries.values()} == {accounts.state_version}
