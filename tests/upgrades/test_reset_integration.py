"""`enhydra reset` on a real broker: refuse while running, then reprocess from the chosen point.

After a reset to a snapshot-like cut, the restarted ledger holds exactly what the model says of
the commands after the cut; after a reset to the beginning, what it says of all of them. The
activity projection (the ledger-audit plugin) is rebuilt from the re-emitted events, once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from enhydra.cli.main import main
from enhydra.projections import replay_projection
from enhydra.testing import Driver
from enhydra.testing.processes import end_offsets, wait_for_committed
from ledger.domain import accounts
from ledger.workload import generate, model
from tests.integration.ledger_support import feed
from tests.upgrades.test_plugins_integration import read_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TARGET = "ledger.service:service"


def reset(bootstrap: str, app_id: str, *args: str) -> Any:
    return CliRunner().invoke(
        main, ["reset", "--app", app_id, "--bootstrap", bootstrap, *args], catch_exceptions=False
    )


def wait_caught_up(bootstrap: str, app_id: str) -> None:
    asyncio.run(wait_for_committed(bootstrap, app_id, f"{app_id}-commands", timeout=90))
    asyncio.run(
        wait_for_committed(
            bootstrap, f"{app_id}-projection-activity", f"{app_id}-events", timeout=90
        )
    )


def test_reset_refuses_while_running_then_reprocesses_from_the_chosen_point(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path, plugin_site: Path
) -> None:
    state_dir = tmp_path / "state"
    env = {"PYTHONPATH": str(plugin_site)}

    def start() -> Any:
        instance = service_factory(TARGET, "i1", state_dir=state_dir, extra_env=env)
        instance.wait_ready()
        return instance

    instance = start()
    commands = generate(30, 500, seed=5)
    first, second = commands[:250], commands[250:]
    feed(kafka_bootstrap, app_id, first)
    cut = asyncio.run(end_offsets(kafka_bootstrap, f"{app_id}-commands"))
    feed(kafka_bootstrap, app_id, second)
    wait_caught_up(kafka_bootstrap, app_id)
    keys = sorted({key for key, _ in commands})

    refused = reset(kafka_bootstrap, app_id, "--yes")
    assert refused.exit_code == 1
    assert "the application is running" in refused.output and "i1" in refused.output
    assert instance.stop() == 0

    to_cut = ",".join(f"{p}={o}" for p, o in sorted(cut.items()))
    dry = reset(kafka_bootstrap, app_id, "--to-offsets", to_cut, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"delete and recreate {app_id}-accounts-changelog" in dry.output
    assert f"group {app_id}-projection-activity: offsets on {app_id}-events" in dry.output
    assert "dry run: nothing changed" in dry.output
    assert (state_dir / app_id / "accounts").is_dir()

    done = reset(
        kafka_bootstrap, app_id, "--to-offsets", to_cut, "--state-dir", str(state_dir), "--yes"
    )
    assert done.exit_code == 0, done.output
    assert not (state_dir / app_id).exists()
    instance = start()
    wait_caught_up(kafka_bootstrap, app_id)
    assert read_store([instance], "accounts", keys) == model(second)
    # The projection saw only the events of the reprocessed commands (after the old end).
    from ledger_audit import activity

    after_cut = Driver(accounts)
    after_cut.send_many(second)
    assert read_store([instance], "activity", keys) == replay_projection(activity, after_cut.events)
    assert instance.stop() == 0

    done = reset(kafka_bootstrap, app_id, "--to-earliest", "--state-dir", str(state_dir), "-y")
    assert done.exit_code == 0, done.output
    instance = start()
    wait_caught_up(kafka_bootstrap, app_id)
    assert read_store([instance], "accounts", keys) == model(commands)
    everything = Driver(accounts)
    everything.send_many(commands)
    assert read_store([instance], "activity", keys) == replay_projection(
        activity, everything.events
    )


def test_a_volume_the_reset_did_not_wipe_is_rebuilt_from_the_new_changelog(
    service_factory: Any, kafka_bootstrap: str, app_id: str, tmp_path: Path
) -> None:
    """The reset ran on another machine: instance a's volume still holds the old history.

    By the time a restarts, the recreated changelog has grown past a's checkpoints, so only
    the record at a's last offset tells the two histories apart.
    """
    first, second = generate(30, 100, seed=8), generate(30, 600, seed=9)
    old = service_factory(TARGET, "a", state_dir=tmp_path / "a")
    old.wait_ready()
    feed(kafka_bootstrap, app_id, first)
    assert old.stop() == 0
    end = asyncio.run(end_offsets(kafka_bootstrap, f"{app_id}-commands"))
    checkpoints = asyncio.run(end_offsets(kafka_bootstrap, f"{app_id}-accounts-changelog"))
    at_end = ",".join(f"{p}={o}" for p, o in sorted(end.items()))
    done = reset(kafka_bootstrap, app_id, "--to-offsets", at_end, "--yes")  # no --state-dir
    assert done.exit_code == 0, done.output
    assert (tmp_path / "a" / app_id / "accounts").is_dir()

    other = service_factory(TARGET, "b", state_dir=tmp_path / "b")
    other.wait_ready()
    # In chunks, each processed before the next: the changelog gets a record per key and batch,
    # so one batch of everything could leave it no longer than a's (seen in CI).
    for at in range(0, len(second), 100):
        feed(kafka_bootstrap, app_id, second[at : at + 100])
        asyncio.run(wait_for_committed(kafka_bootstrap, app_id, f"{app_id}-commands", timeout=90))
    assert other.stop() == 0
    grown = asyncio.run(end_offsets(kafka_bootstrap, f"{app_id}-accounts-changelog"))
    assert all(grown[p] > checkpoints[p] for p in checkpoints), (grown, checkpoints)

    again = service_factory(TARGET, "a-again", state_dir=tmp_path / "a")
    again.wait_ready()
    keys = sorted({key for key, _ in first + second})
    assert read_store([again], "accounts", keys) == model(second)
    assert again.log_tail(400).count("store holds another history of the changelog") == 4
