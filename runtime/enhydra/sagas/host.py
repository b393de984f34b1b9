"""Runs a service's sagas beside its aggregate's engine: per saga, its engine and forwarders.

The saga's engine starts first (it creates the inbox), then one forwarder per source: a
reaction (reactions/engine.py) whose commands topic is the inbox, so forwarding has the
reactions' commit unit, error policies and ids derived from the upstream position.
"""

from __future__ import annotations

from collections.abc import Sequence

from enhydra.errors.policies import ErrorPolicies
from enhydra.reactions.engine import ReactionEngine
from enhydra.reactions.host import Shutdown, stop_instance
from enhydra.runner.runner import TaskRunner
from enhydra.sagas.engine import SagaEngine
from enhydra.sagas.model import Saga
from enhydra.settings import Settings


def saga_engines(
    settings: Settings,
    saga: Saga,
    commands_topic: str,
    *,
    policies: ErrorPolicies,
    transient: tuple[type[BaseException], ...] = (),
) -> tuple[SagaEngine, list[ReactionEngine]]:
    """The saga's engine and its forwarders (nothing starts)."""
    engine = SagaEngine(settings, saga, commands_topic, policies=policies, transient=transient)
    inbox = saga.inbox_topic(settings.app_id)
    forwarders = [
        ReactionEngine(settings, reaction, inbox, policies=policies, transient=transient)
        for reaction in saga.forwarders()
    ]
    return engine, forwarders


class SagaHost:
    """Starts every saga's engines; a failing one stops the instance (as a reaction's does)."""

    def __init__(
        self,
        settings: Settings,
        sagas: Sequence[Saga],
        commands_topic: str,
        *,
        policies: ErrorPolicies,
        transient: tuple[type[BaseException], ...] = (),
        shutdown: Shutdown,
    ) -> None:
        self.settings = settings
        self.sagas = sagas
        self.commands_topic = commands_topic
        self.policies = policies
        self.transient = transient
        self.shutdown = shutdown
        self.engines: dict[str, SagaEngine] = {}
        self.forwarders: dict[str, list[ReactionEngine]] = {}

    def runners(self) -> list[TaskRunner]:
        return [*self.engines.values(), *(f for fs in self.forwarders.values() for f in fs)]

    async def start(self) -> None:
        for saga in self.sagas:
            engine, forwarders = saga_engines(
                self.settings,
                saga,
                self.commands_topic,
                policies=self.policies,
                transient=self.transient,
            )
            self.engines[saga.name] = engine
            self.forwarders[saga.name] = forwarders
            for runner in (engine, *forwarders):
                runner.on_failure = stop_instance(self.shutdown, saga=saga.name)
                await runner.start()

    async def stop(self) -> None:
        for runner in reversed(self.runners()):
            await runner.stop()

    def describe(self) -> dict[str, dict[str, object]]:
        """Per saga: its engine's description and its forwarders' progress."""
        described = {}
        for name, engine in self.engines.items():
            info = engine.describe()
            info["forwarders"] = {
                f.reaction.source: {
                    "processed": f.stats["processed"],
                    "commands": f.stats["commands"],
                    "lag": sum(f.input_lag().values()),
                    "failures": f.failures,
                }
                for f in self.forwarders.get(name, ())
            }
            described[name] = info
        return described
