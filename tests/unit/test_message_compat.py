"""`enhydra topology check` on message contracts: event versions against every version the
history holds, command schemas against their senders, the stored state against its entries.

The typed ledger (examples/ledger/ledger/typed.py) is the input: each test changes one of its
declarations the way a team would, builds the topology, and compares it with the baseline.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import pytest

from enhydra import Aggregate
from enhydra.messages import json_schema
from enhydra.topology import Change, build_topology, compare, locked, render, verdict
from enhydra.topology import Path as UpgradePath
from enhydra.topology.schema import schema_differences
from ledger import typed as ledger

LEDGER = Path(ledger.__file__)
EVENTS = (ledger.Opened, ledger.Deposited, ledger.Withdrawn, ledger.Closed)
COMMANDS = (ledger.Open, ledger.Deposit, ledger.Withdraw, ledger.Close)


def accounts(**changes: Any) -> Aggregate:
    """The typed ledger's aggregate with some declarations changed."""
    args: dict[str, Any] = {
        "name": "accounts",
        "decide": ledger.decide,
        "apply": ledger.apply,
        "command_types": COMMANDS,
        "event_types": EVENTS,
        "state_type": ledger.Account,
        "event_versions": {"deposited": 2},
        "upcasters": {("deposited", 1): ledger.deposited_v1_to_v2},
    }
    args.update(changes)
    return Aggregate(**args)


def topology(aggregate: Aggregate | None = None) -> dict[str, Any]:
    built = build_topology("ledger", aggregate or ledger.accounts, partitions=4)
    return json.loads(json.dumps(built))  # what a file round trip gives


def deployed(aggregate: Aggregate | None = None) -> dict[str, Any]:
    """The baseline written by `enhydra topology lock --deployed` for that code."""
    return locked(topology(aggregate), None, deployed=True)


def message_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    return [c for c in compare(old, new) if not c.subject.startswith("handlers")]


def incompatible(changes: list[Change]) -> list[Change]:
    return [c for c in changes if not c.compatible]


# --------------------------------------------------------------------------- events


class DepositedWithNote(msgspec.Struct, tag="deposited"):
    amount: int
    note: str
    currency: Literal["EUR"] = "EUR"


class DepositedWithOptionalNote(msgspec.Struct, tag="deposited"):
    amount: int
    currency: Literal["EUR"] = "EUR"
    note: str = ""


def with_deposited(cls: type) -> tuple[type, ...]:
    return (ledger.Opened, cls, ledger.Withdrawn, ledger.Closed)


def test_the_typed_ledger_is_compatible_with_its_own_baseline() -> None:
    assert compare(deployed(), topology()) == []


def test_a_required_field_added_without_a_version_bump_is_incompatible() -> None:
    new = topology(accounts(event_types=with_deposited(DepositedWithNote)))
    (change,) = message_changes(deployed(), new)
    assert change.subject == "event deposited" and not change.compatible
    assert change.path is UpgradePath.CHANGE_CODE
    assert change.detail.startswith(
        "event type deposited changed at version 2 without a new version ($.note: new required "
        "field (old values lack it))"
    )
    assert change.detail.endswith(
        "bump event_versions['deposited'] to 3 and add upcasters[('deposited', 2)]"
    )
    assert verdict([change]) is UpgradePath.CHANGE_CODE


def test_an_optional_field_at_the_same_version_is_compatible() -> None:
    new = topology(accounts(event_types=with_deposited(DepositedWithOptionalNote)))
    changes = message_changes(deployed(), new)
    assert [(c.subject, c.compatible) for c in changes] == [("event deposited", True)]
    assert "backward-compatible change at version 2: $.note: new optional field" in (
        changes[0].detail
    )


