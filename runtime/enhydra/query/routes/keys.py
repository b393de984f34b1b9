"""GET /v1/stores/{store}/keys/{key}: a key's state, from whichever instance is asked.

A value is only presented as current when it comes from a running active task outside a
rebalance; anything else is a 503 with Retry-After, or, when the caller asked with
`allow_stale=true`, a copy's value marked with its lag. An instance that does not host the key
forwards the request once to the one that does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aiohttp import web

from enhydra.contracts.codec import decode_entry
from enhydra.contracts.partitioner import partition_for
from enhydra.evolution import StateVersionError, migrate_state
from enhydra.query.api import ApiContext, ApiError, json_response, unavailable
from enhydra.query.openapi import Param, Route, key_param, store_param
from enhydra.query.routing import FORWARDED_HEADER, PeerAnswer
from enhydra.runner.registry import Verdict

KEY_HEADERS = {
    "X-Enhydra-Partition": "the key's partition",
    "X-Enhydra-Instance": "the instance that read the value",
    "X-Enhydra-Lag": "changelog records the copy read is behind (0: current)",
    "X-Enhydra-Stale": "true when a copy that may be behind answered (allow_stale)",
}


def routes(ctx: ApiContext) -> list[Route]:
    instance_id = ctx.instance_id

    def projection_key(store: str, key: str) -> web.Response:
        status, partition, state = ctx.projections()[store].read(key)
        headers = {"X-Enhydra-Partition": str(partition), "X-Enhydra-Instance": instance_id}
        if status == "found":
            return json_response(state, 200, {**headers, "X-Enhydra-Lag": "0"})
        if status == "missing":
            body = {"error": "no such key", "code": "no_such_key", "key": key}
            return json_response({**body, "partition": partition}, 404, headers)
        if status == "not_hosted":
            raise ApiError(
                421,
                "not_hosted",
                f"this instance does not host the key's partition of projection {store!r}",
                key=key,
                partition=partition,
                instance=instance_id,
            )
        raise unavailable("projection partition is being restored or rebalanced")

    def answer(raw: bytes | None, key: str, partition: int, lag: int, stale: bool):
        headers = {
            "X-Enhydra-Partition": str(partition),
            "X-Enhydra-Instance": instance_id,
            "X-Enhydra-Lag": str(lag),
            "X-Enhydra-Stale": "true" if stale else "false",
        }
        if raw is None:
            body = {"error": "no such key", "code": "no_such_key", "key": key}
            return json_response({**body, "partition": partition}, 404, headers)
        entry = decode_entry(raw)
        state = entry.state
        engine = ctx.get_engine()
        if engine is not None:  # an entry older code wrote is shown as this code reads it
            try:
                state = migrate_state(engine.aggregate.aggregate, state, entry.version)
            except StateVersionError as exc:
                raise ApiError(409, "state_version", str(exc), key=key) from None
        return json_response(state, 200, headers)

    async def get_key(request: web.Request, args: dict[str, Any]) -> web.StreamResponse:
        store, key, allow_stale = args["store"], args["key"], args["allow_stale"]
        if store != ctx.store_name and store in ctx.projections():
            return projection_key(store, key)
        ctx.check_store(store)
        engine = ctx.engine()
        raw_key = key.encode("utf-8")
        partition = partition_for(raw_key, engine.settings.partitions)
        access = engine.registry.access(partition, allow_stale=allow_stale)
        if access.readable:
            assert access.store is not None
            stale = access.verdict is Verdict.STALE
            return answer(access.store.get(raw_key), key, partition, access.lag, stale)
        if access.verdict is Verdict.UNAVAILABLE:
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
        if not access.settled:
            raise unavailable("a rebalance is in progress", partition=partition)
        return await forward(store, key, partition, allow_stale)

    async def forward(store: str, key: str, partition: int, allow_stale: bool) -> web.Response:
        registry = ctx.engine().registry
        group = registry.group.instances
        owner = registry.group.active_owner(partition)
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
            reply = await ctx.peers.get(group[name].get("url", ""), path, params)
            body = reply.json() if reply.status == 404 else None
            code = body.get("code") if isinstance(body, dict) else None
            if reply.status == 200 or code == "no_such_key":
                ctx.forwards["ok"] += 1
                headers = {**reply.headers, "X-Enhydra-Forwarded-To": name}
                return web.Response(
                    body=reply.body,
                    status=reply.status,
                    content_type="application/json",
                    headers=headers,
                )
            last = (name, reply)
        assert last is not None
        name, reply = last
        if reply.status in (401, 403):
            ctx.forwards["rejected"] += 1
            raise ApiError(
                502,
                "forward_rejected",
                f"{name} rejected the forwarded request ({reply.status}): every instance "
                "must share ENHYDRA_QUERY_TOKEN",
            )
        ctx.forwards["unavailable"] += 1
        if reply.status == 0:
            reason = f"the owner of partition {partition} ({name}) is unreachable"
        elif reply.status == 421:
            reason = f"partition {partition} is moving between instances"
        else:
            reason = f"the owner of partition {partition} ({name}) cannot answer now"
        raise unavailable(reason, partition=partition, owner=name)

    return [
        Route(
            "GET",
            "/v1/stores/{store}/keys/{key}",
            get_key,
            "a key's current state, from any instance",
            "queries",
            "query",
            (
                store_param((ctx.store_name,)),
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
            headers=KEY_HEADERS,
        )
    ]
