"""Typed settings read from ENHYDRA_* environment variables.

Every setting is validated when the service starts, and a bad value stops it with an error that
names the variable, the value and what is expected: a typo must never surface later as a
puzzling runtime failure.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "ENHYDRA_"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


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


def _upper_choice(*choices: str) -> Callable[[str, str], str]:
    """Kafka spells these in capitals (SASL_SSL, SCRAM-SHA-512); accept any case."""

    def parse(name: str, raw: str) -> str:
        value = raw.strip().upper()
        for spelling in (value, value.replace("_", "-"), value.replace("-", "_")):
            if spelling in choices:
                return spelling
        raise SettingsError(name, raw, "one of " + ", ".join(choices))

    return parse


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(name, raw, "true or false")


def _bool_or_auto(name: str, raw: str) -> bool | None:
    if raw.strip().lower() == "auto":
        return None
    try:
        return _bool(name, raw)
    except SettingsError:
        raise SettingsError(name, raw, "auto, true or false") from None


def _readable_file(name: str, raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_file():
        raise SettingsError(name, raw, "a readable file (no such file)")
    if not os.access(path, os.R_OK):
        raise SettingsError(name, raw, "a readable file (permission denied)")
    return path


_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _callable_name(name: str, raw: str) -> str:
    if not _CALLABLE.match(raw.strip()):
        raise SettingsError(name, raw, "MODULE:CALLABLE, e.g. billing.auth:fetch_token")
    return raw.strip()


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
    # Kafka connection and security (see Connection): every client of the process uses them.
    bootstrap_servers: str = _env(_bootstrap, "127.0.0.1:9092")
    security_protocol: str = _env(_upper_choice(*SECURITY_PROTOCOLS), "PLAINTEXT")
    sasl_mechanism: str = _env(_upper_choice(*SASL_MECHANISMS), "")
    sasl_username: str = _env(_text, "")
    sasl_password: str = _env(_text, "", repr=False)
    sasl_password_file: Path | None = _env(_readable_file, None)
    sasl_oauth_token_provider: str = _env(_callable_name, "")
    ssl_cafile: Path | None = _env(_readable_file, None)
    ssl_certfile: Path | None = _env(_readable_file, None)
    ssl_keyfile: Path | None = _env(_readable_file, None)
    ssl_key_password: str = _env(_text, "", repr=False)
    ssl_check_hostname: bool = _env(_bool, True)
    instance_id: str = _env(_text, "")
    state_dir: Path = _env(lambda n, r: Path(r), Path("state"))
    web_host: str = _env(_text, "0.0.0.0")
    web_port: int = _env(_port, 6066)
    advertised_url: str = _env(_url, "")
    partitions: int = _env(_positive_int, 4)
    # Topic durability (kafka/topics.py applies both to every topic any path creates): unset,
    # the broker's own default.replication.factor and min.insync.replicas.
    replication_factor: int | None = _env(_positive_int, None)
    min_insync_replicas: int | None = _env(_positive_int, None)
    client_tags: dict[str, str] = _env(_tags, {})
    log_format: str = _env(_choice("auto", "json", "console"), "auto")
    log_level: str = _env(_choice("debug", "info", "warning", "error"), "info")
    processing_guarantee: str = _env(_choice("at_least_once", "exactly_once"), "at_least_once")
    max_batch_records: int = _env(_positive_int, 2000)
    commit_interval_ms: int = _env(_non_negative_int, 200)
    producer_linger_ms: int = _env(_non_negative_int, 5)
    # Group membership. Instances join as static members (KIP-345, group.instance.id = the
    # instance id): a restart within the session timeout gets its tasks back without a
    # rebalance, and a dead instance is removed at once by the failure detector (failover/),
    # so the session timeout is only the last resort. Survivors hear of a rebalance at their
    # next heartbeat, hence a short one.
    session_timeout_ms: int = _env(_positive_int, 30000)
    heartbeat_interval_ms: int = _env(_positive_int, 500)
    rebalance_timeout_ms: int = _env(_positive_int, 30000)
    static_membership: bool = _env(_bool, True)
    # On SIGTERM, leave the group at once (a scale-down) instead of being expected back.
    # auto (None until resolved): leave when this instance id cannot come back (instance_returns).
    leave_group_on_shutdown: bool | None = _env(_bool_or_auto, None)
    failure_detection: bool = _env(_bool, True)
    failure_probe_window_ms: int = _env(_positive_int, 5000)  # silent everywhere: dead
    liveness_max_streams: int = _env(_positive_int, 128)  # peers' heartbeat streams held open
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
    # A task with input (or changelog) waiting that makes no progress this long is stuck:
    # /health/live fails so the orchestrator restarts the process (runner/watchdog.py).
    task_watchdog_ms: int = _env(_positive_int, 20_000)
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
    # Control topic messages are signed with this secret, shared by every instance of the app
    # (control/signing.py says what happens when it is unset).
    control_secret: str = _env(_text, "", repr=False)
    control_secret_file: Path | None = _env(_readable_file, None)
    snapshot_interval_s: int = _env(_non_negative_int, 0)
    snapshot_retention: int = _env(_non_negative_int, 0)
    snapshot_timeout_s: int = _env(_positive_int, 300)

    def __post_init__(self) -> None:
        self.connection  # noqa: B018 - a bad combination of security settings fails at start
        if not self.instance_id:
            object.__setattr__(self, "instance_id", remembered_instance_id(self.store_dir))
        if self.leave_group_on_shutdown is None:
            returns = instance_returns(self.instance_id, hostname=_hostname(), env=os.environ)
            object.__setattr__(self, "leave_group_on_shutdown", not returns)
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
        rf, isr = self.replication_factor, self.min_insync_replicas
        if rf is not None and isr is not None and isr > rf:
            raise SettingsError(
                "min_insync_replicas",
                isr,
                f"at most ENHYDRA_REPLICATION_FACTOR ({rf}): every acks=all write would fail",
            )
        self.control_key  # noqa: B018 - an unreadable secret file fails at start
        if not 1000 < self.failure_probe_window_ms < self.session_timeout_ms:
            raise SettingsError(
                "failure_probe_window_ms",
                self.failure_probe_window_ms,
                f"more than 1000 and less than session_timeout_ms ({self.session_timeout_ms})",
            )

    @functools.cached_property
    def control_key(self) -> bytes | None:
        """The key control messages are signed with (control/signing.py), None: unsigned."""
        return control_secret(self.control_secret, self.control_secret_file)

    @property
    def store_dir(self) -> Path:
        """Where this app's stores live; one app per folder so instances can share a disk."""
        return self.state_dir / self.app_id

    @functools.cached_property
    def connection(self) -> Connection:
        """How this process reaches Kafka; enhydra.kafka builds every client from it."""
        return Connection(**{name: getattr(self, name) for name in Connection.field_names()})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, /, **defaults: Any) -> Settings:
        """Build settings from `defaults` (given by the service code) overridden by the env."""
        env = os.environ if env is None else env
        values = _read_fields(dataclasses.fields(cls), env, defaults)
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


