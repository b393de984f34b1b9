"""The contract between a reacting service and its upstream, and reactions in the topology."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import msgspec
import pytest
from click.testing import CliRunner

from enhydra import Aggregate
from enhydra.cli.main import main as cli
from enhydra.reactions import Emit, Reaction
from enhydra.topology import build_topology, compare
from enhydra.topology.asyncapi import build_asyncapi
from enhydra.topology.reactions import ContractError, check_reactions, read_contract


def upstream_topology(deposited: type) -> dict:
    """The ledger's topology with `deposited` as its declared event type."""

    class Opened(msgspec.Struct, tag="opened"):
        pass

    ledger = Aggregate(
        "accounts",
        decide=lambda s, c: [],
        apply=lambda s, e: s,
        event_types=[Opened, deposited],
    )
    return build_topology("ledger", ledger, partitions=4)


class Deposited(msgspec.Struct, tag="deposited"):
    amount: int
    currency: Literal["EUR"] = "EUR"


class DepositedWithoutAmount(msgspec.Struct, tag="deposited"):
    currency: Literal["EUR"] = "EUR"


class DepositedAnyCurrency(msgspec.Struct, tag="deposited"):
    amount: int
    currency: str


class ReadDeposited(msgspec.Struct, tag="deposited"):
    """What the downstream reads: the amount, and the currency as the upstream wrote it."""

    amount: int
    currency: Literal["EUR"] = "EUR"


def downstream(reads: list[type]) -> dict:
    tally = Aggregate("tallies", decide=lambda s, c: [], apply=lambda s, e: s)
    reaction = Reaction("tally", "ledger", lambda up: [Emit(up.key, {})], reads=reads)
    return build_topology("tally", tally, partitions=4, reactions=[reaction])


def findings(upstream: dict, reads: list[type]) -> list[str]:
    down = downstream(reads)
    contract = read_contract(upstream, "contracts/ledger.json")
    found, missing = check_reactions("tally", down["reactions"], {"ledger": contract})
    assert not missing
    return [f.line() for f in found]


@pytest.mark.parametrize("published", ["topology", "asyncapi"])
def test_an_unchanged_upstream_fits_what_the_reaction_reads(published) -> None:
    upstream = upstream_topology(Deposited)
    if published == "asyncapi":
        upstream = build_asyncapi(upstream)
    assert findings(upstream, [ReadDeposited]) == []


@pytest.mark.parametrize("published", ["topology", "asyncapi"])
def test_a_removed_field_the_reaction_reads_is_reported_naming_both_services(published) -> None:
    upstream = upstream_topology(DepositedWithoutAmount)
    if published == "asyncapi":
        upstream = build_asyncapi(upstream)
    [line] = findings(upstream, [ReadDeposited])
    assert line.startswith("ledger -> tally: reaction 'tally' reads ledger's event 'deposited'")
    assert "amount" in line and "the upstream does not write it" in line


def test_a_narrowed_field_is_reported_and_a_removed_type_too() -> None:
    [line] = findings(upstream_topology(DepositedAnyCurrency), [ReadDeposited])
    assert "$.currency: the upstream writes values outside what is read here" in line

    class Closed(msgspec.Struct, tag="closed"):
        pass

    lines = findings(upstream_topology(Deposited), [ReadDeposited, Closed])
    assert lines == [
        "ledger -> tally: reaction 'tally' reads ledger's event 'closed': "
        "contracts/ledger.json no longer lists it (removed or renamed)"
    ]


def test_a_file_that_is_no_contract_says_what_to_save_there() -> None:
    with pytest.raises(ContractError, match="enhydra asyncapi"):
        read_contract({"hello": 1}, "contracts/x.json")


def test_the_asyncapi_document_lists_the_channel_a_reaction_receives_from() -> None:
    doc = build_asyncapi(downstream([ReadDeposited]))
    assert "ledger-events" in doc["channels"]
    assert "deposited" in doc["channels"]["ledger-events"]["messages"]
    receive = doc["operations"]["react_tally"]
    assert receive["action"] == "receive"
    assert receive["channel"] == {"$ref": "#/channels/ledger-events"}
    group = receive["bindings"]["kafka"]["groupId"]["enum"]
    assert group == ["tally-reaction-tally"]


