"""Compare two topologies and say, for each difference, whether a rolling bounce can deploy it.

Kafka Streams users learn these rules in production; here they are checked before a deploy:

| change | verdict | upgrade path |
| --- | --- | --- |
| handler logic (decide/apply/parse, a projection's project) | compatible | rolling bounce |
| value schema, backward compatible (new optional field...) | compatible | rolling bounce |
| an added projection (an independent branch), DLQ on/off | compatible | rolling bounce |
| partition count of an input topic | incompatible | repartition |
| key type or key serde | incompatible | repartition |
| store renamed or removed, store value serde | incompatible | offline reset |
| input topic added or removed, app id | incompatible | offline reset |
| value schema not backward compatible | incompatible | offline reset |
| event: new version, upcasters from every version in history | compatible | rolling bounce |
| event: changed at the same version, missing upcaster step | incompatible | change the code |
| event: history holds versions newer than the code reads | incompatible | change the code |
| event type removed (the history holds it) | incompatible | offline reset |
| command type removed, command schema narrowed | incompatible | senders first |
| state version raised with migrations | compatible | rolling bounce |
| state version lowered, state schema changed at the same version | incompatible | offline reset |

The message rules compare the `messages` sections (model.messages_section): the baseline's
event versions are every version ever deployed (baseline.py), so "the history holds" them.

The check is pure: two JSON documents in, a list of `Change`s out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from enhydra.topology.baseline import history_versions
from enhydra.topology.schema import schema_differences


class Path(StrEnum):
    """How to deploy a change."""

    ROLLING_BOUNCE = "rolling bounce"
    OFFLINE_RESET = "offline reset"
    REPARTITION = "repartition"
    SENDERS_FIRST = "senders first"
    CHANGE_CODE = "change the code"


ADVICE = {
    Path.ROLLING_BOUNCE: "restart the instances one at a time with the new version; state, "
    "offsets and topics stay as they are",
    Path.OFFLINE_RESET: "stop every instance, run `enhydra reset --app <app>` (offsets, "
    "changelogs, local state), deploy the new version; it reprocesses the input from the "
    "chosen point (or load a snapshot rebuilt by a backfill and reset to its cut)",
    Path.REPARTITION: "keys would land in other partitions: create new topics with the new "
    "layout, copy the input into them keyed and partitioned by the default partitioner, point "
    "the new version (a new app id) at them and let it rebuild its state",
    Path.SENDERS_FIRST: "commands of the old shape would go to the dead-letter queue: move "
    "every sender to a shape both versions accept (or stop it), let the commands topic drain, "
    "then restart the instances one at a time",
    Path.CHANGE_CODE: "no deploy procedure makes this safe: the events topic keeps every event "
    "forever and every reader (service, projections, backfill, time travel) folds it; change "
    "the code as the line says and check again",
}
# From the lightest to the heaviest: the whole set needs the heaviest path of its changes.
_ORDER = [
    Path.ROLLING_BOUNCE,
    Path.SENDERS_FIRST,
    Path.OFFLINE_RESET,
    Path.REPARTITION,
    Path.CHANGE_CODE,
]


@dataclass(frozen=True)
class Change:
    subject: str
    detail: str
    compatible: bool
    path: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "detail": self.detail,
            "compatible": self.compatible,
            "upgrade": str(self.path),
        }


def _ok(subject: str, detail: str) -> Change:
    return Change(subject, detail, True, Path.ROLLING_BOUNCE)


def _bad(subject: str, detail: str, path: Path = Path.OFFLINE_RESET) -> Change:
    return Change(subject, detail, False, path)


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def _key_changes(subject: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    old_key, new_key = old.get("key") or {}, new.get("key") or {}
    changes = []
    if old_key.get("serde") != new_key.get("serde"):
        detail = f"key serde changed: {old_key.get('serde')} -> {new_key.get('serde')}"
        changes.append(_bad(subject, detail, Path.REPARTITION))
    if old_key.get("type") != new_key.get("type"):
        detail = f"key type changed: {old_key.get('type')} -> {new_key.get('type')}"
        changes.append(_bad(subject, detail, Path.REPARTITION))
    return changes


def _value_changes(subject: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    old_value, new_value = old.get("value") or {}, new.get("value") or {}
    if old_value.get("serde") != new_value.get("serde"):
        detail = f"value serde changed: {old_value.get('serde')} -> {new_value.get('serde')}"
        return [_bad(subject, detail)]
    old_schema, new_schema = old_value.get("schema"), new_value.get("schema")
    if old_schema == new_schema:
        return []
    if old_schema is None:
        return [_ok(subject, "value schema declared (nothing to compare it with)")]
    if new_schema is None:
        return [_ok(subject, "value schema no longer declared (nothing checked)")]
    changes = []
    for compatible, explanation in schema_differences(old_schema, new_schema):
        if compatible:
            changes.append(_ok(subject, f"backward-compatible value schema change: {explanation}"))
        else:
            changes.append(_bad(subject, f"value schema not backward compatible: {explanation}"))
    return changes


def _topics(kind: str, old: list, new: list, *, inputs: bool) -> list[Change]:
    changes: list[Change] = []
    old_by, new_by = _by_name(old), _by_name(new)
    for name in sorted(old_by.keys() - new_by.keys()):
        subject = f"{kind} {name}"
        if inputs:
            changes.append(_bad(subject, "input topic removed: committed offsets lose meaning"))
        else:
            changes.append(_ok(subject, "output topic no longer written (tell its consumers)"))
    for name in sorted(new_by.keys() - old_by.keys()):
        subject = f"{kind} {name}"
        if inputs:
            detail = "input topic added: no committed offsets, state never saw its records"
            changes.append(_bad(subject, detail))
        else:
            changes.append(_ok(subject, "new output topic"))
    for name in sorted(old_by.keys() & new_by.keys()):
        subject = f"{kind} {name}"
        o, n = old_by[name], new_by[name]
        if o.get("partitions") != n.get("partitions"):
            detail = f"partition count changed: {o.get('partitions')} -> {n.get('partitions')}"
            changes.append(_bad(subject, detail, Path.REPARTITION))
        changes.extend(_key_changes(subject, o, n))
        changes.extend(_value_changes(subject, o, n))
    return changes


def _stores(old: list, new: list) -> list[Change]:
    changes: list[Change] = []
    old_by, new_by = _by_name(old), _by_name(new)
    removed = sorted(old_by.keys() - new_by.keys())
    added = sorted(new_by.keys() - old_by.keys())
    if len(removed) == 1 and len(added) == 1:
        detail = (
            f"store renamed {removed[0]!r} -> {added[0]!r}: its changelog "
            f"{new_by[added[0]].get('changelog')} starts empty, the state would be lost"
        )
        return [_bad(f"store {removed[0]}", detail)]
    for name in removed:
        changes.append(_bad(f"store {name}", "store removed: its state would be lost"))
    for name in added:
        detail = "store added: it would start empty while the input offsets are committed"
        changes.append(_bad(f"store {name}", detail))
    for name in sorted(old_by.keys() & new_by.keys()):
        subject = f"store {name}"
        o, n = old_by[name], new_by[name]
        if o.get("changelog") != n.get("changelog"):
            detail = f"changelog changed: {o.get('changelog')} -> {n.get('changelog')}"
            changes.append(_bad(subject, detail))
        if o.get("partitions") != n.get("partitions"):
            detail = f"partition count changed: {o.get('partitions')} -> {n.get('partitions')}"
            changes.append(_bad(subject, detail, Path.REPARTITION))
        changes.extend(_key_changes(subject, o, n))
        changes.extend(_value_changes(subject, o, n))
    return changes


def _handlers(old: list, new: list) -> list[Change]:
    changes = []
    old_by = {h.get("store"): h for h in old}
    for handler in new:
        previous = old_by.get(handler.get("store"))
        if previous is None:
            continue  # reported with the store
        subject = f"handlers of {handler.get('store')}"
        for role in ("decide", "apply", "parse"):
            if previous.get(role) != handler.get(role):
                detail = f"{role} changed: {previous.get(role)} -> {handler.get(role)}"
                changes.append(_ok(subject, detail))
        if previous.get("code") != handler.get("code"):
            detail = (
                "handler logic changed (stored state keeps what the old logic computed; "
                "reset to reprocess if the change must apply to history)"
            )
            changes.append(_ok(subject, detail))
    return changes


def _projections(old: list, new: list) -> list[Change]:
    changes: list[Change] = []
    old_by, new_by = _by_name(old), _by_name(new)
    for name in sorted(new_by.keys() - old_by.keys()):
        detail = "projection added: an independent branch, it builds from the events topic"
        changes.append(_ok(f"projection {name}", detail))
    for name in sorted(old_by.keys() - new_by.keys()):
        detail = (
            f"projection removed: its group {old_by[name].get('group')} and changelog "
            f"{old_by[name].get('changelog')} stay until deleted"
        )
        changes.append(_ok(f"projection {name}", detail))
    for name in sorted(old_by.keys() & new_by.keys()):
        subject = f"projection {name}"
        o, n = old_by[name], new_by[name]
        for field in ("source", "group", "changelog"):
            if o.get(field) != n.get(field):
                detail = f"{field} changed: {o.get(field)} -> {n.get(field)}"
                changes.append(_bad(subject, detail))
        if o.get("partitions") != n.get("partitions"):
            detail = f"partition count changed: {o.get('partitions')} -> {n.get('partitions')}"
            changes.append(_bad(subject, detail, Path.REPARTITION))
        changes.extend(_key_changes(subject, o, n))
        changes.extend(_value_changes(subject, o, n))
        if o.get("project") != n.get("project") or o.get("code") != n.get("code"):
            detail = (
                "project logic changed (the read model keeps what the old logic computed; "
                "reset the projection to rebuild it)"
            )
            changes.append(_ok(subject, detail))
    return changes


def _reactions(old: list, new: list) -> list[Change]:
    """A reaction's group holds how far it has read upstream: a new group (or input) reads the
    upstream's whole history again, and commands older than dedup_window would apply twice."""
    changes: list[Change] = []
    old_by, new_by = _by_name(old), _by_name(new)
    for name in sorted(new_by.keys() - old_by.keys()):
        detail = f"reaction added: reads {new_by[name].get('input')} from its start"
        changes.append(_ok(f"reaction {name}", detail))
    for name in sorted(old_by.keys() - new_by.keys()):
        detail = f"reaction removed: its group {old_by[name].get('group')} stays until deleted"
        changes.append(_ok(f"reaction {name}", detail))
    for name in sorted(old_by.keys() & new_by.keys()):
        subject = f"reaction {name}"
        o, n = old_by[name], new_by[name]
        for field in ("input", "group"):
            if o.get(field) != n.get(field):
                detail = (
                    f"{field} changed: {o.get(field)} -> {n.get(field)} (the upstream's history "
                    "is read again from its start)"
                )
                changes.append(_bad(subject, detail))
        if o.get("sends") != n.get("sends"):
            detail = f"sends to {o.get('sends')} -> {n.get('sends')}"
            changes.append(_ok(subject, detail))
        if o.get("react") != n.get("react") or o.get("code") != n.get("code"):
            changes.append(_ok(subject, "react logic changed (applies to events read from now)"))
    return changes


