"""Reactions' pure part: command ids from positions, placement, typed reads, failures."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import orjson
import pytest

from enhydra.contracts.headers import COMMAND_OFFSET_HEADER, EVENT_INDEX_HEADER
from enhydra.contracts.partitioner import partition_for
from enhydra.errors.failure import Stage
from enhydra.processing.core import InputRecord, process_batch
from enhydra.reactions import Emit, Reaction, Upstream, react_batch

TOPIC = "ledger-events"


@dataclass
class Rec:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int = 0


def event(offset: int, key: str, body: dict, source: tuple[int, int] | None = None) -> Rec:
    headers = []
    if source is not None:
        headers = [
            (COMMAND_OFFSET_HEADER, b"%d" % source[0]),
            (EVENT_INDEX_HEADER, b"%d" % source[1]),
        ]
    return Rec(offset, key.encode(), orjson.dumps(body), headers)


def count_deposits(up: Upstream) -> list[Emit]:
    if up.event.get("type") != "deposited":
        return []
    return [Emit(up.key, {"type": "count", "amount": up.event["amount"]})]


COUNT = Reaction("count", "ledger", count_deposits)


def run(reaction: Reaction, records, **kw):
    options = dict(
        topic=TOPIC, partition=2, commands_topic="stats-commands", partitions_of=lambda t: 4
    )
    options.update(kw)
    return react_batch(reaction, records, **options)


def commands(result) -> list[dict]:
    return [orjson.loads(v) for recs in result.outputs.values() for _, v, _ in recs]


def test_a_command_id_is_the_event_source_so_a_republished_copy_gets_the_same_id() -> None:
    first = run(COUNT, [event(7, "acc", {"type": "deposited", "amount": 5}, source=(3, 0))])
    copy = run(COUNT, [event(9, "acc", {"type": "deposited", "amount": 5}, source=(3, 0))])
    assert commands(first) == commands(copy)
    assert commands(first)[0]["command_id"] == f"count:{TOPIC}:2:3:0:0"


def test_without_source_headers_the_record_offset_places_the_event() -> None:
    result = run(COUNT, [event(7, "acc", {"type": "deposited", "amount": 5})])
    assert commands(result)[0]["command_id"] == f"count:{TOPIC}:2:7:0:0"


def test_commands_go_to_the_partition_their_key_hashes_to() -> None:
    records = [event(i, f"acc-{i}", {"type": "deposited", "amount": 1}) for i in range(20)]
    result = run(COUNT, records)
    for (topic, partition), recs in result.outputs.items():
        assert topic == "stats-commands"
        assert all(partition_for(k, 4) == partition for k, _, _ in recs)
    assert result.commands == 20 and result.last_offset == 19


def test_a_redelivered_batch_makes_duplicates_the_aggregate_skips() -> None:
    """The whole point: commands made twice from the same events change state once."""
    from enhydra import Aggregate

    totals = Aggregate(
        "totals",
        decide=lambda state, command: [{"type": "counted", "amount": command["amount"]}],
        apply=lambda state, e: (state or 0) + e["amount"],
    )
    records = [event(i, "acc", {"type": "deposited", "amount": i + 1}) for i in range(10)]
    once = commands(run(COUNT, records))
    again = commands(run(COUNT, records[4:]))  # a crash: read again from offset 4
    inputs = [InputRecord(i, b"acc", orjson.dumps(c)) for i, c in enumerate([*once, *again])]
    result = process_batch(totals, inputs, lambda key: None)
    assert result.changed["acc"].state == sum(range(1, 11))
    assert len(result.rejected) == len(again)  # each copy: "duplicate command_id"


def test_several_commands_per_event_and_another_services_topic() -> None:
    def fan_out(up: Upstream) -> list[Emit]:
        return [Emit(up.key, {"type": "a"}), Emit("x", {"type": "b"}, topic="pay-commands")]

    counts = {"stats-commands": 4, "pay-commands": 3}
    result = run(
        Reaction("fan", "ledger", fan_out),
        [event(0, "k", {"type": "opened"})],
        partitions_of=counts.__getitem__,
    )
    ids = sorted(c["command_id"] for c in commands(result))
    assert ids == [f"fan:{TOPIC}:2:0:0:0", f"fan:{TOPIC}:2:0:0:1"]
    assert ("pay-commands", partition_for(b"x", 3)) in result.outputs


class Deposited(msgspec.Struct, tag="deposited"):
    amount: int


def test_typed_reads_give_structs_and_skip_other_types() -> None:
    seen = []
    typed = Reaction("typed", "ledger", lambda up: seen.append(up.event), reads=[Deposited])
    result = run(
        typed,
        [event(0, "k", {"type": "opened"}), event(1, "k", {"type": "deposited", "amount": 3})],
    )
    assert seen == [Deposited(3)] and result.ignored == 1 and not result.failures


def test_an_event_that_does_not_fit_its_declared_type_is_a_deserialize_failure() -> None:
    typed = Reaction("typed", "ledger", lambda up: [], reads=[Deposited])
    result = run(typed, [event(0, "k", {"type": "deposited", "amount": "5"}), Rec(1, b"k", b"{")])
    assert [f.stage for f in result.failures] == [Stage.DESERIALIZE, Stage.DESERIALIZE]
    assert "deposited" in str(result.failures[0].error)


def test_an_error_in_react_fails_the_record_and_a_transient_one_stops_the_batch() -> None:
    def boom(up: Upstream) -> list[Emit]:
        raise TimeoutError("later") if up.offset == 1 else KeyError("bad")

    reaction = Reaction("boom", "ledger", boom)
    records = [event(i, "k", {"type": "x"}) for i in range(3)]
    result = run(reaction, records, transient=(TimeoutError,))
    assert [f.stage for f in result.failures] == [Stage.PROCESS]
    assert result.interrupted is not None and result.interrupted[0] == 1
    assert result.last_offset == 0
    retried = run(reaction, records, transient=(TimeoutError,), give_up={1: 3})
    assert [f.attempts for f in retried.failures] == [1, 4, 1]


def test_a_command_that_cannot_be_written_is_a_produce_failure() -> None:
    big = Reaction("big", "ledger", lambda up: [Emit("k", {"blob": "x" * 2000})])
    bad = Reaction("bad", "ledger", lambda up: [Emit("k", {"when": object()})])
    for reaction in (big, bad):
        result = run(reaction, [event(0, "k", {"type": "x"})], max_record_bytes=1000)
        assert [f.stage for f in result.failures] == [Stage.PRODUCE] and not result.outputs


def test_declarations_are_checked_with_a_hint() -> None:
    with pytest.raises(ValueError, match="use letters"):
        Reaction("a b", "ledger", count_deposits)
    with pytest.raises(ValueError, match="tagged msgspec Struct"):
        Reaction("r", "ledger", count_deposits, reads=[dict])
    assert COUNT.upstream_topic == "ledger-events"
    assert COUNT.group_id("stats") == "stats-reaction-count"


def test_the_driver_feeds_upstream_events_and_a_redelivered_one_changes_nothing() -> None:
    from enhydra.testing.driver import Driver
    from tests.reactions.tally_service import service

    driver = Driver(service)
    driver.feed("tally", "acc", {"type": "opened"})
    deposited = {"type": "deposited", "amount": 5, "currency": "EUR"}
    [outcome] = driver.feed("tally", "acc", deposited)
    assert outcome.accepted and driver.state("acc") == {"events": 2, "net": 5}
    [again] = driver.feed("tally", "acc", deposited, offset=1)  # Kafka delivers it again
    assert again.rejection == "duplicate command_id"
    assert driver.state("acc") == {"events": 2, "net": 5}
    with pytest.raises(KeyError, match="this service's: tally"):
        driver.feed("nope", "acc", deposited)


def test_the_step_applies_the_services_error_policies_to_upstream_records() -> None:
    """A record a reaction cannot read is dead-lettered with its upstream origin, or stops the
    worker, as the service's policies say; its good neighbours' commands still go out."""
    from enhydra.errors.policies import ErrorAction, ErrorPolicies, RecordFailed
    from enhydra.reactions.engine import ReactionStep
    from enhydra.runner.tasks import Task
    from enhydra.settings import Settings

    settings = Settings.from_env({}, app_id="stats", partitions=4)
    records = [Rec(0, b"k", b"not json"), event(1, "k", {"type": "deposited", "amount": 2})]
    task = Task(2, store=None)  # type: ignore[arg-type]  # a reaction reads no store
    dlq = ErrorPolicies(deserialization=ErrorAction.DLQ)
    out = ReactionStep(settings, COUNT, "stats-commands", dlq, ())(task, records, {})
    [letter] = out.outputs[settings.dlq_topic]
    assert letter[0] == b"k" and dict(letter[2])["enhydra.dlq.topic"] == TOPIC.encode()
    [(place, commands_out)] = [(p, o) for p, o in out.outputs.items() if isinstance(p, tuple)]
    assert place == ("stats-commands", partition_for(b"k", 4)) and len(commands_out) == 1
    assert out.failed == ["deserialize:NotAnEvent"] and out.last_offset == 1 and out.puts == []
    with pytest.raises(RecordFailed):
        ReactionStep(settings, COUNT, "stats-commands", ErrorPolicies(), ())(task, records, {})
