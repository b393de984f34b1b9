"""Who may speak on the control topic: an HMAC over each message, with a secret the app shares.

The control topic can stop every instance, make them export their state, and keep a dead peer
looking alive; a prefix ACL on `<app id>-` (which command producers often get) lets anyone
write it. So every message is sealed: its JSON value carries a fresh `at` and `nonce` and the
app id it is for, and the header `enhydra.signature` is HMAC-SHA256(secret, value). A reader
acts on a message only if the signature matches, it is for this app, `at` is within
`max_age_s` of its clock, and it has not seen the same signature before (a copied record is a
replay, so a recorded beacon cannot revive a dead peer).

Without a secret (ENHYDRA_CONTROL_SECRET / ENHYDRA_CONTROL_SECRET_FILE unset) messages go out
unsigned and every message is accepted, with a warning at start. That is allowed only with
ENHYDRA_SECURITY_PROTOCOL=PLAINTEXT: a broker without authentication lets anyone write the
commands and the changelogs directly, so a signed control topic would protect nothing there,
while a generated secret could not be shared by the instances. With any authenticated
protocol there are ACLs to bypass, so the setting refuses to start without a secret.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

SIGNATURE_HEADER = "enhydra.signature"
MAX_AGE_S = 60.0  # clock skew between instances, plus the time a record may sit in the topic
MAX_SENDERS_LOGGED = 1000  # a writer inventing origins must not grow memory without bound

# Rejected control messages by reason, for /metrics: one control channel per process.
rejected: Counter[str] = Counter()


def missing_secret(security_protocol: str, secret: bytes | None, app_id: str) -> str | None:
    """Why an instance must not start without a control secret, or None (see the top)."""
    if secret is not None or security_protocol == "PLAINTEXT":
        return None
    return (
        f"ENHYDRA_CONTROL_SECRET (or ENHYDRA_CONTROL_SECRET_FILE) is required with "
        f"ENHYDRA_SECURITY_PROTOCOL={security_protocol}: whoever may write {app_id}-control "
        "could otherwise stop the application or export its state; set the same secret on "
        "every instance and wherever `enhydra snapshot create` runs"
    )


def signature(secret: bytes, value: bytes) -> bytes:
    return hmac.new(secret, value, hashlib.sha256).hexdigest().encode()


def seal(
    message: Mapping[str, Any], secret: bytes | None, *, app: str | None = None
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record value and headers of `message`, signed when there is a secret. `app`, the
    app id the message is for, is signed with it: a copy into another app's control topic
    (two apps sharing one secret) is refused there."""
    sealed = {
        **message,
        **({"app": app} if app is not None else {}),
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        "nonce": secrets.token_hex(8),
    }
    value = orjson.dumps(sealed)
    if secret is None:
        return value, []
    return value, [(SIGNATURE_HEADER, signature(secret, value))]


def _at(message: Mapping[str, Any]) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(message["at"])).timestamp()
    except (KeyError, ValueError):
        return None


class Verifier:
    """Decides whether a control record may act; `check` returns why not, or None."""

    def __init__(
        self,
        secret: bytes | None,
        *,
        app: str | None = None,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._secret = secret
        self._app = app
        self._max_age_s = max_age_s
        self._clock = clock
        self._seen: dict[bytes, float] = {}  # signature -> the message's `at`

    @property
    def signing(self) -> bool:
        return self._secret is not None

    def check(
        self, value: bytes, headers: Iterable[tuple[str, bytes]]
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(message, None) when it may act, else (the message if readable, the reason)."""
        try:
            message = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None, "unreadable"
        if not isinstance(message, dict):
            return None, "unreadable"
        if self._secret is None:
            return message, None
        given = next((v for k, v in headers if k == SIGNATURE_HEADER), None)
        if given is None:
            return message, "unsigned"
        if not hmac.compare_digest(bytes(given), signature(self._secret, value)):
            return message, "bad_signature"
        # Signed for another app sharing the secret. A message without `app` comes from an
        # earlier release (a rolling upgrade): accepted, as it was.
        if self._app is not None and message.get("app", self._app) != self._app:
            return message, "other_app"
        now = self._clock()
        at = _at(message)
        if at is None or abs(now - at) > self._max_age_s:
            return message, "stale"
        for old in [s for s, seen_at in self._seen.items() if now - seen_at > self._max_age_s]:
            del self._seen[old]
        if bytes(given) in self._seen:
            return message, "replayed"
        self._seen[bytes(given)] = at
        return message, None


class RejectionLog:
    """Counts every rejected message and says so once per sender (the `origin` it claims)."""

    def __init__(self, log: Any) -> None:
        self._log = log
        self._told: set[str] = set()

    def reject(self, reason: str, message: Mapping[str, Any] | None, offset: int) -> None:
        rejected[reason] += 1
        origin = str((message or {}).get("origin") or "unknown")[:200]
        if origin in self._told or len(self._told) >= MAX_SENDERS_LOGGED:
            return
        self._told.add(origin)
        self._log.warning(
            "control message ignored",
            reason=reason,
            origin=origin,
            type=str((message or {}).get("type"))[:100],
            offset=offset,
            hint="every instance and `enhydra snapshot create` need the same "
            "ENHYDRA_CONTROL_SECRET; later messages from this origin are only counted "
            "(enhydra_control_messages_rejected_total)",
        )
