"""The HTTP surface of an instance: interactive queries, metadata, health, metrics, admin.

Any instance answers any key: it reads its own copy when it runs the key's active task, and
otherwise forwards the request once to the instance that does (routing.py). The routes live in
routes/, one module per family; each is declared once as a `Route`, which registers it,
validates its parameters (and its JSON body, for the admin endpoints that take one) and
generates the OpenAPI document. Errors are JSON objects with a reason and a code; stack traces
stay in the log.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from enhydra.failover.endpoint import STREAM_PATH, STREAM_POLICY, StreamPolicy
from enhydra.logs import get_logger
from enhydra.query.api import AdminRoute, ApiConfig, ApiContext, ApiError
from enhydra.query.dlq import DeadLetterCount
from enhydra.query.metrics import Histogram
from enhydra.query.openapi import BadRequest, Route
from enhydra.query.routes import admin, keys, metadata, operations, scans
from enhydra.query.routing import Peers
from enhydra.query.security import Denied, check

if TYPE_CHECKING:
    from enhydra.processing.engine import Engine
    from enhydra.settings import Settings

__all__ = ["ROUTES", "AdminRoute", "ApiError", "build_app"]

log = get_logger("enhydra.http")

MAX_BODY_BYTES = 64 * 1024

ROUTES = web.AppKey("enhydra.routes", list)  # the route table, for docs and tests


def build_app(
    get_engine: Callable[[], Engine | None],
    instance_id: str,
    store_name: str,
    *,
    settings: Settings | None = None,
    shutdown: Callable[[], None] | None = None,
    admin_routes: Iterable[AdminRoute] = (),
    projections: Callable[[], Mapping[str, Any]] | None = None,
    reactions: Callable[[], Mapping[str, Any]] | None = None,
    sagas: Callable[[], Mapping[str, Any]] | None = None,
    runners: Callable[[], list[Any]] | None = None,
    plugins: Callable[[], list[Any]] | None = None,
    asyncapi: Callable[[], dict[str, Any]] | None = None,
) -> web.Application:
    """Routes over whichever engine currently runs (it is replaced after a crash).

    `shutdown` stops this instance (POST /v1/admin/shutdown); `admin_routes` are extra
    (method, path, handler(request, body)) endpoints other parts of the runtime add, guarded by
    the admin token. `projections` returns the read models hosted here (name -> engine); they
    answer key queries from this instance's partitions only, since their consumer groups are
    balanced apart from the aggregate's. `reactions` returns the reactions' engines, whose
    stats /v1/stats reports, and `sagas` the sagas' descriptions. `runners` lists every task
    runner of the instance (a stuck one fails /health/live). `asyncapi` builds the
    service's AsyncAPI document (GET /v1/asyncapi.json, built once on first request).
    """
    config = ApiConfig.of(settings)
    ctx = ApiContext(
        config=config,
        instance_id=instance_id,
        store_name=store_name,
        get_engine=get_engine,
        peers=Peers(
            instance_id, config.query_token or config.admin_token, config.forward_timeout_s
        ),
        latency=Histogram(
            "enhydra_http_request_duration_seconds",
            "time to answer an HTTP request (key queries, scans, metadata, ...)",
        ),
        projections=projections or dict,
        reactions=reactions or dict,
        sagas=sagas or dict,
        runners=runners,
        plugins=plugins or list,
        shutdown=shutdown,
        admin_routes=tuple(admin_routes),
        asyncapi=asyncapi,
        dead_letters=_dead_letters(settings),
    )
    table: list[Route] = []
    table += operations.routes(ctx, lambda: table)
    table += keys.routes(ctx) + scans.routes(ctx) + metadata.routes(ctx) + admin.routes(ctx)

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors_and_timing(ctx)])
    for route in table:
        app.router.add_route(route.method, route.path, _handler(route, config))

    async def start_peers(_app: web.Application) -> None:
        await ctx.peers.start()

    async def close_peers(_app: web.Application) -> None:
        await ctx.peers.close()
        if ctx.dead_letters is not None:
            await ctx.dead_letters.close()

    app.on_startup.append(start_peers)
    app.on_cleanup.append(close_peers)
    app[ROUTES] = table
    # the liveness stream (failover/endpoint.py) is added to this app by the runtime
    app[STREAM_POLICY] = StreamPolicy(_stream_guard(config), config.liveness_max_streams)
    return app


def _dead_letters(settings: Settings | None) -> DeadLetterCount | None:
    if settings is None:
        return None
    exact = settings.processing_guarantee != "exactly_once"  # commit markers count there too
    return DeadLetterCount(settings.connection, settings.dlq_topic, exact=exact)


async def json_body(request: web.Request) -> dict[str, Any]:
    """A request's optional JSON object body ({} when there is none); a 400 otherwise."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "bad_request", f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")
    return body


