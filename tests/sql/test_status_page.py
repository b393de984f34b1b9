"""A service hosting a SQL projection, its database down while events flow: /v1/stats and the
status page (a real browser) say why the projection waits, liveness holds, and nothing is lost
or doubled once the database is back."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from enhydra.sql.config import DatabaseSettings
from enhydra.testing.processes import http_get
from tests.query.test_status_page import browse, chromium
from tests.sql.accounts import history, model, produce
from tests.sql.test_sql_projection import REPO, caught_up, table

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


async def stats_until(url: str, done, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        status, body = await asyncio.to_thread(http_get, url + "/v1/stats")
        if status == 200 and done(body):
            return body
        await asyncio.sleep(0.3)
    pytest.fail(f"/v1/stats never matched: {body}")


async def test_the_status_page_says_why_a_sql_projection_waits_and_liveness_holds(
    kafka_bootstrap: str,
    app_id: str,
    tmp_path: Path,
    database: DatabaseSettings,
    postgres,
    service_factory,
) -> None:
    topic = f"{app_id}-events"
    before, during = history(15, 8, seed=21), history(15, 8, seed=22)
    env = {
        "ENHYDRA_DATABASE_URL": database.url,
        "ENHYDRA_DATABASE_PASSWORD_FILE": str(database.password_file),
        "ENHYDRA_TASK_WATCHDOG_MS": "2000",
        "PYTHONPATH": str(REPO),
    }
    service = service_factory("tests.sql.accounts:SERVICE", "i1", extra_env=env, cwd=REPO)
    await asyncio.to_thread(service.wait_ready)
    await produce(kafka_bootstrap, topic, before)
    await caught_up(database, kafka_bootstrap, topic)
    await asyncio.to_thread(postgres.stop, "fast")
    try:
        await produce(kafka_bootstrap, topic, during)

        def waiting(body: dict) -> bool:
            return bool((body.get("projections", {}).get("accounts") or {}).get("waiting"))

        await stats_until(service.url, waiting)
        await asyncio.sleep(5)  # longer than two watchdog limits
        live, _ = await asyncio.to_thread(http_get, service.url + "/health/live")
        assert live == 200
        dom = await asyncio.to_thread(
            browse, chromium(), tmp_path / "profile", service.url + "/", "--dump-dom"
        )
        html = dom.stdout
        assert 'data-loaded="true"' in html, (dom.stderr[-2000:], html[-2000:])
        row = re.search(r'<tr data-projection="accounts" data-instance="i1">(.*?)</tr>', html)
        assert row, html[-3000:]
        assert '<td class="waiting">database unavailable: ' in row.group(1), row.group(1)
    finally:
        await asyncio.to_thread(postgres.start)
    await caught_up(database, kafka_bootstrap, topic)
    await stats_until(service.url, lambda body: not waiting(body))
    assert await table(database) == model(before + during)
