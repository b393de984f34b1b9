"""`make demo`: a real broker, two ledger instances, a few thousand commands, balances read back.

Everything it starts it stops, and the summary shows numbers read from the running system
(over HTTP and from the topics), checked against an independent model of the ledger.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from enhydra.devtools.broker import LocalBroker
from enhydra.testing.processes import (
    ServiceProcess,
    produce_json,
    read_topic,
    service_env,
    wait_for_committed,
)
from ledger.workload import generate, model

ACCOUNTS = 1000
COMMANDS = 5000
APP_ID = "ledger"


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="enhydra-demo-"))
    broker = LocalBroker(work / "kafka", port=0)
    say("starting a local Apache Kafka broker (KRaft) ...")
    info = broker.start()
    bootstrap = info.bootstrap
    say(f"broker ready at {bootstrap}")
    instances: list[ServiceProcess] = []
    try:
        for name, zone in (("ledger-1", "a"), ("ledger-2", "b")):
            env = service_env(
                app_id=APP_ID,
                bootstrap=bootstrap,
                instance_id=name,
                state_dir=work / name,
                extra={"ENHYDRA_CLIENT_TAGS": f"zone={zone}"},
            )
            instances.append(ServiceProcess("ledger.service:service", env, work / f"{name}.log"))
        for inst in instances:
            inst.start()
        for inst in instances:
            inst.wait_ready(timeout=90)
            say(f"{inst.instance_id} ready at {inst.url}")

        commands = generate(ACCOUNTS, COMMANDS, seed=42)
        say(f"sending {len(commands)} commands for {ACCOUNTS} accounts to {APP_ID}-commands ...")
        started = time.monotonic()
        asyncio.run(produce_json(bootstrap, f"{APP_ID}-commands", commands))
        asyncio.run(wait_for_committed(bootstrap, APP_ID, f"{APP_ID}-commands", timeout=180))
        elapsed = time.monotonic() - started
        say(f"all commands processed in {elapsed:.2f}s ({len(commands) / elapsed:,.0f}/s)")

        say("reading every balance back over HTTP ...")
        balances: dict[str, dict] = {}
        served_by: collections.Counter[str] = collections.Counter()
        for account in sorted({key for key, _ in commands}):
            for inst in instances:
                status, body = inst.get(f"/v1/stores/accounts/keys/{account}?forward=false")
                if status == 200:
                    balances[account] = body
                    served_by[inst.instance_id] += 1
                    break
        expected = model(commands)
        mismatches = [a for a in expected if balances.get(a) != expected[a]]

        events = asyncio.run(read_topic(bootstrap, f"{APP_ID}-events"))
        rejections = asyncio.run(read_topic(bootstrap, f"{APP_ID}-rejections"))
        reasons = collections.Counter(
            re.sub(r"\d+", "N", json.loads(r.value)["reason"]) for r in rejections
        )
        status_counts = collections.Counter(b["status"] for b in balances.values())
        richest = sorted(balances.items(), key=lambda kv: -kv[1]["balance"])[:5]

        print()
        print("Enhydra ledger demo: results read back from the running services")
        print(f"  commands sent         {len(commands):>8}")
        print(f"  events produced       {len(events):>8}")
        print(f"  rejections produced   {len(rejections):>8}")
        for reason, count in reasons.most_common():
            print(f"      {reason[:44]:<44} {count:>6}")
        print(f"  accounts read (HTTP)  {len(balances):>8}  ({dict(status_counts)})")
        for inst in instances:
            print(f"      served by {inst.instance_id:<24} {served_by[inst.instance_id]:>6}")
        print(f"  total balance         {sum(b['balance'] for b in balances.values()):>8}")
        print("  richest accounts:")
        for account, state in richest:
            print(f"      {account}  balance={state['balance']:<6} version={state['version']}")
        print(f"  mismatches vs model   {len(mismatches):>8}")
        print()
        return 0 if not mismatches and len(balances) == len(expected) else 1
    finally:
        say("stopping instances and broker ...")
        for inst in instances:
            try:
                inst.stop(timeout=30)
            except TimeoutError:
                inst.kill()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
