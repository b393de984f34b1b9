"""Admin endpoints, behind ENHYDRA_ADMIN_TOKEN: shutdown, rebalance, and those others add."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from enhydra.logs import get_logger
from enhydra.query.api import AdminHandler, ApiContext, ApiError, json_response
from enhydra.query.openapi import Route

log = get_logger("enhydra.http")


def routes(ctx: ApiContext) -> list[Route]:
    async def shutdown(request: web.Request, args: dict[str, Any]) -> web.Response:
        if ctx.shutdown is None:
            raise ApiError(404, "not_available", "this process cannot be shut down over HTTP")
        log.warning("shutdown requested over HTTP", peer=request.remote)
        asyncio.get_running_loop().call_later(0.2, ctx.shutdown)  # after this answer is sent
        return json_response({"status": "shutting down", "instance": ctx.instance_id}, 202)

    async def rebalance(request: web.Request, args: dict[str, Any]) -> web.Response:
        engine = ctx.engine()
        log.info("rebalance requested over HTTP", peer=request.remote)
        engine.request_rebalance()
        return json_response({"status": "rebalance requested", "instance": ctx.instance_id}, 202)

    def added(method: str, path: str, handler: AdminHandler) -> Route:
        async def call(request: web.Request, args: dict[str, Any]) -> web.StreamResponse:
            return await handler(request, args["body"])

        summary = (handler.__doc__ or f"{method} {path}").strip().splitlines()[0]
        return Route(
            method.upper(), path, call, summary, "admin", "admin", (), (200, 202, 400, 503),
            body=True,
        )  # fmt: skip

    return [
        Route(
            "POST",
            "/v1/admin/shutdown",
            shutdown,
            "stop this instance cleanly (exit code 0)",
            "admin",
            "admin",
            responses=(202,),
        ),
        Route(
            "POST",
            "/v1/admin/rebalance",
            rebalance,
            "ask the group for a rebalance (a probing rebalance)",
            "admin",
            "admin",
            responses=(202, 503),
        ),
        *(added(method, path, handler) for method, path, handler in ctx.admin_routes),
    ]
