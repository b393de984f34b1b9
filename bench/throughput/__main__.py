"""Throughput of the Enhydra ledger against the ceiling, faust-streaming and Quix Streams.

    .venv/bin/python -m bench.throughput                 # 300k commands, 10k keys, 3 repeats
    .venv/bin/python -m bench.throughput --quick         # 40k commands, 3 repeats, no sweep
    .venv/bin/python -m bench.throughput --systems enhydra,quix --repeat 3 --json out.json

One fresh broker; the commands are preloaded once into `bench-commands` (4 partitions) and
every system reads that same topic with its own consumer group, one system at a time, in an
order rotated between repeats so drift in machine load does not favour one of them. Medians
of the repeats are reported. Then: a py-spy profile of one more Enhydra run, records/s as the
number of keys grows, and Enhydra's latency at a quarter and half of its maximum rate
(latency.py: its own fresh broker, the load generator pinned to its own core, the maximum
measured again in that layout, medians of interleaved runs, the raw rocksdict loop at the same
load as the reference for what this machine allows).

Every system asked for must run: a competitor that is not installed stops the benchmark before
it starts, and a system without --repeat successful runs makes it exit with an error.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.common import create_topics, fresh_broker, load_average, machine, produce_fast, progress
from bench.throughput import harness, latency, profile
from bench.throughput.workload import COMMANDS_TOPIC, PARTITIONS, command_records
from enhydra.kafka.topics import TopicSpec
from enhydra.logs import configure_logging

SYSTEMS = ("raw-dict", "raw-rocksdb", "enhydra", "enhydra-typed", "quix", "faust")
LABELS = {
    "raw-dict": "raw aiokafka, dict state (ceiling)",
    "raw-rocksdb": "raw aiokafka, rocksdict + changelog",
    "enhydra": "Enhydra ledger",
    "enhydra-typed": "Enhydra ledger, typed (msgspec)",
    "quix": "Quix Streams",
    "faust": "faust-streaming",
}
QUIX_VENV = Path("/tmp/quixvenv/bin/python")


def quix_python() -> str | None:
    """An interpreter with quixstreams: this one (the `bench` extra), $BENCH_QUIX_PYTHON, or
    /tmp/quixvenv."""
    if importlib.util.find_spec("quixstreams") is not None:
        return sys.executable
    candidate = os.environ.get("BENCH_QUIX_PYTHON") or (
        str(QUIX_VENV) if QUIX_VENV.exists() else ""
    )
    return candidate or None


def launch(name: str, app: str, bootstrap: str, topic: str, run_dir: Path) -> harness.Launch:
    if name.startswith("raw-"):
        return harness.raw(app, bootstrap, topic, run_dir, name.removeprefix("raw-"))
    if name == "enhydra":
        return harness.enhydra(app, bootstrap, topic, run_dir)
    if name == "enhydra-typed":
        return harness.enhydra(app, bootstrap, topic, run_dir, typed=True)
    if name == "faust":
        return harness.faust(app, bootstrap, topic, run_dir)
    if name == "quix":
        python = quix_python()
        assert python is not None
        return harness.quix(app, bootstrap, topic, run_dir, python)
    raise ValueError(f"unknown system {name!r}; expected one of {', '.join(SYSTEMS)}")


def summarize(results: list[harness.Result]) -> dict:
    """Medians per system (rate, CPU, RSS) with the spread of the rates."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r.system for r in results):
        runs = [r for r in results if r.system == name and r.rate > 0]
        if not runs:
            out[name] = {"runs": 0}
            continue
        rate = statistics.median(r.rate for r in runs)
        cpu = statistics.median(r.cpu_percent for r in runs)
        out[name] = {
            "runs": len(runs),
            "rate": round(rate, 1),
            "rate_min": min(r.rate for r in runs),
            "rate_max": max(r.rate for r in runs),
            "cpu_percent": round(cpu, 1),
            "cpu_us_per_record": round(
                statistics.median(1e6 * r.cpu_percent / 100 / r.rate for r in runs), 1
            ),
            "peak_rss_mb": round(statistics.median(r.peak_rss_mb for r in runs), 1),
            "events": runs[0].events,
            "rejections": runs[0].rejections,
            "complete": all(r.complete for r in runs),
            "outputs": runs[0].outputs,
        }
    return out


