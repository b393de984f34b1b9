"""The stock service: the items aggregate, and a reaction to orders' events.

The values here are defaults: every ENHYDRA_* environment variable overrides them.
"""

from enhydra import Service

from stock.domain import items
from stock.reactions import reactions

service = Service(
    "stock",
    items,
    partitions=4,
    web_port=6066,
    deserialization_exception_handler="dlq",
    processing_exception_handler="dlq",
    reactions=reactions(),
)
