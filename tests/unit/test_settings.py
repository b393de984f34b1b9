"""Settings: environment overrides code defaults; bad values fail fast naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from enhydra.settings import Settings, SettingsError


def test_env_overrides_code_defaults() -> None:
    s = Settings.from_env(
        {
            "ENHYDRA_PARTITIONS": "8",
            "ENHYDRA_CLIENT_TAGS": "zone=a, rack=r1",
            "ENHYDRA_STATE_DIR": "/tmp/x",
            "ENHYDRA_WEB_PORT": "7000",
        },
        app_id="ledger",
        partitions=4,
    )
    assert s.partitions == 8
    assert s.client_tags == {"zone": "a", "rack": "r1"}
    assert s.store_dir == Path("/tmp/x/ledger")
    assert s.advertised_url == "http://127.0.0.1:7000"
    assert s.instance_id


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ENHYDRA_PARTITIONS": "zero"}, "ENHYDRA_PARTITIONS"),
        ({"ENHYDRA_PARTITIONS": "0"}, "ENHYDRA_PARTITIONS"),
        ({"ENHYDRA_WEB_PORT": "70000"}, "ENHYDRA_WEB_PORT"),
        ({"ENHYDRA_BOOTSTRAP_SERVERS": "localhost"}, "ENHYDRA_BOOTSTRAP_SERVERS"),
        ({"ENHYDRA_CLIENT_TAGS": "zone"}, "ENHYDRA_CLIENT_TAGS"),
        ({"ENHYDRA_LOG_FORMAT": "xml"}, "ENHYDRA_LOG_FORMAT"),
        ({"ENHYDRA_APP_ID": "bad id!"}, "ENHYDRA_APP_ID"),
        ({"ENHYDRA_ADVERTISED_URL": "10.0.0.1:80"}, "ENHYDRA_ADVERTISED_URL"),
        ({"ENHYDRA_HEARTBEAT_INTERVAL_MS": "40000"}, "ENHYDRA_HEARTBEAT_INTERVAL_MS"),
        ({"ENHYDRA_FAILURE_PROBE_WINDOW_MS": "30000"}, "ENHYDRA_FAILURE_PROBE_WINDOW_MS"),
        ({"ENHYDRA_STATIC_MEMBERSHIP": "maybe"}, "ENHYDRA_STATIC_MEMBERSHIP"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env, app_id="ledger")
    assert str(info.value).startswith(named + "=")


def test_app_id_is_required() -> None:
    with pytest.raises(SettingsError, match="ENHYDRA_APP_ID"):
        Settings.from_env({})


def test_unknown_code_default_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="partitons"):
        Settings.from_env({}, app_id="x", partitons=3)


def test_an_instance_comes_back_under_the_id_its_volume_remembers(tmp_path: Path) -> None:
    """Static membership: a restart on the same state dir is the same member of the group."""
    env = {"ENHYDRA_STATE_DIR": str(tmp_path)}
    first = Settings.from_env(env, app_id="ledger")
    assert first.instance_id  # <hostname>-<pid> the first time
    (first.store_dir).mkdir(parents=True)
    (first.store_dir / "instance-id").write_text("ledger-7\n")
    assert Settings.from_env(env, app_id="ledger").instance_id == "ledger-7"
    named = Settings.from_env({**env, "ENHYDRA_INSTANCE_ID": "pod-1"}, app_id="ledger")
    assert named.instance_id == "pod-1"  # a name given in the environment wins


def test_failover_defaults_detect_in_seconds_not_the_session_timeout() -> None:
    s = Settings.from_env({}, app_id="ledger")
    assert s.static_membership and s.failure_detection
    assert s.session_timeout_ms == 30_000 and s.heartbeat_interval_ms == 500
    assert s.failure_probe_window_ms < s.session_timeout_ms
    assert not s.leave_group_on_shutdown