def _internal(old: list, new: list) -> list[Change]:
    changes = []
    old_roles = {(t.get("role"), t["name"]) for t in old if t.get("role") in ("dlq", "control")}
    new_roles = {(t.get("role"), t["name"]) for t in new if t.get("role") in ("dlq", "control")}
    for role, name in sorted(new_roles - old_roles):
        changes.append(_ok(f"internal topic {name}", f"{role} topic added"))
    for role, name in sorted(old_roles - new_roles):
        changes.append(_ok(f"internal topic {name}", f"{role} topic no longer used"))
    return changes


def _listed(versions: list[int]) -> str:
    return ", ".join(str(v) for v in versions)


def _at_same_version(
    subject: str,
    old_schema: Mapping[str, Any] | None,
    new_schema: Mapping[str, Any] | None,
    *,
    compatible: str,
    incompatible: Callable[[str], str],
    path: Path,
) -> list[Change]:
    """A schema changed under the same version: fine only while every old value still reads
    (events in the history, entries in the store); `incompatible` words the fix."""
    if old_schema is None or new_schema is None or old_schema == new_schema:
        return []
    found = schema_differences(old_schema, new_schema)
    narrowed = "; ".join(explanation for ok, explanation in found if not ok)
    if narrowed:
        return [_bad(subject, incompatible(narrowed), path)]
    return [_ok(subject, f"{compatible}: {explanation}") for _, explanation in found]


