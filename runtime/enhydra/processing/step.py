"""The aggregate's step: decide/apply over one partition's records, and what it publishes.

`process_batch` (core.py) is the pure part; this turns its result into what the task runner
makes durable: events (with the contract headers), rejections and dead letters, in that order,
then the changed entries. A record that failed goes to its error policy here: a dead letter
with its origin, a log line, or a RecordFailed that stops the worker.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from enhydra import tracing
from enhydra.aggregate import BoundAggregate
from enhydra.contracts.codec import Entry, decode_entry
from enhydra.contracts.headers import VERSION_1, command_event_headers
from enhydra.contracts.sizes import MAX_REQUEST_SIZE
from enhydra.errors.dlq import dead_letter_headers, within
from enhydra.errors.failure import Failure
from enhydra.errors.policies import ErrorAction, ErrorPolicies, RecordFailed, fails
from enhydra.evolution import version_headers
from enhydra.logs import get_logger
from enhydra.processing.cache import EntryCache
from enhydra.processing.core import BatchResult, Rejected, entry_records, process_batch
from enhydra.runner.batch import Out, StepOutput
from enhydra.runner.tasks import Task
from enhydra.settings import Settings

if TYPE_CHECKING:
    from enhydra.tracing.spans import BatchTrace

log = get_logger("enhydra.engine")

# Rejections the status page shows (query/recent.py): the last few this instance published.
RECENT_REJECTIONS = 50


def event_outputs(
    result: BatchResult,
    version_of: Callable[[Any], tuple[str, bytes]] | None = None,
    traces: Mapping[int, Sequence[tuple[str, bytes]]] | None = None,
) -> list[Out]:
    """The batch's events in input order, each with the headers of the contract.

    `version_of` gives an event's version header (evolution.version_headers); None: every
    event is version 1. `traces`: command offset -> the trace context headers its events
    carry (tracing on). Built straight into one list because this runs once per output record.
    """
    events: list[Out] = []
    append = events.append
    for emitted in result.emitted:
        key = emitted.key.encode("utf-8")
        payloads = emitted.payloads
        if version_of is not None:
            events_of = emitted.events
            if len(events_of) == 1:
                versions = (version_of(events_of[0]),)
            else:
                versions = [version_of(event) for event in events_of]
        else:
            versions = _VERSION_1 * len(payloads)  # one event: the same tuple, no copy
        headers = command_event_headers(
            emitted.command_id.encode("utf-8"), emitted.offset, versions
        )
        if traces and (context := traces.get(emitted.offset)):
            for each in headers:
                each.extend(context)
        if len(payloads) == 1:
            append((key, payloads[0], headers[0]))
            continue
        for payload, event_headers in zip(payloads, headers, strict=True):
            append((key, payload, event_headers))
    return events


_VERSION_1 = (VERSION_1,)


class AggregateStep:
    """decide/apply for one partition's records (the runner's step for an aggregate)."""

    counters = ("events", "rejections", "skipped")
    # The batch's entries are staged in the task's cache until durable (cache.py), so the
    # runner may compute the next batch, or the next slice, while this one is published.
    reads_unpersisted = True

    def __init__(
        self,
        settings: Settings,
        aggregate: BoundAggregate,
        policies: ErrorPolicies,
        transient: tuple[type[BaseException], ...],
    ) -> None:
        self.settings = settings
        self.aggregate = aggregate
        self.policies = policies
        self.transient = transient
        self.version_of = version_headers(aggregate.aggregate)
        self.tracing = tracing.current(settings.app_id)  # None: off, nothing to do per batch
        # The largest record the broker takes (checkpoint.record_limit; the runner sets it once
        # it has learned the topics'). Events, rejections and entries also keep within
        # max_output_bytes; a dead letter, a copy of its command, only within this.
        self.max_record_bytes = MAX_REQUEST_SIZE
        # (partition, when published, rejection): a ring buffer, filled once a batch is durable
        # so a batch that is retried shows its rejections once.
        self.recent_rejections: deque[tuple[int, float, Rejected]] = deque(maxlen=RECENT_REJECTIONS)

    def new_cache(self) -> EntryCache:
        return EntryCache(self.settings.state_cache_entries)

    def __call__(self, task: Task, records: list[Any], give_up: Mapping[int, int]) -> StepOutput:
        run = self.slices(task, records, give_up, len(records) or 1)
        while True:
            try:
                next(run)
            except StopIteration as done:
                return done.value

    def slices(
        self, task: Task, records: list[Any], give_up: Mapping[int, int], size: int
    ) -> Generator[None, None, StepOutput]:
        """The step over `size` records at a time, pausing between slices; returns its output.

        The slices share one BatchResult, so the batch is the same as in one call; the runner
        lets the event loop run at each pause.
        """
        store = task.store
        cached = task.cache.get

        def load(key: str) -> Entry | None:
            entry = cached(key)
            if entry is not None:
                return entry
            raw = store.get(key.encode("utf-8"))
            return decode_entry(raw) if raw is not None else None

        s = self.settings
        agg = self.aggregate
        traced = None
        if self.tracing is not None:
            traced = self.tracing.batch(f"decide {agg.name}", task.partition)
        limit = min(s.max_output_bytes, self.max_record_bytes)
        batch = functools.partial(
            process_batch,
            agg.aggregate,
            load=load,
            dedup_window=s.dedup_window,
            transient=self.transient,
            give_up=give_up,
            max_output_bytes=limit,
            partition=task.partition,  # a record on another partition than its key's fails
            partitions=s.partitions,
        )
        result = BatchResult()
        for at in range(0, len(records), size):
            if at:
                yield
            batch(records[at : at + size] if size < len(records) else records, into=result)
            if result.interrupted is not None:
                break

        interrupted, last_offset = result.interrupted, result.last_offset

        def again(checked: set[str]) -> BatchResult:
            """The records handled, once more, checking every change of the keys in `checked`.

            Rare (a state grew too large); decide runs again for these records.
            """
            rerun = batch([r for r in records if r.offset <= last_offset], checked=checked)
            if rerun.interrupted is None:
                rerun.interrupted, rerun.last_offset = interrupted, last_offset
            return rerun

        result, puts = entry_records(result, limit, again)
        outputs: dict[str, list[Out]] = {}
        traces = contexts = None
        if traced is not None:
            traces, contexts = _follow(traced, records, result)
        events = event_outputs(result, self.version_of, traces)
        if events:
            outputs[agg.events_topic] = events
        if result.rejected:
            outputs[agg.rejections_topic] = [
                (
                    r.key.encode("utf-8") if r.key is not None else None,
                    r.payload,
                    list(traces[r.offset]) if traces and r.offset in traces else None,
                )
                for r in result.rejected
            ]
        letters = self._dead_letters(task.partition, result.failures, self.max_record_bytes)
        if letters:
            outputs[s.dlq_topic] = letters
        interrupted = result.interrupted
        changed = result.changed
        if changed:
            task.cache.stage(changed)
        rejected, recent = result.rejected, self.recent_rejections

        def persisted() -> None:
            task.cache.persisted(changed)
            if rejected:
                now = time.time()
                recent.extend((task.partition, now, r) for r in rejected)

        return StepOutput(
            outputs=outputs,
            puts=puts,
            last_offset=result.last_offset,
            counts={
                "events": result.event_count,
                "rejections": len(result.rejected),
                "skipped": result.skipped,
            },
            failed=[f"{f.stage}:{type(f.error).__name__}" for f in result.failures],
            interrupted=(
                (interrupted.record.offset, interrupted.error) if interrupted is not None else None
            ),
            persisted=persisted,
            traced=contexts or (),
        )

    def _dead_letters(self, partition: int, failures: list[Failure], limit: int) -> list[Out]:
        return dead_letters(
            failures,
            self.policies,
            self.settings,
            topic=self.aggregate.commands_topic,
            partition=partition,
            limit=limit,
        )


def _follow(
    traced: BatchTrace, records: list[Any], result: BatchResult
) -> tuple[dict[int, Sequence[tuple[str, bytes]]], list[Any]]:
    """Continue the trace of each command that made events or was rejected (tracing on).

    Returns command offset -> the context headers its outputs carry, and the recorded spans.
    An unsampled context is passed on as it is; a sampled one gets a span per command.
    """
    traces, asked = traced.split(records)
    if asked:
        for emitted in result.emitted:
            offset = emitted.offset
            if offset in asked:
                context = traced.follow(asked[offset], offset, emitted.command_id)
                if context is not None:
                    traces[offset] = context
        for rejected in result.rejected:
            offset = rejected.offset
            if offset in asked:
                context = traced.follow(asked[offset], offset, rejected.command_id, rejected.reason)
                if context is not None:
                    traces[offset] = context
    return traces, traced.finish()


def dead_letters(
    failures: list[Failure],
    policies: ErrorPolicies,
    settings: Settings,
    *,
    topic: str,
    partition: int,
    limit: int,
) -> list[Out]:
    """Apply each failure's policy: dead letters to publish, a log line, or stop.

    `topic` and `partition` are where the failed records came from. A dead letter too large
    for the DLQ is cut to fit (errors/dlq.py `within`), not lost.
    """
    s = settings
    letters: list[Out] = []
    for failure in failures:
        action = policies.action(failure)
        context = {
            "stage": str(failure.stage),
            "partition": partition,
            "offset": failure.record.offset,
            "key": failure.key,
            "error": f"{type(failure.error).__name__}: {failure.error}",
            "attempts": failure.attempts,
        }
        if fails(action):
            log.error("record failed; stopping the worker", action=str(action), **context)
            raise RecordFailed(failure, topic, partition)
        if action is ErrorAction.DLQ:
            headers = dead_letter_headers(
                failure,
                topic=topic,
                partition=partition,
                app_id=s.app_id,
                instance_id=s.instance_id,
            )
            letters.append(within(failure.record.key, failure.record.value, headers, limit))
            log.warning("record sent to the dead-letter queue", dlq=s.dlq_topic, **context)
        else:
            log.warning("record skipped", action=str(action), **context)
    return letters
