"""Settings: environment overrides code defaults; bad values fail fast naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from enhydra.settings import Settings, SettingsError, instance_returns


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


def test_failover_defaults_detect_in_seconds_not_the_session_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not a Deployment's pod
    s = Settings.from_env({}, app_id="ledger")
    assert s.static_membership and s.failure_detection
    assert s.session_timeout_ms == 30_000 and s.heartbeat_interval_ms == 500
    assert s.failure_probe_window_ms < s.session_timeout_ms
    assert not s.leave_group_on_shutdown


K8S = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}


@pytest.mark.parametrize(
    ("instance_id", "hostname", "env", "returns"),
    [
        # a Deployment's pod: the ReplicaSet names it, a new pod gets another name
        ("ledger-7d9f8b6c5d-x2k4q", "ledger-7d9f8b6c5d-x2k4q", K8S, False),
        ("ledger-7d9f8b6c5d-x2k4q-17", "ledger-7d9f8b6c5d-x2k4q", K8S, False),  # <host>-<pid>
        # a StatefulSet's pod keeps its name; so does an id given by name
        ("ledger-0", "ledger-0", K8S, True),
        ("ledger-1", "ledger-7d9f8b6c5d-x2k4q", K8S, True),
        # outside Kubernetes, a restart under the same name is assumed
        ("ledger-7d9f8b6c5d-x2k4q", "ledger-7d9f8b6c5d-x2k4q", {}, True),
        ("laptop-123", "laptop", {}, True),
    ],
)
def test_an_instance_id_a_deployment_minted_does_not_come_back(
    instance_id: str, hostname: str, env: dict[str, str], returns: bool
) -> None:
    assert instance_returns(instance_id, hostname=hostname, env=env) is returns


def test_leave_group_on_shutdown_is_auto_true_or_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("HOSTNAME", "ledger-7d9f8b6c5d-x2k4q")
    pod = {"ENHYDRA_INSTANCE_ID": "ledger-7d9f8b6c5d-x2k4q"}
    assert Settings.from_env(pod, app_id="ledger").leave_group_on_shutdown is True
    kept = {**pod, "ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN": "false"}
    assert Settings.from_env(kept, app_id="ledger").leave_group_on_shutdown is False
    named = {"ENHYDRA_INSTANCE_ID": "ledger-0", "ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN": "auto"}
    assert Settings.from_env(named, app_id="ledger").leave_group_on_shutdown is False
    with pytest.raises(SettingsError, match="expected auto, true or false"):
        Settings.from_env({"ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN": "sometimes"}, app_id="ledger")
