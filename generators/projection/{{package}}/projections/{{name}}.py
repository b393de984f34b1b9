"""A read model of the service:

    {{ name }}

Added by `enhydra generate projection`.

It folds the service's events per key (the aggregate id) into its own store, queryable at
`/v1/stores/{{ name }}/keys/<key>`. It runs with its own consumer group and changelog, so it can
be added to a running service (it reads the events from the beginning) with a rolling bounce.
`project` must be pure; returning None deletes the key.
"""

from __future__ import annotations

from typing import Any

from enhydra.projections import Projection


def project(state: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any]:
    """Count the key's events, in total and by type."""
    state = state or {"events": 0, "by_type": {}}
    kind = str(event.get("type"))
    by_type = {**state["by_type"], kind: state["by_type"].get(kind, 0) + 1}
    return {"events": state["events"] + 1, "by_type": by_type}


projection = Projection("{{ name }}", project, description="Events per key, by type.")