def test_the_bumped_version_with_its_upcaster_is_compatible() -> None:
    def v2_to_v3(event: dict) -> dict:
        return {**event, "note": ""}

    new = topology(
        accounts(
            event_types=with_deposited(DepositedWithNote),
            event_versions={"deposited": 3},
            upcasters={("deposited", 1): ledger.deposited_v1_to_v2, ("deposited", 2): v2_to_v3},
        )
    )
    changes = message_changes(deployed(), new)
    assert [(c.subject, c.compatible) for c in changes] == [("event deposited", True)]
    assert changes[0].detail == "version 2 -> 3: events of version(s) 1, 2 are upcast on read"


def test_a_version_without_its_upcaster_is_refused_when_the_aggregate_is_built() -> None:
    with pytest.raises(ValueError, match=r"no upcaster from version 2 to 3"):
        accounts(event_versions={"deposited": 3})


def test_a_missing_upcaster_step_from_a_version_in_the_history_is_incompatible() -> None:
    # The deployed code wrote deposited v1; the candidate reads v2 but (a hand-edited or a
    # plugin-built topology) lists no upcaster from 1: the v1 events could not be read.
    old = deployed()
    old["messages"]["events"]["deposited"].update(version=1, upcasters=[])
    old["messages"]["events"]["deposited"]["schemas"] = {"1": {"type": "object"}}
    new = topology()
    new["messages"]["events"]["deposited"]["upcasters"] = []
    (change,) = message_changes(old, new)
    assert not change.compatible and change.subject == "event deposited"
    assert change.detail.startswith("no upcaster from 1 to 2: events deposited of version(s) 1")
    assert change.path is UpgradePath.CHANGE_CODE
    # with the step, the same history is read
    assert [c.compatible for c in message_changes(old, topology())] == [True]


def test_a_history_newer_than_the_code_is_incompatible() -> None:
    old = deployed()
    old["messages"]["events"]["deposited"]["versions"] = [1, 2, 3]
    (change,) = message_changes(old, topology())
    assert not change.compatible
    assert "the history holds version(s) 3 of deposited, this code reads versions up to 2" in (
        change.detail
    )


def test_a_removed_event_type_is_incompatible() -> None:
    new = topology(accounts(event_types=(ledger.Opened, ledger.Deposited, ledger.Withdrawn)))
    (change,) = message_changes(deployed(), new)
    assert change.subject == "event closed" and not change.compatible
    assert change.path is UpgradePath.OFFLINE_RESET
    assert change.detail.startswith(
        "event type closed removed: the history holds it (versions 1), apply can no longer read it"
    )


def test_a_new_event_type_is_compatible() -> None:
    class Frozen(msgspec.Struct, tag="frozen"):
        pass

    new = topology(accounts(event_types=(*EVENTS, Frozen)))
    changes = message_changes(deployed(), new)
    assert [(c.subject, c.compatible, c.detail) for c in changes] == [
        ("event frozen", True, "new event type (version 1)")
    ]


# --------------------------------------------------------------------------- commands


class DepositWithReference(msgspec.Struct, tag="deposit"):
    account: ledger.AccountId
    amount: ledger.Amount
    reference: str


class DepositUpTo1000(msgspec.Struct, tag="deposit"):
    account: ledger.AccountId
    amount: Annotated[int, msgspec.Meta(gt=0, le=1000)]


class DepositOfAnyAmount(msgspec.Struct, tag="deposit"):
    account: ledger.AccountId
    amount: int | float


def with_deposit(cls: type) -> tuple[type, ...]:
    return (ledger.Open, cls, ledger.Withdraw, ledger.Close)


@pytest.mark.parametrize(
    ("cls", "named"),
    [
        (DepositWithReference, "$.reference: new required field"),
        (DepositUpTo1000, "$.amount: maximum None -> 1000"),
    ],
)
def test_a_narrowed_command_is_incompatible(cls: type, named: str) -> None:
    new = topology(accounts(command_types=with_deposit(cls)))
    changes = incompatible(message_changes(deployed(), new))
    assert [c.subject for c in changes] == ["command deposit"]
    assert changes[0].detail.startswith(f"command schema narrowed: {named}")
    assert changes[0].detail.endswith(
        "senders still writing the old shape go to the dead-letter queue"
    )
    assert changes[0].path is UpgradePath.SENDERS_FIRST


