"""Runs a service's reactions beside its aggregate's engine, one engine per reaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from enhydra.errors.policies import ErrorPolicies
from enhydra.errors.uncaught import EXIT_SHUTDOWN_CLIENT
from enhydra.reactions.engine import ReactionEngine
from enhydra.reactions.model import Reaction
from enhydra.settings import Settings

Shutdown = Callable[..., None]  # (exit_code, message, **context): stop this instance


def stop_instance(shutdown: Shutdown, **what: str) -> Callable[[BaseException], Any]:
    """An engine's on_failure that stops this instance, naming what failed (reaction=...,
    saga=...): a failed engine must not leave the service looking healthy."""
    kind = next(iter(what), "engine")

    def on_failure(error: BaseException) -> None:
        shutdown(
            EXIT_SHUTDOWN_CLIENT,
            f"{kind} failed; shutting down this instance",
            **what,
            error=f"{type(error).__name__}: {error}",
        )

    return on_failure


class ReactionHost:
    """Starts one engine per reaction; a failing reaction stops the instance.

    A reaction that silently stopped would leave the upstream's events unanswered while the
    service looked healthy, so a failure (a FAIL policy, an error past task_timeout) stops the
    instance with 1, as a failing aggregate engine or projection does.
    """

    def __init__(
        self,
        settings: Settings,
        reactions: Sequence[Reaction],
        commands_topic: str,
        *,
        policies: ErrorPolicies,
        transient: tuple[type[BaseException], ...] = (),
        shutdown: Shutdown,
    ) -> None:
        self.settings = settings
        self.reactions = reactions
        self.commands_topic = commands_topic
        self.policies = policies
        self.transient = transient
        self.shutdown = shutdown
        self.engines: dict[str, ReactionEngine] = {}

    async def start(self) -> None:
        for reaction in self.reactions:
            engine = ReactionEngine(
                self.settings,
                reaction,
                self.commands_topic,
                policies=self.policies,
                transient=self.transient,
            )
            engine.on_failure = stop_instance(self.shutdown, reaction=reaction.name)
            self.engines[reaction.name] = engine
            await engine.start()

    async def stop(self) -> None:
        for engine in self.engines.values():
            await engine.stop()
