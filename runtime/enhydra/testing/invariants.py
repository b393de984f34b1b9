"""What every fault test holds afterwards, whatever the fault (ARCHITECTURE.md, "Faults").

1. No zombie write: along each changelog partition, each key's entry input offset never
   decreases; a record carrying a lower offset than an earlier record of its key was written by
   an owner that had already lost the task.
2. Restore equals the model: the changelog folded the way a fresh instance restores it (the
   last entry of each key) holds exactly the model's state.
3. One event per (command id, event index): exactly one under exactly_once (read_committed);
   under at_least_once copies may exist, but each is the same event from the same command
   offset, so none of them changed state a second time.
4. Progress: the commands group's committed offsets reach the end within a bound once the
   fault heals.

The checks are pure functions over records (anything with partition, offset, key, value and
headers, as aiokafka yields them), unit-tested on hand-made records; `check_service` reads the
topics and runs them all.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from enhydra.contracts.codec import decode_entry
from enhydra.contracts.headers import COMMAND_ID_HEADER, event_source, header
from enhydra.runner.fencing import admitted

SHOWN = 5  # examples of each violation kept in a report


class Record(Protocol):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any


@dataclass(frozen=True)
class Zombie:
    """A changelog record whose entry went back in time for its key."""

    partition: int
    offset: int  # the record's own offset in the changelog
    key: str
    entry_offset: int  # the input offset it carries
    previous: int  # the highest input offset an earlier record of the key carried


def _key(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw is not None else ""


def applied(changelog: Iterable[Record]) -> list[Record]:
    """The changelog records a restoring reader applies, in (partition, offset) order.

    At-least-once owners stamp an epoch on their records; a cut-off previous owner's record
    that lands after a newer owner's is skipped by every reader (runner/fencing.py) and
    written over by the current owner, so it is not state, and not a zombie write.
    """
    ordered = sorted(changelog, key=lambda r: (r.partition, r.offset))
    kept: list[Record] = []
    for _, records in itertools.groupby(ordered, key=lambda r: r.partition):
        kept += [record for record, _ in admitted(records)]
    return kept


def zombie_writes(changelog: Iterable[Record]) -> list[Zombie]:
    """Every applied record whose entry offset is lower than an earlier one's of the same key."""
    found: list[Zombie] = []
    highest: dict[tuple[int, str], int] = {}
    for record in applied(changelog):
        if record.value is None:
            continue  # a tombstone carries no offset; the key may come back later
        key = _key(record.key)
        entry = decode_entry(record.value)
        previous = highest.get((record.partition, key))
        if previous is not None and entry.offset < previous:
            found.append(Zombie(record.partition, record.offset, key, entry.offset, previous))
        else:
            highest[(record.partition, key)] = entry.offset
    return found


def restored_state(changelog: Iterable[Record]) -> dict[str, Any]:
    """Each key's state as a fresh instance restores it: the last record of the key wins."""
    state: dict[str, Any] = {}
    for record in applied(changelog):
        key = _key(record.key)
        if record.value is None:
            state.pop(key, None)
        else:
            state[key] = decode_entry(record.value).state
    return state


@dataclass(frozen=True)
class StateDiff:
    matching: int
    expected: int
    missing: list[str]  # in the model, not in the state
    extra: list[str]  # in the state, not in the model
    differing: list[tuple[str, Any, Any]]  # key, expected, actual

    @property
    def ok(self) -> bool:
        return self.matching == self.expected and not self.extra


