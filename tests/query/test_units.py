"""The pure parts of the query layer: scans and cursors over real RocksDB partitions, parameter
validation, tokens, the metrics text, the OpenAPI document, and the app before an engine runs.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import schemathesis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from enhydra.contracts.codec import Entry, encode_entry
from enhydra.query.http import ROUTES, build_app
from enhydra.query.metrics import Exposition, Histogram
from enhydra.query.openapi import BadRequest, Param, document
from enhydra.query.scan import (
    KeyRange,
    count_stores,
    decode_cursor,
    encode_cursor,
    merge_pages,
    scan_stores,
)
from enhydra.query.security import Denied, check
from enhydra.settings import Settings
from enhydra.stores.partition import PartitionStore


@pytest.fixture
def stores(tmp_path):
    """Three partitions holding 300 keys spread at random, like a partitioned store."""
    rng = random.Random(5)
    opened = [PartitionStore(tmp_path / str(p)) for p in range(3)]
    keys = [f"k-{i:04d}" for i in range(300)] + ["é-1", "z", "k-"]
    for key in keys:
        entry = encode_entry(Entry({"key": key}, 0))
        rng.choice(opened).write([(key.encode(), entry)], changelog_offset=0)
    yield opened, sorted(keys)
    for store in opened:
        store.close()


def page_through(stores, rng: KeyRange, limit: int) -> list[str]:
    keys, cursor = [], None
    while True:
        page_range = KeyRange(
            rng.prefix, rng.start, rng.end, decode_cursor(cursor) if cursor else None
        )
        items, more = scan_stores(stores, page_range, limit)
        keys += [k for k, _ in items]
        if not more:
            return keys
        cursor = encode_cursor(items[-1][0])


@pytest.mark.parametrize("limit", [1, 7, 100, 1000])
def test_scans_page_in_key_order_over_partitions(stores, limit):
    opened, keys = stores
    assert page_through(opened, KeyRange(), limit) == keys
    assert page_through(opened, KeyRange(prefix=b"k-00"), limit) == [
        k for k in keys if k.startswith("k-00")
    ]
    ranged = KeyRange(start=b"k-0100", end=b"k-0110")
    assert page_through(opened, ranged, limit) == [k for k in keys if "k-0100" <= k < "k-0110"]
    assert count_stores(opened, KeyRange()) == len(keys)
    assert count_stores(opened, KeyRange(prefix="é".encode())) == 1


def test_pages_merge_like_one_sorted_list():
    a = ([("a", 1), ("d", 4)], False)
    b = ([("b", 2), ("c", 3)], True)
    assert merge_pages([a, b], 3) == ([("a", 1), ("b", 2), ("c", 3)], True)
    assert merge_pages([a], 5) == ([("a", 1), ("d", 4)], False)


@given(st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=50))
@settings(max_examples=200)
def test_cursors_round_trip(key):
    assert decode_cursor(encode_cursor(key)) == key.encode("utf-8")


def test_bad_cursors_and_params_are_400s():
    with pytest.raises(BadRequest):
        decode_cursor("@@@")
    limit = Param("limit", "query", int, "", minimum=1, maximum=10, default=5)
    assert limit.parse(None) == 5 and limit.parse("10") == 10
    for raw in ("0", "11", "x", "1.5"):
        with pytest.raises(BadRequest):
            limit.parse(raw)
    flag = Param("f", "query", bool, "", default=False)
    assert flag.parse("true") is True and flag.parse("0") is False
    with pytest.raises(BadRequest):
        flag.parse("maybe")
    key = Param("key", "path", str, "", required=True, max_length=4)
    assert key.parse("éé") == "éé"
    for raw in ("ééé", "\udc80"):
        with pytest.raises(BadRequest):
            key.parse(raw)


def test_tokens():
    check(None, "", admin_token="", query_token="")
    check("query", "", admin_token="", query_token="")  # queries open without a token
    with pytest.raises(Denied) as off:
        check("admin", "Bearer x", admin_token="", query_token="")
    assert off.value.status == 404
    cases = [("", 401), ("Basic abc", 401), ("Bearer ", 401), ("Bearer wrong", 403)]
    for header, status in cases:
        with pytest.raises(Denied) as denied:
            check("admin", header, admin_token="adm", query_token="q")
        assert denied.value.status == status, header
    check("admin", "Bearer adm", admin_token="adm", query_token="q")
    check("query", "bearer q", admin_token="adm", query_token="q")
    check("query", "Bearer adm", admin_token="adm", query_token="q")
    with pytest.raises(Denied):
        check("admin", "Bearer q", admin_token="adm", query_token="q")


def test_metrics_text_parses_as_prometheus_exposition():
    out = Exposition()
    out.add("enhydra_x_total", "counter", "x", 3, store='a"b\\c\nd')
    histogram = Histogram("enhydra_latency_seconds", "latency")
    for seconds in (0.0001, 0.003, 0.2, 50):
        histogram.observe(seconds, route="/v1/x", code="200")
    histogram.write(out)
    families = {f.name: f for f in text_string_to_metric_families(out.render())}
    assert families["enhydra_x"].samples[0].labels["store"] == 'a"b\\c\nd'
    samples = {
        (s.name, s.labels.get("le")): s.value for s in families["enhydra_latency_seconds"].samples
    }
    assert samples[("enhydra_latency_seconds_count", None)] == 4
    assert samples[("enhydra_latency_seconds_bucket", "0.0005")] == 1
    assert samples[("enhydra_latency_seconds_bucket", "0.25")] == 3
    assert samples[("enhydra_latency_seconds_bucket", "+Inf")] == 4


def settings_for(**env: str) -> Settings:
    return Settings.from_env({f"ENHYDRA_{k.upper()}": v for k, v in env.items()}, app_id="unit")


def test_the_document_comes_from_the_route_table():
    extra = ("POST", "/v1/admin/snapshot", _snapshot)
    app = build_app(lambda: None, "i1", "accounts", settings=settings_for(), admin_routes=[extra])
    routes = app[ROUTES]
    doc = document(routes, title="t", version="1")
    registered = {(r.method, r.resource.canonical) for r in app.router.routes()}
    assert registered == {(r.method, r.path) for r in routes}
    assert {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops} == registered
    snapshot = doc["paths"]["/v1/admin/snapshot"]["post"]
    assert snapshot["summary"] == "Take a snapshot now." and "401" in snapshot["responses"]
    schemathesis.openapi.from_dict(doc).validate()


async def _snapshot(request: web.Request, body: dict) -> web.Response:
    """Take a snapshot now."""
    return web.json_response({"snapshot": "started", **body}, status=202)


def test_before_the_engine_runs_the_api_answers_503_and_json_errors():
    called = []

    async def scenario() -> None:
        app = build_app(
            lambda: None,
            "i1",
            "accounts",
            settings=settings_for(admin_token="adm"),
            shutdown=lambda: called.append("shutdown"),
            admin_routes=[("POST", "/v1/admin/snapshot", _snapshot)],
        )
        async with TestClient(TestServer(app)) as client:
            live = await client.get("/health/live")
            assert live.status == 200
            key = await client.get("/v1/stores/accounts/keys/a")
            assert key.status == 503 and key.headers["Retry-After"] == "1"
            assert (await key.json())["code"] == "starting"
            metrics = await client.get("/metrics")
            assert "enhydra_up 0" in await metrics.text()
            missing = await client.get("/nope")
            assert missing.status == 404 and (await missing.json())["code"] == "no_such_endpoint"
            headers = {"Authorization": "Bearer adm"}
            snap = await client.post("/v1/admin/snapshot", headers=headers)
            assert snap.status == 202 and (await snap.json()) == {"snapshot": "started"}
            # The handler receives the JSON body; a malformed one is a 400 with a reason.
            given = await client.post("/v1/admin/snapshot", headers=headers, json={"storage": "s"})
            assert (await given.json()) == {"snapshot": "started", "storage": "s"}
            bad = await client.post("/v1/admin/snapshot", headers=headers, data=b"{nope")
            assert bad.status == 400 and (await bad.json())["code"] == "bad_request"
            assert "not valid JSON" in (await bad.json())["error"]
            listed = await client.post("/v1/admin/snapshot", headers=headers, data=b"[1]")
            assert listed.status == 400
            assert (await client.post("/v1/admin/snapshot")).status == 401
            down = await client.post("/v1/admin/shutdown", headers=headers)
            assert down.status == 202
            await asyncio.sleep(0.4)
            assert called == ["shutdown"]
            page = await client.get("/")
            assert page.status == 200 and "<title>Enhydra status</title>" in await page.text()

    asyncio.run(scenario())


def test_a_handler_bug_is_a_json_500_without_a_stack_trace():
    async def scenario() -> None:
        app = build_app(lambda: 1 / 0, "i1", "accounts", settings=settings_for())
        async with TestClient(TestServer(app)) as client:
            answer = await client.get("/v1/stats")
            body = await answer.json()
            assert answer.status == 500 and body["code"] == "internal" and body["error_id"]
            assert "ZeroDivisionError" not in await answer.text()

    asyncio.run(scenario())
