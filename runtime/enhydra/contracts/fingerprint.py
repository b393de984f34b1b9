"""The fingerprint of a topology: what must not change for state and offsets to stay valid.

It covers the parts whose change `enhydra topology check` calls incompatible for the aggregate:
the app id, the input topics (name, partitions, key), and the aggregate's stores (name,
changelog, partitions, key and value serdes). Handler code, value schemas, the DLQ and
projections are left out: they change in a rolling bounce, and a snapshot taken before such a
change still fits the service after it. `enhydra topology` compares it; snapshots record it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def compatibility_view(topology: Mapping[str, Any]) -> dict[str, Any]:
    """The compatibility-relevant parts of a topology, in a canonical order."""
    return {
        "app_id": topology["app_id"],
        "input_topics": sorted(
            (
                {"name": t["name"], "partitions": t["partitions"], "key": t.get("key")}
                for t in topology["input_topics"]
            ),
            key=lambda t: t["name"],
        ),
        "stores": sorted(
            (
                {
                    "name": s["name"],
                    "changelog": s.get("changelog"),
                    "partitions": s.get("partitions"),
                    "key": s.get("key"),
                    "value_serde": (s.get("value") or {}).get("serde"),
                }
                for s in topology["stores"]
            ),
            key=lambda s: s["name"],
        ),
    }


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def fingerprint(topology: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of a topology's compatibility-relevant parts (topology/model.py)."""
    view = compatibility_view(topology)
    return "sha256:" + hashlib.sha256(canonical_json(view)).hexdigest()
