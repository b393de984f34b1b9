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
        ({"ENHYDRA_HEARTBEAT_INTERVAL_MS": "20000"}, "ENHYDRA_HEARTBEAT_INTERVAL_MS"),
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
