"""Histograms as Prometheus counts them: per label set, a count per bucket bound, a sum, a count.

The runner times its batches and the commands' way to their events here, and the HTTP layer its
requests; query/metrics.py renders them in /metrics. Pure and cheap: a batch's thousands of
latencies go in with one sort and one bisect per bucket.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator

# Seconds. Fine around the latency targets (10-100 ms), coarse beyond.
BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

Labels = tuple[tuple[str, str], ...]


class Histogram:
    """Cumulative-bucket counts per label set; `series` gives them as /metrics shows them."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self._series: dict[Labels, list[float]] = {}  # per bucket, then +Inf, sum, count

    def _counts(self, labels: dict[str, str]) -> list[float]:
        key = tuple(sorted(labels.items()))
        counts = self._series.get(key)
        if counts is None:
            counts = self._series[key] = [0.0] * (len(self.buckets) + 3)
        return counts

    def observe(self, value: float, **labels: str) -> None:
        counts = self._counts(labels)
        counts[bisect.bisect_left(self.buckets, value)] += 1  # le: value <= bound
        counts[-2] += value
        counts[-1] += 1

    def observe_many(self, values: list[float], *, per_second: float = 1.0, **labels: str) -> None:
        """Many observations at once, in units of 1/`per_second` s (1000: milliseconds)."""
        if not values:
            return
        ordered = sorted(values)
        counts = self._counts(labels)
        below = 0
        for index, bound in enumerate(self.buckets):
            upto = bisect.bisect_right(ordered, bound * per_second)
            counts[index] += upto - below
            below = upto
        counts[len(self.buckets)] += len(ordered) - below
        counts[-2] += sum(ordered) / per_second
        counts[-1] += len(ordered)

    def observe_since(
        self, now: float, stamps: list[float], *, per_second: float = 1.0, **labels: str
    ) -> None:
        """Observe `now - stamp` for each stamp > 0 (timestamps in 1/`per_second` s).

        A batch's record timestamps go in without a subtraction per record: sorted once,
        `now - t <= bound` is `t >= now - bound`, one bisect per bucket.
        """
        ordered = sorted(stamps)
        start = bisect.bisect_right(ordered, 0)  # no timestamp: not a latency
        total = len(ordered) - start
        if not total:
            return
        counts = self._counts(labels)
        above = len(ordered)  # the stamps from here on are counted already
        for index, bound in enumerate(self.buckets):
            # a latency <= bound is a stamp >= now - bound
            first = max(start, bisect.bisect_left(ordered, now - bound * per_second))
            counts[index] += above - first
            above = first
        counts[len(self.buckets)] += above - start
        counts[-2] += (total * now - math.fsum(ordered[start:] if start else ordered)) / per_second
        counts[-1] += total

    def series(self) -> Iterator[tuple[dict[str, str], list[int], float, int]]:
        """(labels, cumulative count per bucket bound, sum, count) per label set, sorted."""
        for key, counts in sorted(self._series.items()):
            cumulative, running = [], 0.0
            for count in counts[: len(self.buckets)]:
                running += count
                cumulative.append(int(running))
            yield dict(key), cumulative, counts[-2], int(counts[-1])