def test_a_widened_command_is_compatible() -> None:
    new = topology(accounts(command_types=with_deposit(DepositOfAnyAmount)))
    changes = message_changes(deployed(), new)
    assert changes and all(c.compatible for c in changes), [c.detail for c in changes]
    assert all(c.detail.startswith("command schema widened: $.amount") for c in changes)


def test_a_removed_command_type_is_incompatible() -> None:
    new = topology(accounts(command_types=(ledger.Open, ledger.Deposit, ledger.Withdraw)))
    (change,) = message_changes(deployed(), new)
    assert (change.subject, change.compatible) == ("command close", False)
    assert "senders still sending it get their commands sent to the dead-letter queue" in (
        change.detail
    )


# --------------------------------------------------------------------------- state


class AccountWithOwner(msgspec.Struct):
    balance: int
    status: Literal["open", "closed"]
    version: int
    owner: str


def add_owner(state: dict) -> dict:
    return {**state, "owner": "?"}


def test_a_state_changed_at_the_same_version_is_incompatible() -> None:
    new = topology(accounts(state_type=AccountWithOwner))
    (change,) = message_changes(deployed(), new)
    assert (change.subject, change.compatible) == ("state of accounts", False)
    assert "$.owner: new required field" in change.detail
    assert "bump state_version to 2 and add state_migrations[1]" in change.detail


def test_a_raised_state_version_with_its_migration_is_compatible() -> None:
    new = topology(
        accounts(state_type=AccountWithOwner, state_version=2, state_migrations={1: add_owner})
    )
    changes = message_changes(deployed(), new)
    assert [(c.subject, c.compatible, c.detail) for c in changes] == [
        ("state of accounts", True, "state version 1 -> 2: entries are migrated on load")
    ]


def test_a_lowered_state_version_is_incompatible() -> None:
    old = deployed(
        accounts(state_type=AccountWithOwner, state_version=2, state_migrations={1: add_owner})
    )
    (change,) = message_changes(old, topology())
    assert not change.compatible and change.path is UpgradePath.OFFLINE_RESET
    assert change.detail.startswith("state version lowered 2 -> 1")


# --------------------------------------------------------------------------- old baselines, logic


def test_a_baseline_without_message_contracts_reports_only_their_declaration() -> None:
    old = deployed()
    del old["messages"]
    changes = compare(old, topology())
    assert [(c.subject, c.compatible) for c in changes] == [("messages", True)]
    assert changes[0].detail == "message contracts declared (the baseline has none yet)"


def test_a_changed_upcaster_is_a_compatible_logic_change() -> None:
    def euros_again(event: dict) -> dict:
        return {**event, "currency": "EUR", "upcast": True}

    new = topology(accounts(upcasters={("deposited", 1): euros_again}))
    changes = compare(deployed(), new)
    assert [(c.subject, c.compatible) for c in changes] == [("handlers of accounts", True)]
    assert changes[0].detail.startswith("handler logic changed")


# --------------------------------------------------------------------------- the baseline grows


class DepositedV1(msgspec.Struct, tag="deposited"):
    amount: int


def test_the_baseline_keeps_every_deployed_event_version() -> None:
    v1 = accounts(event_types=with_deposited(DepositedV1), event_versions={}, upcasters={})
    first = deployed(v1)
    assert list(first["messages"]["events"]["deposited"]["schemas"]) == ["1"]

    second = locked(topology(), first, deployed=True)
    deposited = second["messages"]["events"]["deposited"]
    assert list(deposited["schemas"]) == ["1", "2"]
    assert deposited["schemas"]["1"]["required"] == ["type", "amount"]
    assert deposited["versions"] == [1, 2]
    assert message_changes(second, topology()) == []

    # the code rolled back to v1 would meet v2 events in the history
    (change,) = incompatible(message_changes(second, topology(v1)))
    assert "the history holds version(s) 2 of deposited" in change.detail


