"""A small client of Toxiproxy's HTTP API: proxies and the toxics that fault tests add to them.

Only what the fault tests use: create a proxy, add and remove toxics (timeout, latency,
reset_peer, bandwidth), and cut or restore a proxy. Standard library only, so it runs in any
test process without an event loop.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


class ToxiproxyApiError(RuntimeError):
    """The Toxiproxy API refused a request; the message has its answer."""


@dataclass(frozen=True)
class Toxiproxy:
    """The API of one toxiproxy-server, e.g. Toxiproxy("http://127.0.0.1:8474")."""

    url: str

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise ToxiproxyApiError(f"{method} {path}: {exc.code} {detail}") from None
        return json.loads(raw) if raw.strip() else None

    def create(self, name: str, listen: str, upstream: str) -> Proxy:
        """A proxy accepting on `listen` (host:port) and forwarding to `upstream`."""
        self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream})
        return Proxy(self, name)

    def proxy(self, name: str) -> Proxy:
        return Proxy(self, name)

    def reset(self) -> None:
        """Every proxy enabled again and every toxic removed."""
        self._call("POST", "/reset")


@dataclass(frozen=True)
class Proxy:
    api: Toxiproxy
    name: str

    def add(self, kind: str, stream: str = "downstream", toxicity: float = 1.0, **attributes):
        """Add a toxic of type `kind` (timeout, latency, reset_peer, bandwidth, ...); its name."""
        name = f"{kind}_{stream}"
        self.api._call(
            "POST",
            f"/proxies/{self.name}/toxics",
            {"name": name, "type": kind, "stream": stream, "toxicity": toxicity,
             "attributes": attributes},
        )  # fmt: skip
        return name

    def remove(self, toxic: str) -> None:
        self.api._call("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def toxics(self) -> list[dict[str, Any]]:
        return self.api._call("GET", f"/proxies/{self.name}/toxics")

    def clear(self) -> None:
        for toxic in self.toxics():
            self.remove(toxic["name"])

    # Shorthands for the toxics the fault tests use, both directions where it matters.
    def timeout(self, ms: int = 0) -> list[str]:
        """Data stops flowing; with ms=0 the connections stay open and silent until removed."""
        return [self.add("timeout", stream, timeout=ms) for stream in ("upstream", "downstream")]

    def latency(self, ms: int, jitter: int = 0) -> list[str]:
        return [self.add("latency", "downstream", latency=ms, jitter=jitter)]

    def reset_peer(self, after_ms: int = 0) -> list[str]:
        """Connections are reset (TCP RST) `after_ms` after they send data."""
        return [self.add("reset_peer", "upstream", timeout=after_ms)]

    def bandwidth(self, kb_per_s: int) -> list[str]:
        return [self.add("bandwidth", "downstream", rate=kb_per_s)]

    def set_enabled(self, enabled: bool) -> None:
        """A disabled proxy closes its connections and refuses new ones."""
        self.api._call("POST", f"/proxies/{self.name}", {"enabled": enabled})
