"""The shop's three services are projects of their own (not installed): put them on the path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHOP = Path(__file__).resolve().parents[2] / "examples" / "shop"
ROOTS = [str(SHOP / name) for name in ("orders", "stock", "payments")]

for root in ROOTS:
    if root not in sys.path:
        sys.path.insert(0, root)


def pythonpath() -> str:
    """PYTHONPATH for a service process started by `enhydra run` (it imports one of them)."""
    return os.pathsep.join([*ROOTS, *filter(None, [os.environ.get("PYTHONPATH")])])
