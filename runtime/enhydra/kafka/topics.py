"""Every topic Enhydra creates is created here, and every topic it uses is checked here.

One place so that no path (service start, reset, snapshot restore/clone, backfill sinks) can
forget the cluster's durability: the replication factor and min.insync.replicas come from the
connection (ENHYDRA_REPLICATION_FACTOR / ENHYDRA_MIN_INSYNC_REPLICAS), else the broker's own
defaults. A topic that exists with a layout its role cannot work with is a start-up error
naming the topic, the config found, the config expected and the fix, never a warning: a
commands topic with another partition count routes keys to the wrong store, a changelog that
is not compacted loses old keys, an events topic with retention loses the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    KafkaError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)

from enhydra.kafka.clients import Admin, as_connection, open_admin
from enhydra.kafka.errors import explain
from enhydra.logs import get_logger
from enhydra.settings import Connection

log = get_logger("enhydra.topics")


class TopicError(RuntimeError):
    """A topic exists with a layout the service cannot use."""


HISTORY_RETENTION = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
MIN_ISR = "min.insync.replicas"


COMPACTION_LAG_MS = "60000"


@dataclass(frozen=True)
class TopicSpec:
    """What a topic is for; how many replicas it gets is the cluster's policy (`Durability`)."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    compacted: bool = False
    # An event-sourced history (the events topic, the dead letters) is the source of truth: a
    # rebuild replays it from offset 0, so the broker must never delete it by age or size.
    history: bool = False

    def new_topic(self, durability: Durability) -> NewTopic:
        config = dict(self.config)
        if self.compacted:
            config.setdefault("cleanup.policy", "compact")
            # A cut-off previous owner's late changelog record is repaired by the current
            # owner within seconds (runner/fencing.py); until then compaction must not make it
            # the key's only record.
            config.setdefault("min.compaction.lag.ms", COMPACTION_LAG_MS)
        if self.history:
            for name, value in HISTORY_RETENTION.items():
                config.setdefault(name, value)
        if durability.min_isr_configured:
            config.setdefault(MIN_ISR, str(durability.min_insync_replicas))
        durability.check_creatable()
        return NewTopic(
            self.name, self.partitions, durability.replication_factor, topic_configs=config
        )


# ------------------------------------------------------------------------------- durability
@dataclass(frozen=True)
class Durability:
    """How every topic is replicated: the settings, else the broker's defaults.

    aiokafka's CreateTopics (v3) cannot ask for the broker's default (-1, KIP-464), so the
    default is read from a broker (DescribeConfigs) and asked for by number.
    """

    replication_factor: int
    min_insync_replicas: int
    brokers: int  # up now: a stopped or fenced broker is not counted
    rf_configured: bool = False
    min_isr_configured: bool = False
    # Why no topic can be created now (more replicas than brokers up), or None. Only creating
    # needs them all: existing topics go on with a broker down (min ISR of the rest).
    shortfall: str | None = None

    def check_creatable(self) -> None:
        if self.shortfall is not None:
            raise TopicError(self.shortfall)


def durability_of(conn: Connection, brokers: int, broker_defaults: dict[str, str]) -> Durability:
    """Pure: the durability `conn` asks for on a cluster of `brokers` up, or why it cannot
    have it. More replicas than brokers up is not an error yet: the topics may all exist
    (a broker is down, or restarting); it is one when a topic has to be created."""
    rf_set, isr_set = conn.replication_factor, conn.min_insync_replicas
    try:
        default_rf = int(broker_defaults.get("default.replication.factor", ""))
        default_isr = int(broker_defaults.get(MIN_ISR, "1"))
    except ValueError:
        default_rf, default_isr = 0, 1
    if rf_set is None and default_rf < 1:
        raise TopicError(
            "could not read the broker's default.replication.factor (DescribeConfigs on the "
            "cluster): set ENHYDRA_REPLICATION_FACTOR"
        )
    rf = rf_set if rf_set is not None else default_rf
    isr = isr_set if isr_set is not None else default_isr
    named = (
        f"ENHYDRA_REPLICATION_FACTOR={rf}"
        if rf_set is not None
        else (f"the broker's default.replication.factor={rf} (ENHYDRA_REPLICATION_FACTOR unset)")
    )
    shortfall = None
    if rf > brokers:
        shortfall = (
            f"{named} asks for more replicas than the cluster has brokers up ({brokers}) to "
            f"create a topic on: set ENHYDRA_REPLICATION_FACTOR to at most {brokers}, or "
            "start the brokers that are down"
        )
    if isr > rf:
        where = (
            f"ENHYDRA_MIN_INSYNC_REPLICAS={isr}"
            if isr_set is not None
            else f"the broker's min.insync.replicas={isr} (ENHYDRA_MIN_INSYNC_REPLICAS unset)"
        )
        raise TopicError(
            f"{where} is more than the replication factor ({named}): every write with "
            "acks=all would fail; raise ENHYDRA_REPLICATION_FACTOR or lower "
            "ENHYDRA_MIN_INSYNC_REPLICAS"
        )
    return Durability(rf, isr, brokers, rf_set is not None, isr_set is not None, shortfall)


