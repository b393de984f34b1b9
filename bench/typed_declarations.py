"""msgspec or pydantic for typed declarations: what each costs per ledger command, in-process.

Issue #18 asked for whichever measures faster on the ledger. This times the work typing adds to
one command in the runtime: the decoded command dict validated into its declared type (the
edge), the event built and serialized, and a stored state (JSON) converted to the state type,
with the ledger's own commands (ledger.workload), msgspec and pydantic v2 interleaved, medians
of 5 rounds. The untyped path (the dicts as they are, orjson) is the floor.

    .venv/bin/python -m bench.typed_declarations [--commands 100000]

pydantic comes with the `bench` extra; a missing one fails the run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Annotated, Literal

import orjson

from bench.common import machine
from ledger import typed
from ledger.workload import generate


def _pydantic_models():
    try:
        import pydantic
    except ImportError as exc:
        raise SystemExit(f"pydantic is missing ({exc}): pip install -e '.[bench]'") from None
    from pydantic import BaseModel, Field

    class Open(BaseModel):
        type: Literal["open"]
        account: Annotated[str, Field(min_length=1)]

    class Deposit(BaseModel):
        type: Literal["deposit"]
        account: Annotated[str, Field(min_length=1)]
        amount: Annotated[int, Field(gt=0, strict=True)]

    class Withdraw(BaseModel):
        type: Literal["withdraw"]
        account: Annotated[str, Field(min_length=1)]
        amount: Annotated[int, Field(gt=0, strict=True)]

    class Close(BaseModel):
        type: Literal["close"]
        account: Annotated[str, Field(min_length=1)]

    class Deposited(BaseModel):
        type: Literal["deposited"] = "deposited"
        amount: int
        currency: Literal["EUR"] = "EUR"

    class Account(BaseModel):
        balance: int
        status: Literal["open", "closed"]
        version: int

    command = pydantic.TypeAdapter(
        Annotated[Open | Deposit | Withdraw | Close, Field(discriminator="type")]
    )
    return pydantic.__version__, command, Deposited, Account


def run_untyped(commands, state_json):
    for command in commands:
        orjson.dumps({"type": "deposited", "amount": command.get("amount", 1), "currency": "EUR"})
        orjson.loads(state_json)


def run_msgspec(commands, state_json):
    conversions = typed.accounts.typed  # exactly what the runtime runs (enhydra.messages)
    to_command, to_state, encode = conversions.command, conversions.state, conversions.encode
    deposited = typed.Deposited
    for command in commands:
        value = to_command(command)
        encode(deposited(getattr(value, "amount", 1)))
        to_state(orjson.loads(state_json))


def run_pydantic(commands, state_json, models):
    _, adapter, deposited, account = models
    validate = adapter.validate_python
    for command in commands:
        value = validate(command)
        deposited(amount=getattr(value, "amount", 1)).model_dump_json()
        account.model_validate(orjson.loads(state_json))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commands", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    models = _pydantic_models()
    commands = [
        {k: v for k, v in c.items() if k != "command_id"}
        for _, c in generate(1000, args.commands, seed=7)
    ]
    state_json = orjson.dumps({"balance": 10, "status": "open", "version": 3})
    runs = {
        "untyped (orjson dicts)": lambda: run_untyped(commands, state_json),
        "msgspec": lambda: run_msgspec(commands, state_json),
        f"pydantic {models[0]}": lambda: run_pydantic(commands, state_json, models),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():  # interleaved
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    us = {name: statistics.median(t) / len(commands) * 1e6 for name, t in times.items()}
    print(f"typed declarations, {len(commands):,} ledger commands, {machine()}")
    print("| path | µs per command (median of rounds) |")
    print("|---|---|")
    for name, value in us.items():
        print(f"| {name} | {value:.2f} |")
    names = list(us)
    print(f"ratio pydantic / msgspec: {us[names[2]] / us[names[1]]:.2f} (msgspec is the choice)")
    print(f"typing's cost over untyped: msgspec +{us[names[1]] - us[names[0]]:.2f} µs/command")


if __name__ == "__main__":
    main()
