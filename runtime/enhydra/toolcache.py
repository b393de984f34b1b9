"""The per-user cache of what Maven fetches, and the host's Java and Maven that fetch it.

Two owners use it: Spark's Kafka connector (spark/jars.py, needed by a backfill) and the local
development broker (devtools/broker.py, an extra). It lives here, below both, so the runtime
never reaches into development tooling for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

MIN_JAVA_VERSION = 17
INSTALL_HINT = "install it with: apt-get install openjdk-17-jre-headless maven"


class ToolError(RuntimeError):
    """Java or Maven is missing or too old; the message says what to install."""


def cache_root() -> Path:
    """Cache root: $ENHYDRA_CACHE_DIR, else $XDG_CACHE_HOME/enhydra, else ~/.cache/enhydra."""
    explicit = os.environ.get("ENHYDRA_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "enhydra"
    return Path.home() / ".cache" / "enhydra"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialize fetches/starts across processes (e.g. parallel test workers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str) -> None:
    """Readers never see a half-written file, even if we are killed mid-write."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def last_lines(text: str, count: int) -> str:
    """The end of a tool's output, for an error message."""
    return "\n".join(text.strip().splitlines()[-count:])


def find_java(needed_by: str) -> str:
    """Absolute path of a Java >= 17 (JAVA_HOME first, like Kafka's own scripts)."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is not None and os.access(candidate, os.X_OK):
        java = str(candidate)
    else:
        found = shutil.which("java")
        if found is None:
            raise ToolError(
                f"`java` was not found on PATH; {needed_by} needs Java "
                f"{MIN_JAVA_VERSION}+ ({INSTALL_HINT})"
            )
        java = str(Path(found).resolve())
    major = java_major_version(java)
    if major is not None and major < MIN_JAVA_VERSION:
        raise ToolError(
            f"{java} is Java {major}; {needed_by} needs Java "
            f"{MIN_JAVA_VERSION}+ ({INSTALL_HINT}, or point JAVA_HOME at a newer JDK)"
        )
    return java


@lru_cache(maxsize=8)
def java_major_version(java: str) -> int | None:
    """Parse `java -version`; None when unparseable (the tool itself then complains)."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_java_major_version(out.stderr + out.stdout)


def parse_java_major_version(text: str) -> int | None:
    """`version "1.8.0_292"` -> 8, `version "17.0.15"` -> 17, `version "21"` -> 21."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        return int(match.group(2))
    return major


def find_mvn(needed_for: str) -> str:
    """Maven resolves jars and their exact transitive dependencies from Maven Central."""
    found = shutil.which("mvn")
    if found is None:
        raise ToolError(
            f"`mvn` (Apache Maven) was not found on PATH; it is needed once to download "
            f"{needed_for} ({INSTALL_HINT})"
        )
    return found
