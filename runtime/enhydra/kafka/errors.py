"""What a failed Kafka call means to a user: one line, the setting to look at, and a hint.

aiokafka reports most start-up failures as `Unable to bootstrap from [...]` and logs the
actual cause (a refused connection, a TLS or SASL failure) on its own. `diagnose` connects
once more to learn that cause, and `explain` turns any exception into a KafkaAccessError a
person can act on. Secrets never appear in the message.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

from aiokafka import errors as kafka_errors

from enhydra.settings import Connection

AUTHORIZATION_ERRORS = (
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.GroupAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.TransactionalIdAuthorizationFailed,
)
LOCAL_BROKER_HINT = "`enhydra kafka start` runs one on this machine"


class KafkaAccessError(RuntimeError):
    """Kafka cannot be used as configured; `what` is the line to show, `hint` the next step."""

    def __init__(self, what: str, *, setting: str | None = None, hint: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.setting = setting
        self.hint = hint

    def lines(self) -> list[str]:
        """The message as shown to a person: what failed, then what to look at."""
        lines = [self.what]
        if self.hint or self.setting:
            look = f"check {self.setting}" if self.setting else ""
            lines.append("hint: " + "; ".join(x for x in (look, self.hint) if x))
        return lines

    def fields(self) -> dict[str, Any]:
        """The same, as structured log fields."""
        return {k: v for k, v in (("setting", self.setting), ("hint", self.hint)) if v}


# Errors that end by themselves when a broker comes back: worth waiting for, not dying of.
_TRANSIENT = (
    kafka_errors.KafkaTimeoutError,
    kafka_errors.KafkaConnectionError,
    kafka_errors.NodeNotReadyError,
    kafka_errors.RequestTimedOutError,
)


def transient(exc: BaseException) -> bool:
    """A Kafka error that a retry may cure (aiokafka's `retriable`, plus its timeouts)."""
    return isinstance(exc, _TRANSIENT) or bool(getattr(exc, "retriable", False))


def scrub(text: str, conn: Connection) -> str:
    for secret in conn.secrets():
        text = text.replace(secret, "***")
    return text


def _who(conn: Connection) -> str:
    if conn.uses_sasl:
        if conn.sasl_mechanism == "OAUTHBEARER":
            return "the OAUTHBEARER token's principal"
        return f"user {conn.sasl_username!r}"
    if conn.ssl_certfile is not None:
        return f"the client certificate {conn.ssl_certfile}"
    return "this client (ANONYMOUS)"


def explain(
    exc: BaseException,
    conn: Connection,
    *,
    doing: str = "connect",
    address: str | None = None,
) -> KafkaAccessError:
    """A KafkaAccessError for `exc`, which happened while `doing` something with Kafka."""
    if isinstance(exc, KafkaAccessError):
        return exc
    where = address or conn.bootstrap_servers
    detail = scrub(str(exc) or type(exc).__name__, conn)
    protocol = conn.security_protocol
    if isinstance(exc, kafka_errors.SaslAuthenticationFailed):
        settings = (
            "ENHYDRA_SASL_OAUTH_TOKEN_PROVIDER"
            if conn.sasl_mechanism == "OAUTHBEARER"
            else "ENHYDRA_SASL_USERNAME and ENHYDRA_SASL_PASSWORD"
        )
        return KafkaAccessError(
            f"authentication failed for {_who(conn)} ({conn.sasl_mechanism}) at {where}",
            setting=settings,
            hint="the credentials were refused by the broker; a password file must hold "
            "only the password",
        )
    if isinstance(exc, kafka_errors.UnsupportedSaslMechanismError):
        return KafkaAccessError(
            f"the broker at {where} does not offer SASL mechanism {conn.sasl_mechanism}",
            setting="ENHYDRA_SASL_MECHANISM",
            hint=f"use a mechanism the listener enables ({detail})",
        )
    if isinstance(exc, AUTHORIZATION_ERRORS):
        return KafkaAccessError(
            f"{_who(conn)} is not authorized to {doing} ({type(exc).__name__})",
            setting="ENHYDRA_SASL_USERNAME" if conn.uses_sasl else "ENHYDRA_SECURITY_PROTOCOL",
            hint="ask the cluster's administrator for ACLs on the application's topics "
            "(prefix '<app id>-'), its consumer groups and, with exactly_once, its "
            "transactional ids",
        )
    if isinstance(exc, kafka_errors.UnknownTopicOrPartitionError):
        return KafkaAccessError(
            f"a topic does not exist while trying to {doing} at {where}",
            setting="ENHYDRA_APP_ID",
            hint="is the application id right, and has the service run once to create its topics?",
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        if "mismatch" in detail.lower():
            return KafkaAccessError(
                f"the broker's certificate at {where} does not name that host ({detail})",
                setting="ENHYDRA_BOOTSTRAP_SERVERS",
                hint="connect by a host name the certificate lists; "
                "ENHYDRA_SSL_CHECK_HOSTNAME=false turns the check off (not for production)",
            )
        return KafkaAccessError(
            f"the broker's certificate at {where} is not trusted ({detail})",
            setting="ENHYDRA_SSL_CAFILE",
            hint="point it at the CA certificate that signed the broker's certificate "
            "(without it, the system's CAs are used)",
        )
    if isinstance(exc, ssl.SSLError):
        return KafkaAccessError(
            f"the TLS handshake with {where} failed ({detail})",
            setting="ENHYDRA_SECURITY_PROTOCOL",
            hint=f"it is {protocol}: is this listener TLS? A listener that requires a "
            "client certificate also needs ENHYDRA_SSL_CERTFILE and ENHYDRA_SSL_KEYFILE",
        )
    if isinstance(exc, ConnectionResetError) and conn.uses_ssl:
        return KafkaAccessError(
            f"the TLS handshake with {where} failed: the broker reset the connection",
            setting="ENHYDRA_SECURITY_PROTOCOL",
            hint=f"it is {protocol}, but this listener does not seem to speak TLS",
        )
    if isinstance(exc, ConnectionRefusedError):
        return KafkaAccessError(
            f"cannot reach Kafka at {where}: connection refused",
            setting="ENHYDRA_BOOTSTRAP_SERVERS",
            hint=f"is the broker running, at this address and port? ({LOCAL_BROKER_HINT})",
        )
    if isinstance(exc, socket.gaierror):
        return KafkaAccessError(
            f"cannot reach Kafka at {where}: the host name does not resolve",
            setting="ENHYDRA_BOOTSTRAP_SERVERS",
            hint="check the host name (and the DNS of this machine or pod)",
        )
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return KafkaAccessError(
            f"no answer from Kafka at {where} while trying to {doing}",
            setting="ENHYDRA_BOOTSTRAP_SERVERS",
            hint="a firewall, a wrong port, or a listener that expects another "
            f"security protocol than {protocol}",
        )
    if isinstance(exc, kafka_errors.KafkaConnectionError) and "closed" in detail:
        if conn.uses_ssl and conn.ssl_certfile is None:
            hint = (
                "a listener that requires a client certificate (mutual TLS) closes the "
                "connection without one: set ENHYDRA_SSL_CERTFILE and ENHYDRA_SSL_KEYFILE; "
                "or the listener expects another security protocol"
            )
        else:
            hint = (
                f"the client speaks {protocol}; this listener probably expects another "
                "security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)"
            )
        return KafkaAccessError(
            f"Kafka at {where} closed the connection during the handshake",
            setting="ENHYDRA_SECURITY_PROTOCOL",
            hint=hint,
        )
    if isinstance(exc, OSError):
        return KafkaAccessError(
            f"cannot reach Kafka at {where}: {detail}",
            setting="ENHYDRA_BOOTSTRAP_SERVERS",
            hint=LOCAL_BROKER_HINT,
        )
    return KafkaAccessError(
        f"Kafka failed while trying to {doing}: {type(exc).__name__}: {detail}",
        setting=None,
        hint="run with ENHYDRA_LOG_LEVEL=debug for the full trace",
    )


async def diagnose(conn: Connection, timeout: float = 10.0) -> BaseException | None:
    """Connect to each bootstrap server once; the first failure, or None if one answers.

    aiokafka only logs why a bootstrap failed, so this asks again to hold the real error.
    """
    from aiokafka.conn import create_conn

    from enhydra.kafka.clients import options

    opts = options(conn)
    opts.pop("bootstrap_servers")
    first: BaseException | None = None
    for server in conn.bootstrap_servers.split(","):
        host, _, port = server.rpartition(":")
        try:
            connection = await asyncio.wait_for(create_conn(host, int(port), **opts), timeout)
        except (TimeoutError, OSError, kafka_errors.KafkaError) as exc:
            first = first or exc
            continue
        connection.close()
        return None
    return first
