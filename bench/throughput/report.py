"""docs/benchmarks.md and its plots, written from one run's data so text and numbers agree.

The page is regenerated as a whole by every `python -m bench` (or `python -m bench.throughput
--docs`): numbers are never edited by hand, and each page says which command, date and machine
produced it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import ROOT

DOCS = ROOT / "docs"
PLOTS = DOCS / "benchmarks"
COLORS = {
    "raw-dict": "#9e9e9e",
    "raw-rocksdb": "#616161",
    "enhydra": "#1565c0",
    "quix": "#ef6c00",
    "faust": "#6a1b9a",
}


def _fmt(value: object, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float | int):
        return f"{value:,.{digits}f}"
    return str(value)


def pyplot() -> tuple[Any, Any]:
    """(matplotlib.pyplot, matplotlib.ticker); stops with a hint when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        raise SystemExit(
            "matplotlib is not installed, so the plots of docs/benchmarks.md cannot be drawn: "
            "pip install -e '.[bench]' (make bench does), or pass --no-docs"
        ) from None
    return plt, ticker


def plots(data: dict) -> list[str]:
    """throughput.png and scaling.png; returns the files written."""
    plt, ticker = pyplot()
    PLOTS.mkdir(parents=True, exist_ok=True)
    labels = data["labels"]
    written = []
    summary = {k: v for k, v in data["summary"].items() if v.get("runs")}
    if summary:
        names = list(summary)
        rates = [summary[n]["rate"] for n in names]
        low = [summary[n]["rate"] - summary[n]["rate_min"] for n in names]
        high = [summary[n]["rate_max"] - summary[n]["rate"] for n in names]
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        y = range(len(names))
        ax.barh(y, rates, xerr=[low, high], color=[COLORS.get(n, "#888") for n in names])
        ax.set_yticks(list(y), [labels.get(n, n) for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("records/s (median, bars: min-max)")
        ax.set_title(f"Throughput, {data['config']['commands']:,} ledger commands")
        for i, n in enumerate(names):
            ax.text(summary[n]["rate_max"], i, f"  {rates[i]:,.0f}", va="center", fontsize=8)
        ax.set_xlim(0, max(summary[n]["rate_max"] for n in names) * 1.25)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v / 1000:g}k"))
        cost = [summary[n]["cpu_us_per_record"] for n in names]
        ax2.barh(y, cost, color=[COLORS.get(n, "#888") for n in names])
        ax2.set_yticks(list(y), ["" for _ in names])
        ax2.invert_yaxis()
        ax2.set_xscale("log")
        ax2.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax2.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax2.set_xlim(right=max(cost) * 3)
        ax2.set_xlabel("CPU µs per record (log scale, lower is better)")
        ax2.set_title("Cost per record")
        for i, c in enumerate(cost):
            ax2.text(c, i, f" {c:,.0f}", va="center", fontsize=8)
        fig.tight_layout()
        path = PLOTS / "throughput.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    sweep = data.get("sweep") or []
    if sweep:
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        for name in dict.fromkeys(r["system"] for r in sweep):
            rows = sorted((r for r in sweep if r["system"] == name), key=lambda r: r["keys"])
            keys = [r["keys"] for r in rows]
            style = {
                "marker": "o",
                "color": COLORS.get(name, "#888"),
                "label": labels.get(name, name),
            }
            axes[0].plot(keys, [r["rate"] for r in rows], **style)
            axes[0].yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v / 1000:g}k"))
            axes[1].plot(keys, [r["cpu_us_per_record"] for r in rows], **style)
            axes[2].plot(keys, [r["peak_rss_mb"] for r in rows], **style)
        for ax, title in zip(axes, ("records/s", "CPU µs per record", "peak RSS MiB"), strict=True):
            ax.set_xscale("log")
            ax.set_xlabel("keys (accounts)")
            ax.set_title(title)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle("Cost as the state grows (one run per point)")
        fig.tight_layout()
        path = PLOTS / "scaling.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return [str(p.relative_to(DOCS)) for p in written]


