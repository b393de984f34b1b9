"""The HTTP surface of an instance: key lookups in local stores, health, basic stats.

Errors are JSON objects with a reason; a lookup never presents data that is not current (a
partition being restored or rebalanced answers 503 with Retry-After).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from enhydra.processing.engine import LookupStatus

if TYPE_CHECKING:
    from enhydra.processing.engine import Engine


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _error(status: int, reason: str, **extra: Any) -> web.Response:
    headers = {"Retry-After": "1"} if status == 503 else None
    return _json({"error": reason, **extra}, status, headers)


def build_app(
    get_engine: Callable[[], Engine | None], instance_id: str, store_name: str
) -> web.Application:
    """Routes over whichever engine currently runs (it is replaced after a crash)."""

    def current() -> Engine:
        engine = get_engine()
        if engine is None:
            raise web.HTTPServiceUnavailable(
                text='{"error": "the stream worker is starting"}',
                content_type="application/json",
                headers={"Retry-After": "1"},
            )
        return engine

    async def get_key(request: web.Request) -> web.Response:
        store = request.match_info["store"]
        key = request.match_info["key"]
        if store != store_name:
            return _error(404, f"no such store: {store!r}", stores=[store_name])
        lookup = current().lookup(key)
        if lookup.status is LookupStatus.FOUND:
            assert lookup.entry is not None
            return _json(lookup.entry.state, headers={"X-Enhydra-Partition": str(lookup.partition)})
        if lookup.status is LookupStatus.MISSING:
            return _error(404, "no such key", key=key, partition=lookup.partition)
        if lookup.status is LookupStatus.NOT_HOSTED:
            return _error(
                421,
                "key is not hosted on this instance",
                key=key,
                partition=lookup.partition,
                instance=instance_id,
            )
        return _error(503, "partition is being restored or rebalanced", partition=lookup.partition)

    async def live(_request: web.Request) -> web.Response:
        return _json({"status": "live"})

    async def ready(_request: web.Request) -> web.Response:
        engine = current()
        if engine.ready:
            return _json({"status": "ready"})
        return _error(
            503,
            "not ready",
            tasks={p: t.status.value for p, t in engine.tasks.items()},
            joined=engine.joined,
            rebalancing=engine.rebalancing,
        )

    async def stats(_request: web.Request) -> web.Response:
        engine = current()
        return _json(
            {
                "instance": instance_id,
                "store": store_name,
                "ready": engine.ready,
                "rebalances": engine.rebalances,
                "failures": engine.failures,
                "tasks": {
                    str(p): {
                        "role": t.role.value,
                        "status": t.status.value,
                        "processed": t.processed,
                        "changelog_offset": t.store.changelog_offset,
                        "lag": engine.task_lag(t),
                        "restore": t.restore,
                    }
                    for p, t in sorted(engine.tasks.items())
                },
                **engine.stats,
            }
        )

    app = web.Application(client_max_size=64 * 1024)
    app.router.add_get("/v1/stores/{store}/keys/{key}", get_key)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/health/live", live)
    app.router.add_get("/health/ready", ready)
    return app
