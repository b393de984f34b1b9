"""A Connection as Spark sees it: options for spark-sql-kafka, and a string for the Python reader.

Spark's Kafka connector runs Kafka's Java client, which takes TLS and SASL as `kafka.*`
options; the Python reader and writer run aiokafka on the executors and rebuild the very
Connection the driver has. Both come from here, so the backfill reaches Kafka with the same
settings as the service and every other command.

Import-light on purpose (settings only): executors import it to rebuild the connection.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from enhydra.settings import Connection, SettingsError

# Options whose values must not appear in a query plan, Spark's UI or its event log: the
# Python reader's connection (it holds the password), the JAAS line, the client key and its
# password. `spark.sql.redaction.options.regex` (session.py) matches these names.
SECRET_OPTIONS = ("connection", "kafka.sasl.jaas.config", "kafka.ssl.keystore.key")
REDACTION_REGEX = r"(?i)url|connection|jaas|keystore\.key|password|secret|token"

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.DOTALL)
_PKCS8 = ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY")


class NotForTheJvm(ValueError):
    """The connection cannot be handed to Kafka's Java client (the message says why)."""


def spark_kafka_options(conn: Connection) -> dict[str, str]:
    """`kafka.*` options that make spark-sql-kafka connect and authenticate like `conn`.

    TLS material goes inline as PEM (the CA as the truststore, the client certificate and its
    PKCS#8 key as the keystore), read here on the driver: the executors need no files.
    Raises NotForTheJvm for OAUTHBEARER (the token provider is a Python callable) and
    SettingsError for a TLS file Kafka's Java client cannot read.
    """
    options = {
        "kafka.bootstrap.servers": conn.bootstrap_servers,
        "kafka.security.protocol": conn.security_protocol,
    }
    if conn.uses_sasl:
        if conn.sasl_mechanism not in _LOGIN_MODULES:
            raise NotForTheJvm(
                f"Spark's Kafka connector cannot call the Python {conn.sasl_mechanism} token "
                f"provider ({conn.sasl_oauth_token_provider})"
            )
        options["kafka.sasl.mechanism"] = conn.sasl_mechanism
        options["kafka.sasl.jaas.config"] = (
            f"{_LOGIN_MODULES[conn.sasl_mechanism]} required "
            f"username={_jaas_quote(conn.sasl_username)} "
            f"password={_jaas_quote(conn.sasl_password)};"
        )
    if conn.uses_ssl:
        if conn.ssl_cafile is not None:  # else the JVM's own trusted CAs, like the system's
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.certificates"] = _certificates(
                "ssl_cafile", conn.ssl_cafile
            )
        if conn.ssl_certfile is not None:
            options["kafka.ssl.keystore.type"] = "PEM"
            options["kafka.ssl.keystore.certificate.chain"] = _certificates(
                "ssl_certfile", conn.ssl_certfile
            )
            key_name, key_file = (
                ("ssl_keyfile", conn.ssl_keyfile)
                if conn.ssl_keyfile is not None
                else ("ssl_certfile", conn.ssl_certfile)
            )
            options["kafka.ssl.keystore.key"] = _private_key(key_name, key_file)
            if conn.ssl_key_password:
                options["kafka.ssl.key.password"] = conn.ssl_key_password
        if not conn.ssl_check_hostname:
            options["kafka.ssl.endpoint.identification.algorithm"] = ""
    return options


def _jaas_quote(value: str) -> str:
    """A JAAS option value: double-quoted, with backslashes and quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _blocks(setting: str, path: Path) -> list[tuple[str, str]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(setting, str(path), f"a readable PEM file ({exc})") from None
    return [(m.group(1), m.group(0)) for m in _PEM_BLOCK.finditer(text)]


def _certificates(setting: str, path: Path) -> str:
    certificates = [block for kind, block in _blocks(setting, path) if kind == "CERTIFICATE"]
    if not certificates:
        raise SettingsError(setting, str(path), "a PEM file with a certificate")
    return "\n".join(certificates)


def _private_key(setting: str, path: Path) -> str:
    keys = [(kind, block) for kind, block in _blocks(setting, path) if kind.endswith("PRIVATE KEY")]
    if not keys:
        raise SettingsError(setting, str(path), "a PEM file with the client's private key")
    kind, block = keys[0]
    if kind not in _PKCS8:
        raise SettingsError(
            setting,
            str(path),
            f"a PKCS#8 key ('BEGIN PRIVATE KEY') for Spark's Kafka connector, not '{kind}': "
            f"convert it with `openssl pkcs8 -topk8 -nocrypt -in {path} -out {path}.pk8`",
        )
    return block


# --------------------------------------------------------------------------- the Python reader


def connection_option(conn: Connection) -> str:
    """The connection as a data source option, for executors to rebuild (secrets included).

    A password read from a file travels as the password: the file may not exist on the
    workers. TLS files travel as paths, which must exist at the same path on the workers.
    """
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(conn):
        value = getattr(conn, f.name)
        if f.name == "sasl_password_file":
            continue
        fields[f.name] = str(value) if isinstance(value, Path) else value
    return json.dumps(fields, sort_keys=True)


def connection_from_option(text: str) -> Connection:
    """The Connection `connection_option` wrote (on an executor)."""
    fields = json.loads(text)
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if fields.get(name) is not None:
            fields[name] = Path(fields[name])
    return Connection(**fields)