def test_an_event_type_dropped_after_a_deploy_stays_in_the_baseline_as_retired() -> None:
    without = accounts(event_types=(ledger.Opened, ledger.Deposited, ledger.Withdrawn))
    baseline = locked(topology(without), deployed(), deployed=True)
    assert "closed" not in baseline["messages"]["events"]
    retired = baseline["messages"]["retired_events"]["closed"]
    assert retired["versions"] == [1] and "1" in retired["schemas"]
    assert compare(baseline, topology(without)) == []  # not reported again
    # brought back in a narrower shape, it is held to the history it left there
    later = locked(topology(without), baseline, deployed=True)
    assert later["messages"]["retired_events"] == baseline["messages"]["retired_events"]

    class ClosedWithReason(msgspec.Struct, tag="closed"):
        reason: str

    back = topology(accounts(event_types=(*EVENTS[:3], ClosedWithReason)))
    (change,) = message_changes(later, back)
    assert change.subject == "event closed" and not change.compatible
    assert "$.reason: new required field" in change.detail


def test_a_baseline_not_deployed_yet_follows_the_code() -> None:
    v1 = accounts(event_types=with_deposited(DepositedV1), event_versions={}, upcasters={})
    draft = locked(topology(v1), None, deployed=False)
    rewritten = locked(topology(), draft, deployed=False)
    assert list(rewritten["messages"]["events"]["deposited"]["schemas"]) == ["2"]
    assert "versions" not in rewritten["messages"]["events"]["deposited"]


def test_render_shows_a_message_change_like_the_others() -> None:
    new = topology(accounts(event_types=with_deposited(DepositedWithNote)))
    text = render(compare(deployed(), new), app_id="ledger", against="topology.json")
    assert "  INCOMPATIBLE  event deposited: event type deposited changed at version 2" in text
    assert "upgrade path: change the code: no deploy procedure makes this safe" in text
    assert text.endswith("result: 1 incompatible change(s)")


# --------------------------------------------------------------------------- the CLI


def enhydra(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "enhydra.cli.main", "topology", *args]
    return subprocess.run(command, cwd=project, capture_output=True, text=True, check=False)


def test_cli_check_refuses_an_event_changed_without_a_new_version(tmp_path: Path) -> None:
    bank = tmp_path / "bank.py"
    bank.write_text(LEDGER.read_text())
    done = enhydra(tmp_path, "lock", "bank:service", "--deployed")
    assert done.returncode == 0, done.stderr

    source = LEDGER.read_text()
    old_field = "    amount: int\n    currency: Literal"
    assert old_field in source
    bank.write_text(
        source.replace(old_field, "    amount: int\n    note: str\n    currency: Literal")
    )
    check = enhydra(tmp_path, "check", "bank:service", "--against", "topology.json")
    assert check.returncode == 1, check.stdout + check.stderr
    assert (
        "  INCOMPATIBLE  event deposited: event type deposited changed at version 2 without a "
        "new version ($.note: new required field (old values lack it))"
    ) in check.stdout
    assert "result: 1 incompatible change(s)" in check.stdout

    as_json = enhydra(
        tmp_path, "check", "bank:service", "--against", "topology.json", "--format", "json"
    )
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["compatible"] is False and report["upgrade"] == "change the code"
    bad = [c for c in report["changes"] if not c["compatible"]]
    assert [c["subject"] for c in bad] == ["event deposited"]

    # the fix the line names: version 3 and an upcaster from 2
    fixed = (
        bank.read_text()
        .replace('event_versions={"deposited": 2},', 'event_versions={"deposited": 3},')
        .replace(
            'upcasters={("deposited", 1): deposited_v1_to_v2},',
            'upcasters={("deposited", 1): deposited_v1_to_v2, '
            '("deposited", 2): lambda e: {**e, "note": ""}},',
        )
    )
    assert fixed.count('"deposited", 2') == 1
    bank.write_text(fixed)
    check = enhydra(tmp_path, "check", "bank:service", "--against", "topology.json")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "event deposited: version 2 -> 3" in check.stdout

    assert enhydra(tmp_path, "lock", "bank:service", "--deployed").returncode == 0
    baseline = json.loads((tmp_path / "topology.json").read_text())
    assert list(baseline["messages"]["events"]["deposited"]["schemas"]) == ["2", "3"]
    assert baseline["messages"]["events"]["deposited"]["versions"] == [1, 2, 3]


