"""Secured listeners for the local broker: a CA, certificates and SCRAM users, made locally.

Managed Kafka (Confluent Cloud, MSK, Aiven, a corporate cluster) speaks SASL_SSL or mutual
TLS, so the development broker offers both beside its PLAINTEXT listener:

- SASL_SSL: SCRAM-SHA-256/512 (users created when the storage is formatted), PLAIN, and
  OAUTHBEARER with Kafka's unsecured JWT validator (any unsigned token naming a user: for
  testing a token provider, never for production);
- SSL with `ssl.client.auth=required` (mTLS): the client certificate's subject is the user.

An authorizer runs with three super users (the local admin, the mTLS client and the PLAINTEXT
listener's ANONYMOUS), and one more user, `limited`, who may connect but do nothing: that is
how an authorization error is reproduced for real.

Certificates are made at start when missing or about to expire; passwords once, at format time.
Everything lives in the broker's data directory, private to the user (0600 files).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

ADMIN_USER = "admin"
LIMITED_USER = "limited"
CLIENT_CN = "enhydra-client"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
CERT_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=2)
TLS_DIR = "tls"
SECRETS_DIR = "secrets"


@dataclass(frozen=True)
class SecurityFiles:
    """Where a secured local broker keeps what clients and the broker need."""

    root: Path

    @property
    def tls(self) -> Path:
        return self.root / TLS_DIR

    @property
    def ca(self) -> Path:
        return self.tls / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.tls / "ca-key.pem"

    @property
    def server_keystore(self) -> Path:
        """The broker's private key and certificate chain in one PEM file (Kafka's PEM store)."""
        return self.tls / "server.pem"

    @property
    def client_cert(self) -> Path:
        return self.tls / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.tls / "client-key.pem"

    def password_file(self, user: str) -> Path:
        return self.root / SECRETS_DIR / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text(encoding="utf-8").strip()


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def ensure_passwords(files: SecurityFiles) -> dict[str, str]:
    """The SCRAM users' passwords, made once (they are baked into the formatted storage)."""
    passwords = {}
    for user in (ADMIN_USER, LIMITED_USER):
        path = files.password_file(user)
        if not path.is_file():
            _write_private(path, (secrets.token_urlsafe(18) + "\n").encode())
        passwords[user] = files.password(user)
    return passwords


def scram_format_args(passwords: dict[str, str]) -> list[str]:
    """`kafka-storage format --add-scram ...` arguments creating every user for both SCRAMs."""
    args: list[str] = []
    for user, password in passwords.items():
        for mechanism in SCRAM_MECHANISMS:
            args += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    return args


def ensure_certificates(files: SecurityFiles, now: dt.datetime | None = None) -> None:
    """A CA, the broker's certificate (127.0.0.1 and localhost) and a client certificate.

    Remade together when any is missing or expires within RENEW_BEFORE, so the three always
    chain to the same CA.
    """
    now = now or dt.datetime.now(dt.UTC)
    wanted = (files.ca, files.ca_key, files.server_keystore, files.client_cert, files.client_key)
    if all(p.is_file() for p in wanted) and (
        min(_valid_until(files.ca), _valid_until(files.client_cert)) - RENEW_BEFORE > now
    ):
        return
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        # PKCS#8, unencrypted: the only private-key form Kafka's PEM key store reads as is.
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    not_after = now + dt.timedelta(days=CERT_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("Enhydra local CA"))
        .issuer_name(name("Enhydra local CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(ca_usage, critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    server_key, server = leaf(
        "localhost",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key, client = leaf(CLIENT_CN, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    pem = serialization.Encoding.PEM
    _write_private(files.ca_key, pem_key(ca_key))
    _write_private(files.ca, ca.public_bytes(pem))
    _write_private(
        files.server_keystore, pem_key(server_key) + server.public_bytes(pem) + ca.public_bytes(pem)
    )
    _write_private(files.client_key, pem_key(client_key))
    _write_private(files.client_cert, client.public_bytes(pem) + ca.public_bytes(pem))


def _valid_until(path: Path) -> dt.datetime:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    return cert.not_valid_after_utc


def listener_properties(
    files: SecurityFiles, sasl_ssl_port: int, ssl_port: int, host: str
) -> dict[str, str]:
    """server.properties entries adding the SASL_SSL and SSL listeners and the authorizer."""
    store = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.server_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
    }
    props: dict[str, str] = {}
    for listener in ("sasl_ssl", "ssl"):
        for key, value in store.items():
            props[f"listener.name.{listener}.{key}"] = value
    props["listener.name.ssl.ssl.client.auth"] = "required"
    props["listener.name.sasl_ssl.sasl.enabled.mechanisms"] = ",".join(
        [*SCRAM_MECHANISMS, "PLAIN", "OAUTHBEARER"]
    )
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    for mechanism in SCRAM_MECHANISMS:
        props[f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config"] = scram
    plain_users = " ".join(
        f'user_{user}="{files.password(user)}"' for user in (ADMIN_USER, LIMITED_USER)
    )
    props["listener.name.sasl_ssl.plain.sasl.jaas.config"] = (
        f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
    )
    props["listener.name.sasl_ssl.oauthbearer.sasl.jaas.config"] = (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
    )
    props["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    props["super.users"] = f"User:ANONYMOUS;User:{ADMIN_USER};User:CN={CLIENT_CN}"
    props["allow.everyone.if.no.acl.found"] = "false"
    return props


def unsecured_token(user: str, lifetime_s: int = 3600) -> str:
    """An unsigned JWT for the broker's test-only OAUTHBEARER validator (alg "none")."""
    import base64
    import json
    import time

    def part(value: dict) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    now = int(time.time())
    header = part({"alg": "none"})
    claims = part({"sub": user, "iat": now, "exp": now + lifetime_s, "scope": "kafka"})
    return f"{header}.{claims}."
