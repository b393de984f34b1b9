"""Typed settings read from ENHYDRA_* environment variables.

Every setting is validated when the service starts, and a bad value stops it with an error that
names the variable, the value and what is expected: a typo must never surface later as a
puzzling runtime failure.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "ENHYDRA_"


class SettingsError(ValueError):
    """A setting is missing or has a value the runtime cannot use."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        self.name = name
        self.value = value
        self.expected = expected
        super().__init__(f"{PREFIX}{name.upper()}={value!r} is invalid: expected {expected}")


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(name, raw, "a whole number") from None
    if value <= 0:
        raise SettingsError(name, raw, "a number greater than 0")
    return value


def _non_negative_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(name, raw, "a whole number") from None
    if value < 0:
        raise SettingsError(name, raw, "a number of 0 or more")
    return value


def _port(name: str, raw: str) -> int:
    value = _non_negative_int(name, raw)
    if value > 65535:
        raise SettingsError(name, raw, "a TCP port between 0 and 65535")
    return value


_APP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def _app_id(name: str, raw: str) -> str:
    if not _APP_ID.match(raw):
        expected = "letters, digits, '.', '_' or '-' (a Kafka group/topic name)"
        raise SettingsError(name, raw, expected)
    return raw


def _bootstrap(name: str, raw: str) -> str:
    servers = [s.strip() for s in raw.split(",") if s.strip()]
    if not servers:
        raise SettingsError(name, raw, "host:port[,host:port...]")
    for server in servers:
        server = server.removeprefix("kafka://")
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SettingsError(name, raw, "host:port[,host:port...]")
    return ",".join(s.removeprefix("kafka://") for s in servers)


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise SettingsError(name, raw, "one of " + ", ".join(choices))
        return value

    return parse


