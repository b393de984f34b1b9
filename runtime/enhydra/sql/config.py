"""Where the read models live: ENHYDRA_DATABASE_URL, and the password apart from it.

    ENHYDRA_DATABASE_URL=postgresql://enhydra@db:5432/reads?sslmode=verify-full&sslrootcert=...
    ENHYDRA_DATABASE_PASSWORD_FILE=/run/secrets/db-password    (optional)
    ENHYDRA_DATABASE_POOL_MAX=4                 connections per instance at most (optional)
    ENHYDRA_DATABASE_CONNECT_TIMEOUT_S=5        2-600; a connection not made by then is retried

TLS goes in the URL as libpq takes it (sslmode, sslrootcert, sslcert, sslkey). The password is
read from its file when the pool connects, and no log line or error shows the URL's password.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote_plus

URL_VAR = "ENHYDRA_DATABASE_URL"
PASSWORD_FILE_VAR = "ENHYDRA_DATABASE_PASSWORD_FILE"
POOL_MAX_VAR = "ENHYDRA_DATABASE_POOL_MAX"
CONNECT_TIMEOUT_VAR = "ENHYDRA_DATABASE_CONNECT_TIMEOUT_S"


class DatabaseConfigError(ValueError):
    """A database setting is missing or wrong: one plain line with the fix."""


# libpq also takes the password, and the client key's passphrase, as query parameters.
_SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def _redact_query(query: str) -> str:
    """Each secret parameter's value replaced, its name matched as libpq decodes it
    (`pass%77ord=` is `password=`)."""
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        secret = equals and unquote_plus(name).strip().lower() in _SECRET_PARAMETERS
        pairs.append(f"{name}=***" if secret else pair)
    return "&".join(pairs)


def redact(url: str) -> str:
    """The URL with its passwords replaced (user:password@, ?password=, ?sslpassword=), fit
    for a log line. Split as libpq splits it, not as a web URL: the user part ends at the
    first `@` before any `/` (a `#` or `?` in a password is the password's), the query at the
    end (libpq has no fragment)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    ends = [i for i in (rest.find("@"), rest.find("/")) if i >= 0]
    if ends and rest[min(ends)] == "@":
        user, colon, _ = rest[: min(ends)].partition(":")
        rest = f"{user}:***" + rest[min(ends) :] if colon else rest
    head, question, query = rest.partition("?")
    return f"{scheme}://{head}{question}{_redact_query(query)}"


@dataclass(frozen=True)
class DatabaseSettings:
    url: str
    password_file: Path | None = None
    pool_min: int = 1
    pool_max: int = 4
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("postgresql://", "postgres://")):
            raise DatabaseConfigError(
                f"{URL_VAR}={redact(self.url)!r}: expected postgresql://user@host:port/dbname"
            )

    def __repr__(self) -> str:  # never the password
        return f"DatabaseSettings(url={redact(self.url)!r}, password_file={self.password_file})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DatabaseSettings:
        env = os.environ if env is None else env
        url = env.get(URL_VAR, "").strip()
        if not url:
            raise DatabaseConfigError(
                f"{URL_VAR} is not set: a SQL projection needs postgresql://user@host:port/db"
            )
        raw = env.get(PASSWORD_FILE_VAR, "").strip()
        path = Path(raw) if raw else None
        if path is not None and not path.is_file():
            raise DatabaseConfigError(f"{PASSWORD_FILE_VAR}={raw}: not a readable file")
        pool_max = _number(env, POOL_MAX_VAR, int, cls.pool_max, "a whole number from 1 to 100")
        if not 1 <= pool_max <= 100:
            raise DatabaseConfigError(f"{POOL_MAX_VAR}={pool_max}: expected 1 to 100 connections")
        timeout = _number(env, CONNECT_TIMEOUT_VAR, float, cls.connect_timeout_s, "2-600 seconds")
        if not 2 <= timeout <= 600:
            raise DatabaseConfigError(
                f"{CONNECT_TIMEOUT_VAR}={timeout}: expected 2 to 600 seconds (libpq waits 2 s "
                "at least)"
            )
        return cls(url, path, min(cls.pool_min, pool_max), pool_max, timeout)

    def conninfo(self) -> str:
        """What libpq connects with: the URL, its password from the file when one is given."""
        if self.password_file is None:
            return self.url
        from psycopg.conninfo import make_conninfo

        try:
            password = self.password_file.read_text(encoding="utf-8").strip("\r\n")
        except OSError as exc:
            raise DatabaseConfigError(
                f"{PASSWORD_FILE_VAR}={self.password_file}: not readable ({exc.strerror})"
            ) from None
        return make_conninfo(self.url, password=password)

    def describe(self) -> str:
        return redact(self.url)


def _number(env: Mapping[str, str], name: str, kind: type, default: float, expected: str):
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise DatabaseConfigError(f"{name}={raw!r}: expected {expected}") from None
