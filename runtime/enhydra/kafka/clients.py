"""Every aiokafka producer, consumer and admin client of Enhydra is built here, from a Connection.

One place means one behaviour: TLS, SASL and the start timeout are set the same way for the
engine, the projections, the changelog reader, the CLI, the Spark readers and the tests; a
client that fails to start is closed before the error leaves (no `Unclosed AIOKafkaConsumer`),
and the error is explained (errors.py) instead of surfacing as aiokafka's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.metadata import MetadataRequest

from enhydra.kafka.errors import KafkaAccessError, diagnose, explain
from enhydra.kafka.noise import starting
from enhydra.settings import Connection, SettingsError


class Admin(AIOKafkaAdminClient):
    """aiokafka's admin client, whose topic lookups never create a topic.

    aiokafka asks for a topic's metadata allowing the broker to create it, and a broker with
    `auto.create.topics.enable=true` (Kafka's default) then does, with its own defaults (one
    replica, seven days of retention): a lookup before the creation would make an events
    history that loses its past. Topics are created by kafka/topics.py only.
    """

    async def describe_topics(self, topics: list[str] | None = None) -> list[Any]:
        request = MetadataRequest(topics, allow_auto_topic_creation=False)
        return (await self._send_request(request)).to_object()["topics"]


# The client types other modules may name in annotations.
Producer = AIOKafkaProducer
Consumer = AIOKafkaConsumer
RebalanceListener = ConsumerRebalanceListener

# Long enough for a TLS handshake and SASL round trips to a remote cluster, short enough that a
# wrong address or password ends a command well within 20 seconds.
START_TIMEOUT_S = 15.0
# A stdlib logger: the Spark readers import this module without structlog (logs.py formats it).
log = logging.getLogger("enhydra.kafka")


class _CallableTokenProvider(AbstractTokenProvider):
    """OAUTHBEARER: aiokafka asks for a token; the user's callable (sync or async) makes it."""

    def __init__(self, fetch: Callable[[], Any]) -> None:
        self._fetch = fetch

    async def token(self) -> str:
        if inspect.iscoroutinefunction(self._fetch):
            value = await self._fetch()
        else:  # an identity provider call may block: keep it off the event loop
            value = await asyncio.to_thread(self._fetch)
        if not isinstance(value, str) or not value:
            raise KafkaAccessError(
                "the OAUTHBEARER token provider returned no token",
                setting="ENHYDRA_SASL_OAUTH_TOKEN_PROVIDER",
                hint="the callable must return the access token as a non-empty string",
            )
        return value


@functools.lru_cache(maxsize=16)
def ssl_context(conn: Connection) -> ssl.SSLContext:
    """The TLS context of a connection: its CA (or the system's), its client certificate."""

    def unusable(setting: str, exc: Exception) -> KafkaAccessError:
        return KafkaAccessError(
            f"{setting} cannot be used: {exc}",
            setting=setting,
            hint="the file must be PEM; a client key must match its certificate and, when "
            "encrypted, ENHYDRA_SSL_KEY_PASSWORD must be its password",
        )

    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=str(conn.ssl_cafile) if conn.ssl_cafile else None
        )
    except (ssl.SSLError, OSError) as exc:
        raise unusable("ENHYDRA_SSL_CAFILE", exc) from None
    if conn.ssl_certfile is not None:
        try:
            context.load_cert_chain(
                str(conn.ssl_certfile),
                str(conn.ssl_keyfile) if conn.ssl_keyfile else None,
                password=conn.ssl_key_password or None,
            )
        except (ssl.SSLError, OSError) as exc:
            setting = "ENHYDRA_SSL_KEYFILE" if conn.ssl_keyfile else "ENHYDRA_SSL_CERTFILE"
            raise unusable(setting, exc) from None
    context.check_hostname = conn.ssl_check_hostname
    return context


def options(conn: Connection | str) -> dict[str, Any]:
    """aiokafka keyword arguments for reaching and authenticating to the cluster."""
    conn = as_connection(conn)
    opts: dict[str, Any] = {
        "bootstrap_servers": conn.bootstrap_servers,
        "security_protocol": conn.security_protocol,
    }
    if conn.uses_ssl:
        opts["ssl_context"] = ssl_context(conn)
    if conn.uses_sasl:
        opts["sasl_mechanism"] = conn.sasl_mechanism
        if conn.sasl_mechanism == "OAUTHBEARER":
            try:
                fetch = conn.token_provider()
            except SettingsError as exc:
                raise KafkaAccessError(
                    str(exc),
                    setting="ENHYDRA_SASL_OAUTH_TOKEN_PROVIDER",
                    hint="name an importable callable, e.g. billing.auth:fetch_token",
                ) from None
            opts["sasl_oauth_token_provider"] = _CallableTokenProvider(fetch)
        else:
            opts["sasl_plain_username"] = conn.sasl_username
            opts["sasl_plain_password"] = conn.sasl_password
    return opts


def new_producer(conn: Connection | str, **settings: Any) -> Producer:
    """An unstarted producer (call `start` below, or use `open_producer`)."""
    return AIOKafkaProducer(**options(conn), **settings)


