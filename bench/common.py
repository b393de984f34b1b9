"""Shared plumbing for the state benchmarks: a fresh broker, fast producing, RSS, output.

Every benchmark starts its own broker in a temp dir, so numbers never depend on what other
people run on a shared broker, and the broker's disk starts empty (no page-cache leftovers).
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from aiokafka import AIOKafkaProducer

from enhydra.contracts.partitioner import partition_for
from enhydra.devtools.broker import LocalBroker
from enhydra.kafka.topics import TopicSpec, ensure_topics

ROOT = Path(__file__).resolve().parents[1]
_STARTED = time.monotonic()

Record = tuple[bytes, bytes, list[tuple[str, bytes]]]  # key, value, headers


def progress(message: str) -> None:
    """One line to stderr with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def fresh_broker(keep: bool = False) -> Iterator[tuple[str, Path]]:
    """A new single-node broker in a temp dir: (bootstrap, temp dir for the run's files)."""
    root = Path(tempfile.mkdtemp(prefix="enhydra-bench-"))
    progress(f"starting a fresh broker in {root}")
    broker = LocalBroker(root / "kafka", port=0)
    info = broker.start()
    progress(f"broker ready at {info.bootstrap}")
    try:
        yield info.bootstrap, root
    finally:
        broker.stop()
        if keep:
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


async def create_topics(bootstrap: str, specs: list[TopicSpec]) -> None:
    await ensure_topics(bootstrap, specs, client_id="bench")


async def produce_fast(
    bootstrap: str, topic: str, records: Iterable[Record], partitions: int
) -> int:
    """Produce keyed records through explicit batches, partitioned like any Kafka producer.

    One `send` per record costs more Python time than the broker needs to store it; filling
    batches directly keeps the loading phase short, so the benchmark spends its time measuring.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=256 * 1024
    )
    await producer.start()
    count = 0
    try:
        batches = [producer.create_batch() for _ in range(partitions)]
        pending = []
        for key, value, headers in records:
            p = partition_for(key, partitions)
            while batches[p].append(key=key, value=value, timestamp=None, headers=headers) is None:
                pending.append(await producer.send_batch(batches[p], topic, partition=p))
                batches[p] = producer.create_batch()
            count += 1
            if len(pending) >= 64:
                await pending.pop(0)
        for p, batch in enumerate(batches):
            if batch.record_count():
                pending.append(await producer.send_batch(batch, topic, partition=p))
        for future in pending:
            await future
    finally:
        await producer.stop()
    return count


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux: clear_refs 5), so each run reports its own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_mb(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb() -> float | None:
    """Peak resident memory of this process since the last reset, in MiB."""
    return _status_mb("VmHWM")


def rss_mb() -> float | None:
    """Resident memory of this process now, in MiB."""
    return _status_mb("VmRSS")


def load_average() -> str:
    """The 1-minute load average: on a shared 2-core machine, other work skews the numbers."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    """One line describing where the numbers come from."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A small aligned text table (markdown-compatible), ready for stdout and the docs."""
    text = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(text[0]), rule, *(line(r) for r in text[1:])])


def cpu_rounds(steps: Mapping[str, Callable[[], int]], rounds: int) -> dict[str, list[float]]:
    """CPU µs per record of each step, the steps alternating round by round (fair under load).

    Each step returns how many records it handled. The heap is frozen first, as `enhydra run`
    does after start-up, so a collection of the set-up data does not land in one round.
    """
    if rounds < 3:
        raise SystemExit("--rounds must be at least 3: the ratio is a median")
    gc.collect()
    gc.freeze()
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            started = time.process_time()
            count = step()
            runs[name].append((time.process_time() - started) / count * 1e6)
    return runs


def cpu_table(runs: Mapping[str, Sequence[float]]) -> str:
    """The per-record CPU medians of `cpu_rounds`, every round shown."""
    return table(
        ["step", "CPU µs/record (median)", "rounds"],
        [[n, f"{median(v):.2f}", " ".join(f"{x:.2f}" for x in v)] for n, v in runs.items()],
    )
