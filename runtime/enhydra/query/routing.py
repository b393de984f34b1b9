"""Calls from one instance to another: forwarding a key query, fanning a scan out, asking stats.

A forwarded request carries FORWARDED_HEADER; an instance that receives one answers from its
own copy or says it does not host the key (421), and never forwards again, so a request makes
at most one hop even while two instances disagree about who owns a partition.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

FORWARDED_HEADER = "X-Enhydra-Forwarded-By"
PASSED_HEADERS = (
    "Retry-After",
    "X-Enhydra-Partition",
    "X-Enhydra-Instance",
    "X-Enhydra-Lag",
    "X-Enhydra-Stale",
)


@dataclass
class PeerAnswer:
    """What a peer said, or status 0 when it could not be reached."""

    status: int
    body: bytes
    headers: dict[str, str]
    error: str = ""

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None


class Peers:
    """One HTTP client session for every call this instance makes to the others."""

    def __init__(self, instance_id: str, token: str, timeout_s: float) -> None:
        self.instance_id = instance_id
        self.token = token
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.forwarded = 0
        self.failed = 0

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=256, limit_per_host=64)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        headers = {FORWARDED_HEADER: self.instance_id}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    async def get(
        self, base_url: str, path: str, params: dict[str, str] | None = None, *, timeout=None
    ) -> PeerAnswer:
        """GET `path` (already percent-encoded) on the instance at `base_url`, as a forward."""
        if self._session is None:
            return PeerAnswer(0, b"", {}, "not started")
        self.forwarded += 1
        try:
            async with self._session.get(
                URL(base_url + path, encoded=True),
                params=params,
                headers=self._headers(),
                timeout=timeout or self.timeout,
                allow_redirects=False,
            ) as response:
                body = await response.read()
                headers = {h: response.headers[h] for h in PASSED_HEADERS if h in response.headers}
                return PeerAnswer(response.status, body, headers)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.failed += 1
            return PeerAnswer(0, b"", {}, f"{type(exc).__name__}: {exc}")

    async def gather(self, calls: dict[str, Any]) -> dict[str, PeerAnswer]:
        """Run named `get` coroutines concurrently."""
        names = list(calls)
        answers = await asyncio.gather(*(calls[name] for name in names))
        return dict(zip(names, answers, strict=True))
