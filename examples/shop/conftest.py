"""The shop's services are three projects (not installed here): put each one on the path."""

import sys
from pathlib import Path

for name in ("orders", "stock", "payments"):
    root = str(Path(__file__).resolve().parent / name)
    if root not in sys.path:
        sys.path.insert(0, root)