def _throughput_table(data: dict) -> list[str]:
    labels = data["labels"]
    lines = [
        "| system | records/s (median) | range | CPU % | CPU µs/record | peak RSS MiB | "
        "outputs (events + rejections) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, s in data["summary"].items():
        if not s.get("runs"):
            lines.append(f"| {labels.get(name, name)} | failed | | | | | |")
            continue
        outputs = f"{s['outputs']:,} ({s['events']:,} + {s['rejections']:,})"
        if not s["complete"]:
            outputs += ", capped: rate over the records processed"
        lines.append(
            f"| {labels.get(name, name)} | {_fmt(s['rate'])} | "
            f"{_fmt(s['rate_min'])}-{_fmt(s['rate_max'])} | {_fmt(s['cpu_percent'])} | "
            f"{_fmt(s['cpu_us_per_record'], 1)} | {_fmt(s['peak_rss_mb'])} | {outputs} |"
        )
    return lines


def _ratio_table(data: dict) -> list[str]:
    lines = [
        "| measure | Enhydra | reference | reference's figure | ratio | target | met |",
        "|---|---:|---|---:|---:|---|---|",
    ]
    for r in data["ratios"]:
        digits = 1 if r["unit"] in ("µs", "ms") else 0
        target = ""
        if r["target"] is not None:
            op = "≤" if r["measure"].startswith(("peak", "latency")) else "≥"
            target = f"{op} {r['target']}"
        met = {None: "", True: "yes", False: "**no**"}[r["met"]]
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(
            f"| {r['measure']} | {_fmt(r['ours'], digits)} {r['unit']} | {r['reference']} | "
            f"{_fmt(r['ref'], digits)} {r['unit']} | {ratio} | {target} | {met} |"
        )
    return lines


def _profile_section(prof: dict | None) -> list[str]:
    if not prof:
        return ["No profile in this run (`--quick`, `--no-profile`, or py-spy unavailable)."]
    lines = [
        f"py-spy, {prof['samples']:,} samples of the worker's active threads between its first "
        f"and last output (rate while profiled: {_fmt(prof.get('rate_while_profiled'))} "
        "records/s; `--nonblocking`, so the worker is never paused). Percentages are of all "
        "active samples. C calls (orjson, rocksdict, socket writes) are charged to the Python "
        "line that makes them.",
        "",
        "By area (the module of the innermost Python frame of each sample):",
        "",
        "| area | % |",
        "|---|---:|",
        *(f"| {name} | {pct:.1f} |" for name, pct in prof["areas"][:12]),
        "",
        "Top lines by self time:",
        "",
        "| line | % |",
        "|---|---:|",
        *(f"| `{name}` | {pct:.1f} |" for name, pct in prof["self_lines"][:15]),
        "",
        "Top functions by inclusive time:",
        "",
        "| function | % |",
        "|---|---:|",
        *(f"| `{name}` | {pct:.1f} |" for name, pct in prof["inclusive"][:20]),
    ]
    return lines


def _sweep_table(data: dict) -> list[str]:
    sweep = data.get("sweep") or []
    if not sweep:
        return ["No sweep in this run (`--quick` or `--sweep-keys ''`)."]
    labels = data["labels"]
    lines = [
        "| system | keys | records/s | CPU µs/record | peak RSS MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in sweep:
        lines.append(
            f"| {labels.get(r['system'], r['system'])} | {r['keys']:,} | {_fmt(r['rate'])} | "
            f"{_fmt(r['cpu_us_per_record'], 1)} | {_fmt(r['peak_rss_mb'])} |"
        )
    return lines


def _latency_lines(lat: dict | None) -> list[str]:
    if not lat:
        return ["Not measured in this run."]
    lines = [
        "Measured by `bench/throughput/latency.py` on its own fresh broker. "
        f"Layout: {lat['layout']}. The maximum rate is measured again in that layout "
        "(drain of a preloaded topic), then commands are produced at a steady share of it "
        f"for {lat['config']['seconds']:.0f} s per run, the systems interleaved; each event is "
        "matched to its command through the `enhydra.command_offset` header. Latency = event "
        + (
            "LogAppendTime (when the broker stored the event, after the service's publish "
            "round trip)"
            if lat["config"]["event_time"] == "append"
            else "CreateTime (the service's own stamp)"
        )
        + " - command CreateTime (set by the load generator). The raw rocksdict loop runs "
        "the same load as a reference: what this machine and broker allow a plain Python "
        f"consumer. 1-min load average {lat['load_before']} before, {lat['load_after']} after.",
        "",
    ]
    for system, m in lat["max"].items():
        lines.append(f"- maximum rate in that layout, {system}: {_fmt(m['rate'])} records/s")
    lines += [
        "",
        "| system | load | commands/s | runs | p50 | p90 | p99 (median) | p99 range | "
        "/metrics p99 | target | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in lat["summary"]:
        target = f"≤ {r['target_ms']:.0f} ms" if r["target_ms"] else ""
        service = "" if r["service_p99_ms"] is None else f"≤ {r['service_p99_ms']:.0f} ms"
        ratio = "" if r["ratio"] is None or r["system"] != "enhydra" else f"{r['ratio']:.2f}"
        lines.append(
            f"| {r['system']} | {100 * r['load']:.0f} % | {_fmt(r['rate'])} | {r['runs']} | "
            f"{r['p50_ms']:.0f} ms | {r['p90_ms']:.0f} ms | **{r['p99_ms']:.0f} ms**"
            f"{'' if r['complete'] else ' (fell behind)'} | "
            f"{r['p99_min_ms']:.0f}-{r['p99_max_ms']:.0f} ms | {service} | {target} | {ratio} |"
        )
    lines += [
        "",
        "The ratio is Enhydra's median p99 over its target (≤ 1.0 meets it). `/metrics p99` is "
        "the bucket bound the service's own `enhydra_command_event_latency_seconds` histogram "
        "puts its 99th percentile under (command timestamp to outputs acknowledged).",
    ]
    return lines


LATENCY_HEADER = "### Latency (Enhydra, at a share of its maximum rate)"
# Analysis lives on its own page: this one is rewritten whole by every run.
POINTER = (
    "Benchmarks run by hand since, and why each target is or is not met: "
    "[performance.md](performance.md), which this command does not rewrite."
)


def write_latency(lat: dict, command: str) -> Path:
    """Replace only the latency section of docs/benchmarks.md with this latency run."""
    page = DOCS / "benchmarks.md"
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("### Latency"))
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith(("## ", "### "))),
        len(lines),
    )
    body = [
        LATENCY_HEADER,
        "",
        f"Command: `{command}`; {lat['date']}; {lat['machine']}.",
        "",
        *_latency_lines(lat),
        "",
    ]
    page.write_text("\n".join([*lines[:start], *body, *lines[end:]]) + "\n")
    return page


