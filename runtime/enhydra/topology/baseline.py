"""The committed baseline, topology.json: what runs in production, or will at the first deploy.

Before the first deploy nothing can break, so the baseline follows the code: it is marked
`"deployed": false` and `enhydra topology lock` rewrites it (a generated project's tests do it).
`enhydra topology lock --deployed` marks it deployed; from then on `enhydra topology check` and
the tests fail on a change that a rolling bounce cannot deploy. A baseline without the mark
(written by `topology show -o`, or before the mark existed) counts as deployed: strict is safe.

Events are kept forever, so a deployed baseline only grows in what it says about them: each
event type lists every version ever deployed (`versions`) and keeps the schema of each
(`schemas`), and an event type the code no longer declares moves to
`messages.retired_events`. `enhydra topology check` holds the code to all of them. Commands
and states are not kept this way: commands are transient, and a stored state is migrated on
load or rebuilt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEPLOYED = "deployed"
MESSAGES = "messages"
RETIRED = "retired_events"


class BaselineError(ValueError):
    """The baseline may not be rewritten this way; the message says what to run instead."""


def is_deployed(baseline: Mapping[str, Any]) -> bool:
    """True unless the baseline is explicitly marked `"deployed": false`."""
    return baseline.get(DEPLOYED, True) is not False


def history_versions(event: Mapping[str, Any]) -> list[int]:
    """The versions of one event type that the history may hold, by a baseline's entry.

    The version deployed, those it kept a schema of or listed as deployed, and those its code
    upcast from (that code read them, so older code wrote them).
    """
    versions = {int(v) for v in event.get("schemas") or {}}
    versions.update(event.get("versions") or ())
    versions.update(event.get("upcasters") or ())
    versions.add(event.get("version", 1))
    return sorted(versions)


def _merged_event(current: Mapping[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """The code's entry for an event type, keeping what the deployed baseline knew of it."""
    schemas = {**(previous.get("schemas") or {}), **(current.get("schemas") or {})}
    versions = sorted(set(history_versions(previous)) | set(history_versions(current)))
    return {
        **current,
        "schemas": dict(sorted(schemas.items(), key=lambda item: int(item[0]))),
        "versions": versions,
    }


def _grown_messages(current: Mapping[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """The code's message contracts plus every event version the previous baseline held."""
    before = {**(previous.get(RETIRED) or {}), **(previous.get("events") or {})}
    events = {
        name: _merged_event(entry, before.get(name, {}))
        for name, entry in (current.get("events") or {}).items()
    }
    retired = {
        name: {**entry, "versions": history_versions(entry)}
        for name, entry in sorted(before.items())
        if name not in events
    }
    grown = {**current, "events": events}
    if retired:
        grown[RETIRED] = retired
    return grown


def locked(
    current: Mapping[str, Any], previous: Mapping[str, Any] | None, *, deployed: bool
) -> dict[str, Any]:
    """The baseline to write for `current` (a topology), the mark placed right after `format`.

    Refuses to turn a deployed baseline back into one that follows the code: that would let
    an incompatible change through unnoticed. After a deployed baseline, the new one keeps
    every event version and event type the previous held (see the module docstring).
    """
    if previous is not None and is_deployed(previous) and not deployed:
        raise BaselineError(
            "the baseline is marked deployed (it is what runs in production), so it is only "
            "rewritten after a deploy: run `enhydra topology lock --deployed` then"
        )
    rest = {k: v for k, v in current.items() if k not in ("format", DEPLOYED)}
    if previous is not None and is_deployed(previous) and MESSAGES in rest:
        rest[MESSAGES] = _grown_messages(rest[MESSAGES], previous.get(MESSAGES) or {})
    return {"format": current["format"], DEPLOYED: deployed, **rest}
