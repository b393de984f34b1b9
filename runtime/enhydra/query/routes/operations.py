"""Health, Prometheus metrics, the OpenAPI and AsyncAPI documents and the status page."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web

from enhydra.control.signing import rejected as control_rejected
from enhydra.query.api import ApiContext, json_response, unavailable
from enhydra.query.metrics import (
    CONTENT_TYPE,
    Exposition,
    engine_metrics,
    reaction_metrics,
    saga_metrics,
)
from enhydra.query.openapi import Route, document


def _status_page() -> bytes:
    return (resources.files("enhydra.query") / "static" / "index.html").read_bytes()


def routes(ctx: ApiContext, table: Callable[[], list[Route]]) -> list[Route]:
    """`table` gives every route of the app, for the OpenAPI document."""
    status_page = _status_page()

    def stuck_tasks() -> dict[str, str]:
        """Every runner's stuck tasks: the aggregate's by partition, the others' as name:p."""
        engine = ctx.get_engine()
        runners = ctx.runners() if ctx.runners is not None else [engine]
        found: dict[str, str] = {}
        for runner in runners:
            if runner is None:
                continue
            prefix = "" if runner is engine else f"{runner.name}:"
            for partition, stall in sorted(runner.registry.stuck.items()):
                found[f"{prefix}{partition}"] = stall.reason()
        return found

    async def live(request: web.Request, args: dict[str, Any]) -> web.Response:
        if stuck := stuck_tasks():  # the orchestrator restarts the process: a liveness failure
            raise unavailable("a task is stuck", stuck=stuck)
        return json_response({"status": "live"})

    async def ready(request: web.Request, args: dict[str, Any]) -> web.Response:
        engine = ctx.engine()
        registry = engine.registry
        if registry.ready and not engine.stopping:
            return json_response({"status": "ready"})
        raise unavailable(
            "not ready",
            tasks={p: t.status.value for p, t in registry.tasks.items()},
            joined=registry.joined,
            rebalancing=registry.rebalancing,
        )

    async def metrics(request: web.Request, args: dict[str, Any]) -> web.Response:
        out = Exposition()
        engine_metrics(out, ctx.get_engine(), ctx.store_name)
        reaction_metrics(out, ctx.reactions())
        saga_metrics(out, ctx.sagas())
        ctx.latency.write(out)
        out.family("enhydra_http_forwards_total", "counter", "key queries forwarded, by outcome")
        for outcome in ("ok", "unavailable", "rejected"):
            out.add(
                "enhydra_http_forwards_total",
                "counter",
                "",
                ctx.forwards[outcome],
                outcome=outcome,
            )
        out.family(
            "enhydra_control_messages_rejected_total",
            "counter",
            "control topic messages ignored, by reason: unsigned, bad_signature, other_app, "
            "stale, replayed, unreadable, or why a snapshot request was refused",
        )
        for reason, count in sorted(control_rejected.items()):
            out.add("enhydra_control_messages_rejected_total", "counter", "", count, reason=reason)
        return web.Response(body=out.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def openapi(request: web.Request, args: dict[str, Any]) -> web.Response:
        return json_response(document(table(), title=f"{ctx.config.app_id} (Enhydra)", version="1"))

    built: list[bytes] = []  # the AsyncAPI document: built on the first request, then kept

    async def asyncapi(request: web.Request, args: dict[str, Any]) -> web.Response:
        if not built and ctx.asyncapi is not None:
            built.append(json_response(ctx.asyncapi()).body)
        return web.Response(body=built[0], content_type="application/json")

    async def index(request: web.Request, args: dict[str, Any]) -> web.Response:
        return web.Response(body=status_page, content_type="text/html", charset="utf-8")

    own = [
        Route("GET", "/", index, "the status page", "operations", content_type="text/html"),
        Route(
            "GET",
            "/health/live",
            live,
            "the process answers and no task is stuck (task_watchdog_ms)",
            "operations",
            responses=(200, 503),
        ),
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
    ]
    if ctx.asyncapi is not None:
        text = "the AsyncAPI 3 document of the service's topics, messages and headers"
        own.append(Route("GET", "/v1/asyncapi.json", asyncapi, text, "operations"))
    return own