def _others(others: list[dict]) -> list[str]:
    if not others:
        return [
            "Not run this time (`python -m bench.throughput` runs the throughput benchmark "
            "only; `python -m bench` runs them all)."
        ]
    lines = ["| benchmark | command | status | seconds |", "|---|---|---|---:|"]
    for o in others:
        lines.append(f"| {o['name']} | `{o['command']}` | {o['status']} | {o['seconds']:.0f} |")
    for o in others:
        lines += ["", f"### {o['name']}", "", "```", *(o["output"] or ["(no output)"]), "```"]
    return lines


def write(data: dict, others: list[dict], command: str = "python -m bench") -> Path:
    """Regenerate docs/benchmarks.md (and the plots) from `data`."""
    images = plots(data)
    cfg = data["config"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`.venv/bin/python -m bench`; `--quick` for a ~2-minute "
        "version). Do not edit the numbers by hand: rerun the command.",
        "",
        POINTER,
        "",
        f"- Command: `{command}`",
        f"- Date: {data['date']}",
        f"- Machine: {data['machine']}; a single fresh Apache Kafka broker (KRaft, local, "
        "`enhydra kafka`) on the same machine, started in a temp dir for this run. The "
        "broker's JVM and the load generator share the 2 cores with the system measured.",
        f"- Load: 1-min load average {data['load_before']} before, {data.get('load_after')} "
        "after. **The machine is shared**: other engineers run test suites (brokers, Spark, "
        "browsers) on the same 2 cores at the same time, so absolute numbers move by tens of "
        "percent between runs; compare systems within one run, where they saw similar load. "
        "CPU µs per record depends much less on that load than records/s does.",
        "",
        "## Throughput: the ledger workload",
        "",
        f"{cfg['commands']:,} ledger commands over {cfg['keys']:,} accounts (JSON values of "
        "~80 bytes, opens first, then deposits, withdrawals, closes and ~2 % client retries; "
        "`ledger.workload.generate`), preloaded once into a 4-partition topic. Every system "
        "reads that topic with its own consumer group, runs the ledger's `decide`/`apply` with "
        "RocksDB-backed state and a changelog (except the dict ceiling), and publishes one "
        "output per command (an event or a rejection), at-least-once, acks=all, producer "
        f"linger 5 ms. Medians of {cfg['repeat']} run(s) per system, systems interleaved.",
        "",
        *(f"![{Path(p).stem}]({p})" for p in images[:1]),
        "",
        *_throughput_table(data),
        "",
        "### Ratios against the targets of issue 10",
        "",
        *_ratio_table(data),
        "",
        LATENCY_HEADER,
        "",
        *_latency_lines(data.get("latency")),
        "",
        "### Cost as the state grows",
        "",
        "The same workload with 1k, 10k and 100k accounts (commands = max(the main size, "
        "2 x keys)); one run per point except the main size, which reuses its medians.",
        "",
        *(f"![{Path(p).stem}]({p})" for p in images[1:]),
        "",
        *_sweep_table(data),
        "",
        "### Where Enhydra's worker spends its time",
        "",
        *_profile_section(data.get("profile")),
        "",
        "### How it is measured, and what each system is given",
        "",
        "- **Records/s** = outputs / (timestamp of the last output - timestamp of the first), "
        "read back from the output topics. The harness creates the output topics with "
        "`message.timestamp.type=LogAppendTime`, so the broker stamps every output when it "
        "stores it: start-up, group join and shutdown are excluded the same way for every "
        "system, and no system reports its own numbers. (CreateTime would not do: Quix Streams "
        "copies the input record's timestamp to its outputs by default.)",
        "- **CPU %** = the process's utime + stime (all threads, from /proc) over the same "
        "window; **CPU µs/record** = CPU seconds / records. **Peak RSS** = VmHWM of the "
        "process, start-up included.",
        "- Every system runs as its own process, started fresh, one at a time, with a fresh "
        "consumer group, fresh output topics (4 partitions) and an empty state directory.",
        "- **Same logic everywhere**: the competitors run the ledger's own `parse`/`decide`/"
        "`apply` (`ledger.domain`) with the bookkeeping Enhydra keeps per key (offset of the "
        "last applied command, the last 100 command ids for client retries) in the same "
        "orjson encoding; each run's event/rejection counts are in the table and agree across "
        "systems. Competitor processes import `ledger.domain` without `enhydra/__init__` "
        "(which loads faust and aiohttp for the Service), so Enhydra's imports do not "
        "inflate their RSS.",
        "- **raw aiokafka (ceiling)**: `getmany` (2,000 records), the shared step per record, "
        "`send` without awaiting delivery, `flush` + commit every 200 ms; dict state, or one "
        "rocksdict DB per partition with a changelog record per update.",
        "- **Enhydra**: `ledger.service:service` via `enhydra run`, one instance, "
        "`ENHYDRA_NUM_STANDBY_REPLICAS=0`, `ENHYDRA_PROCESSING_GUARANTEE=at_least_once`, "
        "`ENHYDRA_PRODUCER_LINGER_MS=5`, `ENHYDRA_COMMANDS_TOPIC=bench-commands`, everything "
        "else (DLQ, web server, control topic, the entry cache of 10,000 keys per partition, "
        "32 MB of RocksDB memory for all stores) as the example ships.",
        "- **faust-streaming 0.15.3**: an agent over `stream.events()` updating a RocksDB "
        "(rocksdict) `Table` and `send`ing one output per event; tuned: producer acks=-1, "
        "`producer_linger` 5 ms, 256 KiB producer batches, `stream_buffer_maxsize=16384`, raw "
        "serializers + orjson, no standbys, no web. `take()`/`take_events()` cannot be used: "
        'faust refuses Table updates inside them ("Cannot modify table key from outside of '
        'stream iteration"), and forcing the current-event context lost and duplicated '
        f"records in a trial. faust runs are capped at {cfg['faust_cap']:.0f} s of processing; "
        "its rate is over the records it processed in that time.",
        "- **Quix Streams**: `sdf.apply(stateful=True)` (RocksDB state, changelog topics), two "
        "one `to_topic` whose topic callback routes events and rejections; its defaults (5 s "
        "commit interval, idempotent producer) plus acks=all and linger.ms=5. Quix writes its "
        "state and changelog at each checkpoint (every 5 s), so the work of the last "
        "checkpoint falls after its last output, outside the measured window: a small bias in "
        "Quix's favour on the full run (several checkpoints), larger on `--quick`.",
        "- Latency uses a separate topic and app, produced by the harness at a fixed rate "
        "while Enhydra runs; see above.",
        "",
        "## Other benchmarks",
        "",
        "Each script in `bench/` that exists is run with small sizes (see its command below) "
        "and its printed table and ratio lines are copied here verbatim.",
        "",
        *_others(others),
        "",
    ]
    path = DOCS / "benchmarks.md"
    path.write_text("\n".join(lines))
    return path
