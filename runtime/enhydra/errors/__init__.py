"""Error handling: record-level policies, the dead-letter queue, uncaught-exception policies."""

from enhydra.errors.policies import ErrorAction, ErrorPolicies, UncaughtPolicy

__all__ = ["ErrorAction", "ErrorPolicies", "UncaughtPolicy"]
