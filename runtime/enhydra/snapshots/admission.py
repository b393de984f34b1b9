"""What a snapshot request on the control topic may ask for, even when correctly signed (pure).

A snapshot writes every partition's state to the storage it names, so it may name only the
storage the service is configured with (ENHYDRA_SNAPSHOT_STORAGE), never a URL of the sender's
choosing. Its id must not come from the future: retention keeps the ids that sort last, so
such an id would outlive, and delete, the real snapshots. A `snapshot_create` is made when it
is sent, so its id is also recent; a `snapshot_request` is announced again while the snapshot
runs (a new coordinator after a death), so an older id is fine there. Each partition's owner
cuts at the offset it has reached; a request that names a cut below it (a rewind: its commands
applied again) is refused, one above it changes nothing.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from enhydra.snapshots.live import SNAPSHOT_CREATE, SNAPSHOT_REQUEST

ID_AGE_S = 600.0  # a snapshot id is made when it is asked for
_ID_TIME = re.compile(r"-(\d{8}T\d{6})(\d{6})Z$")


def same_storage(url: str) -> str:
    """A storage URL in one spelling: a path resolved, `file://` dropped, no trailing slash."""
    url = url.strip()
    if "://" in url and not url.startswith("file://"):
        return url.rstrip("/")
    return str(Path(url.removeprefix("file://")).expanduser().resolve())


def snapshot_id_time(snapshot_id: str) -> float | None:
    found = _ID_TIME.search(snapshot_id)
    if found is None:
        return None
    at = dt.datetime.strptime(found.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC)
    return at.timestamp() + int(found.group(2)) / 1e6


def refusal(
    message: Mapping[str, Any],
    *,
    app_id: str,
    storage: str,
    position: Callable[[int], int | None],
    now: float,
) -> str | None:
    """Why `message` must not act here, or None. `position(p)`: p's next input offset here."""
    kind = message.get("type")
    if kind not in (SNAPSHOT_CREATE, SNAPSHOT_REQUEST):
        return None
    asked = message.get("storage") or (storage if kind == SNAPSHOT_CREATE else "")
    if not storage or not isinstance(asked, str) or same_storage(asked) != same_storage(storage):
        return "storage_not_configured"
    snapshot_id = message.get("id")
    if not isinstance(snapshot_id, str) or not snapshot_id.startswith(f"{app_id}-"):
        return "bad_snapshot_id"
    made = snapshot_id_time(snapshot_id)
    if made is None or made - now > ID_AGE_S:
        return "bad_snapshot_id"
    if kind == SNAPSHOT_CREATE and now - made > ID_AGE_S:
        return "bad_snapshot_id"
    cut = message.get("cut")
    if kind == SNAPSHOT_REQUEST and cut is not None:
        if not isinstance(cut, dict):
            return "bad_cut"
        for partition, offset in cut.items():
            try:
                p, o = int(partition), int(offset)
            except (TypeError, ValueError):
                return "bad_cut"
            reached = position(p)
            if reached is not None and o < reached:
                return "cut_below_position"
    return None
