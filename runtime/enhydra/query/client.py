"""An async client for a service's interactive queries.

It learns the group from `/v1/metadata` once, computes a key's partition the way Kafka
producers do, and asks that partition's active instance directly: one hop instead of two. When
the group moves underneath it (421, 503, a dead instance), it refreshes the metadata and tries
again, honouring Retry-After, until `retry_for` seconds have passed.

    async with Client("http://ledger-0:6066") as client:
        account = await client.get("accounts", "acct-42")      # None when there is no such key
        async for key, state in client.scan("accounts", prefix="acct-"):
            ...
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from enhydra.contracts.partitioner import partition_for

RETRIABLE = (0, 421, 502, 503)
METADATA_TTL_S = 30.0


def _unreachable(body: Any) -> bool:
    return isinstance(body, dict) and body.get("code") == "unreachable"


class QueryError(Exception):
    """The service answered with an error that retrying will not fix (or retries ran out)."""

    def __init__(self, status: int, reason: str, body: Any = None) -> None:
        super().__init__(f"{status}: {reason}" if status else reason)
        self.status = status
        self.reason = reason
        self.body = body
        self.code = body.get("code") if isinstance(body, dict) else None


class Client:
    """Routes key queries to the owning instance; scans and counts go to any instance."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 5.0,
        retry_for: float = 30.0,
        session: aiohttp.ClientSession | None = None,
        retry_unreachable: bool = True,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        """`retry_unreachable=False`: when no instance answers at all (nothing listens, or the
        name does not resolve) fail at once, with a QueryError of code "unreachable", instead
        of retrying; once one answered, a dead instance is retried as the group moves.
        `on_wait(reason)` hears why each retry waits."""
        seeds = [urls] if isinstance(urls, str) else list(urls)
        if not seeds:
            raise ValueError("give at least one instance URL")
        self.seeds = [u.rstrip("/") for u in seeds]
        self.token = token
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.retry_for = retry_for
        self.retry_unreachable = retry_unreachable
        self.on_wait = on_wait
        self._session = session
        self._owns_session = session is None
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    # plumbing --------------------------------------------------------------------------------
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def _call(
        self, base: str, path: str, params: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with self._http().get(base + path, params=params, headers=headers) as response:
                raw = await response.read()
                try:
                    body = orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    body = raw.decode("utf-8", "replace")
                return response.status, dict(response.headers), body
        except aiohttp.ClientConnectorError as exc:
            # Nothing listens there (refused), the name does not resolve, TLS fails.
            error = getattr(exc, "os_error", None)  # certificate errors carry none
            if isinstance(error, OSError) and error.errno == errno.ECONNREFUSED:
                why = "connection refused"
            else:
                why = (error.strerror if isinstance(error, OSError) else None) or str(exc)
            return 0, {}, {"error": f"{base} unreachable: {why}", "code": "unreachable"}
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return 0, {}, {"error": f"{base} unreachable: {type(exc).__name__}: {exc}"}

    def _urls(self) -> list[str]:
        """Every instance URL known: the discovered ones first, then the seeds."""
        found = [i["url"] for i in (self._metadata or {}).get("instances", []) if i.get("url")]
        return list(dict.fromkeys([*found, *self.seeds]))

    async def _retrying(self, ask) -> tuple[int, dict[str, str], Any]:
        """Run `ask()` until it gets a non-retriable answer or retry_for runs out."""
        deadline = time.monotonic() + self.retry_for
        delay = 0.1
        while True:
            status, headers, body = await ask()
            if status not in RETRIABLE or self._give_up_on(body):
                return status, headers, body
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return status, headers, body
            if self.on_wait is not None:
                self.on_wait(self._fail(status, body).args[0])
            try:
                wait = float(headers.get("Retry-After", delay))
            except ValueError:
                wait = delay
            await asyncio.sleep(max(0.05, min(wait, remaining, 5.0)))
            delay = min(delay * 2, 2.0)
            self._metadata = None  # the group may have moved: learn it again

    def _give_up_on(self, body: Any) -> bool:
        """Nothing answers and no instance ever did: nothing to wait for, unless asked to."""
        return not self.retry_unreachable and self._metadata is None and _unreachable(body)

    @staticmethod
    def _fail(status: int, body: Any) -> QueryError:
        reason = body.get("error", "error") if isinstance(body, dict) else str(body)[:200]
        return QueryError(status, reason, body)

    # metadata --------------------------------------------------------------------------------
    async def metadata(self, *, refresh: bool = False) -> dict[str, Any]:
        """The group's instances and their partitions (cached for a while)."""
        fresh = time.monotonic() - self._metadata_at < METADATA_TTL_S
        if self._metadata is not None and fresh and not refresh:
            return self._metadata
        last: tuple[int, Any] = (0, {"error": "no instance answered"})
        for url in self._urls():
            status, _, body = await self._call(url, "/v1/metadata", {"peers": "false"})
            if status == 200 and isinstance(body, dict):
                self._metadata, self._metadata_at = body, time.monotonic()
                return body
            last = (status, body)
            if status in (401, 403):
                break
        raise self._fail(*last)

    async def _owner(self, key: str) -> str:
        try:
            meta = await self.metadata()
        except QueryError as exc:
            if exc.status in (401, 403):
                raise
            return self.seeds[0]  # nobody answered; the call itself will report it
        partition = partition_for(key.encode("utf-8"), meta["partitions"])
        for instance in meta["instances"]:
            if partition in instance["stores"].get(meta["stores"][0], {}).get("active", ()):
                return instance["url"]
        return self._urls()[0]

    # queries ---------------------------------------------------------------------------------
    async def get(self, store: str, key: str, *, allow_stale: bool = False) -> Any | None:
        """The key's state, or None when the store has no such key."""
        path = f"/v1/stores/{quote(store, safe='')}/keys/{quote(key, safe='')}"
        params = {"allow_stale": "true"} if allow_stale else None

        async def ask():
            return await self._call(await self._owner(key), path, params)

        status, _, body = await self._retrying(ask)
        if status == 200:
            return body
        if status == 404 and isinstance(body, dict) and body.get("code") == "no_such_key":
            return None
        raise self._fail(status, body)

    async def key_metadata(self, store: str, key: str) -> dict[str, Any]:
        """The key's partition, active instance and standbys."""
        path = f"/v1/metadata/stores/{quote(store, safe='')}/keys/{quote(key, safe='')}"
        return await self._any(path, None)

    async def _any(self, path: str, params: dict[str, str] | None) -> Any:
        urls = self._urls()
        turn = 0

        async def ask():
            nonlocal turn
            url = urls[turn % len(urls)]
            turn += 1
            return await self._call(url, path, params)

        status, _, body = await self._retrying(ask)
        if status != 200:
            raise self._fail(status, body)
        return body

    @staticmethod
    def _range(prefix: str | None, start: str | None, end: str | None) -> dict[str, str]:
        given = {"prefix": prefix, "from": start, "to": end}
        return {name: value for name, value in given.items() if value is not None}

    async def scan(
        self,
        store: str,
        *,
        prefix: str | None = None,
        start: str | None = None,
        end: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[tuple[str, Any]]:
        """Every (key, state) in key order with `prefix`, in [start, end), page by page."""
        path = f"/v1/stores/{quote(store, safe='')}/scan"
        params = {**self._range(prefix, start, end), "limit": str(page_size)}
        while True:
            page = await self._any(path, params)
            for item in page["items"]:
                yield item["key"], item["value"]
            if not page.get("next_cursor"):
                return
            params = {**params, "cursor": page["next_cursor"]}

    async def count(
        self,
        store: str,
        *,
        prefix: str | None = None,
        start: str | None = None,
        end: str | None = None,
    ) -> int:
        """How many keys match, over every partition."""
        path = f"/v1/stores/{quote(store, safe='')}/count"
        return int((await self._any(path, self._range(prefix, start, end)))["count"])
