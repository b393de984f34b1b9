"""Backward compatibility of declared value schemas (a JSON Schema subset).

Backward compatible means the new code can read every value the old code wrote: the commands
still in the topic, the events in history, the states in the store. So a new optional field is
fine and a dropped field is fine (readers ignore it), while a new required field, a field
becoming required, a changed type, a shrunk enum or a tightened bound is not.

Understood keywords: type (a name or a list), properties, required, items, enum, anyOf,
local `$ref`s into `$defs` (what msgspec derives for nested and optional types), the bounds
minimum/maximum (and exclusive), minLength/maxLength, minItems/maxItems, pattern, and
additionalProperties: false.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A reader of the new type accepts every value of the old one.
_WIDENINGS = {("integer", "number")}
# keyword -> True when a larger value accepts more (a maximum), False when it accepts less.
_BOUNDS = {
    "minimum": False,
    "exclusiveMinimum": False,
    "minLength": False,
    "minItems": False,
    "maximum": True,
    "exclusiveMaximum": True,
    "maxLength": True,
    "maxItems": True,
}

Defs = Mapping[str, Any]


_JSON_TYPES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "object")


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    """The schema's JSON types; an enum or const without "type" (a Literal) has its values'."""
    kind = schema.get("type")
    if kind is not None:
        return {kind} if isinstance(kind, str) else set(kind)
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list) and values:
        return {_json_type(v) for v in values}
    return None


def _resolve(schema: Mapping[str, Any], defs: Defs, seen: frozenset[str]) -> Mapping[str, Any]:
    """A `#/$defs/Name` reference replaced by its definition (once per path: no cycles)."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and ref not in seen:
        target = defs.get(ref.rsplit("/", 1)[-1])
        if isinstance(target, Mapping):
            return _resolve(target, defs, seen | {ref})
    return schema


def _members(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    any_of = schema.get("anyOf")
    if isinstance(any_of, list):
        return [m for m in any_of if isinstance(m, Mapping)]
    return [schema]


def _accepts(widening: bool, old: Any, new: Any) -> bool:
    return new >= old if widening else new <= old


def _bounds(old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> list[tuple[bool, str]]:
    found: list[tuple[bool, str]] = []
    for keyword, widening in _BOUNDS.items():
        before, after = old.get(keyword), new.get(keyword)
        if before == after:
            continue
        if after is None:
            found.append((True, f"{path}: {keyword} {before} removed"))
        elif before is None or not _accepts(widening, before, after):
            found.append((False, f"{path}: {keyword} {before} -> {after}"))
        else:
            found.append((True, f"{path}: {keyword} relaxed {before} -> {after}"))
    if old.get("pattern") != new.get("pattern"):
        if new.get("pattern") is None:
            found.append((True, f"{path}: pattern removed"))
        else:
            shown = f"{old.get('pattern')!r} -> {new.get('pattern')!r}"
            found.append((False, f"{path}: pattern {shown}"))
    closed_before = old.get("additionalProperties") is False
    closed_after = new.get("additionalProperties") is False
    if closed_after and not closed_before:
        found.append((False, f"{path}: unknown fields now refused (additionalProperties: false)"))
    elif closed_before and not closed_after:
        found.append((True, f"{path}: unknown fields now accepted"))
    return found


def _alternatives(
    old: Mapping[str, Any], new: Mapping[str, Any], path: str, defs: tuple[Defs, Defs]
) -> list[tuple[bool, str]]:
    """Each old alternative (anyOf member) must still be read by a new one of its type."""
    found: list[tuple[bool, str]] = []
    olds = [_resolve(m, defs[0], frozenset()) for m in _members(old)]
    news = [_resolve(m, defs[1], frozenset()) for m in _members(new)]
    for member in olds:
        kinds = _types(member) or set()
        match = next((n for n in news if kinds and kinds <= (_types(n) or set())), None)
        if match is None and not kinds:
            match = news[0] if len(news) == 1 else None
        if match is None:
            found.append((False, f"{path}: no longer accepts {sorted(kinds) or member}"))
        else:
            found.extend(_compare(member, match, path, defs))
    for member in news:
        kinds = _types(member) or set()
        if kinds and not any(kinds <= (_types(o) or set()) for o in olds):
            found.append((True, f"{path}: now also accepts {sorted(kinds)}"))
    return found


def schema_differences(
    old: Mapping[str, Any], new: Mapping[str, Any], path: str = "$"
) -> list[tuple[bool, str]]:
    """(compatible, explanation) for each difference between two schemas."""
    defs = (old.get("$defs") or {}, new.get("$defs") or {})
    return _compare(old, new, path, defs)


def _compare(
    old: Mapping[str, Any], new: Mapping[str, Any], path: str, defs: tuple[Defs, Defs]
) -> list[tuple[bool, str]]:
    old, new = _resolve(old, defs[0], frozenset()), _resolve(new, defs[1], frozenset())
    if "anyOf" in old or "anyOf" in new:
        return _alternatives(old, new, path, defs)
    found: list[tuple[bool, str]] = []
    old_types, new_types = _types(old), _types(new)
    if old_types is not None and new_types is not None and old_types != new_types:
        lost = {
            t
            for t in old_types
            if t not in new_types and not any((t, n) in _WIDENINGS for n in new_types)
        }
        if lost:
            found.append((False, f"{path}: type {sorted(old_types)} -> {sorted(new_types)}"))
        else:
            found.append((True, f"{path}: type widened {sorted(old_types)} -> {sorted(new_types)}"))
    elif old_types is None and new_types is not None:
        found.append((False, f"{path}: now restricted to type {sorted(new_types)}"))
    if "enum" in old or "enum" in new:
        old_enum, new_enum = old.get("enum"), new.get("enum")
        if new_enum is not None:
            missing = [v for v in (old_enum or []) if v not in new_enum]
            if old_enum is None or missing:
                shown = missing if old_enum is not None else "any value"
                found.append((False, f"{path}: enum no longer accepts {shown}"))
            elif len(new_enum) > len(old_enum):
                added = [v for v in new_enum if v not in old_enum]
                found.append((True, f"{path}: enum accepts new values {added}"))
        else:
            found.append((True, f"{path}: enum restriction removed"))
    found.extend(_bounds(old, new, path))
    old_props = old.get("properties") or {}
    new_props = new.get("properties") or {}
    old_req, new_req = set(old.get("required") or ()), set(new.get("required") or ())
    for name in sorted(set(new_props) - set(old_props)):
        if name in new_req:
            found.append((False, f"{path}.{name}: new required field (old values lack it)"))
        else:
            found.append((True, f"{path}.{name}: new optional field"))
    for name in sorted(set(old_props) - set(new_props)):
        found.append((True, f"{path}.{name}: field removed (readers ignore it)"))
    for name in sorted(set(old_props) & set(new_props)):
        found.extend(_compare(old_props[name], new_props[name], f"{path}.{name}", defs))
        if name in new_req and name not in old_req:
            found.append((False, f"{path}.{name}: now required (old values may lack it)"))
        elif name in old_req and name not in new_req:
            found.append((True, f"{path}.{name}: no longer required"))
    for name in sorted((new_req - old_req) - set(new_props)):
        found.append((False, f"{path}.{name}: now required (old values may lack it)"))
    if isinstance(old.get("items"), Mapping) and isinstance(new.get("items"), Mapping):
        found.extend(_compare(old["items"], new["items"], f"{path}[]", defs))
    return found