def ratios(summary: dict, lat: dict | None) -> list[dict]:
    """The issue's targets, each as Enhydra's figure, the reference's, the ratio and the bar."""
    rows = []
    enh = summary.get("enhydra", {})

    def add(measure, ref_name, unit, ours, ref, target, higher_is_better=True, ratio=None):
        if ours is None or ref in (None, 0):
            rows.append(
                {
                    "measure": measure,
                    "reference": ref_name,
                    "unit": unit,
                    "ours": ours,
                    "ref": ref,
                    "ratio": None,
                    "target": target,
                    "met": None,
                }
            )
            return
        value = ratio if ratio is not None else ours / ref
        met = None
        if target is not None:
            met = value >= target if higher_is_better else value <= target
        rows.append(
            {
                "measure": measure,
                "reference": ref_name,
                "unit": unit,
                "ours": ours,
                "ref": ref,
                "ratio": round(value, 3),
                "target": target,
                "met": met,
            }
        )

    def fig(name, key):
        return summary.get(name, {}).get(key)

    rate = enh.get("rate")
    add("records/s", "Quix Streams", "rec/s", rate, fig("quix", "rate"), 1.2)
    add("records/s", "faust-streaming", "rec/s", rate, fig("faust", "rate"), 15)
    add("records/s", "raw aiokafka dict-state ceiling", "rec/s", rate, fig("raw-dict", "rate"), 0.6)
    add(
        "records/s",
        "raw aiokafka rocksdict + changelog",
        "rec/s",
        rate,
        fig("raw-rocksdb", "rate"),
        None,
    )
    # what typed declarations cost: the typed ledger against the untyped one (issue: >= 0.9)
    add(
        "records/s, typed / untyped",
        "its untyped ledger",
        "rec/s",
        fig("enhydra-typed", "rate"),
        rate,
        0.9,
    )
    add(
        "peak RSS",
        "Quix Streams",
        "MiB",
        enh.get("peak_rss_mb"),
        fig("quix", "peak_rss_mb"),
        1.0,
        higher_is_better=False,
    )
    cost = enh.get("cpu_us_per_record")
    for name in ("quix", "faust", "raw-dict"):
        ref = fig(name, "cpu_us_per_record")
        # Reported as reference / ours, so > 1 means Enhydra needs less CPU per record.
        add(
            "CPU µs/record (ref / ours)",
            LABELS[name],
            "µs",
            cost,
            ref,
            None,
            ratio=(ref / cost) if cost and ref else None,
        )
    rows_by = {(r["system"], r["load"]): r for r in (lat or {}).get("summary", [])}
    for (system, load), row in rows_by.items():
        if system != "enhydra":
            continue
        measure = f"latency p99 at {100 * load:.0f}% of max rate"
        if row["target_ms"]:
            add(measure, "target", "ms", row["p99_ms"], row["target_ms"], 1.0, False)
        reference = rows_by.get(("raw-rocksdb", load))
        if reference is not None:
            add(
                measure,
                "raw aiokafka rocksdict + changelog, same load",
                "ms",
                row["p99_ms"],
                reference["p99_ms"],
                None,
            )
    return rows


def print_report(data: dict) -> None:
    from bench.common import table

    summary = data["summary"]
    print(
        f"\nthroughput, ledger workload: {data['config']['commands']:,} commands, "
        f"{data['config']['keys']:,} keys, {PARTITIONS} partitions; {data['machine']}"
    )
    print(
        f"medians of {data['config']['repeat']} run(s); 1-min load average "
        f"{data['load_before']} before, {data['load_after']} after"
    )
    rows = []
    for name, s in summary.items():
        if not s.get("runs"):
            rows.append([LABELS.get(name, name), "failed", "", "", "", "", ""])
            continue
        rows.append(
            [
                LABELS.get(name, name),
                f"{s['rate']:,.0f}",
                f"{s['rate_min']:,.0f}-{s['rate_max']:,.0f}",
                f"{s['cpu_percent']:.0f}",
                f"{s['cpu_us_per_record']:.1f}",
                f"{s['peak_rss_mb']:.0f}",
                f"{s['outputs']:,}" + ("" if s["complete"] else " (capped)"),
            ]
        )
    print(
        table(
            ["system", "records/s", "range", "CPU %", "CPU µs/rec", "peak RSS MiB", "outputs"], rows
        )
    )
    print()
    for r in data["ratios"]:
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        target = ""
        if r["target"] is not None:
            op = "<=" if r["measure"].startswith(("peak", "latency")) else ">="
            status = "n/a" if r["met"] is None else ("met" if r["met"] else "MISSED")
            target = f" (target {op} {r['target']}: {status})"
        print(
            f"ratio Enhydra vs {r['reference']}, {r['measure']}: ours {r['ours']}, "
            f"reference {r['ref']}, ratio {ratio}{target}"
        )
    if data.get("latency"):
        latency.print_report(data["latency"])
    if data.get("sweep"):
        print("\nrecords/s as keys grow:")
        for row in data["sweep"]:
            print(
                f"  {row['system']:<12} {row['keys']:>8,} keys  {row['rate']:>10,.0f} rec/s  "
                f"{row['cpu_us_per_record']:>6.1f} µs/rec  {row['peak_rss_mb']:>6.0f} MiB"
            )
    if data.get("profile"):
        print("\nEnhydra worker profile (py-spy, % of active samples), by area:")
        for name, pct in data["profile"]["areas"][:10]:
            print(f"  {pct:5.1f}%  {name}")


