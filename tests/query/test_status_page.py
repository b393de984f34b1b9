"""The status page in a real headless Chromium: it shows every instance and its tasks.

Chromium comes from Debian's `chromium` package; the test installs it when it is missing
(CI runs as root on a fresh machine). With ENHYDRA_UPDATE_DOCS=1 its screenshot replaces
docs/status-page.png; otherwise the tracked image is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.query.conftest import PARTITIONS, QUERY_TOKEN, Cluster, call

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("query-cluster")]

ROOT = Path(__file__).resolve().parents[2]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1280,1000",
    "--virtual-time-budget=6000",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.fail("chromium is missing and only root can install it: apt-get install chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
        check=True,
        env=env,
        timeout=900,
    )
    found = shutil.which("chromium")
    assert found, "apt-get installed chromium but it is not on PATH"
    return found


def browse(browser: str, profile: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, *FLAGS, f"--user-data-dir={profile}", *extra, url],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_status_page_shows_every_instance_and_its_tasks(cluster: Cluster, tmp_path):
    browser = chromium()
    page = cluster.instances[1].url + f"/#token={QUERY_TOKEN}"
    assert call(cluster.instances[1].url + "/", token=None).status == 200
    dom = browse(browser, tmp_path / "profile-dom", page, "--dump-dom")
    html = dom.stdout
    assert 'data-loaded="true"' in html, (dom.stderr[-2000:], html[-2000:])
    stats = {i.instance_id: call(i.url + "/v1/stats").body for i in cluster.instances}
    for name, body in stats.items():
        card = re.search(
            rf'<section class="card instance" data-instance="{name}">(.*?)</section>', html, re.S
        )
        assert card, f"no card for {name}"
        rows = dict(re.findall(r'<tr data-partition="(\d+)" data-role="(\w+)">', card.group(1)))
        assert rows == {p: t["role"] for p, t in body["tasks"].items()}, name
        assert f"zone={body['tags']['zone']}" in card.group(1)
        assert body["url"] in card.group(1)
    roles = [
        role for body in stats.values() for role in (t["role"] for t in body["tasks"].values())
    ]
    assert roles.count("active") == PARTITIONS
    assert f"{cluster.app_id}-accounts-changelog" in html  # the topology diagram
    assert "failed records since start" in html  # this instance's counters
    assert '<div id="dlq"' in html and 'id="rejections"' in html and 'id="projections"' in html

    shot = tmp_path / "status-page.png"
    done = browse(browser, tmp_path / "profile-shot", page, f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    if os.environ.get("ENHYDRA_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "status-page.png")