async def durability_for(admin: Admin, conn: Connection) -> Durability:
    """`resolve_durability`, a refused or failed call explained in one line."""
    try:
        return await resolve_durability(admin, conn)
    except KafkaError as exc:
        raise explain(
            exc,
            conn,
            doing="read the broker's default.replication.factor (DescribeConfigs on the "
            "cluster; or set ENHYDRA_REPLICATION_FACTOR)",
        ) from exc


async def resolve_durability(admin: Admin, conn: Connection) -> Durability:
    """Read the broker count and a broker's defaults, then apply `durability_of`."""
    cluster = await admin.describe_cluster()
    brokers = [b["node_id"] for b in cluster["brokers"]]
    defaults: dict[str, str] = {}
    wanted = {"default.replication.factor": None, MIN_ISR: None}
    resource = ConfigResource(ConfigResourceType.BROKER, str(min(brokers)), wanted)
    for response in await admin.describe_configs([resource]):
        for error_code, message, _type, _name, entries in response.resources:
            if not error_code:
                defaults.update({entry[0]: entry[1] for entry in entries})
            elif conn.replication_factor is None:  # needed: say why it could not be read
                raise for_code(error_code)(message or f"error {error_code}")
    return durability_of(conn, len(brokers), defaults)


# ----------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Finding:
    """One way an existing topic differs from what its role needs."""

    topic: str
    found: str
    expected: str
    fix: str
    fatal: bool = True

    def line(self) -> str:
        return f"topic {self.topic}: {self.found}, expected {self.expected}; fix: {self.fix}"


def _alter(topic: str, config: str) -> str:
    return (
        "kafka-configs.sh --bootstrap-server <broker> --alter --entity-type topics "
        f"--entity-name {topic} --add-config {config}"
    )


def layout_findings(
    spec: TopicSpec, configs: dict[str, str], replicas: int, durability: Durability
) -> list[Finding]:
    """Pure: what is wrong with an existing topic for its role, fatal first.

    A changelog that is not compacted restores from the log start and loses old keys; a
    history with retention loses what every fold reads from offset 0; a lower min ISR than
    asked makes acks=all mean fewer copies. A lower replication factor is a warning: the
    topic works, and raising it is a partition reassignment, not a config change.
    """
    found: list[Finding] = []
    policy = configs.get("cleanup.policy", "delete")
    if spec.compacted and policy != "compact":
        found.append(
            Finding(
                spec.name,
                f"cleanup.policy={policy}",
                "cleanup.policy=compact (a changelog)",
                _alter(spec.name, "cleanup.policy=compact"),
            )
        )
    if spec.history:
        losing = history_loss(configs)
        if losing:
            found.append(
                Finding(
                    spec.name,
                    ",".join(losing),
                    "retention.ms=-1,retention.bytes=-1,cleanup.policy=delete (a history)",
                    _alter(spec.name, "retention.ms=-1,retention.bytes=-1,cleanup.policy=delete"),
                )
            )
    isr = configs.get(MIN_ISR)
    if isr is not None and isr.isdigit() and int(isr) < durability.min_insync_replicas:
        found.append(
            Finding(
                spec.name,
                f"{MIN_ISR}={isr}",
                f"{MIN_ISR}>={durability.min_insync_replicas}",
                _alter(spec.name, f"{MIN_ISR}={durability.min_insync_replicas}"),
            )
        )
    if replicas < durability.replication_factor:
        found.append(
            Finding(
                spec.name,
                f"replication factor {replicas}",
                f"at least {durability.replication_factor}",
                "kafka-reassign-partitions.sh --execute with a plan listing "
                f"{durability.replication_factor} replicas per partition",
                fatal=False,
            )
        )
    return sorted(found, key=lambda f: not f.fatal)


