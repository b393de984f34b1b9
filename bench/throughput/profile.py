"""Where Enhydra's worker spends its time: py-spy samples while it works through the topic.

py-spy samples the running process from outside (no instrumentation, `--nonblocking` so the
worker is never paused), only while a thread is active, so idle waits on the broker do not
count. Samples are taken only between the first and the last output, not during start-up. The
summary reduces the raw stacks to: self time by source line (C calls such as orjson, rocksdict
and socket writes land on the Python line that calls them), inclusive time by function, and
self time by area (the module a sample's leaf frame belongs to).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

# Frames every sample shares (interpreter start, CLI, event loop): left out of "inclusive".
_PLUMBING = ("<frozen", "click/", "asyncio/", "mode/", "enhydra/cli/", "enhydra/service.py")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str | None:
    """The py-spy binary next to this interpreter, or on PATH."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def start(pid: int, out: Path, rate: int = 400) -> subprocess.Popen[bytes] | None:
    binary = py_spy()
    if binary is None:
        return None
    argv = [
        binary,
        "record",
        "--pid",
        str(pid),
        "--format",
        "raw",
        "--rate",
        str(rate),
        "--nonblocking",
        "--output",
        str(out),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(recorder: subprocess.Popen[bytes]) -> None:
    """SIGINT makes py-spy write its file and exit."""
    if recorder.poll() is None:
        recorder.send_signal(signal.SIGINT)
        try:
            recorder.wait(60)
        except subprocess.TimeoutExpired:
            recorder.kill()


def _frames(stack: str) -> list[tuple[str, str, str]]:
    """(function, file, line) per frame, outermost first; process/thread pseudo-frames dropped."""
    frames = []
    for part in stack.split(";"):
        match = _FRAME.match(part)
        if match is None or match["file"] == "" or part.startswith(("process ", "thread ")):
            continue
        frames.append((match["func"], match["file"], match["line"] or ""))
    return frames


def area(file: str) -> str:
    """A readable bucket for a leaf frame's file."""
    path = file.replace("\\", "/")
    for prefix, name in (
        ("enhydra/processing/core", "enhydra core: decide/apply loop, entries"),
        ("enhydra/processing/step", "enhydra step: output records"),
        ("enhydra/contracts", "enhydra contracts: entry codec, headers"),
        ("enhydra/runner/checkpoint", "enhydra checkpoint: publish, persist"),
        ("enhydra/runner", "enhydra runner: batch loop"),
        ("enhydra/processing", "enhydra processing: cache, engine"),
        ("enhydra/stores", "enhydra stores: RocksDB"),
        ("enhydra/", "enhydra other"),
        ("ledger/", "ledger domain (user code)"),
        ("aiokafka/producer", "aiokafka producer"),
        ("aiokafka/record", "aiokafka record encoding/decoding"),
        ("aiokafka/consumer", "aiokafka consumer/fetcher"),
        ("aiokafka/", "aiokafka other (client, protocol)"),
        ("asyncio/", "asyncio event loop"),
        ("quixstreams/", "quixstreams"),
        ("confluent_kafka/", "confluent-kafka"),
        ("faust/", "faust/mode"),
        ("mode/", "faust/mode"),
        ("structlog/", "logging"),
        ("logging/", "logging"),
    ):
        if prefix in path:
            return name
    return "other (" + path.rsplit("/", 1)[-1] + ")"


def summarize(raw: Path, top: int = 15) -> dict:
    """Counters from a py-spy raw file: totals, top lines, top functions, areas (in % of all)."""
    self_lines: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = _frames(stack)
        if not frames:
            continue
        n = int(count)
        total += n
        func, file, lineno = frames[-1]
        self_lines[f"{func} ({file}:{lineno})"] += n
        areas[area(file)] += n
        for name in {f"{f} ({p})" for f, p, _ in frames if not p.startswith(_PLUMBING)}:
            inclusive[name] += n

    def pct(counter: Counter[str], limit: int) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in counter.most_common(limit)]

    return {
        "samples": total,
        "self_lines": pct(self_lines, top),
        "inclusive": pct(inclusive, top + 10),
        "areas": pct(areas, 20),
    }
