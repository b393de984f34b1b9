"""The orders service: the orders aggregate, reactions to stock's and payments' events, and
the checkout saga (orders unpaid in time are cancelled).

The values here are defaults: every ENHYDRA_* environment variable overrides them.
"""

from enhydra import Service

from orders.domain import orders
from orders.reactions import reactions

service = Service(
    "orders",
    orders,
    partitions=4,
    web_port=6066,
    deserialization_exception_handler="dlq",
    processing_exception_handler="dlq",
    reactions=reactions(),
)


# Sagas added by `enhydra generate saga`: one module each in orders/sagas/.
from orders.sagas import SAGAS  # noqa: E402

service.sagas.extend(SAGAS)
