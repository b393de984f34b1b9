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


def store_fingerprint(
    *, app_id: str, store: str, partitions: int, commands_topic: str, changelog_topic: str
) -> str:
    """What a snapshot records: `fingerprint` of the one-store topology it was taken from.

    Same definition as the service's, restricted to what a snapshot's files depend on (which
    keys each partition holds, where the cut points, which changelog a clone fills), so a
    snapshot and `enhydra topology check` cannot disagree on what compatible means.
    """
    return fingerprint(
        {
            "app_id": app_id,
            "input_topics": [{"name": commands_topic, "partitions": partitions}],
            "stores": [{"name": store, "changelog": changelog_topic, "partitions": partitions}],
        }
    )


def accepted_store_fingerprints(
    *, app_id: str, store: str, partitions: int, commands_topic: str, changelog_topic: str
) -> tuple[str, str]:
    """The fingerprints a snapshot of that store may carry: today's, and the one snapshots
    recorded before it was defined through the topology (so they still restore)."""
    legacy = json.dumps(  # exactly as those snapshots wrote it (ASCII-escaped)
        {
            "app_id": app_id,
            "store": store,
            "partitions": partitions,
            "commands_topic": commands_topic,
            "changelog_topic": changelog_topic,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode("utf-8")
    current = store_fingerprint(
        app_id=app_id,
        store=store,
        partitions=partitions,
        commands_topic=commands_topic,
        changelog_topic=changelog_topic,
    )
    return current, "sha256:" + hashlib.sha256(legacy).hexdigest()