def test_topology_lists_reactions_and_a_service_without_any_is_unchanged() -> None:
    down = downstream([ReadDeposited])
    [reaction] = down["reactions"]
    assert reaction["input"] == "ledger-events" and reaction["sends"] == ["tally-commands"]
    assert "reactions" not in upstream_topology(Deposited)
    moved = json.loads(json.dumps(down))
    moved["reactions"][0]["group"] = "elsewhere"
    [change] = compare(down, moved)
    assert not change.compatible and "read again" in change.detail


def test_topology_check_fails_on_a_broken_upstream_contract(tmp_path, monkeypatch) -> None:
    (tmp_path / "downstream_svc.py").write_text(
        "import msgspec\n"
        "from enhydra import Aggregate, Service\n"
        "from enhydra.reactions import Reaction\n"
        "class Deposited(msgspec.Struct, tag='deposited'):\n"
        "    amount: int\n"
        "service = Service('tally', Aggregate('tallies', lambda s, c: [], lambda s, e: s),\n"
        "    reactions=[Reaction('tally', 'ledger', lambda up: [], reads=[Deposited])])\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    target = "downstream_svc:service"
    assert runner.invoke(cli, ["topology", "lock", target, "-f", "topology.json"]).exit_code == 0
    (tmp_path / "contracts").mkdir()
    contract = tmp_path / "contracts" / "ledger.json"
    contract.write_text(json.dumps(upstream_topology(Deposited)))
    ok = runner.invoke(cli, ["topology", "check", target, "--against", "topology.json"])
    assert ok.exit_code == 0, ok.output
    assert "every event a reaction reads still fits" in ok.output
    contract.write_text(json.dumps(build_asyncapi(upstream_topology(DepositedWithoutAmount))))
    broken = runner.invoke(cli, ["topology", "check", target, "--against", "topology.json"])
    assert broken.exit_code == 1
    assert "INCOMPATIBLE  ledger -> tally: reaction 'tally'" in broken.output
    assert "Traceback" not in broken.output


LEDGER = Path(__file__).resolve().parents[2] / "examples" / "ledger"


@pytest.mark.parametrize("contract", ["asyncapi.json", "topology.json"])
def test_the_tally_reads_what_the_ledgers_committed_contract_publishes(contract) -> None:
    """The untyped ledger lists only the event type it versions: others are not 'removed'."""
    from enhydra.topology import topology_of
    from tests.reactions.tally_service import service

    tally = topology_of(service.resolved(plugins=[]))
    upstream = read_contract(json.loads((LEDGER / contract).read_text()), contract)
    assert upstream.app_id == "ledger" and upstream.events_topic == "ledger-events"
    assert not upstream.complete and "deposited" in upstream.events
    assert check_reactions("tally", tally["reactions"], {"ledger": upstream}) == ([], [])


@pytest.mark.parametrize("published", ["topology", "asyncapi"])
def test_the_tally_fits_the_typed_ledgers_contract(published) -> None:
    from enhydra.topology import topology_of
    from ledger.typed import service as typed_ledger
    from tests.reactions.tally_service import service

    document = topology_of(typed_ledger.resolved(plugins=[]))
    if published == "asyncapi":
        document = build_asyncapi(document)
    upstream = read_contract(document, published)
    assert upstream.complete and set(upstream.events) == {
        "opened",
        "deposited",
        "withdrawn",
        "closed",
    }
    tally = topology_of(service.resolved(plugins=[]))
    assert check_reactions("tally", tally["reactions"], {"ledger": upstream}) == ([], [])


@pytest.mark.slow
def test_the_reference_parser_accepts_a_reacting_services_document(tmp_path) -> None:
    from tests.unit.test_asyncapi_parser import parse, write_document

    path = tmp_path / "tally.json"
    write_document("tests.reactions.tally_service:service", {}, path)
    verdict = parse([path])["tally"]
    errors = [d for d in verdict["diagnostics"] if d["severity"] == "error"]
    assert verdict["valid"] and errors == [], json.dumps(errors, indent=2)
    receive = json.loads(path.read_text())["operations"]["react_tally"]
    assert receive["channel"] == {"$ref": "#/channels/ledger-events"}


def test_the_diagram_draws_a_reaction_between_the_two_topics() -> None:
    from enhydra.topology import to_mermaid

    diagram = to_mermaid(downstream([ReadDeposited]))
    assert "reaction tally (from ledger)" in diagram
    assert diagram.count("-->") >= 2
