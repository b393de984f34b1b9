"""Names every instance and tool derive from an application id, so they always agree."""

from __future__ import annotations


def control_topic_name(app_id: str) -> str:
    """The one-partition topic an application's instances talk over (control/channel.py)."""
    return f"{app_id}-control"
