"""Backward compatibility of declared value schemas (a JSON Schema subset).

Backward compatible means the new code can read every value the old code wrote: the commands
still in the topic, the events in history, the states in the store. So a new optional field is
fine and a dropped field is fine (readers ignore it), while a new required field, a field
becoming required, a changed type or a shrunk enum is not.

Understood keywords: type (a name or a list), properties, required, items, enum.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A reader of the new type accepts every value of the old one.
_WIDENINGS = {("integer", "number")}


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def schema_differences(
    old: Mapping[str, Any], new: Mapping[str, Any], path: str = "$"
) -> list[tuple[bool, str]]:
    """(compatible, explanation) for each difference between two schemas."""
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
        found.extend(schema_differences(old_props[name], new_props[name], f"{path}.{name}"))
        if name in new_req and name not in old_req:
            found.append((False, f"{path}.{name}: now required (old values may lack it)"))
        elif name in old_req and name not in new_req:
            found.append((True, f"{path}.{name}: no longer required"))
    for name in sorted((new_req - old_req) - set(new_props)):
        found.append((False, f"{path}.{name}: now required (old values may lack it)"))
    if isinstance(old.get("items"), Mapping) and isinstance(new.get("items"), Mapping):
        found.extend(schema_differences(old["items"], new["items"], f"{path}[]"))
    return found