async def preload(bootstrap: str, topic: str, keys: int, commands: int, seed: int) -> None:
    await create_topics(bootstrap, [TopicSpec(topic, PARTITIONS)])
    started = time.monotonic()
    count = await produce_fast(bootstrap, topic, command_records(keys, commands, seed), PARTITIONS)
    progress(
        f"preloaded {count:,} commands over {keys:,} keys into {topic} "
        f"in {time.monotonic() - started:.1f}s"
    )


async def run(args: argparse.Namespace) -> dict:
    """Every measurement of this benchmark; returns the data the report is written from."""
    configure_logging(level="warning")  # topic creation etc. would drown the results
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown system(s) {', '.join(unknown)}; choose from {SYSTEMS}")
    if "quix" in systems and quix_python() is None:
        raise SystemExit(
            "quixstreams is not installed, so Quix Streams cannot run: "
            "pip install -e '.[bench]' (make bench does), set BENCH_QUIX_PYTHON to a python "
            "that has it, or leave it out with --systems"
        )
    if args.profile and "enhydra" in systems and profile.py_spy() is None:
        raise SystemExit(
            "py-spy is not installed, so the profile cannot be taken: "
            "pip install -e '.[bench]' (make bench does), or pass --no-profile"
        )
    data: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine(),
        "config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "load_before": load_average(),
        "systems": systems,
        "labels": LABELS,
    }
    results: list[harness.Result] = []
    with fresh_broker() as (bootstrap, root):
        await preload(bootstrap, COMMANDS_TOPIC, args.keys, args.commands, args.seed)
        for repeat in range(args.repeat):
            order = systems[repeat % len(systems) :] + systems[: repeat % len(systems)]
            for name in order:
                app = f"{name}-r{repeat}"
                progress(f"run {repeat + 1}/{args.repeat}: {LABELS[name]}")
                result = await harness.measure(
                    bootstrap,
                    launch(name, app, bootstrap, COMMANDS_TOPIC, root / app),
                    inputs=args.commands,
                    keys=args.keys,
                    cap_s=args.faust_cap if name == "faust" else args.cap,
                )
                progress(
                    f"  {result.rate:,.0f} rec/s, CPU {result.cpu_percent:.0f}%, "
                    f"RSS {result.peak_rss_mb:.0f} MiB, {result.outputs:,} outputs"
                )
                results.append(result)
        data["runs"] = [r.as_dict() for r in results]
        data["summary"] = summarize(results)
        if args.profile and "enhydra" in systems:
            data["profile"] = await profile_run(bootstrap, root, args)
        data["sweep"] = await sweep(bootstrap, root, args, systems, data["summary"])
        data["load_after"] = load_average()
    data["latency"] = None
    if args.latency_seconds > 0 and "enhydra" in systems:
        data["latency"] = await latency.run(latency_args(args, systems))
    data["ratios"] = ratios(data["summary"], data["latency"])
    return data


def latency_args(args: argparse.Namespace, systems: list[str]) -> argparse.Namespace:
    """latency.py's options for this run: the same keys and repeats, its own defaults else."""
    chosen = [s for s in ("enhydra", "raw-rocksdb") if s in systems]
    options = [
        "--loads",
        args.latency_loads,
        "--seconds",
        str(args.latency_seconds),
        "--repeat",
        str(args.repeat),
        "--systems",
        ",".join(chosen),
        "--keys",
        str(args.keys),
        "--pin",
        args.latency_pin,
    ]
    return latency.apply_defaults(latency.parser().parse_args(options))


def throughput_problems(data: dict) -> list[str]:
    """What makes this run's figures incomplete: systems without a median of all repeats."""
    repeat = data["config"]["repeat"]
    problems = []
    for name in data["systems"]:
        runs = data["summary"].get(name, {}).get("runs", 0)
        if runs < repeat:
            problems.append(f"{LABELS[name]}: {runs} of {repeat} runs succeeded")
    return problems


