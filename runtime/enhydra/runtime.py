"""The runtime container: one instance of a resolved service, from start to exit code.

faust-streaming provides what it does well here: the worker lifecycle (signals, ordered start
and stop, a clean exit) and the app container. Records do not go through faust's per-message
agent path: the engines consume and process them in batches (runner/).

    Runtime      holds the resolved service and the running parts; decides the exit code
    _Instance    the one mode service faust starts: the web server first (so probes answer
                 early), then the supervisor
    Supervisor   runs the aggregate's engine under the uncaught-exception policy, the control
                 channel, live snapshots, the projections and the failure detector

Instances join their groups as static members: a restart under the same instance id gets its
tasks back without a rebalance. Every instance streams heartbeats to its peers and writes a
beacon to the control topic; when a peer is certainly gone, its member is removed from the
groups at once (failover/), so its tasks move in about a second instead of a session timeout.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import faust
from aiohttp import web
from aiokafka.errors import UnknownMemberIdError
from faust.app.base import BootStrategy
from mode import Service as ModeService

from enhydra.control.channel import SHUTDOWN_APPLICATION, ControlChannel
from enhydra.control.signing import missing_secret
from enhydra.errors.policies import UncaughtPolicy
from enhydra.errors.uncaught import (
    EXIT_CANNOT_START,
    EXIT_SHUTDOWN_APPLICATION,
    EXIT_SHUTDOWN_CLIENT,
    RestartBudget,
    UncaughtDecider,
)
from enhydra.failover import (
    Beacon,
    DetectorConfig,
    FailureDetector,
    LivenessEndpoint,
    add_liveness_routes,
)
from enhydra.kafka.clients import check_access
from enhydra.kafka.errors import KafkaAccessError
from enhydra.kafka.membership import FencedInstanceIdError, remove_static_members
from enhydra.kafka.topics import TopicError, TopicSpec
from enhydra.logs import get_logger
from enhydra.processing.engine import Engine
from enhydra.projections.host import ProjectionHost, engine_for
from enhydra.query.http import AdminRoute, build_app
from enhydra.reactions.engine import ReactionEngine
from enhydra.reactions.host import ReactionHost
from enhydra.runner.registry import Verdict
from enhydra.runner.runner import STOP_MARGIN_S, FencedInstance, TaskRunner
from enhydra.sagas.host import SagaHost, saga_engines
from enhydra.settings import INSTANCE_ID_FILE
from enhydra.snapshots.admission import refusal, same_storage
from enhydra.snapshots.live import (
    SNAPSHOT_CREATE,
    SNAPSHOT_DONE,
    LiveSnapshots,
    new_snapshot_id,
)
from enhydra.spec import ResolvedService
from enhydra.topology.asyncapi import asyncapi_of

log = get_logger("enhydra.service")
# mode logs each service's "Starting..."/"Stopping..." at INFO under the class's module name;
# under its own logger, that chatter stays below the service's log level (logs.py).
_LIFECYCLE_LOGGER = logging.getLogger("mode.enhydra")


class _BootStrategy(BootStrategy):
    # The engines own the Kafka clients; faust's consumer would join the group a second time.
    enable_kafka = False


class _App(faust.App):
    BootStrategy = _BootStrategy
    logger = _LIFECYCLE_LOGGER


def topic_specs(service: ResolvedService) -> list[TopicSpec]:
    """Every topic an instance of `service` creates at start, as its engines declare them.

    Built by the engines themselves (nothing starts), so `enhydra topology check --live`
    checks exactly the layout a start would.
    """
    s, bound = service.settings, service.bound
    engine = Engine(s, bound, policies=service.policies, transient=service.spec.transient_errors)
    specs = {spec.name: spec for spec in engine.topic_specs()}
    for projection, plugin in service.projections:
        host = engine_for(
            s, projection, bound.events_topic, plugin=plugin, aggregate=bound.aggregate
        )
        for spec in host.topic_specs():
            specs.setdefault(spec.name, spec)
    for reaction in service.reactions:
        engine = ReactionEngine(s, reaction, bound.commands_topic, policies=service.policies)
        for spec in engine.topic_specs():
            specs.setdefault(spec.name, spec)
    for saga in service.sagas:
        runner, forwarders = saga_engines(s, saga, bound.commands_topic, policies=service.policies)
        for part in (runner, *forwarders):
            for spec in part.topic_specs():
                specs.setdefault(spec.name, spec)
    return list(specs.values())


def settle_heap() -> None:
    """Put everything start-up created out of the garbage collector's reach (gc.freeze).

    A full collection otherwise walks every module, class and setting of the process while
    the engine waits: measured 30-65 ms pauses about once a second under load, the largest
    part of the p99 latency. Objects made later are collected as before, less often.
    """
    gc.collect()
    gc.freeze()
    # A batch allocates tens of thousands of short-lived containers; with the default
    # threshold (700) many survive into older generations and are scanned again and again.
    gc.set_threshold(50_000, 20, 20)


class Runtime:
    """One running instance of a resolved service."""

    def __init__(self, service: ResolvedService) -> None:
        self.service = service
        self.settings = service.settings
        self.engine: Engine | None = None
        self.projection_host: ProjectionHost | None = None
        self.reaction_host: ReactionHost | None = None
        self.saga_host: SagaHost | None = None
        self.snapshots: LiveSnapshots | None = None
        self.exit_code = 0
        self.liveness: LivenessEndpoint | None = None
        self._stop_worker: Callable[[], None] | None = None
        self.exit_timer: threading.Timer | None = None  # armed when a stop begins
        # Extra (method, path, handler) endpoints behind ENHYDRA_ADMIN_TOKEN (query/http.py).
        self.admin_routes: list[AdminRoute] = [
            ("POST", "/v1/admin/snapshots", self._snapshot_now),
            ("POST", "/v1/admin/leave", self._leave_now),
        ]

    # what the parts ask of the runtime --------------------------------------------------------
    @property
    def bound(self):
        return self.service.bound

    def new_engine(self) -> Engine:
        s = self.service
        return Engine(s.settings, s.bound, policies=s.policies, transient=s.spec.transient_errors)

    async def run_snapshot_hooks(self, phase: str, info: dict[str, Any]) -> None:
        for hook in self.service.spec.snapshot_hooks:
            result = hook(phase, info)
            if inspect.isawaitable(result):
                await result

    def shutdown(
        self, exit_code: int, message: str, *, level: str = "warning", **context: Any
    ) -> None:
        """Stop this instance cleanly with `exit_code` (the first reason given wins)."""
        if self.exit_code == 0:
            self.exit_code = exit_code
        getattr(log, level)(message, exit_code=exit_code, **context)
        if self._stop_worker is not None:
            self._stop_worker()

    async def _snapshot_now(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        """Take a consistent snapshot of the whole application now (returns its id at once).

        Body (optional JSON): {"storage": "<url>"}, which must be ENHYDRA_SNAPSHOT_STORAGE (the
        control plane refuses any other, snapshots/admission.py). Poll
        `enhydra snapshot list` or watch the log for "snapshot written".
        """
        configured = self.settings.snapshot_storage
        storage = body.get("storage") or configured
        if not configured or not isinstance(storage, str):
            reason = "no snapshot storage: set ENHYDRA_SNAPSHOT_STORAGE"
        elif same_storage(storage) != same_storage(configured):
            reason = f"instances write snapshots only to ENHYDRA_SNAPSHOT_STORAGE ({configured})"
        else:
            reason = ""
        if reason:
            return web.json_response({"error": reason, "code": "bad_request"}, status=400)
        if self.snapshots is None:
            return web.json_response(
                {"error": "the worker is starting", "code": "starting"},
                status=503,
                headers={"Retry-After": "1"},
            )
        snapshot_id = new_snapshot_id(self.settings.app_id)
        await self.snapshots.send(SNAPSHOT_CREATE, id=snapshot_id, storage=storage)
        return web.json_response({"id": snapshot_id, "storage": storage}, status=202)

    async def _leave_now(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        """Leave the groups and stop this instance (a scale-down: the others take over at once).

        A plain SIGTERM keeps this instance's static membership for a restart; this does not.
        """
        self.leave_groups()
        asyncio.get_running_loop().call_later(0.2, self.shutdown, 0, "leaving the group over HTTP")
        body = {"status": "leaving", "instance": self.settings.instance_id}
        return web.json_response(body, status=202)

    def task_runners(self) -> list[TaskRunner]:
        """Every task runner of this instance: the aggregate's, projections', reactions', sagas'."""
        runners = [
            self.engine,
            *(self.projection_host.stores().values() if self.projection_host else ()),
            *(self.reaction_host.engines.values() if self.reaction_host else ()),
            *(self.saga_host.runners() if self.saga_host else ()),
        ]
        return [r for r in runners if r is not None]

    def leave_groups(self) -> None:
        """On stop, leave every group at once instead of being expected back."""
        for runner in self.task_runners():
            runner.leave_on_stop = True

    def group_ids(self) -> list[str]:
        """The consumer groups this instance is a member of: the aggregate's and projections'."""
        groups = [self.settings.app_id]
        groups += [p.group_id(self.settings.app_id) for p, _ in self.service.projections]
        groups += [r.group_id(self.settings.app_id) for r in self.service.reactions]
        for saga in self.service.sagas:
            groups.append(saga.group_id(self.settings.app_id))
            groups += [f.group_id(self.settings.app_id) for f in saga.forwarders()]
        return groups

    async def remove_member(self, instance: str, member: str | None) -> bool:
        """Remove a dead peer's static member from every group of the application."""
        groups = self.group_ids()
        conn = self.settings.connection
        results = await remove_static_members(conn, groups[0], {instance: member})
        for group in groups[1:]:  # its member ids there are not known: by instance id
            await remove_static_members(conn, group, [instance])
        error = results.get(instance)
        # Gone already, or a newer incarnation holds the id: nothing left to remove.
        return error is None or isinstance(error, UnknownMemberIdError | FencedInstanceIdError)

    def member_id(self) -> str | None:
        return self.engine.member_id if self.engine is not None else None

    def peers(self) -> dict[str, str]:
        """The other instances' advertised URLs, from the group's last assignment."""
        if self.engine is None:
            return {}
        instances = self.engine.registry.group.instances
        mine = self.settings.instance_id
        return {
            name: info["url"]
            for name, info in instances.items()
            if name != mine and info.get("url")
        }

    # the process -------------------------------------------------------------------------------
    def build(self) -> faust.App:
        """The faust App with this instance's one service attached."""
        s = self.settings
        s.store_dir.mkdir(parents=True, exist_ok=True)
        # A restart on this volume comes back under the same id: the same static member.
        (s.store_dir / INSTANCE_ID_FILE).write_text(s.instance_id + "\n", encoding="utf-8")
        app = _App(
            s.app_id,
            broker=f"kafka://{s.bootstrap_servers}",
            datadir=str(s.store_dir / "faust"),
            web_enabled=True,
            web_host=s.web_host,
            web_port=s.web_port,
            canonical_url=s.advertised_url,
            topic_partitions=s.partitions,
        )
        web_app = build_app(
            lambda: self.engine,
            s.instance_id,
            self.service.aggregate.name,
            projections=lambda: self.projection_host.stores() if self.projection_host else {},
            reactions=lambda: dict(self.reaction_host.engines) if self.reaction_host else {},
            sagas=lambda: self.saga_host.describe() if self.saga_host else {},
            runners=self.task_runners,
            plugins=lambda: [p.describe() for p in self.service.plugins],
            settings=s,
            shutdown=lambda: self.shutdown(0, "shutdown requested over HTTP"),
            admin_routes=self.admin_routes,
            asyncapi=lambda: asyncapi_of(self.service),
        )
        self.liveness = add_liveness_routes(web_app, s.instance_id, member_id=self.member_id)
        app.web_server(_Instance(self, web_app))
        return app

    def run(self) -> int:
        """Run a worker until SIGTERM/SIGINT or a shutdown policy; the exit code."""
        s = self.settings
        app = self.build()
        worker = faust.Worker(app, quiet=True, loglevel=s.log_level.upper(), override_logging=False)
        worker.spinner = None  # it writes terminal escapes into the JSON log stream
        stopping: list[asyncio.Future[None]] = []
        self._stop_worker = lambda: stopping.append(asyncio.ensure_future(worker.stop()))
        try:  # fail in seconds with one line, not inside the worker with a traceback
            asyncio.run(check_access(s.connection))
        except KafkaAccessError as exc:
            log.error(exc.what, **exc.fields())
            return EXIT_CANNOT_START
        missing = missing_secret(s.security_protocol, s.control_key, s.app_id)
        if missing:
            log.error(missing, setting="ENHYDRA_CONTROL_SECRET")
            return EXIT_CANNOT_START
        code = 0
        try:
            worker.execute_from_commandline()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else EXIT_SHUTDOWN_CLIENT
        finally:
            if self.exit_timer is not None:  # the stop ended in time: nothing to end
                self.exit_timer.cancel()
        return self.exit_code or code


