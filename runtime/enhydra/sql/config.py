"""Where the read models live: ENHYDRA_DATABASE_URL, and the password apart from it.

    ENHYDRA_DATABASE_URL=postgresql://enhydra@db:5432/reads?sslmode=verify-full&sslrootcert=...
    ENHYDRA_DATABASE_PASSWORD_FILE=/run/secrets/db-password    (optional)

TLS goes in the URL as libpq takes it (sslmode, sslrootcert, sslcert, sslkey). The password is
read from its file when the pool connects, and no log line or error shows the URL's password.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

URL_VAR = "ENHYDRA_DATABASE_URL"
PASSWORD_FILE_VAR = "ENHYDRA_DATABASE_PASSWORD_FILE"


class DatabaseConfigError(ValueError):
    """A database setting is missing or wrong: one plain line with the fix."""


# libpq also takes the password, and the client key's passphrase, as query parameters.
_SECRET_PARAMETER = re.compile(r"(?i)(^|&)(password|sslpassword)=[^&]*")


def redact(url: str) -> str:
    """The URL with its passwords replaced (user:password@, ?password=, ?sslpassword=), fit
    for a log line."""
    parts = urlsplit(url)
    query = _SECRET_PARAMETER.sub(r"\1\2=***", parts.query)
    if parts.password is None:
        return urlunsplit(parts._replace(query=query))
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit(parts._replace(netloc=netloc, query=query))


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
        return cls(url, path)

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
