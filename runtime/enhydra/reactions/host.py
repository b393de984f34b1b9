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
            engine.on_failure = self._failed(reaction.name)
            self.engines[reaction.name] = engine
            await engine.start()

    def _failed(self, name: str) -> Callable[[BaseException], Any]:
        def on_failure(error: BaseException) -> None:
            self.shutdown(
                EXIT_SHUTDOWN_CLIENT,
                "reaction failed; shutting down this instance",
                reaction=name,
                error=f"{type(error).__name__}: {error}",
            )

        return on_failure

    async def stop(self) -> None:
        for engine in self.engines.values():
            await engine.stop()