def _tags(name: str, raw: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SettingsError(name, raw, "key=value[,key=value...], e.g. zone=a")
        tags[key.strip()] = value.strip()
    return tags


def _names(name: str, raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if any(not re.match(r"^[A-Za-z0-9_.-]+$", n) for n in names):
        raise SettingsError(name, raw, "comma-separated tag names, e.g. zone,rack")
    return names


def _text(name: str, raw: str) -> str:
    return raw


def _url(name: str, raw: str) -> str:
    if not re.match(r"^https?://[^/\s]+", raw):
        raise SettingsError(name, raw, "an http(s) URL such as http://10.0.0.5:6066")
    return raw.rstrip("/")


def _env(parser: Callable[[str, str], Any], default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    kw.setdefault("metadata", {})["parser"] = parser
    if default is dataclasses.MISSING:
        return field(**kw)
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), **kw)
    return field(default=default, **kw)


@dataclass(frozen=True)
class Settings:
    """Everything a running instance needs to know, all overridable from the environment."""

    app_id: str = _env(_app_id)
    bootstrap_servers: str = _env(_bootstrap, "127.0.0.1:9092")
    instance_id: str = _env(_text, "")
    state_dir: Path = _env(lambda n, r: Path(r), Path("state"))
    web_host: str = _env(_text, "0.0.0.0")
    web_port: int = _env(_port, 6066)
    advertised_url: str = _env(_url, "")
    partitions: int = _env(_positive_int, 4)
    replication_factor: int = _env(_positive_int, 1)
    client_tags: dict[str, str] = _env(_tags, {})
    log_format: str = _env(_choice("auto", "json", "console"), "auto")
    log_level: str = _env(_choice("debug", "info", "warning", "error"), "info")
    processing_guarantee: str = _env(_choice("at_least_once", "exactly_once"), "at_least_once")
    max_batch_records: int = _env(_positive_int, 2000)
    commit_interval_ms: int = _env(_non_negative_int, 200)
    producer_linger_ms: int = _env(_non_negative_int, 5)
    session_timeout_ms: int = _env(_positive_int, 10000)
    heartbeat_interval_ms: int = _env(_positive_int, 3000)
    rebalance_timeout_ms: int = _env(_positive_int, 30000)
    shutdown_timeout_s: int = _env(_positive_int, 25)
    dedup_window: int = _env(_non_negative_int, 100)
    state_cache_entries: int = _env(_non_negative_int, 10_000)
    store_memory_mb: int = _env(_positive_int, 32)
    num_standby_replicas: int = _env(_non_negative_int, 0)
    acceptable_recovery_lag: int = _env(_non_negative_int, 10_000)
    max_warmup_replicas: int = _env(_positive_int, 2)
    probing_rebalance_interval_ms: int = _env(_positive_int, 600_000)
    rack_aware_assignment_tags: tuple[str, ...] = _env(_names, ())
    deserialization_exception_handler: str = _env(
        _choice("log_and_continue", "log_and_fail", "dlq"), "log_and_fail"
    )
    processing_exception_handler: str = _env(_choice("dlq", "fail"), "fail")
    production_exception_handler: str = _env(_choice("fail", "continue", "dlq"), "fail")
    uncaught_exception_handler: str = _env(
        _choice("replace_worker", "shutdown_client", "shutdown_application"), "shutdown_client"
    )
    uncaught_escalation: str = _env(
        _choice("shutdown_client", "shutdown_application"), "shutdown_client"
    )
    max_worker_replacements: int = _env(_positive_int, 3)
    worker_replacement_window_s: int = _env(_positive_int, 300)
    task_timeout_ms: int = _env(_positive_int, 300_000)
    retry_backoff_ms: int = _env(_positive_int, 100)
    dlq_topic: str = _env(_text, "")
    max_output_bytes: int = _env(_positive_int, 1_000_000)
    # HTTP API (query/): admin endpoints are off without a token; queries are open without one.
    admin_token: str = _env(_text, "", repr=False)
    query_token: str = _env(_text, "", repr=False)
    max_scan_limit: int = _env(_positive_int, 1000)
    forward_timeout_ms: int = _env(_positive_int, 5000)
    commands_topic: str = _env(_text, "")  # read another app's commands (a clone, blue/green)
    snapshot_storage: str = _env(_text, "")
    snapshot_interval_s: int = _env(_non_negative_int, 0)
    snapshot_retention: int = _env(_non_negative_int, 0)
    snapshot_timeout_s: int = _env(_positive_int, 300)

    def __post_init__(self) -> None:
        if not self.instance_id:
            object.__setattr__(self, "instance_id", f"{socket.gethostname()}-{os.getpid()}")
        if not self.dlq_topic:
            object.__setattr__(self, "dlq_topic", f"{self.app_id}-dlq")
        if not self.advertised_url:
            host = "127.0.0.1" if self.web_host in ("0.0.0.0", "::") else self.web_host
            object.__setattr__(self, "advertised_url", f"http://{host}:{self.web_port}")
        missing = [t for t in self.rack_aware_assignment_tags if t not in self.client_tags]
        if missing:
            raise SettingsError(
                "client_tags",
                ",".join(f"{k}={v}" for k, v in self.client_tags.items()),
                f"a value for every rack-aware tag ({', '.join(missing)} missing)",
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise SettingsError(
                "heartbeat_interval_ms",
                self.heartbeat_interval_ms,
                f"less than session_timeout_ms ({self.session_timeout_ms})",
            )

    @property
    def store_dir(self) -> Path:
        """Where this app's stores live; one app per folder so instances can share a disk."""
        return self.state_dir / self.app_id

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, /, **defaults: Any) -> Settings:
        """Build settings from `defaults` (given by the service code) overridden by the env."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            parser = f.metadata["parser"]
            raw = env.get(PREFIX + f.name.upper())
            has_default = f.name in defaults
            default = defaults.pop(f.name, None)
            if raw is not None and raw.strip() != "":
                values[f.name] = parser(f.name, raw.strip())
            elif has_default:
                if isinstance(default, str):
                    default = parser(f.name, default)
                elif isinstance(default, list):
                    default = tuple(default)
                values[f.name] = default
        if defaults:
            unknown = ", ".join(sorted(defaults))
            raise TypeError(f"unknown setting(s): {unknown}")
        if "app_id" not in values:
            raise SettingsError("app_id", None, "an application id (set ENHYDRA_APP_ID)")
        return cls(**values)

    @classmethod
    def names(cls) -> list[str]:
        """The environment variable of every setting, for docs and `--help`."""
        return [PREFIX + f.name.upper() for f in dataclasses.fields(cls)]
