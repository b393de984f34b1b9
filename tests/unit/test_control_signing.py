"""Signed control messages and what a snapshot request may ask for (pure parts)."""

from __future__ import annotations

import datetime as dt
import time

import orjson

from enhydra.control.signing import SIGNATURE_HEADER, Verifier, missing_secret, seal, signature
from enhydra.snapshots.admission import refusal
from enhydra.snapshots.live import new_snapshot_id

KEY = b"shared"


def test_a_sealed_message_is_accepted_once() -> None:
    verifier = Verifier(KEY)
    value, headers = seal({"type": "shutdown_application", "origin": "i1"}, KEY)
    message, reason = verifier.check(value, headers)
    assert reason is None and message is not None and message["type"] == "shutdown_application"
    assert verifier.check(value, headers)[1] == "replayed"  # a copied record acts no more


def test_the_same_message_sealed_twice_is_two_messages() -> None:
    verifier = Verifier(KEY)
    for _ in range(2):
        assert verifier.check(*seal({"type": "liveness", "origin": "i1", "seq": 1}, KEY))[1] is None


def test_unsigned_wrongly_signed_tampered_and_stale_messages_are_refused() -> None:
    verifier = Verifier(KEY)
    value, headers = seal({"type": "shutdown_application"}, KEY)
    assert verifier.check(value, [])[1] == "unsigned"
    assert verifier.check(value, [(SIGNATURE_HEADER, signature(b"guess", value))])[1] == (
        "bad_signature"
    )
    tampered = value.replace(b"shutdown_application", b"snapshot_create")
    assert verifier.check(tampered, headers)[1] == "bad_signature"
    old = orjson.dumps({"type": "liveness", "at": "2020-01-01T00:00:00.000+00:00"})
    assert verifier.check(old, [(SIGNATURE_HEADER, signature(KEY, old))])[1] == "stale"
    assert verifier.check(b"{not json", headers)[1] == "unreadable"


def test_a_message_signed_for_another_app_sharing_the_secret_is_refused() -> None:
    """Two apps with one secret: a record copied from one's control topic into the other's
    (within the freshness window, never seen there) must not act there."""
    bank = Verifier(KEY, app="bank")
    for_shop = seal({"type": "shutdown_application", "origin": "i1"}, KEY, app="shop")
    assert bank.check(*for_shop)[1] == "other_app"
    assert Verifier(KEY, app="shop").check(*for_shop)[1] is None
    assert bank.check(*seal({"type": "liveness"}, KEY, app="bank"))[1] is None
    # An instance of an earlier release signs no app: accepted during a rolling upgrade.
    assert bank.check(*seal({"type": "liveness"}, KEY))[1] is None


def test_without_a_secret_messages_are_unsigned_and_accepted() -> None:
    value, headers = seal({"type": "liveness"}, None)
    assert headers == []
    assert Verifier(None).check(value, [])[1] is None


def test_a_secret_is_required_on_an_authenticated_cluster_only() -> None:
    assert missing_secret("PLAINTEXT", None, "bank") is None
    assert missing_secret("SASL_SSL", KEY, "bank") is None
    assert "ENHYDRA_CONTROL_SECRET" in (missing_secret("SASL_SSL", None, "bank") or "")


def ask(message: dict, position: int | None = 10, storage: str = "/snaps") -> str | None:
    return refusal(
        message, app_id="bank", storage=storage, position=lambda p: position, now=time.time()
    )


def test_a_snapshot_may_name_only_the_configured_storage() -> None:
    fresh = new_snapshot_id("bank")
    assert ask({"type": "snapshot_create", "id": fresh, "storage": "/snaps/"}) is None
    assert ask({"type": "snapshot_create", "id": fresh}) is None  # the configured one
    assert ask({"type": "snapshot_create", "id": fresh, "storage": "file:///snaps"}) is None
    elsewhere = "s3://x/y?endpoint_url=http://elsewhere"
    assert ask({"type": "snapshot_create", "id": fresh, "storage": elsewhere}) == (
        "storage_not_configured"
    )
    no_storage = {"type": "snapshot_create", "id": fresh}
    assert ask(no_storage, storage="") == "storage_not_configured"


def test_a_snapshot_id_from_the_future_or_another_app_is_refused() -> None:
    future = "bank-29991231T235959999999Z"  # would sort last and outlive every real snapshot
    assert ask({"type": "snapshot_create", "id": future}) == "bad_snapshot_id"
    assert ask({"type": "snapshot_create", "id": new_snapshot_id("other")}) == "bad_snapshot_id"
    # A request (announced again while a snapshot runs) may be older, never from the future.
    request = {"type": "snapshot_request", "storage": "/snaps"}
    assert ask({**request, "id": future}) == "bad_snapshot_id"
    assert ask({**request, "id": "bank-no-time"}) == "bad_snapshot_id"
    hour_ago = f"bank-{dt.datetime.fromtimestamp(time.time() - 3600, dt.UTC):%Y%m%dT%H%M%S%fZ}"
    assert ask({**request, "id": hour_ago}) is None
    assert ask({"type": "snapshot_create", "id": hour_ago}) == "bad_snapshot_id"


def test_a_cut_below_the_position_is_refused() -> None:
    request = {"type": "snapshot_request", "id": new_snapshot_id("bank"), "storage": "/snaps"}
    assert ask({**request, "cut": None}) is None
    assert ask({**request, "cut": {"0": 10}}) is None
    assert ask({**request, "cut": {"0": 9}}) == "cut_below_position"
    assert ask({**request, "cut": {"0": 9}}, position=None) is None  # not this instance's
    assert ask({**request, "cut": {"0": "x"}}) == "bad_cut"


def test_other_messages_pass() -> None:
    assert ask({"type": "shutdown_application"}) is None
    assert ask({"type": "liveness", "origin": "i1"}) is None


def test_the_secret_comes_from_the_setting_or_a_mounted_file_and_is_never_shown(
    tmp_path,
) -> None:
    import pytest

    from enhydra.settings import Settings, SettingsError, control_secret_from_env

    mounted = tmp_path / "secret"
    mounted.write_text("from-a-file\n")
    base = {"ENHYDRA_APP_ID": "bank", "ENHYDRA_STATE_DIR": str(tmp_path)}
    by_file = Settings.from_env({**base, "ENHYDRA_CONTROL_SECRET_FILE": str(mounted)})
    assert by_file.control_key == b"from-a-file"
    given = Settings.from_env({**base, "ENHYDRA_CONTROL_SECRET": "s3cret-value"})
    assert given.control_key == b"s3cret-value" and "s3cret-value" not in repr(given)
    assert Settings.from_env(base).control_key is None
    both = {"ENHYDRA_CONTROL_SECRET": "x", "ENHYDRA_CONTROL_SECRET_FILE": str(mounted)}
    with pytest.raises(SettingsError, match="not both"):
        Settings.from_env({**base, **both})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingsError, match="a file holding the secret"):
        control_secret_from_env({"ENHYDRA_CONTROL_SECRET_FILE": str(tmp_path / "empty")})
    assert control_secret_from_env({"ENHYDRA_CONTROL_SECRET": "cli"}) == b"cli"
