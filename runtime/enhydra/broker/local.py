"""Compatibility only: the local broker lives in `enhydra.devtools.broker`.

`enhydra.spark.jars` still imports these helpers from here; when it imports them from
`enhydra.devtools.broker`, delete this package (and its line in tests/unit/test_layers.py).
"""

from __future__ import annotations

from enhydra.devtools.broker import (
    BrokerError,
    _file_lock,
    _last_lines,
    _write_atomic,
    cache_root,
    find_java,
    find_mvn,
)

__all__ = [
    "BrokerError",
    "_file_lock",
    "_last_lines",
    "_write_atomic",
    "cache_root",
    "find_java",
    "find_mvn",
]
