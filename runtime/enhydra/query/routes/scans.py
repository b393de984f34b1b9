"""Scans and counts: keys in order over every partition, each owner answering for its own.

Without `partitions`, the instance asked plans which owner answers for which partitions and
asks them (fan-out); with it, it answers from its own active copies only (one leg of a fan-out).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from aiohttp import web

from enhydra.query.api import ApiContext, ApiError, json_response, unavailable
from enhydra.query.openapi import BadRequest, Param, Route, store_param
from enhydra.query.scan import KeyRange, count_slices, encode_cursor, merge_pages, scan_stores
from enhydra.runner.registry import Verdict

COUNTS_AT_ONCE = 2  # whole-store counts run in slices on the loop; more would crowd it


def routes(ctx: ApiContext) -> list[Route]:
    instance_id = ctx.instance_id
    counting = [0]  # counts running on this instance now

    def local_stores(partitions: list[int]) -> list:
        registry = ctx.engine().registry
        if not registry.settled:
            raise unavailable("a rebalance is in progress")
        stores = []
        for partition in partitions:
            access = registry.access(partition)
            if access.verdict is Verdict.NOT_HOSTED:
                raise ApiError(
                    421, "not_hosted", f"partition {partition} is not active on this instance"
                )
            if access.verdict is not Verdict.SERVE:
                raise unavailable(f"partition {partition}: {access.reason}")
            stores.append(access.store)
        return stores

    def parse_partitions(raw: str) -> list[int]:
        try:
            parts = sorted({int(p) for p in raw.split(",") if p.strip()})
        except ValueError:
            raise BadRequest("partitions", "expected comma-separated partition numbers") from None
        count = ctx.engine().settings.partitions
        if not parts or any(p < 0 or p >= count for p in parts):
            raise BadRequest("partitions", f"expected numbers from 0 to {count - 1}")
        return parts

    def plan() -> dict[str, list[int]]:
        """Which instance to ask for which partitions: every partition's active owner."""
        engine = ctx.engine()
        registry = engine.registry
        if not registry.settled:
            raise unavailable("a rebalance is in progress")
        owners: dict[str, list[int]] = {}
        for partition in range(engine.settings.partitions):
            owner = registry.group.active_owner(partition)
            if owner is None:
                raise unavailable(f"no instance hosts partition {partition} now")
            owners.setdefault(owner, []).append(partition)
        return owners

    async def fan_out(
        what: str,
        store: str,
        params: dict[str, str],
        local: Callable[[list[int]], Awaitable[dict[str, Any]]],
    ) -> list:
        """Answer from each owner for its partitions (this instance's own part meanwhile, with
        `local`); any owner unable to answer fails all."""
        owners = plan()
        engine = ctx.engine()
        calls = {}
        results = []
        mine: list[int] = []
        for owner, parts in owners.items():
            if owner == instance_id:
                mine = parts
                continue
            url = engine.registry.group.instances[owner].get("url", "")
            leg = {**params, "partitions": ",".join(map(str, parts))}
            calls[owner] = ctx.peers.get(url, f"/v1/stores/{quote(store, safe='')}/{what}", leg)

        async def own_part() -> None:
            if mine:
                results.append(await local(mine))

        _, answers = await asyncio.gather(own_part(), ctx.peers.gather(calls))
        for owner, answer in answers.items():
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

    def page(items: list[tuple[str, Any]], more: bool) -> dict[str, Any]:
        return {"items": [{"key": k, "value": v} for k, v in items], "more": more}

    async def scan(request: web.Request, args: dict[str, Any]) -> web.Response:
        ctx.check_store(args["store"])
        rng = KeyRange.from_args(args["prefix"], args["from"], args["to"], args["cursor"])
        limit = args["limit"]
        if args["partitions"] is not None:
            stores = local_stores(parse_partitions(args["partitions"]))
            return json_response(page(*scan_stores(stores, rng, limit)))
        params = {**range_params(args), "limit": str(limit)}

        async def scan_part(parts: list[int]) -> dict[str, Any]:
            return page(*scan_stores(local_stores(parts), rng, limit))

        pages = await fan_out("scan", args["store"], params, scan_part)
        items, more = merge_pages(
            (([(i["key"], i["value"]) for i in p["items"]], p["more"]) for p in pages), limit
        )
        return json_response(
            {
                "items": [{"key": k, "value": v} for k, v in items],
                "next_cursor": encode_cursor(items[-1][0]) if more and items else None,
            }
        )

    async def count(request: web.Request, args: dict[str, Any]) -> web.Response:
        ctx.check_store(args["store"])
        rng = KeyRange.from_args(args["prefix"], args["from"], args["to"], None)
        if args["partitions"] is not None:
            parts = parse_partitions(args["partitions"])
            return json_response({"count": await count_local(parts, rng)})
        answers = await fan_out(
            "count",
            args["store"],
            range_params(args),
            lambda parts: count_part(parts, rng),
        )
        return json_response({"count": sum(int(a.get("count", 0)) for a in answers)})

    async def count_part(parts: list[int], rng: KeyRange) -> dict[str, int]:
        return {"count": await count_local(parts, rng)}

    async def count_local(parts: list[int], rng: KeyRange) -> int:
        """This instance's part of a count: in slices, between which the loop runs on (a
        partition that moves away meanwhile ends the count with a 503 or a 421)."""
        local_stores(parts)  # refused at once when not hosted here
        if counting[0] >= COUNTS_AT_ONCE:
            raise unavailable(f"{COUNTS_AT_ONCE} counts are running on this instance; retry")
        counting[0] += 1
        try:
            return await count_slices(lambda: local_stores(parts), rng)
        finally:
            counting[0] -= 1

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

    store = store_param((ctx.store_name,))
    return [
        Route(
            "GET",
            "/v1/stores/{store}/scan",
            scan,
            "keys and states in key order, over every partition, a page at a time",
            "queries",
            "query",
            (
                store,
                *range_query(cursor=True),
                Param(
                    "limit",
                    "query",
                    int,
                    "page size",
                    default=100,
                    minimum=1,
                    maximum=ctx.config.max_scan_limit,
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
            (store, *range_query(cursor=False)),
            (200, 404, 421, 503),
        ),
    ]
