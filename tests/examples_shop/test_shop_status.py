"""A reaction on /metrics, /v1/metadata and the status page, on the real broker.

Stock runs alone; the test writes orders' events itself: placed ones (stock reserves, or
refuses, one command each), one of a type stock does not read, and one that is not JSON
(stock's reaction dead-letters it). Each number then shows where an operator looks: the
Prometheus text, the metadata the status page reads, and the page in a real Chromium.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enhydra.testing.processes import produce_json, wait_for_committed
from tests.examples_shop.conftest import pythonpath
from tests.query.test_status_page import browse, chromium

pytestmark = [pytest.mark.integration]

PLACED = 6


def samples(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_reaction_shows_its_counters_failures_and_lag(
    service_factory, kafka_bootstrap, app_id, tmp_path
):
    prefix = f"{app_id}-"
    env = {"ENHYDRA_APP_ID": f"{prefix}stock", "SHOP_PREFIX": prefix, "PYTHONPATH": pythonpath()}
    stock = service_factory("stock.service:service", "stock-1", extra_env=env)
    stock.wait_ready()
    events = [
        (f"o{n}", {"type": "placed", "sku": "mug", "quantity": 1, "amount": 5})
        for n in range(PLACED)
    ]
    events += [("o0", {"type": "confirmed"}), ("o1", b"not json")]
    upstream = f"{prefix}orders-events"
    asyncio.run(produce_json(kafka_bootstrap, upstream, events))
    group = f"{prefix}stock-reaction-orders"
    asyncio.run(wait_for_committed(kafka_bootstrap, group, upstream, timeout=60))
    asyncio.run(wait_for_committed(kafka_bootstrap, f"{prefix}stock", f"{prefix}stock-commands"))

    found = samples(stock.url)
    labels = (("reaction", "orders"), ("source", f"{prefix}orders"))
    assert found[("enhydra_reaction_processed_total", labels)] == len(events)
    assert found[("enhydra_reaction_commands_total", labels)] == PLACED
    assert found[("enhydra_reaction_ignored_total", labels)] == 1
    failed = ("enhydra_reaction_failed_records_total", (*labels, ("error_class", "NotAnEvent")))
    assert found[(failed[0], tuple(sorted((*failed[1], ("stage", "deserialize")))))] == 1
    lags = {k[1]: v for k, v in found.items() if k[0] == "enhydra_reaction_lag_records"}
    assert len(lags) == 4 and set(lags.values()) == {0.0}  # every partition is this instance's
    # the receiving aggregate counts the commands it refused (a sku never restocked)
    assert found[("enhydra_processed_total", (("store", "items"),))] == PLACED

    status, metadata = stock.get("/v1/metadata")
    assert status == 200
    [instance] = metadata["instances"]
    reaction = instance["reactions"]["orders"]
    assert (reaction["lag"], reaction["commands"], reaction["ignored"]) == (0, PLACED, 1)
    assert reaction["failures"] == {"deserialize:NotAnEvent": 1}

    dom = browse(chromium(), tmp_path / "profile", stock.url + "/", "--dump-dom").stdout
    assert 'data-loaded="true"' in dom, dom[-2000:]
    row = re.search(r'<tr data-reaction="orders" data-instance="stock-1">(.*?)</tr>', dom, re.S)
    assert row, dom[-3000:]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    # ready, lag, events read, commands, events not read, failed
    shown = ["yes", "0", str(len(events)), str(PLACED), "1", "1"]
    assert cells[1] == upstream and cells[4:] == shown