def control_secret(secret: str, path: Path | None) -> bytes | None:
    """The control topic's signing key: ENHYDRA_CONTROL_SECRET or the file it is mounted as."""
    if path is not None:
        if secret:
            raise SettingsError(
                "control_secret_file",
                str(path),
                "either ENHYDRA_CONTROL_SECRET or ENHYDRA_CONTROL_SECRET_FILE, not both",
            )
        try:
            secret = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(
                "control_secret_file", str(path), f"a readable file ({exc})"
            ) from None
        if not secret:
            raise SettingsError("control_secret_file", str(path), "a file holding the secret")
    return secret.encode() if secret else None


def control_secret_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """The signing key for a command that runs no application (`enhydra snapshot create`)."""
    env = os.environ if env is None else env
    path = env.get(PREFIX + "CONTROL_SECRET_FILE", "").strip()
    return control_secret(
        env.get(PREFIX + "CONTROL_SECRET", "").strip(),
        _readable_file("control_secret_file", path) if path else None,
    )


INSTANCE_ID_FILE = "instance-id"


def remembered_instance_id(store_dir: Path) -> str:
    """The instance id this state dir ran under last, else a new `<hostname>-<pid>`.

    A static group member is known by its instance id, so a restart on the same volume must
    come back under the same one (the runtime writes it next to the stores at start).
    """
    try:
        remembered = (store_dir / INSTANCE_ID_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        remembered = ""
    return remembered or f"{socket.gethostname()}-{os.getpid()}"


# A pod a ReplicaSet (a Deployment) names: <deployment>-<pod-template-hash>-<5 random>, both
# drawn from Kubernetes' alphabet without vowels (apimachinery's rand.SafeEncodeString).
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
_REPLICA_SET_POD = re.compile(rf"^[a-z0-9]([-a-z0-9]*[a-z0-9])?-{_SAFE}{{6,10}}-{_SAFE}{{5}}$")


def instance_returns(instance_id: str, *, hostname: str, env: Mapping[str, str]) -> bool:
    """Whether this instance id is expected back after a clean stop (a static member waits).

    A Deployment replaces a pod by one of another name (and an empty volume), so an id taken
    from its pod name never comes back, and its static member would hold the next pod's join
    until the session timeout: such an instance leaves its groups on stop. A StatefulSet's
    pod keeps its name; compose and VMs restart under the name they were given.
    """
    if "KUBERNETES_SERVICE_HOST" not in env or not _REPLICA_SET_POD.match(hostname):
        return True
    return not instance_id.startswith(hostname)  # the pod name, or <pod name>-<pid>


def _hostname() -> str:
    """The pod name in Kubernetes (its HOSTNAME), else the machine's."""
    return os.environ.get("HOSTNAME") or socket.gethostname()


def _read_fields(
    fields: tuple[dataclasses.Field, ...], env: Mapping[str, str], defaults: dict[str, Any]
) -> dict[str, Any]:
    """Parse each field from ENHYDRA_<NAME>, else from `defaults` (popped as they are used)."""
    values: dict[str, Any] = {}
    for f in fields:
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
    return values


@dataclass(frozen=True)
class Connection:
    """Where Kafka is and how to authenticate: the one input of every Kafka client we build.

    A projection of the connection settings, so a CLI command that has no application (dlq,
    snapshot, reset) reads the same ENHYDRA_* variables with the same checks as `enhydra run`.
    Secrets stay out of repr() and describe(): they reach no log, page or error message.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    sasl_password_file: Path | None = None
    sasl_oauth_token_provider: str = ""
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: str = field(default="", repr=False)
    ssl_check_hostname: bool = True
    # How durable the topics created through this connection are (None: the broker's default).
    # They travel with the connection because every command that creates topics (run, reset,
    # snapshot restore/clone, backfill) already builds one from the same ENHYDRA_* variables.
    replication_factor: int | None = None
    min_insync_replicas: int | None = None

    def __post_init__(self) -> None:
        if self.sasl_password_file is not None:
            if self.sasl_password:
                raise SettingsError(
                    "sasl_password_file",
                    str(self.sasl_password_file),
                    "either ENHYDRA_SASL_PASSWORD or ENHYDRA_SASL_PASSWORD_FILE, not both",
                )
            try:
                secret = Path(self.sasl_password_file).read_text(encoding="utf-8").strip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise SettingsError(
                    "sasl_password_file", str(self.sasl_password_file), f"a readable file ({exc})"
                ) from None
            object.__setattr__(self, "sasl_password", secret)
        protocol = self.security_protocol
        if self.uses_sasl:
            if not self.sasl_mechanism:
                raise SettingsError(
                    "sasl_mechanism", "", f"one of {', '.join(SASL_MECHANISMS)} with {protocol}"
                )
            if self.sasl_mechanism == "OAUTHBEARER":
                if not self.sasl_oauth_token_provider:
                    raise SettingsError(
                        "sasl_oauth_token_provider",
                        "",
                        "MODULE:CALLABLE returning a token, required by OAUTHBEARER",
                    )
            else:
                if not self.sasl_username:
                    raise SettingsError(
                        "sasl_username", "", f"a user name for {self.sasl_mechanism}"
                    )
                if not self.sasl_password:
                    raise SettingsError(
                        "sasl_password",
                        "",
                        f"a password for {self.sasl_mechanism} (or ENHYDRA_SASL_PASSWORD_FILE)",
                    )
        elif self.sasl_mechanism:
            raise SettingsError(
                "sasl_mechanism",
                self.sasl_mechanism,
                f"no SASL mechanism with ENHYDRA_SECURITY_PROTOCOL={protocol} "
                "(use SASL_SSL or SASL_PLAINTEXT)",
            )
        tls_files = {"ssl_cafile", "ssl_certfile", "ssl_keyfile"}
        given = sorted(name for name in tls_files if getattr(self, name) is not None)
        if given and not self.uses_ssl:
            raise SettingsError(
                given[0],
                str(getattr(self, given[0])),
                f"TLS files only with SSL or SASL_SSL (ENHYDRA_SECURITY_PROTOCOL={protocol})",
            )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise SettingsError(
                "ssl_certfile", "", "the client certificate that goes with ENHYDRA_SSL_KEYFILE"
            )

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def describe(self) -> dict[str, Any]:
        """What may be shown: addresses, protocol, user and file paths, never a secret."""
        shown: dict[str, Any] = {
            "bootstrap": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.uses_sasl:
            shown["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_username:
                shown["sasl_username"] = self.sasl_username
        if self.uses_ssl:
            shown["ssl_cafile"] = str(self.ssl_cafile) if self.ssl_cafile else "(system CAs)"
            if self.ssl_certfile:
                shown["ssl_certfile"] = str(self.ssl_certfile)
            if not self.ssl_check_hostname:
                shown["ssl_check_hostname"] = False
        return shown

    def secrets(self) -> list[str]:
        """The secret values, so messages that might echo them can be scrubbed."""
        return [s for s in (self.sasl_password, self.ssl_key_password) if s]

    def token_provider(self) -> Callable[[], Any]:
        """The OAUTHBEARER token callable named by ENHYDRA_SASL_OAUTH_TOKEN_PROVIDER."""
        module_name, _, attr = self.sasl_oauth_token_provider.partition(":")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise SettingsError(
                "sasl_oauth_token_provider", self.sasl_oauth_token_provider, f"importable ({exc})"
            ) from None
        if not callable(target):
            raise SettingsError(
                "sasl_oauth_token_provider", self.sasl_oauth_token_provider, "a callable"
            )
        return target

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def env(self) -> dict[str, str]:
        """The ENHYDRA_* variables that give a child process this connection.

        A password read from a file is passed as that file, so it stays out of the environment.
        """
        env = {}
        for name in self.field_names():
            value = getattr(self, name)
            if name == "sasl_password" and self.sasl_password_file is not None:
                continue
            if value is None or value == "" or (name == "ssl_check_hostname" and value):
                continue
            env[PREFIX + name.upper()] = (
                str(value).lower() if isinstance(value, bool) else str(value)
            )
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, /, **given: Any) -> Connection:
        """The connection settings alone (for commands that run no application).

        `given` values (e.g. a --bootstrap flag) win over the environment.
        """
        env = os.environ if env is None else env
        names = set(cls.field_names())
        fields = tuple(f for f in dataclasses.fields(Settings) if f.name in names)
        chosen = {k: v for k, v in given.items() if v is not None}
        overridden = {PREFIX + k.upper() for k in chosen}
        values = _read_fields(fields, {k: v for k, v in env.items() if k not in overridden}, chosen)
        if chosen:
            raise TypeError(f"unknown connection setting(s): {', '.join(sorted(chosen))}")
        return cls(**values)

    @classmethod
    def plain(cls, bootstrap: str) -> Connection:
        """A PLAINTEXT connection to `bootstrap` (tests, the local development broker)."""
        return cls(bootstrap_servers=_bootstrap("bootstrap_servers", bootstrap))


def unknown_variables(env: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """ENHYDRA_* variables no setting reads, each with the closest known name (typos).

    Variables of tools around the runtime (the cache, the broker dir, tests) are not settings
    but are known too.
    """
    env = os.environ if env is None else env
    known = set(Settings.names()) | OTHER_VARIABLES
    found = []
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
            found.append((name, close[0] if close else None))
    return found


# ENHYDRA_* variables read outside Settings: by the CLI, the dev broker, tests and benchmarks.
OTHER_VARIABLES = {
    "ENHYDRA_CACHE_DIR",
    "ENHYDRA_BROKER_DIR",
    "ENHYDRA_TEST_BOOTSTRAP",
    "ENHYDRA_UPDATE_DOCS",
    "ENHYDRA_QUERY_URL",
}