async def profile_run(bootstrap: str, root: Path, args: argparse.Namespace) -> dict:
    app = "enhydra-profile"
    raw = root / "enhydra-profile.txt"
    progress("profiling one more Enhydra run with py-spy")
    result = await harness.measure(
        bootstrap,
        launch("enhydra", app, bootstrap, COMMANDS_TOPIC, root / app),
        inputs=args.commands,
        keys=args.keys,
        cap_s=args.cap,
        profile_to=raw,
    )
    if not raw.exists():
        raise SystemExit(
            "py-spy wrote no profile: is ptrace permitted here? (pass --no-profile to run "
            "without the profile)"
        )
    summary = profile.summarize(raw)
    summary["rate_while_profiled"] = result.rate
    if args.profile_out:
        Path(args.profile_out).write_text(raw.read_text())
    return summary


async def sweep(
    bootstrap: str, root: Path, args: argparse.Namespace, systems: list[str], summary: dict
) -> list[dict]:
    """Records/s, CPU per record and RSS as the number of keys (the state) grows."""
    rows = []
    chosen = [s for s in args.sweep_systems.split(",") if s in systems]
    sizes = [int(k) for k in args.sweep_keys.split(",") if k]
    for keys in sizes:
        if keys == args.keys:  # already measured: reuse the medians
            for name in chosen:
                s = summary.get(name, {})
                if s.get("runs"):
                    rows.append(
                        {
                            "system": name,
                            "keys": keys,
                            "rate": s["rate"],
                            "cpu_us_per_record": s["cpu_us_per_record"],
                            "peak_rss_mb": s["peak_rss_mb"],
                        }
                    )
            continue
        commands = max(args.sweep_commands, 2 * keys)
        topic = f"sweep-{keys}-commands"
        await preload(bootstrap, topic, keys, commands, args.seed)
        for name in chosen:
            app = f"{name}-k{keys}"
            progress(f"sweep {keys:,} keys: {LABELS[name]}")
            r = await harness.measure(
                bootstrap,
                launch(name, app, bootstrap, topic, root / app),
                inputs=commands,
                keys=keys,
                cap_s=args.cap,
            )
            if r.rate > 0:
                rows.append(
                    {
                        "system": name,
                        "keys": keys,
                        "rate": r.rate,
                        "cpu_us_per_record": round(1e6 * r.cpu_percent / 100 / r.rate, 1),
                        "peak_rss_mb": r.peak_rss_mb,
                    }
                )
    return sorted(rows, key=lambda row: (row["system"], row["keys"]))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="~5 minutes: fewer commands, no sweep")
    p.add_argument("--commands", type=int, help="preloaded commands (default 300k, quick 40k)")
    p.add_argument("--keys", type=int, default=10_000, help="accounts in the main workload")
    p.add_argument("--repeat", type=int, default=3, help="runs per system (at least 3)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    p.add_argument("--cap", type=float, default=180, help="max seconds of processing per run")
    p.add_argument("--faust-cap", type=float, help="faust's cap (default 40 s, quick 10 s)")
    p.add_argument("--latency-seconds", type=float, help="latency run length (0: skip)")
    p.add_argument("--latency-loads", default="0.25,0.5", help="fractions of the max rate")
    p.add_argument("--latency-pin", choices=("split", "service", "none"), default="split")
    p.add_argument("--sweep-keys", help="key counts for the scaling plot (empty: skip)")
    p.add_argument("--sweep-systems", default="raw-dict,enhydra,quix")
    p.add_argument(
        "--sweep-commands",
        type=int,
        help="commands per sweep point (default: --commands; at least 2 x keys)",
    )
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--profile-out", help="also keep py-spy's raw stacks here")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--docs", action="store_true", help="write docs/benchmarks.md and the plots")
    return p


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Sizes for a full run (~15 min on 2 busy cores) or a quick one (~5 min)."""
    quick = args.quick
    if args.repeat < 3:
        raise SystemExit("--repeat must be at least 3: every ratio is a median of 3 or more runs")
    defaults = {
        "commands": 40_000 if quick else 300_000,
        "faust_cap": 10.0 if quick else 40.0,
        "latency_seconds": 6.0 if quick else 20.0,
        "sweep_keys": "" if quick else "1000,10000,100000",
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.sweep_commands is None:
        args.sweep_commands = args.commands
    if quick:
        args.profile = False
    return args


def main() -> None:
    args = apply_defaults(parser().parse_args())
    data = asyncio.run(run(args))
    print_report(data)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2, default=str))
    if args.docs:
        from bench.throughput import report

        report.write(data, others=[])
    problems = throughput_problems(data)
    if problems:
        sys.exit("throughput benchmark incomplete: " + "; ".join(problems))


if __name__ == "__main__":
    main()
