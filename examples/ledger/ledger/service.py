"""The service: the accounts aggregate with Enhydra's runtime around it.

The values here are defaults: every ENHYDRA_* environment variable overrides them, so the same
code runs on a laptop, in compose and in Kubernetes.
"""

from enhydra import Service

from ledger.domain import accounts

service = Service(
    "ledger",
    accounts,
    partitions=4,
    web_port=6066,
    # a warm copy of every task on another instance: failover without a full restore
    num_standby_replicas=1,
    # malformed commands and failing handlers go to the dead-letter queue, not into the void
    deserialization_exception_handler="dlq",
    processing_exception_handler="dlq",
    # a crashed stream worker is replaced at most 3 times in 5 minutes, then the instance stops
    uncaught_exception_handler="replace_worker",
    max_worker_replacements=3,
    worker_replacement_window_s=300,
)
