"""Pure parts of the runner's latency metrics: histograms fed a batch at a time, rendered."""

from __future__ import annotations

import random

from prometheus_client.parser import text_string_to_metric_families

from enhydra.query.metrics import Exposition, write_histogram
from enhydra.runner.histogram import Histogram


def test_many_observations_at_once_count_like_one_at_a_time() -> None:
    rng = random.Random(3)
    millis = [rng.choice([0, 1, 5, 10, 20, 50]) + rng.random() * 40 for _ in range(2000)]
    millis += [-3.0, 45_000.0]  # a clock behind, and one beyond every bucket
    one, many = Histogram(), Histogram()
    for value in millis:
        one.observe(value / 1000, store="s")
    many.observe_many(millis, per_second=1000, store="s")
    [(labels_a, cum_a, sum_a, n_a)] = list(one.series())
    [(labels_b, cum_b, sum_b, n_b)] = list(many.series())
    assert labels_a == labels_b == {"store": "s"}
    assert cum_a == cum_b and n_a == n_b == len(millis)
    assert abs(sum_a - sum_b) < 1e-6


def test_latencies_since_record_timestamps_count_like_one_at_a_time() -> None:
    rng = random.Random(5)
    now_ms = 1_700_000_000_000.0
    stamps = [
        now_ms - rng.choice([0, 2, 9, 30, 70, 400, 40_000]) - rng.random() for _ in range(999)
    ]
    stamps += [0, -1, now_ms + 3]  # no timestamp (skipped), and a producer clock ahead
    one, since = Histogram(), Histogram()
    for stamp in stamps:
        if stamp > 0:
            one.observe((now_ms - stamp) / 1000)
    since.observe_since(now_ms, stamps, per_second=1000)
    [(_, cum_a, sum_a, n_a)] = list(one.series())
    [(_, cum_b, sum_b, n_b)] = list(since.series())
    assert cum_a == cum_b and n_a == n_b == len(stamps) - 2
    assert abs(sum_a - sum_b) < 1e-7 * sum_a  # float sums of ~1e15 ms


def test_latency_histograms_render_as_prometheus_text() -> None:
    batches = Histogram()
    batches.observe(0.004, phase="process")
    batches.observe(0.030, phase="publish")
    batches.observe(0.012, phase="publish")
    out = Exposition()
    write_histogram(out, "enhydra_batch_duration_seconds", "per phase", batches, store="acc")
    [family] = text_string_to_metric_families(out.render())
    samples = {(s.name, s.labels.get("phase"), s.labels.get("le")): s.value for s in family.samples}
    assert samples[("enhydra_batch_duration_seconds_count", "publish", None)] == 2
    assert samples[("enhydra_batch_duration_seconds_bucket", "publish", "0.015")] == 1
    assert samples[("enhydra_batch_duration_seconds_bucket", "publish", "+Inf")] == 2
    assert samples[("enhydra_batch_duration_seconds_bucket", "process", "0.005")] == 1
    assert all(s.labels["store"] == "acc" for s in family.samples)