async def check_layout(
    admin: Admin, specs: list[TopicSpec], durability: Durability
) -> list[Finding]:
    """Describe the (existing) topics in `specs` and return every finding."""
    if not specs:
        return []
    described = await admin.describe_topics([s.name for s in specs])
    replicas: dict[str, int] = {}
    for topic in described:
        parts = topic.get("partitions") or []
        if topic.get("error_code", 0) == 0 and parts:
            replicas[topic["topic"]] = min(len(p["replicas"]) for p in parts)
    wanted = {"cleanup.policy": None, MIN_ISR: None, **dict.fromkeys(HISTORY_RETENTION)}
    resources = [
        ConfigResource(ConfigResourceType.TOPIC, s.name, wanted)
        for s in specs
        if s.name in replicas
    ]
    configs: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources) if resources else []:
        for error_code, message, _type, name, entries in response.resources:
            if error_code:  # unread is not "wrong": say why it could not be read
                raise for_code(error_code)(f"{name}: {message or 'error ' + str(error_code)}")
            configs[name] = {entry[0]: entry[1] for entry in entries}
    findings: list[Finding] = []
    for spec in specs:
        if spec.name in replicas:
            found = configs.get(spec.name, {})
            findings += layout_findings(spec, found, replicas[spec.name], durability)
    return findings


async def partition_counts(admin: Admin, names: list[str]) -> dict[str, int]:
    """Partition count of each existing topic among `names`."""
    described = await admin.describe_topics(names)
    _raise_topic_errors(
        [(t["topic"], t.get("error_code", 0), "") for t in described], tolerate=(_UNKNOWN_TOPIC,)
    )
    counts: dict[str, int] = {}
    for topic in described:
        if topic.get("error_code", 0) == 0 and topic.get("partitions"):
            counts[topic["topic"]] = len(topic["partitions"])
    return counts


_TOPIC_EXISTS = TopicAlreadyExistsError.errno
_UNKNOWN_TOPIC = UnknownTopicOrPartitionError.errno


def _raise_topic_errors(errors: list[tuple], tolerate: tuple[int, ...] = (_TOPIC_EXISTS,)) -> None:
    """aiokafka's admin returns per-topic error codes instead of raising: raise the first."""
    for topic, code, message, *_ in errors:
        if code and code not in tolerate:
            raise for_code(code)(f"{topic}: {message or 'error ' + str(code)}")


async def ensure_topics(
    conn: Connection | str,
    specs: list[TopicSpec],
    *,
    client_id: str = "enhydra",
    timeout: float = 30.0,
) -> Durability:
    """Create missing topics; verify existing ones can do their job (partitions, layout).

    Several instances may start at once and race to create the same topics; metadata of a
    topic just created takes a moment to show, so this retries until every topic is visible.
    A fatal layout finding (`layout_findings`) is a TopicError with one line per topic.
    """
    conn = as_connection(conn)
    async with open_admin(conn, client_id=client_id) as admin:
        durability = await durability_for(admin, conn)
        if durability.shortfall is not None:
            log.warning(
                "fewer brokers up than the replication factor: existing topics are used, "
                "none can be created",
                brokers_up=durability.brokers,
                replication_factor=durability.replication_factor,
            )
        try:
            deadline = time.monotonic() + timeout
            await _ensure(admin, specs, durability, timeout)
            _report(await _layout_once_known(admin, specs, durability, deadline))
        except KafkaError as exc:
            names = ", ".join(s.name for s in specs)
            raise explain(exc, conn, doing=f"create or describe the topics {names}") from exc
    return durability


async def _layout_once_known(
    admin: Admin, specs: list[TopicSpec], durability: Durability, deadline: float
) -> list[Finding]:
    """`check_layout`, asked again while a broker does not know a topic yet.

    On a cluster a topic just created shows in one broker's metadata before another's: the
    broker that answers DescribeConfigs may say it does not exist for a moment (two instances
    starting together on a fresh cluster: one created the topics, the other stopped).
    """
    while True:
        try:
            return await check_layout(admin, specs, durability)
        except UnknownTopicOrPartitionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def _report(findings: list[Finding]) -> None:
    """Warnings are logged; fatal findings stop whoever asked, one line per finding."""
    for finding in findings:
        if not finding.fatal:
            log.warning(
                "topic less replicated than configured",
                topic=finding.topic,
                found=finding.found,
                expected=finding.expected,
                fix=finding.fix,
            )
    fatal = [f.line() for f in findings if f.fatal]
    if fatal:
        raise TopicError("\n".join(fatal))


async def _ensure(
    admin: Admin, specs: list[TopicSpec], durability: Durability, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    created: set[str] = set()
    while True:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing and s.name not in created]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # another instance was first
                response = await admin.create_topics([s.new_topic(durability) for s in missing])
                _raise_topic_errors(response.topic_errors)
            for spec in missing:
                created.add(spec.name)
                log.info(
                    "topic created",
                    topic=spec.name,
                    partitions=spec.partitions,
                    replication_factor=durability.replication_factor,
                )
        counts = await partition_counts(admin, [s.name for s in specs])
        absent = [s.name for s in specs if s.name not in counts]
        if not absent:
            break
        if time.monotonic() > deadline:
            raise TopicError(f"topics {absent} could not be created or described")
        await asyncio.sleep(0.3)
    for spec in specs:
        found = counts[spec.name]
        if found != spec.partitions:
            raise TopicError(
                f"topic {spec.name!r} has {found} partitions but the service expects "
                f"{spec.partitions} (ENHYDRA_PARTITIONS); keys would be routed to the wrong "
                "store partition. Use a new app id or repartition the topic."
            )


