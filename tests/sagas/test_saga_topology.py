"""Sagas in the topology and the AsyncAPI document, and what `topology check` says of them."""

from __future__ import annotations

import copy

from enhydra import Aggregate, Service
from enhydra.topology.asyncapi import asyncapi_of
from enhydra.topology.compat import compare
from enhydra.topology.model import topology_of
from tests.sagas.checkout_service import apply, checkout_saga, decide


def shop() -> Service:
    saga = checkout_saga("shop", "payments")
    return Service("shop", Aggregate("orders", decide, apply), sagas=[saga])


def test_a_saga_lists_its_inbox_its_forwarders_and_their_upstream_channels(monkeypatch):
    monkeypatch.delenv("ENHYDRA_APP_ID", raising=False)
    topology = topology_of(shop())
    [saga] = topology["sagas"]
    assert saga["inbox"] == "shop-checkout-saga-inbox" and saga["group"] == "shop-saga-checkout"
    assert saga["sources"] == ["payments", "shop"] and saga["sends"] == ["shop-commands"]
    forwarders = {r["name"]: r for r in topology["reactions"]}
    assert forwarders["checkout-from-payments"]["input"] == "payments-events"
    assert forwarders["checkout-from-payments"]["sends"] == ["shop-checkout-saga-inbox"]
    assert forwarders["checkout-from-shop"]["saga"] == "checkout"
    internal = {t["name"]: t for t in topology["internal_topics"]}
    assert internal["shop-checkout-saga-inbox"]["role"] == "saga-inbox"
    assert internal["shop-checkout-changelog"]["compacted"] is True
    document = asyncapi_of(shop())
    receive = document["operations"]["react_checkout_from_payments"]
    assert receive["action"] == "receive" and "payments-events" in document["channels"]
    assert "shop-checkout-saga-inbox" not in document["channels"]  # internal
    # reading its own events adds no message to the service's own events channel
    own = asyncapi_of(Service("shop", Aggregate("orders", decide, apply)))
    assert document["channels"]["shop-events"] == own["channels"]["shop-events"]
    assert document["operations"]["saga_checkout_send_shop_commands"]["action"] == "send"


def test_moving_a_sagas_group_is_incompatible_changing_its_logic_is_not(monkeypatch):
    monkeypatch.delenv("ENHYDRA_APP_ID", raising=False)
    old = topology_of(shop())
    new = copy.deepcopy(old)
    new["sagas"][0]["group"] = "shop-saga-other"
    new["sagas"][0]["code"] = "sha256:0"
    changes = {(c.detail.split(":")[0], c.compatible) for c in compare(old, new)}
    assert ("group changed", False) in changes and (
        "saga logic changed (applies from now)",
        True,
    ) in changes


def test_removing_a_saga_or_a_target_its_deadlines_send_to_is_flagged(monkeypatch):
    monkeypatch.delenv("ENHYDRA_APP_ID", raising=False)
    old = topology_of(shop())
    old["sagas"][0]["sends"] = ["pay-commands", "shop-commands"]
    fewer = copy.deepcopy(old)
    fewer["sagas"][0]["sends"] = ["shop-commands"]
    [change] = [c for c in compare(old, fewer) if c.subject == "saga checkout"]
    assert not change.compatible and "no longer sends to pay-commands" in change.detail
    gone = copy.deepcopy(old)
    gone["sagas"] = []
    [change] = [c for c in compare(old, gone) if c.subject == "saga checkout"]
    assert not change.compatible and "pending deadlines never fire" in change.detail
