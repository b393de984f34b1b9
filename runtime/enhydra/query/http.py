"""The HTTP surface of an instance: interactive queries, metadata, health, metrics, admin.

Any instance answers any key: it reads its own copy when it runs the key's active task, and
otherwise forwards the request once to the instance that does (routing.py). A value is only
ever presented as current when it comes from a running active task outside a rebalance;
anything else is a 503 with Retry-After, or, when the caller asked with `allow_stale=true`, a
copy's value marked with its lag. Every route is declared once in `routes()`, which registers
it, validates its parameters and generates the OpenAPI document. Errors are JSON objects with
a reason and a code; stack traces stay in the log.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import orjson
from aiohttp import web

from enhydra.logs import get_logger
from enhydra.processing.core import decode_entry
from enhydra.processing.engine import Role, TaskStatus, partition_for
from enhydra.query import metadata as meta
from enhydra.query.metrics import CONTENT_TYPE, Exposition, Histogram, engine_metrics
from enhydra.query.openapi import BadRequest, Param, Route, document, key_param, store_param
from enhydra.query.routing import FORWARDED_HEADER, PeerAnswer, Peers
from enhydra.query.scan import KeyRange, count_stores, encode_cursor, merge_pages, scan_stores
from enhydra.query.security import Denied, check

if TYPE_CHECKING:
    from enhydra.processing.engine import Engine
    from enhydra.settings import Settings

log = get_logger("enhydra.http")

MAX_BODY_BYTES = 64 * 1024
RETRY_AFTER_S = "1"
PEER_STATS_TIMEOUT_S = 1.5

ROUTES = web.AppKey("enhydra.routes", list)  # the route table, for docs and tests

AdminHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
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
        return _json(body, self.status, self.headers)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
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
        )


def _status_page() -> bytes:
    return (resources.files("enhydra.query") / "static" / "index.html").read_bytes()


def build_app(
    get_engine: Callable[[], Engine | None],
    instance_id: str,
    store_name: str,
    *,
    settings: Settings | None = None,
    shutdown: Callable[[], None] | None = None,
    admin_routes: Iterable[AdminRoute] = (),
    projections: Callable[[], Mapping[str, Any]] | None = None,
    plugins: Callable[[], list[Any]] | None = None,
) -> web.Application:
    """Routes over whichever engine currently runs (it is replaced after a crash).

    `shutdown` stops this instance (POST /v1/admin/shutdown); `admin_routes` are extra
    (method, path, handler) endpoints other parts of the runtime add, guarded by the admin token.
    `projections` returns the read models hosted here (name -> engine with `lookup` and
    `describe`); they answer key queries from this instance's partitions only, since their
    consumer groups are balanced apart from the aggregate's.
    """
    config = ApiConfig.of(settings)
    peers = Peers(instance_id, config.query_token or config.admin_token, config.forward_timeout_s)
    latency = Histogram(
        "enhydra_http_request_duration_seconds",
        "time to answer an HTTP request (key queries, scans, metadata, ...)",
    )
    forwards: Counter[str] = Counter()
    status_page = _status_page()

    def current() -> Engine:
        engine = get_engine()
        if engine is None:
            raise ApiError(503, "starting", "the stream worker is starting")
        return engine

    def hosted_projections() -> Mapping[str, Any]:
        return projections() if projections is not None else {}

    def check_store(store: str) -> None:
        if store != store_name:
            known = [store_name, *sorted(hosted_projections())]
            reason = f"no such store: {store!r}"
            if store in known:
                reason = f"{store!r} is a projection: scans cover the aggregate's store only"
            raise ApiError(404, "no_such_store", reason, store=store, stores=known)

    def projection_key(store: str, key: str) -> web.Response:
        lookup = hosted_projections()[store].lookup(key)
        status = lookup.status.value
        headers = {"X-Enhydra-Partition": str(lookup.partition), "X-Enhydra-Instance": instance_id}
        if status == "found":
            return _json(lookup.entry.state, 200, {**headers, "X-Enhydra-Lag": "0"})
        if status == "missing":
            body = {"error": "no such key", "code": "no_such_key", "key": key}
            return _json({**body, "partition": lookup.partition}, 404, headers)
        if status == "not_hosted":
            raise ApiError(
                421,
                "not_hosted",
                f"this instance does not host the key's partition of projection {store!r}",
                key=key,
                partition=lookup.partition,
                instance=instance_id,
            )
        raise unavailable("projection partition is being restored or rebalanced")

    # key queries -----------------------------------------------------------------------------
    def key_answer(
        engine: Engine, raw: bytes | None, key: str, partition: int, lag: int, stale: bool
    ) -> web.Response:
        headers = {
            "X-Enhydra-Partition": str(partition),
            "X-Enhydra-Instance": instance_id,
            "X-Enhydra-Lag": str(lag),
            "X-Enhydra-Stale": "true" if stale else "false",
        }
        if raw is None:
            body = {"error": "no such key", "code": "no_such_key", "key": key}
            return _json({**body, "partition": partition}, 404, headers)
        return _json(decode_entry(raw).state, 200, headers)

    async def get_key(request: web.Request, args: dict[str, Any]) -> web.StreamResponse:
        store, key, allow_stale = args["store"], args["key"], args["allow_stale"]
        if store != store_name and store in hosted_projections():
            return projection_key(store, key)
        check_store(store)
        engine = current()
        raw_key = key.encode("utf-8")
        partition = partition_for(raw_key, engine.settings.partitions)
        task = engine.tasks.get(partition)
        settled = engine.joined and not engine.rebalancing and not engine.stopping
        if (
            settled
            and task is not None
            and task.role is Role.ACTIVE
            and task.status is TaskStatus.RUNNING
        ):
            return key_answer(engine, task.store.get(raw_key), key, partition, 0, False)
        if allow_stale and task is not None and not engine.stopping:
            lag = engine.task_lag(task)
            if lag is not None:
                return key_answer(engine, task.store.get(raw_key), key, partition, lag, True)
        if task is not None and task.role is Role.ACTIVE:
            raise unavailable("partition is being restored or rebalanced", partition=partition)
        if FORWARDED_HEADER in request.headers or not args["forward"]:
            raise ApiError(
                421,
                "not_hosted",
                "key is not hosted on this instance",
                key=key,
                partition=partition,
                instance=instance_id,
            )
        if not settled:
            raise unavailable("a rebalance is in progress", partition=partition)
        return await forward_key(engine, store, key, partition, allow_stale)

    async def forward_key(
        engine: Engine, store: str, key: str, partition: int, allow_stale: bool
    ) -> web.Response:
        group = engine.group.instances
        owner = engine.group.active_owner(partition)
        candidates = [owner] if owner is not None and owner != instance_id else []
        if allow_stale:
            candidates += [
                name
                for name, info in sorted(group.items())
                if partition in info.get("standby", ()) and name not in (owner, instance_id)
            ]
        if not candidates:
            raise unavailable(f"no instance hosts partition {partition} now", partition=partition)
        path = f"/v1/stores/{quote(store, safe='')}/keys/{quote(key, safe='')}"
        params = {"allow_stale": "true"} if allow_stale else None
        last: tuple[str, PeerAnswer] | None = None
        for name in candidates:
            answer = await peers.get(group[name].get("url", ""), path, params)
            body = answer.json() if answer.status == 404 else None
            code = body.get("code") if isinstance(body, dict) else None
            if answer.status == 200 or code == "no_such_key":
                forwards["ok"] += 1
                headers = {**answer.headers, "X-Enhydra-Forwarded-To": name}
                return web.Response(
                    body=answer.body,
                    status=answer.status,
                    content_type="application/json",
                    headers=headers,
                )
            last = (name, answer)
        assert last is not None
        name, answer = last
        if answer.status in (401, 403):
            forwards["rejected"] += 1
            raise ApiError(
                502,
                "forward_rejected",
                f"{name} rejected the forwarded request ({answer.status}): every instance "
                "must share ENHYDRA_QUERY_TOKEN",
            )
        forwards["unavailable"] += 1
        if answer.status == 0:
            reason = f"the owner of partition {partition} ({name}) is unreachable"
        elif answer.status == 421:
            reason = f"partition {partition} is moving between instances"
        else:
            reason = f"the owner of partition {partition} ({name}) cannot answer now"
        raise unavailable(reason, partition=partition, owner=name)

    # scans -----------------------------------------------------------------------------------
    def local_stores(engine: Engine, partitions: list[int]) -> list:
        if engine.rebalancing or engine.stopping or not engine.joined:
            raise unavailable("a rebalance is in progress")
        stores = []
        for partition in partitions:
            task = engine.tasks.get(partition)
            if task is None or task.role is not Role.ACTIVE:
                raise ApiError(
                    421, "not_hosted", f"partition {partition} is not active on this instance"
                )
            if task.status is not TaskStatus.RUNNING:
                raise unavailable(f"partition {partition} is being restored")
            stores.append(task.store)
        return stores

    def parse_partitions(engine: Engine, raw: str) -> list[int]:
        try:
            parts = sorted({int(p) for p in raw.split(",") if p.strip()})
        except ValueError:
            raise BadRequest("partitions", "expected comma-separated partition numbers") from None
        count = engine.settings.partitions
        if not parts or any(p < 0 or p >= count for p in parts):
            raise BadRequest("partitions", f"expected numbers from 0 to {count - 1}")
        return parts

    def plan(engine: Engine) -> dict[str, list[int]]:
        """Which instance to ask for which partitions: every partition's active owner."""
        if engine.rebalancing or engine.stopping or not engine.joined:
            raise unavailable("a rebalance is in progress")
        owners: dict[str, list[int]] = {}
        for partition in range(engine.settings.partitions):
            owner = engine.group.active_owner(partition)
            if owner is None:
                raise unavailable(f"no instance hosts partition {partition} now")
            owners.setdefault(owner, []).append(partition)
        return owners

    async def fan_out(
        engine: Engine, what: str, store: str, params: dict[str, str], local: Callable
    ) -> list[Any]:
        """Answer from each owner for its partitions; any owner unable to answer fails all."""
        owners = plan(engine)
        calls = {}
        results = []
        for owner, parts in owners.items():
            if owner == instance_id:
                results.append(local(local_stores(engine, parts)))
                continue
            url = engine.group.instances[owner].get("url", "")
            leg = {**params, "partitions": ",".join(map(str, parts))}
            calls[owner] = peers.get(url, f"/v1/stores/{quote(store, safe='')}/{what}", leg)
        for owner, answer in (await peers.gather(calls)).items():
            body = answer.json()
            if answer.status != 200 or not isinstance(body, dict):
                raise unavailable(
                    f"{owner} could not answer its part of the {what} ({answer.status or 'down'})",
                    owner=owner,
                )
            results.append(body)
        return results

    def range_params(args: dict[str, Any]) -> dict[str, str]:
        names = ("prefix", "from", "to", "cursor")
        return {name: args[name] for name in names if args.get(name) is not None}

    async def scan(request: web.Request, args: dict[str, Any]) -> web.Response:
        check_store(args["store"])
        engine = current()
        rng = KeyRange.from_args(args["prefix"], args["from"], args["to"], args["cursor"])
        limit = args["limit"]
        if args["partitions"] is not None:
            stores = local_stores(engine, parse_partitions(engine, args["partitions"]))
            items, more = scan_stores(stores, rng, limit)
            return _json({"items": [{"key": k, "value": v} for k, v in items], "more": more})

        def local(stores: list) -> dict[str, Any]:
            items, more = scan_stores(stores, rng, limit)
            return {"items": [{"key": k, "value": v} for k, v in items], "more": more}

        params = {**range_params(args), "limit": str(limit)}
        pages = await fan_out(engine, "scan", args["store"], params, local)
        items, more = merge_pages(
            (([(i["key"], i["value"]) for i in page["items"]], page["more"]) for page in pages),
            limit,
        )
        return _json(
            {
                "items": [{"key": k, "value": v} for k, v in items],
                "next_cursor": encode_cursor(items[-1][0]) if more and items else None,
            }
        )

    async def count(request: web.Request, args: dict[str, Any]) -> web.Response:
        check_store(args["store"])
        engine = current()
        rng = KeyRange.from_args(args["prefix"], args["from"], args["to"], None)
        if args["partitions"] is not None:
            stores = local_stores(engine, parse_partitions(engine, args["partitions"]))
            return _json({"count": count_stores(stores, rng)})
        answers = await fan_out(
            engine,
            "count",
            args["store"],
            range_params(args),
            lambda stores: {"count": count_stores(stores, rng)},
        )
        return _json({"count": sum(int(a.get("count", 0)) for a in answers)})

    # metadata --------------------------------------------------------------------------------
    async def stats(request: web.Request, args: dict[str, Any]) -> web.Response:
        report = meta.local_report(current(), instance_id, store_name)
        report["projections"] = {n: e.describe() for n, e in sorted(hosted_projections().items())}
        report["plugins"] = plugins() if plugins is not None else []
        return _json(report)

    async def metadata(request: web.Request, args: dict[str, Any]) -> web.Response:
        engine = current()
        instances = meta.group_instances(engine, instance_id)
        reports: dict[str, Any] = {instance_id: meta.local_report(engine, instance_id, store_name)}
        if args["peers"]:
            timeout = aiohttp.ClientTimeout(total=PEER_STATS_TIMEOUT_S)
            calls = {
                name: peers.get(info["url"], "/v1/stats", timeout=timeout)
                for name, info in instances.items()
                if name != instance_id and info.get("url")
            }
            for name, answer in (await peers.gather(calls)).items():
                body = answer.json()
                if answer.status == 200 and isinstance(body, dict) and "tasks" in body:
                    reports[name] = body
        return _json(
            {
                "instance": instance_id,
                "app_id": config.app_id,
                "stores": [store_name],
                "partitions": engine.settings.partitions,
                "ready": engine.ready,
                "rebalancing": engine.rebalancing,
                "topology": meta.topology(engine),
                "instances": [
                    meta.describe_instance(
                        name, info, reports.get(name), store_name, is_self=name == instance_id
                    )
                    for name, info in sorted(instances.items())
                ],
            }
        )

    async def key_metadata(request: web.Request, args: dict[str, Any]) -> web.Response:
        check_store(args["store"])
        return _json(meta.key_metadata(current(), store_name, args["key"].encode("utf-8")))

    # health, metrics, docs -------------------------------------------------------------------
    async def live(request: web.Request, args: dict[str, Any]) -> web.Response:
        return _json({"status": "live"})

    async def ready(request: web.Request, args: dict[str, Any]) -> web.Response:
        engine = current()
        if engine.ready and not engine.stopping:
            return _json({"status": "ready"})
        raise unavailable(
            "not ready",
            tasks={p: t.status.value for p, t in engine.tasks.items()},
            joined=engine.joined,
            rebalancing=engine.rebalancing,
        )

    async def metrics(request: web.Request, args: dict[str, Any]) -> web.Response:
        out = Exposition()
        engine_metrics(out, get_engine(), store_name)
        latency.write(out)
        out.family("enhydra_http_forwards_total", "counter", "key queries forwarded, by outcome")
        for outcome in ("ok", "unavailable", "rejected"):
            out.add(
                "enhydra_http_forwards_total", "counter", "", forwards[outcome], outcome=outcome
            )
        return web.Response(body=out.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def openapi(request: web.Request, args: dict[str, Any]) -> web.Response:
        return _json(document(table, title=f"{config.app_id} (Enhydra)", version="1"))

    async def index(request: web.Request, args: dict[str, Any]) -> web.Response:
        return web.Response(body=status_page, content_type="text/html", charset="utf-8")

    # admin -----------------------------------------------------------------------------------
    async def admin_shutdown(request: web.Request, args: dict[str, Any]) -> web.Response:
        if shutdown is None:
            raise ApiError(404, "not_available", "this process cannot be shut down over HTTP")
        log.warning("shutdown requested over HTTP", peer=request.remote)
        asyncio.get_running_loop().call_later(0.2, shutdown)  # after this answer is sent
        return _json({"status": "shutting down", "instance": instance_id}, 202)

    async def admin_rebalance(request: web.Request, args: dict[str, Any]) -> web.Response:
        engine = current()
        log.info("rebalance requested over HTTP", peer=request.remote)
        engine._request_rebalance()
        return _json({"status": "rebalance requested", "instance": instance_id}, 202)

    def extra_admin(method: str, path: str, handler: AdminHandler) -> Route:
        async def call(request: web.Request, args: dict[str, Any]) -> web.StreamResponse:
            return await handler(request)

        summary = (handler.__doc__ or f"{method} {path}").strip().splitlines()[0]
        return Route(method.upper(), path, call, summary, "admin", "admin", (), (200, 202, 503))

    # the table -------------------------------------------------------------------------------
    def range_query(*, cursor: bool) -> tuple[Param, ...]:
        params = [
            Param("prefix", "query", str, "keys starting with this", max_length=1024),
            Param("from", "query", str, "keys from this one (inclusive)", max_length=1024),
            Param("to", "query", str, "keys before this one (exclusive)", max_length=1024),
        ]
        if cursor:
            params.append(
                Param("cursor", "query", str, "next_cursor of the previous page", max_length=2048)
            )
        params.append(
            Param(
                "partitions",
                "query",
                str,
                "answer from this instance's active copies of these partitions only, e.g. 0,2 "
                "(what a fan-out sends to each owner)",
                max_length=1024,
            )
        )
        return tuple(params)

    key_headers = {
        "X-Enhydra-Partition": "the key's partition",
        "X-Enhydra-Instance": "the instance that read the value",
        "X-Enhydra-Lag": "changelog records the copy read is behind (0: current)",
        "X-Enhydra-Stale": "true when a copy that may be behind answered (allow_stale)",
    }
    table: list[Route] = [
        Route("GET", "/", index, "the status page", "operations", content_type="text/html"),
        Route(
            "GET",
            "/v1/stores/{store}/keys/{key}",
            get_key,
            "a key's current state, from any instance",
            "queries",
            "query",
            (
                store_param((store_name,)),
                key_param(),
                Param(
                    "allow_stale",
                    "query",
                    bool,
                    "let a standby or restoring copy answer; its lag is in X-Enhydra-Lag",
                    default=False,
                ),
                Param(
                    "forward",
                    "query",
                    bool,
                    "false: answer only from this instance (421 when it does not host the key)",
                    default=True,
                ),
            ),
            (200, 404, 421, 502, 503),
            {"description": "the aggregate's state"},
            headers=key_headers,
        ),
        Route(
            "GET",
            "/v1/stores/{store}/scan",
            scan,
            "keys and states in key order, over every partition, a page at a time",
            "queries",
            "query",
            (
                store_param((store_name,)),
                *range_query(cursor=True),
                Param(
                    "limit",
                    "query",
                    int,
                    "page size",
                    default=100,
                    minimum=1,
                    maximum=config.max_scan_limit,
                ),
            ),
            (200, 404, 421, 503),
        ),
        Route(
            "GET",
            "/v1/stores/{store}/count",
            count,
            "how many keys match, over every partition",
            "queries",
            "query",
            (store_param((store_name,)), *range_query(cursor=False)),
            (200, 404, 421, 503),
        ),
        Route(
            "GET",
            "/v1/metadata",
            metadata,
            "every instance: URL, tags, active / standby / warm-up partitions with lags",
            "metadata",
            "query",
            (
                Param(
                    "peers",
                    "query",
                    bool,
                    "ask the other instances for their lags and tasks (false: the assignment only)",
                    default=True,
                ),
            ),
            (200, 503),
        ),
        Route(
            "GET",
            "/v1/metadata/stores/{store}/keys/{key}",
            key_metadata,
            "a key's partition (murmur2, as Kafka producers) and the instances hosting it",
            "metadata",
            "query",
            (store_param((store_name,)), key_param()),
            (200, 404, 503),
        ),
        Route(
            "GET",
            "/v1/stats",
            stats,
            "this instance's tasks and counters",
            "metadata",
            "query",
            responses=(200, 503),
        ),
        Route("GET", "/health/live", live, "the process answers", "operations"),
        Route(
            "GET",
            "/health/ready",
            ready,
            "in the group, not rebalancing, every active task restored",
            "operations",
            responses=(200, 503),
        ),
        Route(
            "GET",
            "/metrics",
            metrics,
            "Prometheus metrics (text exposition format)",
            "operations",
            content_type="text/plain",
        ),
        Route("GET", "/v1/openapi.json", openapi, "this document", "operations"),
        Route(
            "POST",
            "/v1/admin/shutdown",
            admin_shutdown,
            "stop this instance cleanly (exit code 0)",
            "admin",
            "admin",
            responses=(202,),
        ),
        Route(
            "POST",
            "/v1/admin/rebalance",
            admin_rebalance,
            "ask the group for a rebalance (a probing rebalance)",
            "admin",
            "admin",
            responses=(202, 503),
        ),
        *(extra_admin(method, path, handler) for method, path, handler in admin_routes),
    ]

    # middleware and registration -------------------------------------------------------------
    def wrap(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
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
                headers = {"WWW-Authenticate": 'Bearer realm="enhydra"'}
                raise ApiError(
                    denied.status,
                    denied.code,
                    denied.reason,
                    headers if denied.status == 401 else None,
                ) from None
            if request.method == "POST":
                await request.read()  # bounded by client_max_size
            try:
                args = route.parse(request)
            except BadRequest as bad:
                raise ApiError(400, "bad_request", str(bad), param=bad.param) from None
            return await route.handler(request, args)

        return handle

    @web.middleware
    async def errors_and_timing(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except ApiError as error:
            response = error.response()
        except BadRequest as bad:
            response = ApiError(400, "bad_request", str(bad), param=bad.param).response()
        except web.HTTPException as exc:
            response = http_error(request, exc)
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
        latency.observe(
            time.perf_counter() - started,
            route=resource.canonical if resource is not None else "unmatched",
            method=request.method,
            code=str(response.status),
        )
        return response

    def http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
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

    async def start_peers(_app: web.Application) -> None:
        await peers.start()

    async def close_peers(_app: web.Application) -> None:
        await peers.close()

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[errors_and_timing])
    for route in table:
        app.router.add_route(route.method, route.path, wrap(route))
    app.on_startup.append(start_peers)
    app.on_cleanup.append(close_peers)
    app[ROUTES] = table
    return app
