"""A Connection as Spark's Kafka connector and the Python reader receive it (pure translation).

The broker-facing half (both readers, both writers, over SASL_SSL and mTLS) runs in
tests/spark/test_security.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from enhydra.kafka.spark_options import (
    REDACTION_REGEX,
    SECRET_OPTIONS,
    NotForTheJvm,
    connection_from_option,
    connection_option,
    spark_kafka_options,
)
from enhydra.settings import Connection, SettingsError


def pem(kind: str, body: str) -> str:
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----\n"


CA = pem("CERTIFICATE", "Q0EtY2VydA==")
LEAF = pem("CERTIFICATE", "bGVhZg==")
KEY = pem("PRIVATE KEY", "a2V5")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_plaintext_is_the_address_and_the_protocol() -> None:
    assert spark_kafka_options(Connection.plain("k1:9092,k2:9092")) == {
        "kafka.bootstrap.servers": "k1:9092,k2:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        ("SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"),
        ("SCRAM-SHA-256", "org.apache.kafka.common.security.scram.ScramLoginModule"),
        ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
    ],
)
def test_sasl_ssl_gives_the_jaas_line_and_the_ca_as_a_pem_truststore(
    tmp_path: Path, mechanism: str, module: str
) -> None:
    conn = Connection(
        bootstrap_servers="broker:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_username="svc",
        sasl_password="s3cret",
        ssl_cafile=write(tmp_path, "ca.pem", "comment line\n" + CA),
    )
    options = spark_kafka_options(conn)
    assert options == {
        "kafka.bootstrap.servers": "broker:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": mechanism,
        "kafka.sasl.jaas.config": f'{module} required username="svc" password="s3cret";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.certificates": CA.strip(),
    }


def test_quotes_and_backslashes_in_credentials_are_escaped_for_jaas() -> None:
    conn = Connection(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username='we"ird',
        sasl_password='a\\b"c;d',
    )
    jaas = spark_kafka_options(conn)["kafka.sasl.jaas.config"]
    assert jaas.endswith(' required username="we\\"ird" password="a\\\\b\\"c;d";')
    assert "kafka.ssl.truststore.type" not in spark_kafka_options(conn)


def test_a_password_file_is_read_into_the_jaas_line(tmp_path: Path) -> None:
    conn = Connection(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password_file=write(tmp_path, "pw", "from-a-file\n"),
    )
    assert 'password="from-a-file";' in spark_kafka_options(conn)["kafka.sasl.jaas.config"]


def test_mutual_tls_sends_the_certificate_chain_and_the_pkcs8_key(tmp_path: Path) -> None:
    conn = Connection(
        bootstrap_servers="broker:9094",
        security_protocol="SSL",
        ssl_cafile=write(tmp_path, "ca.pem", CA),
        ssl_certfile=write(tmp_path, "client.pem", LEAF + CA),
        ssl_keyfile=write(tmp_path, "client-key.pem", KEY),
        ssl_key_password="kp",
        ssl_check_hostname=False,
    )
    options = spark_kafka_options(conn)
    assert options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.keystore.certificate.chain"] == LEAF.strip() + "\n" + CA.strip()
    assert options["kafka.ssl.keystore.key"] == KEY.strip()
    assert options["kafka.ssl.key.password"] == "kp"
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert "kafka.sasl.jaas.config" not in options


def test_a_key_inside_the_certificate_file_is_found_there(tmp_path: Path) -> None:
    conn = Connection(security_protocol="SSL", ssl_certfile=write(tmp_path, "both.pem", KEY + LEAF))
    options = spark_kafka_options(conn)
    assert options["kafka.ssl.keystore.key"] == KEY.strip()
    assert options["kafka.ssl.keystore.certificate.chain"] == LEAF.strip()
    assert "kafka.ssl.truststore.type" not in options  # the JVM's own CAs


def test_a_pkcs1_key_is_refused_with_the_command_that_converts_it(tmp_path: Path) -> None:
    conn = Connection(
        security_protocol="SSL",
        ssl_certfile=write(tmp_path, "client.pem", LEAF),
        ssl_keyfile=write(tmp_path, "rsa.pem", pem("RSA PRIVATE KEY", "a2V5")),
    )
    with pytest.raises(SettingsError, match=r"ENHYDRA_SSL_KEYFILE.*PKCS#8.*openssl pkcs8 -topk8"):
        spark_kafka_options(conn)


def test_a_file_without_a_certificate_names_its_setting(tmp_path: Path) -> None:
    conn = Connection(security_protocol="SSL", ssl_cafile=write(tmp_path, "ca.pem", "nothing"))
    with pytest.raises(SettingsError, match="ENHYDRA_SSL_CAFILE"):
        spark_kafka_options(conn)


def test_oauthbearer_cannot_go_to_the_jvm() -> None:
    conn = Connection(
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider="billing.auth:fetch_token",
    )
    with pytest.raises(NotForTheJvm, match="token provider"):
        spark_kafka_options(conn)


def test_the_python_reader_gets_the_same_connection_without_the_password_file(
    tmp_path: Path,
) -> None:
    conn = Connection(
        bootstrap_servers="broker:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password_file=write(tmp_path, "pw", "from-a-file"),
        ssl_cafile=write(tmp_path, "ca.pem", CA),
        ssl_check_hostname=False,
    )
    text = connection_option(conn)
    (tmp_path / "pw").unlink()  # the workers do not have it
    rebuilt = connection_from_option(text)
    assert rebuilt.sasl_password == "from-a-file" and rebuilt.sasl_password_file is None
    assert rebuilt.ssl_cafile == conn.ssl_cafile and rebuilt.ssl_check_hostname is False
    assert rebuilt.describe() == conn.describe()


def test_the_options_that_carry_secrets_are_redacted_by_spark() -> None:
    names = [*SECRET_OPTIONS, "kafka.ssl.key.password"]
    assert all(re.search(REDACTION_REGEX, name) for name in names)
    assert not re.search(REDACTION_REGEX, "kafka.bootstrap.servers")
    assert not re.search(REDACTION_REGEX, "kafka.ssl.truststore.certificates")
