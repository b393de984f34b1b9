"""The examples these tests import without installing them into the environment.

ledger-audit is a plugin: installed into the shared environment it would extend every ledger
that other tests start, so only its source is put on the path here (an installation into a
private directory is what test_plugins_integration does). trade-stats is imported the same way.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN_ROOT = REPO / "examples" / "ledger-audit-plugin"
TRADE_STATS_ROOT = REPO / "examples" / "trade-stats"

for root in (PLUGIN_ROOT, TRADE_STATS_ROOT):
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ledger-audit installed by pip into a directory of its own."""
    site = tmp_path_factory.mktemp("plugin-site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(PLUGIN_ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(site.glob("ledger_audit-*.dist-info/entry_points.txt"))
    return site
