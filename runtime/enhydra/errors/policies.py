"""What happens to a record that fails, and to a worker that crashes: policies as plain data.

Names follow Kafka Streams so users arriving from it know them:

- deserialization errors (not JSON, wrong fields or types, unknown command type):
  LOG_AND_CONTINUE, LOG_AND_FAIL or DLQ;
- processing errors (an exception in decide/apply; a Rejection is an answer, not an error):
  DLQ or FAIL, after retrying the user's transient exception types until task_timeout;
- production errors (an output that cannot be serialized or is too large): FAIL, CONTINUE or
  DLQ. The failed command's effects are dropped whole: its state change is never persisted
  without its events.

A user callable may decide instead of a fixed policy: it receives the Failure and returns one
of the allowed policies for that stage.

Later records of the same key are processed normally after a record is dead-lettered or
skipped: the key's state is as if the failed record never came.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from enhydra.errors.failure import Failure, Stage


class ErrorAction(StrEnum):
    LOG_AND_CONTINUE = "log_and_continue"
    LOG_AND_FAIL = "log_and_fail"
    DLQ = "dlq"
    FAIL = "fail"
    CONTINUE = "continue"


class UncaughtPolicy(StrEnum):
    REPLACE_WORKER = "replace_worker"
    SHUTDOWN_CLIENT = "shutdown_client"
    SHUTDOWN_APPLICATION = "shutdown_application"


ALLOWED: dict[Stage, frozenset[ErrorAction]] = {
    Stage.DESERIALIZE: frozenset(
        {ErrorAction.LOG_AND_CONTINUE, ErrorAction.LOG_AND_FAIL, ErrorAction.DLQ}
    ),
    Stage.PROCESS: frozenset({ErrorAction.DLQ, ErrorAction.FAIL}),
    Stage.PRODUCE: frozenset({ErrorAction.FAIL, ErrorAction.CONTINUE, ErrorAction.DLQ}),
}

Handler = ErrorAction | str | Callable[[Failure], ErrorAction | str]


class PolicyError(ValueError):
    """A handler returned a policy that does not exist for its stage."""


def resolve(stage: Stage, handler: Handler, failure: Failure) -> ErrorAction:
    """The action for one failure: the fixed policy, or what the user's callable says."""
    choice = handler(failure) if callable(handler) else handler
    try:
        action = ErrorAction(str(choice).lower())
    except ValueError:
        action = None
    if action is None or action not in ALLOWED[stage]:
        allowed = ", ".join(sorted(a.upper() for a in ALLOWED[stage]))
        raise PolicyError(f"{stage} error handler returned {choice!r}; allowed: {allowed}")
    return action


def fails(action: ErrorAction) -> bool:
    return action in (ErrorAction.LOG_AND_FAIL, ErrorAction.FAIL)


@dataclass(frozen=True)
class ErrorPolicies:
    """The three record-level handlers of a service."""

    deserialization: Handler = ErrorAction.LOG_AND_FAIL
    processing: Handler = ErrorAction.FAIL
    production: Handler = ErrorAction.FAIL

    def action(self, failure: Failure) -> ErrorAction:
        handler = {
            Stage.DESERIALIZE: self.deserialization,
            Stage.PROCESS: self.processing,
            Stage.PRODUCE: self.production,
        }[failure.stage]
        return resolve(failure.stage, handler, failure)

    def uses_dlq(self) -> bool:
        """Whether the DLQ topic must exist (a callable may choose DLQ at any time)."""
        return any(callable(h) or str(h).lower() == ErrorAction.DLQ for h in self.handlers())

    def handlers(self) -> tuple[Handler, Handler, Handler]:
        return (self.deserialization, self.processing, self.production)


class RecordFailed(RuntimeError):
    """A record failed and its policy says stop: the uncaught-exception policy takes over."""

    def __init__(self, failure: Failure, topic: str, partition: int) -> None:
        self.failure = failure
        super().__init__(
            f"{failure.stage} error at {topic}[{partition}]@{failure.record.offset}: "
            f"{type(failure.error).__name__}: {failure.error}"
        )
