"""A SQL projection over TLS, as production runs it: the server accepts only TLS connections
(hostssl), the service verifies its certificate (sslmode=verify-full with the CA), and the
password comes from a file. A wrong CA or no TLS is refused by the connection, plainly."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from enhydra.devtools.broker_security import SecurityFiles, ensure_certificates
from enhydra.devtools.postgres import Postgres, find_server_bin
from enhydra.settings import Settings
from enhydra.sql.config import DatabaseSettings
from enhydra.sql.engine import SqlProjectionEngine
from tests.sql.accounts import PROJECTION, history, model, produce
from tests.sql.test_sql_projection import caught_up, env_for, table

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def _owned_by_server(path: Path) -> None:
    """The server refuses a key others may read; as root it runs as the postgres user."""
    path.chmod(0o600)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Postgres, Path]]:
    """A server with a certificate of the local CA that takes TLS connections only; the CA."""
    root = Path(tempfile.mkdtemp(prefix="enhydra-pg-tls-"))
    root.chmod(0o755)
    files = SecurityFiles(tmp_path_factory.mktemp("pki"))
    ensure_certificates(files)
    pem = files.server_keystore.read_text()  # the key, then the certificate chain
    key = re.search(r"-----BEGIN PRIVATE KEY-----.*?-----END PRIVATE KEY-----\n", pem, re.S)
    assert key is not None
    (root / "server.key").write_text(key.group(0))
    (root / "server.crt").write_text(pem.replace(key.group(0), ""))
    settings = {
        "ssl": "on",
        "ssl_cert_file": str(root / "server.crt"),
        "ssl_key_file": str(root / "server.key"),
    }
    server = Postgres(find_server_bin(), root, settings=settings)
    server.init()
    for name in ("server.key", "server.crt"):
        _owned_by_server(root / name)
    # TLS or nothing over TCP (the unix socket stays for the admin).
    (server.data / "pg_hba.conf").write_text(
        "local all all scram-sha-256\nhostssl all all 127.0.0.1/32 scram-sha-256\n"
    )
    server.start()
    try:
        yield server, files.ca
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


def over_tls(server: Postgres, ca: Path, mode: str = "verify-full") -> DatabaseSettings:
    return DatabaseSettings(f"{server.url()}?sslmode={mode}&sslrootcert={ca}", server.password_file)


async def test_rows_land_over_a_verified_tls_connection(
    kafka_bootstrap: str, app_id: str, tmp_path: Path, tls_server
) -> None:
    server, ca = tls_server
    database = over_tls(server, ca)
    settings = Settings.from_env(env_for(kafka_bootstrap, app_id, tmp_path / "state"))
    topic = f"{app_id}-events"
    events = history(20, 8, seed=11)
    engine = SqlProjectionEngine(settings, PROJECTION, topic, database=database)
    await engine.start()
    try:
        await produce(kafka_bootstrap, topic, events)
        await caught_up(database, kafka_bootstrap, topic)
    finally:
        await engine.stop()
    assert await table(database) == model(events)
    assert "sslmode=verify-full" in repr(
        database
    ) and server.password_file.read_text().strip() not in repr(database)


def test_no_tls_or_another_ca_is_refused(tls_server, tmp_path: Path) -> None:
    import psycopg

    server, _ = tls_server
    plain = over_tls(server, Path("/nonexistent"), mode="disable")
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(plain.conninfo(), connect_timeout=10).close()
    stranger = SecurityFiles(tmp_path / "other")
    ensure_certificates(stranger)
    with pytest.raises(psycopg.OperationalError, match="SSL error"):
        # Same CA name, another key: the certificate does not verify.
        psycopg.connect(over_tls(server, stranger.ca).conninfo(), connect_timeout=10).close()
