"""The payments service: the payments aggregate, and a reaction to stock's events.

The values here are defaults: every ENHYDRA_* environment variable overrides them.
"""

from enhydra import Service

from payments.domain import payments
from payments.reactions import reactions

service = Service(
    "payments",
    payments,
    partitions=4,
    web_port=6066,
    deserialization_exception_handler="dlq",
    processing_exception_handler="dlq",
    reactions=reactions(),
)