class _Instance(ModeService):
    """The web server, then the supervisor: one service faust starts and stops in order."""

    logger = _LIFECYCLE_LOGGER

    def __init__(self, runtime: Runtime, web_app: web.Application, **kw: Any) -> None:
        super().__init__(**kw)
        self.runtime = runtime
        self._web_app = web_app
        self._runner: web.AppRunner | None = None
        self.supervisor = Supervisor(runtime)

    async def on_start(self) -> None:
        s = self.runtime.settings
        self._runner = web.AppRunner(self._web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.web_host, s.web_port, reuse_address=True)
        await site.start()
        log.info("web server listening", host=s.web_host, port=s.web_port)
        try:
            await self.supervisor.start()
        except (KafkaAccessError, TopicError) as exc:
            fields = exc.fields() if isinstance(exc, KafkaAccessError) else {}
            self.runtime.shutdown(EXIT_CANNOT_START, str(exc), level="error", **fields)

    async def on_stop(self) -> None:
        rt = self.runtime
        budget = rt.settings.shutdown_timeout_s
        # The last resort, whatever hangs; cancelled when run() returns in time.
        rt.exit_timer = _exit_after(budget - 1, lambda: rt.exit_code)
        try:  # each part bounds its own steps; this bounds their sum
            await asyncio.wait_for(self.supervisor.stop(), max(1.0, budget - STOP_MARGIN_S))
        except TimeoutError:
            log.warning("stop did not finish in time; going on", seconds=budget - STOP_MARGIN_S)
        if self._runner is not None:
            await self._runner.cleanup()


