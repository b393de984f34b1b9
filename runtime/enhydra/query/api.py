"""What every route shares: JSON answers, errors as JSON, the API's settings and context."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from enhydra.failover.endpoint import DEFAULT_MAX_STREAMS
from enhydra.query.metrics import Histogram
from enhydra.query.routing import Peers

if TYPE_CHECKING:
    from enhydra.processing.engine import Engine
    from enhydra.projections.engine import ProjectionEngine
    from enhydra.query.dlq import DeadLetterCount
    from enhydra.settings import Settings

RETRY_AFTER_S = "1"

# An admin endpoint another part of the runtime adds: (request, JSON body) -> response.
AdminHandler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]
AdminRoute = tuple[str, str, AdminHandler]  # method, path, handler


class ApiError(Exception):
    """An answer that is not a success: becomes a JSON error response."""

    def __init__(
        self,
        status: int,
        code: str,
        reason: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason
        self.headers = dict(headers or {})
        self.extra = extra
        if status == 503:
            self.headers.setdefault("Retry-After", RETRY_AFTER_S)

    def response(self) -> web.Response:
        body = {"error": self.reason, "code": self.code, **self.extra}
        return json_response(body, self.status, self.headers)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def unavailable(reason: str, **extra: Any) -> ApiError:
    return ApiError(503, "unavailable", reason, **extra)


@dataclass(frozen=True)
class ApiConfig:
    """The settings the API needs; defaults when built without Settings (e.g. in a REPL)."""

    app_id: str = "enhydra"
    admin_token: str = ""
    query_token: str = ""
    max_scan_limit: int = 1000
    forward_timeout_s: float = 5.0
    liveness_max_streams: int = DEFAULT_MAX_STREAMS

    @classmethod
    def of(cls, settings: Settings | None) -> ApiConfig:
        if settings is None:
            return cls()
        return cls(
            app_id=settings.app_id,
            admin_token=settings.admin_token,
            query_token=settings.query_token,
            max_scan_limit=settings.max_scan_limit,
            forward_timeout_s=settings.forward_timeout_ms / 1000,
            liveness_max_streams=settings.liveness_max_streams,
        )


@dataclass
class ApiContext:
    """The instance behind the routes: its engine (replaced after a crash), stores, peers."""

    config: ApiConfig
    instance_id: str
    store_name: str
    get_engine: Callable[[], Engine | None]
    peers: Peers
    latency: Histogram
    projections: Callable[[], Mapping[str, ProjectionEngine]] = dict
    reactions: Callable[[], Mapping[str, Any]] = dict  # name -> ReactionEngine (describe())
    sagas: Callable[[], Mapping[str, Any]] = dict  # name -> the saga's description
    # Every task runner of the instance (None: the aggregate's engine alone), for liveness.
    runners: Callable[[], list[Any]] | None = None
    plugins: Callable[[], list[Any]] = list
    shutdown: Callable[[], None] | None = None
    admin_routes: Iterable[AdminRoute] = ()
    asyncapi: Callable[[], dict[str, Any]] | None = None  # the service's AsyncAPI document
    dead_letters: DeadLetterCount | None = None  # the DLQ topic's size (None without Settings)
    forwards: Counter[str] = field(default_factory=Counter)

    def engine(self) -> Engine:
        """The running engine, or a 503 while the stream worker starts."""
        engine = self.get_engine()
        if engine is None:
            raise ApiError(503, "starting", "the stream worker is starting")
        return engine

    async def dlq(self) -> dict[str, Any] | None:
        """What the DLQ topic holds now (query/dlq.py), or None when not known here."""
        return await self.dead_letters.get() if self.dead_letters is not None else None

    def check_store(self, store: str) -> None:
        """Scans and counts cover the aggregate's store."""
        if store != self.store_name:
            known = [self.store_name, *sorted(self.projections())]
            reason = f"no such store: {store!r}"
            if store in known:
                reason = f"{store!r} is a projection: scans cover the aggregate's store only"
            raise ApiError(404, "no_such_store", reason, store=store, stores=known)