def _event_changes(name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """One event type the history holds (`old`, from the baseline) read by the code (`new`)."""
    subject = f"event {name}"
    held = history_versions(old)
    current = new.get("version", 1)
    steps = set(new.get("upcasters") or ())
    changes: list[Change] = []
    newer = [v for v in held if v > current]
    if newer:
        detail = (
            f"the history holds version(s) {_listed(newer)} of {name}, this code reads versions "
            f"up to {current}: every reader would refuse them; declare "
            f"event_versions[{name!r}] = {max(newer)} with its upcasters"
        )
        changes.append(_bad(subject, detail, Path.CHANGE_CODE))
    older = [v for v in held if v < current]
    missing = [s for s in range(min(older), current) if s not in steps] if older else []
    for step in missing:
        detail = (
            f"no upcaster from {step} to {step + 1}: events {name} of version(s) "
            f"{_listed([v for v in older if v <= step])} in the history cannot reach version "
            f"{current}; add upcasters[({name!r}, {step})]"
        )
        changes.append(_bad(subject, detail, Path.CHANGE_CODE))
    if older and not missing and current not in held:
        detail = (
            f"version {max(held)} -> {current}: events of version(s) {_listed(older)} are "
            "upcast on read"
        )
        changes.append(_ok(subject, detail))
    if current in held:
        changes += _at_same_version(
            subject,
            (old.get("schemas") or {}).get(str(current)),
            (new.get("schemas") or {}).get(str(current)),
            compatible=f"backward-compatible change at version {current}",
            incompatible=lambda narrowed: (
                f"event type {name} changed at version {current} without a new version "
                f"({narrowed}): the history holds events of the old shape; bump "
                f"event_versions[{name!r}] to {current + 1} and add upcasters[({name!r}, "
                f"{current})]"
            ),
            path=Path.CHANGE_CODE,
        )
    return changes


def _events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    old_events = old.get("events") or {}
    retired = old.get("retired_events") or {}
    new_events = new.get("events") or {}
    typed = bool(new.get("typed"))
    # Without declared types, the code reads an unlisted event type at version 1 only.
    implicit = {"version": 1, "schemas": {}, "upcasters": []}
    changes: list[Change] = []
    for name in sorted(old_events.keys() | (retired.keys() & new_events.keys())):
        held = old_events.get(name) or retired[name]
        if name in new_events or not typed:
            changes += _event_changes(name, held, new_events.get(name, implicit))
            continue
        detail = (
            f"event type {name} removed: the history holds it (versions "
            f"{_listed(history_versions(held))}), apply can no longer read it; keep the type "
            "(apply may ignore it), or rebuild the state offline from a backfill without it"
        )
        changes.append(_bad(f"event {name}", detail))
    for name in sorted(new_events.keys() - old_events.keys() - retired.keys()):
        entry = new_events[name]
        if old.get("typed"):
            changes.append(_ok(f"event {name}", f"new event type (version {entry['version']})"))
        else:  # the old code declared no types: its history may hold this type at version 1
            changes += _event_changes(name, implicit, entry)
    return changes


def _commands(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    old_commands, new_commands = old.get("commands") or {}, new.get("commands") or {}
    if not new.get("typed") or not old.get("typed"):
        if old_commands == new_commands:
            return []
        detail = (
            "command types declared: commands that fit none go to the dead-letter queue "
            "(no declared types before to compare them with)"
            if new_commands
            else "command types no longer declared: nothing checks their shape at the edge"
        )
        return [_ok("commands", detail)]
    changes: list[Change] = []
    for name in sorted(old_commands.keys() - new_commands.keys()):
        detail = (
            f"command type {name} removed: senders still sending it get their commands sent "
            "to the dead-letter queue"
        )
        changes.append(_bad(f"command {name}", detail, Path.SENDERS_FIRST))
    for name in sorted(new_commands.keys() - old_commands.keys()):
        changes.append(_ok(f"command {name}", "new command type"))
    for name in sorted(old_commands.keys() & new_commands.keys()):
        old_schema = old_commands[name].get("schema")
        new_schema = new_commands[name].get("schema")
        if old_schema is None or new_schema is None or old_schema == new_schema:
            continue
        for compatible, explanation in schema_differences(old_schema, new_schema):
            if compatible:
                changes.append(_ok(f"command {name}", f"command schema widened: {explanation}"))
            else:
                detail = (
                    f"command schema narrowed: {explanation}: senders still writing the old "
                    "shape go to the dead-letter queue"
                )
                changes.append(_bad(f"command {name}", detail, Path.SENDERS_FIRST))
    return changes


def _state(store: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    subject = f"state of {store}"
    before, after = old.get("version", 1), new.get("version", 1)
    if after < before:
        detail = (
            f"state version lowered {before} -> {after}: the store holds entries of version "
            f"{before} that this code refuses; rebuild the state offline"
        )
        return [_bad(subject, detail)]
    if after > before:
        steps = set(new.get("migrations") or ())
        missing = [s for s in range(before, after) if s not in steps]
        if missing:
            detail = (
                f"state version {before} -> {after} without a migration from "
                f"{_listed(missing)}: add state_migrations[{missing[0]}]"
            )
            return [_bad(subject, detail)]
        return [_ok(subject, f"state version {before} -> {after}: entries are migrated on load")]
    return _at_same_version(
        subject,
        old.get("schema"),
        new.get("schema"),
        compatible="backward-compatible state change",
        incompatible=lambda narrowed: (
            f"state changed at version {after} without a new version ({narrowed}): the store "
            f"holds entries of the old shape; bump state_version to {after + 1} and add "
            f"state_migrations[{after}], or rebuild the state offline"
        ),
        path=Path.OFFLINE_RESET,
    )


def _messages(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[Change]:
    """The message contracts: event versions against the history, commands, stored state."""
    if new is None:
        return []
    if old is None:
        return [_ok("messages", "message contracts declared (the baseline has none yet)")]
    return (
        _events(old, new)
        + _commands(old, new)
        + _state(new.get("store") or "?", old.get("state") or {}, new.get("state") or {})
    )


def compare(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """Every difference between the deployed topology `old` and the candidate `new`."""
    changes: list[Change] = []
    if old["app_id"] != new["app_id"]:
        detail = (
            f"app id changed: {old['app_id']} -> {new['app_id']} (a new consumer group and "
            "new topics: the new app starts from nothing unless cloned from a snapshot)"
        )
        changes.append(_bad("application", detail))
    changes += _topics("input topic", old["input_topics"], new["input_topics"], inputs=True)
    changes += _topics("output topic", old["output_topics"], new["output_topics"], inputs=False)
    changes += _stores(old["stores"], new["stores"])
    changes += _handlers(old["handlers"], new["handlers"])
    changes += _projections(old["projections"], new["projections"])
    changes += _reactions(old.get("reactions") or [], new.get("reactions") or [])
    if old.get("sagas") or new.get("sagas"):
        from enhydra.topology.sagas import saga_changes

        changes += saga_changes(old.get("sagas") or [], new.get("sagas") or [], _ok, _bad)
    changes += _internal(old["internal_topics"], new["internal_topics"])
    changes += _messages(old.get("messages"), new.get("messages"))
    return changes


def verdict(changes: list[Change]) -> Path | None:
    """The upgrade path the whole set needs (the heaviest one), or None when nothing changed."""
    if not changes:
        return None
    return max((c.path for c in changes), key=_ORDER.index)


def render(changes: list[Change], *, app_id: str, against: str) -> str:
    """A report for people: each change, its verdict and what to do."""
    lines = [f"topology check of {app_id} against {against}"]
    if not changes:
        lines.append("  no changes")
    for change in changes:
        mark = "compatible  " if change.compatible else "INCOMPATIBLE"
        lines.append(f"  {mark}  {change.subject}: {change.detail}")
        lines.append(f"                upgrade path: {change.path}")
    path = verdict(changes)
    bad = [c for c in changes if not c.compatible]
    if path is not None:
        lines.append("")
        lines.append(f"upgrade path: {path}: {ADVICE[path]}")
    if bad:
        lines.append(f"result: {len(bad)} incompatible change(s)")
    else:
        lines.append("result: compatible")
    return "\n".join(lines)