def _exit_after(seconds: float, exit_code: Callable[[], int]) -> threading.Timer:
    """End the process `seconds` from now if it is still running then.

    An orchestrator kills a process that outlasts its grace period (Kubernetes: 30 s after
    SIGTERM) without a word; this ends it first, saying so. What was not made durable is read
    again by the next owner and skipped where it was already applied.
    """

    def exit_now() -> None:
        log.error("stop took longer than shutdown_timeout_s; exiting now", seconds=seconds)
        logging.shutdown()
        os._exit(exit_code() or EXIT_SHUTDOWN_CLIENT)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True
    timer.start()
    return timer


class Supervisor:
    """Runs the engine under the uncaught-exception policy, and listens to the control topic.

    The engine is replaced, not restarted in place: a fresh one rejoins the group and restores
    from its local checkpoints, so no half-updated in-memory state survives a crash.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        s = runtime.settings
        self.decider = UncaughtDecider(
            runtime.service.spec.on_uncaught_error or s.uncaught_exception_handler,
            RestartBudget(s.max_worker_replacements, s.worker_replacement_window_s),
            UncaughtPolicy(s.uncaught_escalation),
        )
        self.control: ControlChannel | None = None
        self.beacon: Beacon | None = None
        self.detector: FailureDetector | None = None
        self._handling: list[asyncio.Future[None]] = []

    async def start(self) -> None:
        rt = self.runtime
        s = rt.settings
        engine = rt.new_engine()
        engine.on_failure = self._on_failure
        rt.engine = engine
        await engine.start()  # creates the topics, the control topic among them
        self.control = ControlChannel(
            s.connection,
            s.app_id,
            s.instance_id,
            self._on_control,
            secret=s.control_key,
            admit=self._admit,
        )
        if s.control_key is None:
            log.warning(
                "control topic unsigned: anyone who may write it can stop the application",
                topic=self.control.topic,
                hint="set ENHYDRA_CONTROL_SECRET (or _FILE) to the same value on every instance",
            )
        rt.snapshots = LiveSnapshots(rt, self.control.send)
        await self.control.start()
        rt.snapshots.start()
        if s.failure_detection:
            self.beacon = Beacon(self.control.send, member_id=rt.member_id)
            self.beacon.start()
            self.detector = FailureDetector(
                s.instance_id,
                peers=rt.peers,
                on_dead=rt.remove_member,
                config=DetectorConfig(probe_window_s=s.failure_probe_window_ms / 1000),
                headers={"Authorization": f"Bearer {token}"} if (token := s.query_token) else None,
            )
            await self.detector.start()
        if s.snapshot_interval_s:
            self._handling.append(asyncio.ensure_future(rt.snapshots.periodic()))
        rt.projection_host = ProjectionHost(
            s,
            rt.service.projections,
            rt.bound.events_topic,
            transient=rt.service.spec.transient_errors,
            shutdown=rt.shutdown,
            aggregate=rt.bound.aggregate,
        )
        await rt.projection_host.start()
        rt.reaction_host = ReactionHost(
            s,
            rt.service.reactions,
            rt.bound.commands_topic,
            policies=rt.service.policies,
            transient=rt.service.spec.transient_errors,
            shutdown=rt.shutdown,
        )
        await rt.reaction_host.start()
        rt.saga_host = SagaHost(
            s,
            rt.service.sagas,
            rt.bound.commands_topic,
            policies=rt.service.policies,
            transient=rt.service.spec.transient_errors,
            shutdown=rt.shutdown,
        )
        await rt.saga_host.start()
        settle_heap()

    async def stop(self) -> None:
        rt = self.runtime
        if rt.liveness is not None:  # peers: a clean stop, expected back (not a death)
            leaving = rt.engine is not None and rt.engine.leave_on_stop
            await rt.liveness.goodbye("leave" if leaving else "restart")
        for part in (self.detector, self.beacon):
            if part is not None:
                await part.stop()
        for pending in self._handling:
            pending.cancel()
        if rt.saga_host is not None:
            await rt.saga_host.stop()
        if rt.reaction_host is not None:
            await rt.reaction_host.stop()
        if rt.projection_host is not None:
            await rt.projection_host.stop()
        if rt.snapshots is not None:
            await rt.snapshots.stop()
        if rt.engine is not None:
            await rt.engine.stop()
        if self.control is not None:
            await self.control.stop()

    def _on_failure(self, error: BaseException) -> None:
        self._handling.append(asyncio.ensure_future(self._handle(error)))

    async def _handle(self, error: BaseException) -> None:
        rt = self.runtime
        if isinstance(error, FencedInstance):  # replacing the worker would fence the other
            rt.shutdown(EXIT_CANNOT_START, str(error), level="error")
            return
        policy = self.decider.decide(error)
        log.error(
            "stream worker died",
            error=f"{type(error).__name__}: {error}",
            policy=policy.upper(),
            replacements=self.decider.budget.used,
            max_replacements=self.decider.budget.max_restarts,
        )
        if policy is UncaughtPolicy.REPLACE_WORKER:
            old = rt.engine
            if old is not None:
                await old.stop()
            engine = rt.new_engine()
            engine.on_failure = self._on_failure
            rt.engine = engine
            await engine.start()
            log.warning("stream worker replaced", replacements=self.decider.budget.used)
            return
        if policy is UncaughtPolicy.SHUTDOWN_APPLICATION:
            assert self.control is not None
            await self.control.send(SHUTDOWN_APPLICATION, reason=f"{type(error).__name__}: {error}")
            rt.shutdown(EXIT_SHUTDOWN_APPLICATION, "shutting down the whole application")
            return
        rt.shutdown(EXIT_SHUTDOWN_CLIENT, "shutting down this instance")

    def _admit(self, message: dict[str, Any]) -> str | None:
        """Why a signed control message must not act here (snapshots/admission.py), or None."""
        s = self.runtime.settings
        reason = refusal(
            message,
            app_id=s.app_id,
            storage=s.snapshot_storage,
            position=self._position,
            now=time.time(),
        )
        if reason and message.get("type") == SNAPSHOT_CREATE:
            self._refuse_snapshot(message, reason)
        return reason

    def _refuse_snapshot(self, message: dict[str, Any], reason: str) -> None:
        """Answer a refused snapshot_create, once (the coordinator): its asker waits for one."""
        snapshots, s = self.runtime.snapshots, self.runtime.settings
        if snapshots is None or not snapshots.is_coordinator:
            return
        error = f"refused: {reason}"
        if reason == "storage_not_configured":
            error += f" (instances write only to ENHYDRA_SNAPSHOT_STORAGE={s.snapshot_storage!r})"
        answer = snapshots.send(SNAPSHOT_DONE, id=str(message.get("id")), error=error)
        self._handling.append(asyncio.ensure_future(answer))

    def _position(self, partition: int) -> int | None:
        """The next input offset of `partition` when this instance serves it, else None."""
        engine = self.runtime.engine
        access = engine.registry.access(partition) if engine is not None else None
        if access is None or access.verdict is not Verdict.SERVE or access.store is None:
            return None
        return access.store.input_offset + 1

    async def _on_control(self, message: dict[str, Any]) -> None:
        rt = self.runtime
        if self.detector is not None:
            await self.detector.on_control_message(message)
        if rt.snapshots is not None:
            await rt.snapshots.on_message(message)
        if message.get("type") == SHUTDOWN_APPLICATION:
            rt.shutdown(
                EXIT_SHUTDOWN_APPLICATION,
                "application shutdown requested",
                requested_by=message.get("origin"),
                reason=message.get("reason"),
            )
