"""Bearer tokens for the HTTP API.

Admin endpoints can stop an instance or move tasks, so they do not exist (404) until an admin
token is configured. Queries are open unless a query token is set; the admin token also
opens them, so one operator token is enough. Comparisons are constant-time.
"""

from __future__ import annotations

import hmac


class Denied(Exception):
    """The request may not go on: status 401, 403 or 404, and why."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason


def _bearer(header: str) -> str | None:
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _matches(given: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(
        given.encode("utf-8", "replace"), expected.encode("utf-8", "replace")
    )


def check(level: str | None, authorization: str, *, admin_token: str, query_token: str) -> None:
    """Raise Denied unless `authorization` (the header) may call a route of `level`."""
    if level is None:
        return
    if level == "admin":
        if not admin_token:
            raise Denied(
                404,
                "admin_disabled",
                "admin endpoints are off: set ENHYDRA_ADMIN_TOKEN to use them",
            )
        accepted = (admin_token,)
    else:
        if not query_token:
            return
        accepted = (query_token, admin_token)
    token = _bearer(authorization)
    if token is None:
        raise Denied(401, "unauthorized", "send Authorization: Bearer <token>")
    if not any(_matches(token, expected) for expected in accepted):
        raise Denied(403, "forbidden", "the bearer token is not valid for this endpoint")