def test_a_malformed_messages_section_is_named(tmp_path: Path) -> None:
    baseline = deployed()
    baseline["messages"]["events"]["deposited"]["version"] = "2"
    (tmp_path / "topology.json").write_text(json.dumps(baseline))
    (tmp_path / "bank.py").write_text(LEDGER.read_text())
    check = enhydra(tmp_path, "check", "bank:service", "--against", "topology.json")
    assert check.returncode == 1
    assert check.stderr.strip().splitlines()[-1] == (
        "Error: topology.json: messages.events.deposited: 'version' must be a whole number from 1"
    )


def test_cli_lock_says_which_event_types_it_retires(tmp_path: Path) -> None:
    bank = tmp_path / "bank.py"
    bank.write_text(LEDGER.read_text())
    assert enhydra(tmp_path, "lock", "bank:service", "--deployed").returncode == 0
    source = LEDGER.read_text()
    declared = "event_types=(Opened, Deposited, Withdrawn, Closed),"
    assert declared in source
    bank.write_text(source.replace(declared, "event_types=(Opened, Deposited, Withdrawn),"))
    check = enhydra(tmp_path, "check", "bank:service", "--against", "topology.json")
    assert check.returncode == 1 and "INCOMPATIBLE  event closed: event type closed removed" in (
        check.stdout
    )
    # deployed with an offline reset: the baseline keeps the type as retired
    done = enhydra(tmp_path, "lock", "bank:service", "--deployed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "topology.json: event type(s) closed no longer declared: kept under "
        "messages.retired_events (the history still holds them)"
    )
    again = enhydra(tmp_path, "check", "bank:service", "--against", "topology.json")
    assert again.returncode == 0 and "no changes" in again.stdout


class Address(msgspec.Struct):
    city: str


class AddressWithZip(msgspec.Struct):
    city: str
    zip: str


def schema_of(**fields: Any) -> dict[str, Any]:
    cls = msgspec.defstruct("Customer", list(fields.items()), tag="customer")
    return json_schema(cls)


@pytest.mark.parametrize(
    ("old", "new", "narrowed"),
    [
        # a nested type reached through $defs and anyOf (msgspec's shape of `X | None`)
        (Address | None, AddressWithZip | None, "$.where.zip: new required field"),
        (Address | None, Address, "$.where: no longer accepts ['null']"),
        (list[Address], list[AddressWithZip], "$.where[].zip: new required field"),
        (Annotated[str, msgspec.Meta(max_length=9)], str, None),
        (str, Annotated[str, msgspec.Meta(pattern="^[a-z]+$")], "$.where: pattern None -> "),
    ],
)
def test_schema_differences_follow_nested_and_optional_types(
    old: Any, new: Any, narrowed: str | None
) -> None:
    found = schema_differences(schema_of(where=old), schema_of(where=new))
    bad = [explanation for compatible, explanation in found if not compatible]
    if narrowed is None:
        assert found and bad == [], found
    else:
        assert any(b.startswith(narrowed) for b in bad), found


def test_a_literal_written_upstream_read_as_a_plain_string_is_compatible() -> None:
    """A msgspec Literal has an enum and no "type": its values say it is a string."""

    class Written(msgspec.Struct):
        reason: Literal["out_of_stock", "declined"]

    class Read(msgspec.Struct):
        reason: str

    differences = schema_differences(json_schema(Written), json_schema(Read))
    assert all(ok for ok, _ in differences), differences
    back = schema_differences(json_schema(Read), json_schema(Written))
    assert not all(ok for ok, _ in back), "a string read as a Literal narrows it"


def test_a_list_constant_is_an_array_when_types_are_compared() -> None:
    assert schema_differences({"const": [1, 2]}, {"type": "array"}) == []