def compare_state(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> StateDiff:
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    shared = [k for k in sorted(expected) if k in actual]
    differing = [(k, expected[k], actual[k]) for k in shared if actual[k] != expected[k]]
    matching = len(shared) - len(differing)
    return StateDiff(matching, len(expected), missing, extra, differing)


@dataclass(frozen=True)
class EventCopies:
    """What the events topic says about (command id, event index) pairs."""

    distinct: int  # pairs seen
    records: int  # records read
    duplicated: int  # pairs with more than one record
    conflicting: list[tuple[str, int]]  # pairs whose copies differ (source or payload)
    unlabelled: int  # events without the headers (never expected from the runtime)

    def ok(self, guarantee: str, expected: int | None = None) -> bool:
        if self.conflicting or self.unlabelled:
            return False
        if expected is not None and self.distinct != expected:
            return False
        return guarantee != "exactly_once" or self.duplicated == 0


def event_copies(events: Iterable[Record]) -> EventCopies:
    """Group events by (command id, event index) and tell copies that differ."""
    copies: dict[tuple[str, int], list[tuple[Any, bytes | None]]] = defaultdict(list)
    records = unlabelled = 0
    for record in events:
        records += 1
        command_id = header(record.headers, COMMAND_ID_HEADER)
        source = event_source(record.headers)
        if command_id is None or source is None:
            unlabelled += 1
            continue
        copies[(_key(command_id), source[1])].append((source[0], record.value))
    duplicated = sum(1 for found in copies.values() if len(found) > 1)
    conflicting = [pair for pair, found in copies.items() if len(set(found)) > 1]
    return EventCopies(len(copies), records, duplicated, sorted(conflicting), unlabelled)


@dataclass
class Progress:
    """How the commands group's committed offsets moved after a fault healed."""

    resumed_s: dict[int, float | None] = field(default_factory=dict)  # partition -> seconds
    drained_s: float | None = None  # all partitions committed to the end
    lag: dict[int, int] = field(default_factory=dict)  # at the end of the watch

    def all_resumed(self) -> bool:
        return bool(self.resumed_s) and all(s is not None for s in self.resumed_s.values())

    def ok(self, resume_within: float) -> bool:
        return self.drained_s is not None and all(
            s is not None and s <= resume_within for s in self.resumed_s.values()
        )


def resumed_partitions(
    at_heal: Mapping[int, tuple[int, int]],
    now: Mapping[int, tuple[int, int]],
    elapsed: float,
    resumed: dict[int, float | None],
) -> None:
    """Mark the partitions that resumed: (committed, end) at heal against now.

    A partition resumes when its committed offset moves past where it was at heal time, or
    when it had nothing left to do (committed at the end then and now).
    """
    for partition, (committed0, end0) in at_heal.items():
        if resumed.get(partition) is not None:
            continue
        committed, _ = now.get(partition, (committed0, end0))
        if committed > committed0 or (committed0 >= end0 and committed >= end0):
            resumed[partition] = elapsed
        else:
            resumed.setdefault(partition, None)


# --------------------------------------------------------------------------- the shell


async def group_positions(conn: Any, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (committed offset, end offset) of `group` on `topic`."""
    from enhydra.kafka.clients import as_connection, open_admin
    from enhydra.kafka.groups import committed_offsets
    from enhydra.kafka.reading import end_offsets

    conn = as_connection(conn)
    ends = await end_offsets(conn, topic)
    async with open_admin(conn) as admin:
        committed = {
            tp.partition: offset
            for tp, offset in (await committed_offsets(admin, group)).items()
            if tp.topic == topic
        }
    return {p: (committed.get(p, 0), end) for p, end in ends.items()}


async def watch_progress(
    conn: Any,
    group: str,
    topic: str,
    *,
    resume_within: float = 10.0,
    drain_within: float = 60.0,
    stream_done: Callable[[], bool] = lambda: True,
    progress: Progress | None = None,
) -> Progress:
    """Watch from now (the fault just healed): when each partition resumes, when all drain.

    Draining counts only once `stream_done()` says no more commands are coming. `progress`
    (filled in as the watch goes) lets the caller see partitions resume before it ends.
    """
    started = time.monotonic()
    progress = progress if progress is not None else Progress()
    at_heal = await group_positions(conn, group, topic)
    while True:
        elapsed = time.monotonic() - started
        now = await group_positions(conn, group, topic)
        resumed_partitions(at_heal, now, elapsed, progress.resumed_s)
        progress.lag = {p: end - committed for p, (committed, end) in now.items()}
        if stream_done() and all(lag <= 0 for lag in progress.lag.values()):
            progress.drained_s = round(elapsed, 1)
            return progress
        if elapsed > max(resume_within, drain_within):
            return progress
        stuck = [p for p, s in progress.resumed_s.items() if s is None]
        if stuck and elapsed > 2 * resume_within:
            return progress  # a partition that has not moved for twice the bound is stuck
        await asyncio.sleep(0.5)


def _rounded(seconds: Mapping[int, float | None]) -> dict[int, float | None]:
    return {k: None if v is None else round(v, 1) for k, v in sorted(seconds.items())}


@dataclass
class Verdict:
    """Every invariant's numbers for one run; `problems` is empty when all hold."""

    guarantee: str
    state: StateDiff
    zombies: list[Zombie]
    events: EventCopies
    expected_events: int | None
    progress: Progress | None = None
    resume_within: float = 10.0
    failures: list[str] = field(default_factory=list)  # broken by the caller's own checks
    notes: list[str] = field(default_factory=list)  # what happened, for the summary

    @property
    def problems(self) -> list[str]:
        found = []
        s = self.state
        if not s.ok:
            found.append(
                f"restored state: {s.matching}/{s.expected} accounts match the model "
                f"(missing {s.missing[:SHOWN]}, extra {s.extra[:SHOWN]}, "
                f"differing {s.differing[:SHOWN]})"
            )
        if self.zombies:
            found.append(f"{len(self.zombies)} zombie writes, e.g. {self.zombies[:SHOWN]}")
        e = self.events
        if not e.ok(self.guarantee, self.expected_events):
            found.append(
                f"events: {e.distinct} distinct (command id, index) of {self.expected_events} "
                f"expected, {e.records} records, {e.duplicated} duplicated, "
                f"{len(e.conflicting)} conflicting {e.conflicting[:SHOWN]}, "
                f"{e.unlabelled} without headers ({self.guarantee})"
            )
        p = self.progress
        if p is not None and not p.ok(self.resume_within):
            found.append(
                f"progress: partitions resumed after {_rounded(p.resumed_s)} s (bound "
                f"{self.resume_within:.0f} s), drained after {p.drained_s} s, lag {p.lag}"
            )
        return found + self.failures

    def summary(self) -> str:
        p = self.progress
        e = self.events
        lines = [
            f"accounts matching the model: {self.state.matching}/{self.state.expected}",
            f"zombie writes: {len(self.zombies)}",
            f"events: {e.distinct}/{self.expected_events} distinct, {e.records} records, "
            f"{e.duplicated} duplicated, {len(e.conflicting)} conflicting",
        ]
        if p is not None:
            lines.append(
                f"resumed after (s): {_rounded(p.resumed_s)}; drained after: {p.drained_s}"
            )
            lines.append(f"lag at the end: {p.lag}")
        return "\n".join(lines + self.failures + self.notes)

    def assert_holds(self) -> None:
        problems = self.problems
        assert not problems, "invariants broken:\n" + "\n".join(problems)


async def check_service(
    conn: Any,
    app_id: str,
    store: str,
    expected: Mapping[str, Any],
    *,
    guarantee: str = "at_least_once",
    expected_events: int | None = None,
    progress: Progress | None = None,
    resume_within: float = 10.0,
) -> Verdict:
    """Read the changelog and the events of `app_id` and check them against the model.

    `expected_events`: how many (command id, event index) pairs the model accepted (None:
    not counted).
    """
    from enhydra.kafka.clients import as_connection
    from enhydra.kafka.reading import read_all

    conn = as_connection(conn)
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    changelog = await read_all(conn, f"{app_id}-{store}-changelog", isolation_level=isolation)
    events = await read_all(conn, f"{app_id}-events", isolation_level=isolation)
    return Verdict(
        guarantee=guarantee,
        state=compare_state(restored_state(changelog), expected),
        zombies=zombie_writes(changelog),
        events=event_copies(events),
        expected_events=expected_events,
        progress=progress,
        resume_within=resume_within,
    )