def _handler(route: Route, config: ApiConfig) -> Callable[[web.Request], Awaitable[Any]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        if (request.content_length or 0) > MAX_BODY_BYTES:
            raise ApiError(413, "too_large", f"request bodies are limited to {MAX_BODY_BYTES}")
        try:
            check(
                route.auth,
                request.headers.get("Authorization", ""),
                admin_token=config.admin_token,
                query_token=config.query_token,
            )
        except Denied as denied:
            raise _refusal(denied) from None
        try:
            args = route.parse(request)
        except BadRequest as bad:
            raise ApiError(400, "bad_request", str(bad), param=bad.param) from None
        if route.body:
            args["body"] = await json_body(request)
        elif request.method == "POST":
            await request.read()  # bounded by client_max_size
        return await route.handler(request, args)

    return handle


def _refusal(denied: Denied) -> ApiError:
    headers = {"WWW-Authenticate": 'Bearer realm="enhydra"'}
    return ApiError(
        denied.status, denied.code, denied.reason, headers if denied.status == 401 else None
    )


def _stream_guard(config: ApiConfig) -> Callable[[web.Request], web.Response | None]:
    """The liveness stream answers whom the queries answer: peers send the query token."""

    def refuse(request: web.Request) -> web.Response | None:
        try:
            check(
                "query",
                request.headers.get("Authorization", ""),
                admin_token=config.admin_token,
                query_token=config.query_token,
            )
        except Denied as denied:
            return _refusal(denied).response()
        return None

    return refuse


def _errors_and_timing(ctx: ApiContext):
    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == STREAM_PATH:  # peers' long-lived heartbeat streams: not requests
            return await handler(request)
        started = time.perf_counter()
        try:
            response = await handler(request)
        except ApiError as error:
            response = error.response()
        except BadRequest as bad:
            response = ApiError(400, "bad_request", str(bad), param=bad.param).response()
        except web.HTTPException as exc:
            response = _http_error(request, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error_id = uuid.uuid4().hex[:12]
            log.error(
                "request failed",
                method=request.method,
                path=request.path,
                error_id=error_id,
                exc_info=exc,
            )
            response = ApiError(
                500, "internal", "internal error; the log has the details", error_id=error_id
            ).response()
        resource = request.match_info.route.resource
        ctx.latency.observe(
            time.perf_counter() - started,
            route=resource.canonical if resource is not None else "unmatched",
            method=request.method,
            code=str(response.status),
        )
        return response

    return middleware


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    if exc.status == 404:
        reason = f"no such endpoint: {request.method} {request.path}"
        return ApiError(404, "no_such_endpoint", reason, docs="/v1/openapi.json").response()
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return ApiError(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed here",
            {"Allow": allowed},
            allowed=allowed,
        ).response()
    if exc.status == 413:
        return ApiError(
            413, "too_large", f"request bodies are limited to {MAX_BODY_BYTES}"
        ).response()
    code = exc.reason.lower().replace(" ", "_")
    return ApiError(exc.status, code, exc.reason).response()