def new_consumer(conn: Connection | str, **settings: Any) -> Consumer:
    """An unstarted consumer; group-less unless `group_id` is given."""
    settings.setdefault("enable_auto_commit", False)
    return AIOKafkaConsumer(**options(conn), **settings)


def new_admin(conn: Connection | str, **settings: Any) -> Admin:
    return Admin(**options(conn), **settings)


async def start(
    client: Producer | Consumer | Admin,
    conn: Connection | str,
    *,
    doing: str = "connect",
    timeout: float = START_TIMEOUT_S,
) -> None:
    """Start a client within `timeout`; on failure close it and raise an explained error.

    A group's consumer also joins its group here. Once the group's coordinator answers, a join
    that takes longer is the group holding it (a static member that stopped without leaving is
    awaited until its session times out), not a broker that does not answer: the start waits
    on, and fails only when the coordinator has been unknown for `timeout`.
    """
    conn = as_connection(conn)
    try:
        with starting():
            await _start_within(client, timeout, doing)
    except BaseException as exc:
        await close(client)
        if not isinstance(exc, Exception):
            raise
        cause: BaseException = exc
        if isinstance(exc, KafkaConnectionError) and "bootstrap" in str(exc):
            cause = await diagnose(conn) or exc
        raise explain(cause, conn, doing=doing) from exc


JOIN_POLL_S = 0.5
HELD_LOG_S = 30.0  # a join held this long is logged again


async def _start_within(client: Producer | Consumer | Admin, timeout: float, doing: str) -> None:
    """client.start(); TimeoutError once `timeout` passed without an answering coordinator."""
    loop = asyncio.get_running_loop()
    started = asyncio.ensure_future(client.start())
    begun = answered = loop.time()
    told: float | None = None  # when the held join was last logged
    try:
        while True:
            await asyncio.wait({started}, timeout=JOIN_POLL_S)
            now = loop.time()
            if started.done():
                started.result()  # raises what the start failed with
                if told is not None:
                    log.info("joined after %.1f s while trying to %s", now - begun, doing)
                return
            if _coordinator_known(client):
                answered = now
                if now - begun >= timeout and (told is None or now - told >= HELD_LOG_S):
                    told = now
                    log.warning(
                        "the group holds this join; waiting, not ready meanwhile (%.0f s so "
                        "far, trying to %s). hint: a member that stopped without leaving the "
                        "group is awaited until its session times out (ENHYDRA_SESSION_TIMEOUT_MS)",
                        now - begun,
                        doing,
                    )
            elif now - answered >= timeout:
                raise TimeoutError(f"no answer within {timeout:g} s")
    finally:
        if not started.done():
            started.cancel()
            with contextlib.suppress(BaseException):
                await started


def _coordinator_known(client: Producer | Consumer | Admin) -> bool:
    """Whether a consumer's group coordinator is found and connected (aiokafka's own state:
    it forgets the coordinator when a request to it fails or times out)."""
    coordinator = getattr(client, "_coordinator", None) if isinstance(client, Consumer) else None
    return coordinator is not None and coordinator.coordinator_id is not None


# A close waits at most this long: a producer flushing to a broker that does not answer, or a
# consumer committing to a lost coordinator, would otherwise hold a stop for minutes.
CLOSE_TIMEOUT_S = 5.0


async def close(client: Producer | Consumer | Admin, timeout: float = CLOSE_TIMEOUT_S) -> None:
    """Stop a client, whatever state it is in; errors while closing are not the caller's news.

    Bounded by `timeout`: what a producer had not sent by then is not sent (every caller has
    either waited for its acknowledgements already or can lose it, such as a control message).
    """
    with contextlib.suppress(Exception):
        if isinstance(client, AIOKafkaAdminClient):
            await asyncio.wait_for(client.close(), timeout)
        else:
            await asyncio.wait_for(client.stop(), timeout)


@contextlib.asynccontextmanager
async def open_producer(conn: Connection | str, **settings: Any) -> AsyncIterator[Producer]:
    producer = new_producer(conn, **settings)
    await start(producer, conn)
    try:
        yield producer
    finally:
        await close(producer)


@contextlib.asynccontextmanager
async def open_consumer(conn: Connection | str, **settings: Any) -> AsyncIterator[Consumer]:
    consumer = new_consumer(conn, **settings)
    await start(consumer, conn)
    try:
        yield consumer
    finally:
        await close(consumer)


@contextlib.asynccontextmanager
async def open_admin(conn: Connection | str, **settings: Any) -> AsyncIterator[Admin]:
    admin = new_admin(conn, **settings)
    await start(admin, conn)
    try:
        yield admin
    finally:
        await close(admin)


def as_connection(target: Connection | str) -> Connection:
    """A Connection, or a PLAINTEXT one to a bootstrap string (tests, the local broker)."""
    return target if isinstance(target, Connection) else Connection.plain(target)


async def check_access(conn: Connection | str, *, timeout: float = START_TIMEOUT_S) -> int:
    """Connect and authenticate once; the number of brokers the cluster lists.

    Raises KafkaAccessError when the cluster cannot be used as configured (unreachable, wrong
    protocol, refused credentials), before a service or a command begins its work.
    """
    async with open_admin(conn, request_timeout_ms=int(timeout * 1000)) as admin:
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout)
    return len(cluster.get("brokers") or ())
