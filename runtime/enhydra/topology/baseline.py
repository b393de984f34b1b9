"""The committed baseline, topology.json: what runs in production, or will at the first deploy.

Before the first deploy nothing can break, so the baseline follows the code: it is marked
`"deployed": false` and `enhydra topology lock` rewrites it (a generated project's tests do it).
`enhydra topology lock --deployed` marks it deployed; from then on `enhydra topology check` and
the tests fail on a change that a rolling bounce cannot deploy. A baseline without the mark
(written by `topology show -o`, or before the mark existed) counts as deployed: strict is safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEPLOYED = "deployed"


class BaselineError(ValueError):
    """The baseline may not be rewritten this way; the message says what to run instead."""


def is_deployed(baseline: Mapping[str, Any]) -> bool:
    """True unless the baseline is explicitly marked `"deployed": false`."""
    return baseline.get(DEPLOYED, True) is not False


def locked(
    current: Mapping[str, Any], previous: Mapping[str, Any] | None, *, deployed: bool
) -> dict[str, Any]:
    """The baseline to write for `current` (a topology), the mark placed right after `format`.

    Refuses to turn a deployed baseline back into one that follows the code: that would let
    an incompatible change through unnoticed.
    """
    if previous is not None and is_deployed(previous) and not deployed:
        raise BaselineError(
            "the baseline is marked deployed (it is what runs in production), so it is only "
            "rewritten after a deploy: run `enhydra topology lock --deployed` then"
        )
    rest = {k: v for k, v in current.items() if k not in ("format", DEPLOYED)}
    return {"format": current["format"], DEPLOYED: deployed, **rest}
