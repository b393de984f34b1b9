"""Every benchmark in one command: `make bench` or `.venv/bin/python -m bench [--quick]`.

Runs the throughput benchmark (bench/throughput: Enhydra vs the raw aiokafka ceiling, faust and
Quix Streams), then each other benchmark script in bench/ with small sizes, one after the other
so they never compete for the 2 cores; prints each one's figures and ratios (every ratio a
median of at least 3 interleaved runs), and regenerates docs/benchmarks.md and its plots from
this run. A script that fails is reported with its output tail and the others still run, but
the whole run then exits with an error: a result that is missing is never passed off as done.
`make bench` installs what the benchmarks need first (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, machine, progress
from bench.throughput import report
from bench.throughput.__main__ import apply_defaults, print_report, throughput_problems
from bench.throughput.__main__ import parser as throughput_parser
from bench.throughput.__main__ import run as run_throughput

# script -> (full args, quick args): small sizes so the whole run stays near 25 (6) minutes;
# every ratio is still a median of 3 interleaved runs.
OTHERS = {
    "state_restore.py": (
        ["--keys", "200000", "--repeat", "3"],
        ["--keys", "50000", "--repeat", "3"],
    ),
    # static (no detector) waits the 30 s session timeout per kill: left to the full script
    "state_failover.py": (
        ["--keys", "100000", "--repeat", "3", "--variants", "dynamic,static+fd"],
        [
            *("--keys", "10000", "--repeat", "3", "--variants", "static+fd"),
            *("--roll-keys", "10000", "--roll-variants", "static"),
        ],
    ),
    "static_membership.py": (["--repeat", "3"], ["--repeat", "3", "--skip-static-alone"]),
    "snapshot_export.py": (  # below ~500k keys, opening RocksDB and topics weigh on the ratios
        ["--keys", "1000000", "--repeat", "3"],
        ["--keys", "500000", "--repeat", "3"],
    ),
    "spark_fold.py": (
        ["--events", "1000000", "--accounts", "50000", "--rounds", "3"],
        ["--events", "100000", "--accounts", "10000", "--rounds", "3"],
    ),
    "framework_step.py": (["--rounds", "5"], ["--commands", "40000", "--rounds", "3"]),
    "query_latency.py": (
        ["--rate", "500", "--seconds", "4", "--rounds", "3"],
        ["--rate", "300", "--seconds", "2", "--rounds", "3"],
    ),
    # the ledger engine with tracing off, 1 % and every command sampled (OpenTelemetry SDK)
    "tracing_cost.py": (
        ["--commands", "20000", "--keys", "2000", "--rounds", "3"],
        ["--commands", "10000", "--keys", "1000", "--rounds", "3"],
    ),
    # the aggregate's step alone: what passing contexts on and the sampled spans cost in it
    "tracing_step.py": (["--rounds", "9"], ["--commands", "10000", "--rounds", "3"]),
    # a SQL projection's write path against a raw COPY, then the whole engine (own PostgreSQL)
    "sql_projection.py": (["--events", "100000", "--repeat", "3"], ["--repeat", "3"]),
    "sql_engine.py": (
        ["--events", "100000", "--repeat", "3"],
        ["--events", "40000", "--repeat", "3"],
    ),
}


# structlog lines some scripts let through to stdout: not part of their results
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


def run_other(script: str, args: list[str], timeout: float) -> dict:
    """Run one bench script; keep its stdout (tables, ratio lines) and the tail of stderr."""
    module = f"bench.{script.removesuffix('.py')}"  # as a module: `bench` imports resolve
    command = [sys.executable, "-m", module, *args]
    shown = " ".join([".venv/bin/python", "-m", module, *args])
    progress(f"running {shown}")
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        output = [x for x in done.stdout.strip().splitlines() if not _LOG_LINE.match(x)]
        status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
        if done.returncode != 0:
            output += ["--- stderr (tail) ---", *done.stderr.strip().splitlines()[-15:]]
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        output = [*stdout.strip().splitlines(), f"--- killed after {timeout:.0f} s ---"]
        status = f"timed out after {timeout:.0f} s"
    seconds = time.monotonic() - started
    progress(f"{script}: {status} in {seconds:.0f}s")
    return {
        "name": script.removesuffix(".py"),
        "command": shown,
        "status": status,
        "seconds": seconds,
        "output": output,
    }


def main() -> None:
    parser = throughput_parser()
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--only", help="comma-separated: throughput and/or other script names")
    parser.add_argument("--other-timeout", type=float, help="seconds per other script")
    parser.add_argument(
        "--no-docs",
        dest="docs_out",
        action="store_false",
        help="do not rewrite docs/benchmarks.md and its plots",
    )
    args = apply_defaults(parser.parse_args())
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - {"throughput", *(s.removesuffix(".py") for s in OTHERS)}
    if unknown:
        parser.error(f"--only: no benchmark named {', '.join(sorted(unknown))}")
    if args.docs_out and (only is None or "throughput" in only):
        report.pyplot()  # before the measuring, not after
    started = time.monotonic()
    data = None
    if only is None or "throughput" in only:
        data = asyncio.run(run_throughput(args))
        print_report(data)
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2, default=str))
    timeout = args.other_timeout or (240 if args.quick else 600)
    others = []
    for script, (full, quick) in OTHERS.items():
        name = script.removesuffix(".py")
        if only is not None and name not in only:
            continue
        others.append(run_other(script, quick if args.quick else full, timeout))
    print(f"\nmachine: {machine()}")
    for other in others:
        print(f"\n== {other['name']} ({other['status']}, {other['seconds']:.0f}s)")
        print("\n".join(other["output"]))
    if data is not None and args.docs_out:
        command = "python -m bench" + (" --quick" if args.quick else "")
        path = report.write(data, others, command=command)
        progress(f"wrote {path.relative_to(ROOT)} and its plots")
    progress(f"all benchmarks done in {time.monotonic() - started:.0f}s")
    problems = [f"{o['name']} {o['status']}" for o in others if o["status"] != "ok"]
    if data is not None:
        problems += throughput_problems(data)
    if problems:
        sys.exit("benchmarks incomplete: " + "; ".join(problems))


if __name__ == "__main__":
    main()
