"""The ledger with a snapshot hook that records its calls (for the hooks test)."""

from __future__ import annotations

import json
import os
from typing import Any

from enhydra import Service
from ledger.domain import accounts

service = Service("ledger", accounts, partitions=4)


@service.on_snapshot
def record(phase: str, info: dict[str, Any]) -> None:
    with open(os.environ["HOOKS_LOG"], "a") as log:
        log.write(json.dumps({"phase": phase, **info}) + "\n")