async def require_creatable(conn: Connection | str) -> None:
    """Raise the one-line TopicError now if no topic could be created (more replicas than
    brokers up): for a command that changes something else first (reset's group offsets)."""
    conn = as_connection(conn)
    async with open_admin(conn, client_id="enhydra-admin") as admin:
        (await durability_for(admin, conn)).check_creatable()


async def recreate_topics(
    conn: Connection | str, specs: list[TopicSpec], *, timeout: float = 60.0
) -> None:
    """Delete the topics (when they exist) and create them anew, empty, as `specs` say.

    A deleted topic's name is free again only once the controller has finished deleting it,
    so creation is retried until then. The durability is resolved before anything is
    deleted, so a setting the cluster cannot meet leaves the old topics in place.
    """
    if not specs:
        return
    conn = as_connection(conn)
    async with open_admin(conn, client_id="enhydra-admin") as admin:
        durability = await durability_for(admin, conn)
        durability.check_creatable()  # before anything is deleted
        names = [s.name for s in specs]
        existing = [name for name in names if name in set(await admin.list_topics())]
        if existing:
            await admin.delete_topics(existing)
        deadline = time.monotonic() + timeout
        while set(names) & set(await admin.list_topics()):
            if time.monotonic() > deadline:
                raise TopicError(f"topics {names} were not deleted within {timeout:.0f}s")
            await asyncio.sleep(0.3)
        while True:
            try:
                response = await admin.create_topics([s.new_topic(durability) for s in specs])
                _raise_topic_errors(response.topic_errors)
                return
            except TopicAlreadyExistsError:  # deletion still settling on the controller
                if time.monotonic() > deadline:
                    raise TopicError(f"topics {names} could not be recreated") from None
                await asyncio.sleep(0.5)


async def verify_topics(conn: Connection | str, specs: list[TopicSpec]) -> list[Finding]:
    """Every finding about `specs` on a running cluster, missing topics included (a CLI check)."""
    conn = as_connection(conn)
    async with open_admin(conn, client_id="enhydra-verify") as admin:
        durability = await durability_for(admin, conn)
        try:
            return await _verify(admin, specs, durability)
        except KafkaError as exc:
            raise explain(exc, conn, doing="describe the application's topics") from exc


async def _verify(admin: Admin, specs: list[TopicSpec], durability: Durability) -> list[Finding]:
    existing = set(await admin.list_topics())
    findings = [
        Finding(s.name, "missing", "the topic", "start the service once: it creates it")
        for s in specs
        if s.name not in existing
    ]
    present = [s for s in specs if s.name in existing]
    counts = await partition_counts(admin, [s.name for s in present]) if present else {}
    findings += [
        Finding(
            s.name,
            f"{counts[s.name]} partitions",
            f"{s.partitions} partitions (ENHYDRA_PARTITIONS)",
            "a new app id, or repartition the topic",
        )
        for s in present
        if s.name in counts and counts[s.name] != s.partitions
    ]
    return findings + await check_layout(admin, present, durability)


def history_loss(configs: dict[str, str]) -> list[str]:
    """The settings of an existing topic under which the broker would delete its history."""
    return [
        f"{name}={configs[name]}"
        for name, kept in HISTORY_RETENTION.items()
        if name in configs and configs[name] != kept
    ]


async def max_message_bytes(
    conn: Connection | str, names: list[str], *, client_id: str = "enhydra"
) -> dict[str, int]:
    """Each existing topic's max.message.bytes (its own or the broker's default): the largest
    record batch the broker accepts for it. Topics that do not exist are left out."""
    conn = as_connection(conn)
    wanted = {"max.message.bytes": None}
    resources = [ConfigResource(ConfigResourceType.TOPIC, name, wanted) for name in names]
    limits: dict[str, int] = {}
    async with open_admin(conn, client_id=client_id) as admin:
        try:
            responses = await admin.describe_configs(resources)
        except KafkaError as exc:
            raise explain(exc, conn, doing=f"describe the topics {', '.join(names)}") from exc
    for response in responses:
        for error_code, _message, _type, name, entries in response.resources:
            for entry in entries if not error_code else ():
                if entry[0] == "max.message.bytes" and entry[1]:
                    limits[name] = int(entry[1])
    return limits
