"""Interactive queries against three real ledger instances: routing, stale reads, scans, errors,
auth, metrics, the client and the CLI. The ledger model says what every answer must be.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enhydra.query import Client, QueryError
from enhydra.testing.processes import produce_json, read_topic
from tests.query.conftest import ADMIN_TOKEN, PARTITIONS, QUERY_TOKEN, Cluster, call, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("query-cluster")]


def key_url(base: str, key: str, query: str = "", store: str = "accounts") -> str:
    return f"{base}/v1/stores/{store}/keys/{quote(key, safe='')}{query}"


def test_metadata_lists_every_instance_with_tags_tasks_and_lags(cluster: Cluster):
    for inst in cluster.instances:
        answer = call(inst.url + "/v1/metadata")
        assert answer.status == 200, answer.body
        body = answer.body
        assert body["instance"] == inst.instance_id
        assert body["partitions"] == PARTITIONS and body["stores"] == ["accounts"]
        described = {i["id"]: i for i in body["instances"]}
        assert set(described) == {"i1", "i2", "i3"}
        assert {i["tags"]["zone"] for i in described.values()} == {"a", "b", "c"}
        actives = [p for i in described.values() for p in i["stores"]["accounts"]["active"]]
        assert sorted(actives) == list(range(PARTITIONS))
        standbys = [p for i in described.values() for p in i["stores"]["accounts"]["standby"]]
        assert set(standbys) == set(range(PARTITIONS))  # one standby per partition at least
        for name, info in described.items():
            store = info["stores"]["accounts"]
            assert info["url"] == cluster.by_id(name).url
            assert not set(store["active"]) & set(store["standby"])
            hosted = {str(p) for p in store["active"] + store["standby"] + store["warmup"]}
            assert set(store["lags"]) == hosted, (name, store)
            assert all(lag == 0 for lag in store["lags"].values())
        assert body["topology"]["commands"] == f"{cluster.app_id}-commands"


def test_key_metadata_uses_the_partition_kafka_producers_use(cluster: Cluster):
    records = asyncio.run(read_topic(cluster.bootstrap, f"{cluster.app_id}-commands"))
    produced = {r.key.decode(): r.partition for r in records}
    assert len(produced) >= 300
    for key in sorted(produced)[:40]:
        answer = call(f"{cluster.instances[1].url}/v1/metadata/stores/accounts/keys/{key}")
        assert answer.status == 200, answer.body
        assert answer.body["partition"] == produced[key], key
        owner = answer.body["active"]["instance"]
        stats = call(cluster.by_id(owner).url + "/v1/stats").body
        assert stats["tasks"][str(produced[key])]["role"] == "active"
        assert answer.body["standbys"], answer.body
        assert owner not in {s["instance"] for s in answer.body["standbys"]}


def test_every_account_reads_correctly_through_every_instance(cluster: Cluster):
    expected = cluster.expected
    forwarded = local = 0
    for inst in cluster.instances:
        for account in cluster.accounts:
            answer = call(key_url(inst.url, account))
            if account in expected:
                assert (answer.status, answer.body) == (200, expected[account]), account
            else:
                assert answer.status == 404, (account, answer.body)
                assert answer.body["code"] == "no_such_key"
            assert answer.headers["X-Enhydra-Stale"] == "false"
            assert answer.headers["X-Enhydra-Lag"] == "0"
            if answer.headers["X-Enhydra-Instance"] == inst.instance_id:
                local += 1
                assert "X-Enhydra-Forwarded-To" not in answer.headers
            else:
                forwarded += 1
                assert (
                    answer.headers["X-Enhydra-Forwarded-To"] == answer.headers["X-Enhydra-Instance"]
                )
    assert local and forwarded and local + forwarded == 3 * len(cluster.accounts)


def test_a_standby_answers_with_allow_stale_and_says_how_far_behind_it_is(cluster: Cluster):
    expected = cluster.expected
    served = set()
    for account in sorted(expected)[:120]:
        where = call(f"{cluster.instances[0].url}/v1/metadata/stores/accounts/keys/{account}")
        standby = cluster.by_id(where.body["standbys"][0]["instance"])
        answer = call(key_url(standby.url, account, "?allow_stale=true"))
        assert (answer.status, answer.body) == (200, expected[account]), account
        assert answer.headers["X-Enhydra-Instance"] == standby.instance_id
        assert answer.headers["X-Enhydra-Stale"] == "true"
        assert int(answer.headers["X-Enhydra-Lag"]) == 0  # caught up: nothing written since
        served.add(standby.instance_id)
        # Without allow_stale the same instance forwards to the active owner instead.
        fresh = call(key_url(standby.url, account))
        assert fresh.headers["X-Enhydra-Instance"] == where.body["active"]["instance"]
    assert len(served) >= 2


def test_scans_page_through_every_partition_in_key_order(cluster: Cluster):
    expected = cluster.expected
    items, cursor, pages = [], None, 0
    while True:
        query = f"?limit=37{'&cursor=' + cursor if cursor else ''}"
        answer = call(f"{cluster.instances[1].url}/v1/stores/accounts/scan{query}")
        assert answer.status == 200, answer.body
        assert len(answer.body["items"]) <= 37
        items += answer.body["items"]
        pages += 1
        cursor = answer.body["next_cursor"]
        if not cursor:
            break
    assert [i["key"] for i in items] == sorted(expected)
    assert {i["key"]: i["value"] for i in items} == expected
    assert pages == -(-len(expected) // 37)

    prefix = "acct-00001"
    answer = call(f"{cluster.instances[2].url}/v1/stores/accounts/scan?prefix={prefix}")
    assert [i["key"] for i in answer.body["items"]] == [
        k for k in sorted(expected) if k.startswith(prefix)
    ]
    ranged = call(
        f"{cluster.instances[0].url}/v1/stores/accounts/scan?from=acct-000050&to=acct-000060"
    )
    assert [i["key"] for i in ranged.body["items"]] == [
        k for k in sorted(expected) if "acct-000050" <= k < "acct-000060"
    ]
    count = call(f"{cluster.instances[0].url}/v1/stores/accounts/count")
    assert count.body == {"count": len(expected)}
    count = call(f"{cluster.instances[2].url}/v1/stores/accounts/count?prefix={prefix}")
    assert count.body["count"] == sum(1 for k in expected if k.startswith(prefix))


def test_errors_are_json_with_a_reason_and_say_which_404_it_is(cluster: Cluster):
    base = cluster.instances[0].url
    no_store = call(key_url(base, "acct-000001", store="nope"))
    assert no_store.status == 404 and no_store.body["code"] == "no_such_store"
    assert no_store.body["stores"] == ["accounts"]
    no_key = call(key_url(base, "never-opened"))
    assert no_key.status == 404 and no_key.body["code"] == "no_such_key"
    slash = call(key_url(base, "a/b c%?#é"))
    assert slash.status == 404 and slash.body["key"] == "a/b c%?#é"
    too_long = call(key_url(base, "k" * 1025))
    assert too_long.status == 400 and too_long.body["param"] == "key"
    for query in ("?limit=0", "?limit=1001", "?limit=ten", "?cursor=%40%40", "?partitions=9"):
        bad = call(f"{base}/v1/stores/accounts/scan{query}")
        assert bad.status == 400, (query, bad.body)
        assert bad.body["code"] == "bad_request" and bad.body["error"]
    assert call(f"{base}/v1/stores/accounts/keys/x?allow_stale=maybe").status == 400
    unknown = call(f"{base}/v2/nothing")
    assert unknown.status == 404 and unknown.body["code"] == "no_such_endpoint"
    wrong_method = call(f"{base}/v1/metadata", method="DELETE")
    assert wrong_method.status == 405 and wrong_method.headers["Allow"] == "GET"
    big = call(
        f"{base}/v1/admin/rebalance",
        method="POST",
        token=ADMIN_TOKEN,
        headers={"Content-Length": str(1 << 20)},
    )
    assert big.status == 413, big.body
    # A host that does not own the key says so (421) when asked not to forward.
    owner = call(f"{base}/v1/metadata/stores/accounts/keys/acct-000003").body["active"]
    other = next(i for i in cluster.instances if i.instance_id != owner["instance"])
    misrouted = call(key_url(other.url, "acct-000003", "?forward=false"))
    assert misrouted.status == 421 and misrouted.body["code"] == "not_hosted"
    for answer in (no_store, no_key, too_long, unknown, misrouted):
        assert answer.headers["Content-Type"].startswith("application/json")
        assert "Traceback" not in answer.raw.decode()


def test_queries_need_the_query_token_when_one_is_set(cluster: Cluster):
    url = key_url(cluster.instances[2].url, "acct-000001")
    missing = call(url, token=None)
    assert missing.status == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert call(url, token="wrong").status == 403
    assert call(url, token=ADMIN_TOKEN).status == 403  # i3 has no admin token
    opened = call(key_url(cluster.by_id("i1").url, "acct-000001"), token=ADMIN_TOKEN)
    assert opened.status == 200  # where an admin token is set, it opens queries too
    assert call(cluster.instances[2].url + "/v1/metadata", token=None).status == 401
    assert call(cluster.instances[2].url + "/health/ready", token=None).status == 200
    assert call(cluster.instances[2].url + "/metrics", token=None).status == 200


def test_admin_endpoints_need_the_admin_token_and_are_off_without_one(cluster: Cluster):
    i1, i3 = cluster.by_id("i1"), cluster.by_id("i3")
    for path in ("/v1/admin/shutdown", "/v1/admin/rebalance"):
        assert call(i1.url + path, method="POST", token=None).status == 401
        assert call(i1.url + path, method="POST", token="wrong").status == 403
        assert call(i1.url + path, method="POST", token=QUERY_TOKEN).status == 403
        off = call(i3.url + path, method="POST", token=ADMIN_TOKEN)
        assert off.status == 404 and off.body["code"] == "admin_disabled"
    assert all(inst.alive() for inst in cluster.instances)


def test_metrics_are_prometheus_text_with_lags_failures_and_latency(cluster: Cluster):
    # One malformed command: the ledger dead-letters it, and the DLQ count must show it.
    bad = {"command_id": "bad-1", "type": "teleport", "account": "acct-000001"}
    asyncio.run(
        produce_json(cluster.bootstrap, f"{cluster.app_id}-commands", [("acct-000001", bad)])
    )

    def families(url: str) -> dict:
        answer = call(url + "/metrics", token=None)
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return {f.name: f for f in text_string_to_metric_families(answer.raw.decode())}

    def dead_lettered() -> bool:
        for inst in cluster.instances:
            family = families(inst.url).get("enhydra_failed_records")
            if family and any(
                s.labels.get("error_class") == "InvalidCommand" for s in family.samples
            ):
                return True
        return False

    wait_until(dead_lettered, 30, "the malformed command to be counted")
    got = families(cluster.instances[0].url)
    for name in (
        "enhydra_processed",
        "enhydra_rebalances",
        "enhydra_consumer_lag_records",
        "enhydra_changelog_lag_records",
        "enhydra_restore_remaining_records",
        "enhydra_task",
        "enhydra_http_request_duration_seconds",
    ):
        assert name in got, sorted(got)
    roles = {s.labels["role"] for s in got["enhydra_changelog_lag_records"].samples}
    assert roles >= {"active", "standby"}
    lagged = {s.labels["partition"] for s in got["enhydra_consumer_lag_records"].samples}
    active = call(cluster.instances[0].url + "/v1/stats").body["tasks"]
    assert lagged == {p for p, t in active.items() if t["role"] == "active"}
    routes = {
        s.labels["route"]
        for s in got["enhydra_http_request_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert "/v1/stores/{store}/keys/{key}" in routes


def test_the_client_routes_to_owners_and_scans(cluster: Cluster):
    expected = cluster.expected

    async def use() -> None:
        urls = [cluster.instances[2].url]
        async with Client(urls, token=QUERY_TOKEN) as client:
            for account in sorted(expected)[:60]:
                assert await client.get("accounts", account) == expected[account]
            assert await client.get("accounts", "never-opened") is None
            scanned = [
                key async for key, _ in client.scan("accounts", prefix="acct-0000", page_size=7)
            ]
            assert scanned == [k for k in sorted(expected) if k.startswith("acct-0000")]
            assert await client.count("accounts") == len(expected)
            where = await client.key_metadata("accounts", "acct-000007")
            assert where["active"]["instance"] in {"i1", "i2", "i3"}
            with pytest.raises(QueryError) as error:
                await client.get("nope", "acct-000001")
            assert error.value.status == 404 and error.value.code == "no_such_store"
        async with Client(urls, token="wrong", retry_for=1) as client:
            with pytest.raises(QueryError) as error:
                await client.get("accounts", "acct-000001")
            assert error.value.status == 403

    asyncio.run(use())


def test_the_cli_reads_a_key_through_any_instance(cluster: Cluster):
    account = sorted(cluster.expected)[5]
    command = [sys.executable, "-m", "enhydra.cli.main", "query", "accounts"]
    url = ["--url", cluster.instances[1].url, "--token", QUERY_TOKEN]
    done = subprocess.run([*command, account, *url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == cluster.expected[account]
    missing = subprocess.run([*command, "never", *url], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no such key" in missing.stderr
    no_store = subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", "query", "nope", account, *url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert no_store.returncode == 2
    assert no_store.stderr.splitlines() == [
        "Error: no such store: 'nope' (this service has: accounts)"
    ]
    denied = subprocess.run(
        [*command, account, "--url", cluster.instances[1].url],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert denied.returncode != 0 and "401" in denied.stderr
