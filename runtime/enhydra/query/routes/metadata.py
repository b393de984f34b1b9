"""Who hosts what: /v1/metadata (every instance), a key's placement, this instance's stats."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from enhydra.query import metadata as meta
from enhydra.query.api import ApiContext, json_response
from enhydra.query.openapi import Param, Route, key_param, store_param
from enhydra.snapshots.live import in_progress

PEER_STATS_TIMEOUT_S = 1.5


def routes(ctx: ApiContext) -> list[Route]:
    instance_id, store_name = ctx.instance_id, ctx.store_name

    def own_report() -> dict[str, Any]:
        report = meta.local_report(ctx.engine(), instance_id, store_name)
        report["projections"] = meta.projections_report(ctx.projections())
        if reactions := ctx.reactions():
            report["reactions"] = meta.reactions_report(reactions)
        if sagas := ctx.sagas():
            report["sagas"] = dict(sorted(sagas.items()))
        return report

    async def stats(request: web.Request, args: dict[str, Any]) -> web.Response:
        report = own_report()
        report["plugins"] = ctx.plugins()
        report["dlq"] = await ctx.dlq()
        report["snapshots"] = in_progress()  # under way, per partition
        return json_response(report)

    async def metadata(request: web.Request, args: dict[str, Any]) -> web.Response:
        engine = ctx.engine()
        instances = meta.group_instances(engine, instance_id)
        reports: dict[str, Any] = {instance_id: own_report()}
        if args["peers"]:
            timeout = aiohttp.ClientTimeout(total=PEER_STATS_TIMEOUT_S)
            calls = {
                name: ctx.peers.get(info["url"], "/v1/stats", timeout=timeout)
                for name, info in instances.items()
                if name != instance_id and info.get("url")
            }
            for name, answer in (await ctx.peers.gather(calls)).items():
                body = answer.json()
                if answer.status == 200 and isinstance(body, dict) and "tasks" in body:
                    reports[name] = body
        return json_response(
            {
                "instance": instance_id,
                "app_id": ctx.config.app_id,
                "stores": [store_name],
                "partitions": engine.settings.partitions,
                "ready": engine.registry.ready,
                "rebalancing": engine.registry.rebalancing,
                "topology": meta.topology(engine),
                "dlq": await ctx.dlq(),
                "instances": [
                    meta.describe_instance(
                        name, info, reports.get(name), store_name, is_self=name == instance_id
                    )
                    for name, info in sorted(instances.items())
                ],
            }
        )

    async def key_metadata(request: web.Request, args: dict[str, Any]) -> web.Response:
        ctx.check_store(args["store"])
        key = args["key"].encode("utf-8")
        return json_response(meta.key_metadata(ctx.engine(), store_name, key))

    return [
        Route(
            "GET",
            "/v1/metadata",
            metadata,
            "every instance: URL, tags, active / standby / warm-up partitions with lags, "
            "projections and reactions with lags, recent rejections; the DLQ's size",
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
            "this instance's tasks, counters, projections, reactions, recent rejections and the "
            "snapshots under way; the DLQ's size",
            "metadata",
            "query",
            responses=(200, 503),
        ),
    ]
