"""One route table for the HTTP API: it registers the handlers, validates their parameters and
generates the OpenAPI document, so the three can never disagree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]

MAX_KEY_BYTES = 1024
OPENAPI_VERSION = "3.0.3"

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "code"],
    "properties": {
        "error": {"type": "string", "description": "what went wrong, for a person"},
        "code": {"type": "string", "description": "what went wrong, for a program"},
    },
    "additionalProperties": True,
}

_DESCRIPTIONS = {
    200: "OK",
    202: "accepted; happens in the background",
    400: "a parameter is invalid",
    401: "a bearer token is required",
    403: "the bearer token is wrong",
    404: "not found (the reason says what)",
    413: "the request is too large",
    421: "this instance does not host the key (only when forwarding is off)",
    503: "not available right now (rebalance, restore, starting); see Retry-After",
}


class BadRequest(Exception):
    """A parameter failed validation; becomes a 400 with the parameter named."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"{param}: {reason}")
        self.param = param
        self.reason = reason


@dataclass(frozen=True)
class Param:
    """A path or query parameter: its type and bounds drive both validation and the docs."""

    name: str
    where: str  # "path" | "query"
    kind: type  # str, int, bool
    description: str
    required: bool = False
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None
    examples: tuple[str, ...] = ()  # documented values; validation stays in the handler

    def schema(self) -> dict[str, Any]:
        kind = {str: "string", int: "integer", bool: "boolean"}[self.kind]
        out: dict[str, Any] = {"type": kind}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        if self.kind is str and self.where == "path":
            out["minLength"] = 1
        if self.examples:
            out["enum"] = list(self.examples)
        if self.default is not None:
            out["default"] = self.default
        return out

    def parse(self, raw: str | None) -> Any:
        if raw is None:
            if self.required:
                raise BadRequest(self.name, "is required")
            return self.default
        if self.kind is bool:
            value = raw.strip().lower()
            if value in ("true", "1", "yes"):
                return True
            if value in ("false", "0", "no"):
                return False
            raise BadRequest(self.name, f"expected true or false, got {raw[:40]!r}")
        if self.kind is int:
            try:
                number = int(raw.strip())
            except ValueError:
                raise BadRequest(self.name, f"expected a whole number, got {raw[:40]!r}") from None
            if self.minimum is not None and number < self.minimum:
                raise BadRequest(self.name, f"must be at least {self.minimum}")
            if self.maximum is not None and number > self.maximum:
                raise BadRequest(self.name, f"must be at most {self.maximum}")
            return number
        try:
            size = len(raw.encode("utf-8"))
        except UnicodeEncodeError:
            raise BadRequest(self.name, "is not valid UTF-8") from None
        if self.max_length is not None and size > self.max_length:
            raise BadRequest(self.name, f"is longer than {self.max_length} bytes")
        if self.where == "path" and not raw:
            raise BadRequest(self.name, "must not be empty")
        return raw


@dataclass(frozen=True)
class Route:
    """One operation: where it is, who may call it, what it takes and what it answers."""

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    auth: str | None = None  # None, "query" or "admin"
    params: tuple[Param, ...] = ()
    responses: tuple[int, ...] = (200,)
    response_schema: dict[str, Any] | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)  # response headers documented on 200
    body: bool = False  # takes an optional JSON object body (args["body"], {} when absent)

    @property
    def operation_id(self) -> str:
        words = [w.strip("{}") for w in self.path.strip("/").split("/") if w] or ["status_page"]
        return "_".join([self.method.lower(), *words]).replace("-", "_").replace(".", "_")

    def parse(self, request: web.Request) -> dict[str, Any]:
        args: dict[str, Any] = {}
        for param in self.params:
            if param.where == "path":
                raw: str | None = request.match_info.get(param.name)
            else:
                raw = request.query.get(param.name)
            args[param.name] = param.parse(raw)
        return args


def key_param(description: str = "the aggregate key, percent-encoded") -> Param:
    return Param("key", "path", str, description, required=True, max_length=MAX_KEY_BYTES)


def store_param(stores: tuple[str, ...] = ()) -> Param:
    text = "the store (aggregate) name; a projection's name works for key queries"
    return Param("store", "path", str, text, required=True, max_length=200, examples=stores)


def document(routes: Iterable[Route], *, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI document of `routes`."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        responses: dict[str, Any] = {}
        statuses = set(route.responses)
        if route.auth is not None:
            statuses |= {401, 403}
        if route.auth == "admin":
            statuses.add(404)
        if route.params or route.body:
            statuses.add(400)
        for status in sorted(statuses):
            response: dict[str, Any] = {"description": _DESCRIPTIONS.get(status, "")}
            if status < 300:
                schema = route.response_schema or {"type": "object"}
                if route.content_type == "application/json":
                    response["content"] = {route.content_type: {"schema": schema}}
                else:
                    response["content"] = {route.content_type: {"schema": {"type": "string"}}}
                if route.headers:
                    response["headers"] = {
                        name: {"description": text, "schema": {"type": "string"}}
                        for name, text in route.headers.items()
                    }
            else:
                error = {"$ref": "#/components/schemas/Error"}
                response["content"] = {"application/json": {"schema": error}}
                if status == 503:
                    response["headers"] = {
                        "Retry-After": {
                            "description": "seconds to wait before asking again",
                            "schema": {"type": "string"},
                        }
                    }
            responses[str(status)] = response
        operation: dict[str, Any] = {
            "operationId": route.operation_id,
            "summary": route.summary,
            "tags": [route.tag],
            "responses": responses,
        }
        if route.params:
            operation["parameters"] = [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required or p.where == "path",
                    "description": p.description,
                    "schema": p.schema(),
                }
                for p in route.params
            ]
        if route.body:
            operation["requestBody"] = {
                "required": False,
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        if route.auth == "query":
            operation["security"] = [{"queryToken": []}, {"adminToken": []}]
        elif route.auth == "admin":
            operation["security"] = [{"adminToken": []}]
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": (
                "Interactive queries over an Enhydra service's state, plus health, metrics "
                "and admin operations. Any instance answers any key: it forwards to the owner."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR_SCHEMA},
            "securitySchemes": {
                "queryToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "ENHYDRA_QUERY_TOKEN (only when set)",
                },
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "ENHYDRA_ADMIN_TOKEN",
                },
            },
        },
    }
