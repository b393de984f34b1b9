"""The checkout saga: an order still pending UNPAID_AFTER_S seconds after it was placed is
cancelled.

Added by `enhydra generate saga checkout`, then filled in.

It reads this service's own events (correlation id: the order id, their key): `placed`
schedules the deadline `unpaid`, whose command is `cancel {order, reason: unpaid}`;
`confirmed`, `rejected` or `cancelled` settle the order and end the saga, which cancels the
deadline. So only an order that nobody answered in time is cancelled, once: a deadline fired
twice around a crash sends the same command id (`checkout:<order>:deadline:unpaid:1`) and the
aggregate skips the copy. Stock releases a cancelled order's items (stock's reaction to
`cancelled`); a payment captured after the cancel is ignored by orders (README, "the flow").

The deadline lives in the saga's changelog-backed store: it survives restarts, kill -9 and
failover (docs/sagas.md). `correlate` and `handle` are pure.
"""

from __future__ import annotations

import os
from typing import Any

from enhydra.sagas import Deadline, Emit, Saga, Upstream

from orders.domain import Cancel, Cancelled, Confirmed, Placed, Rejected
from orders.upstreams import app_id

DEFAULT_UNPAID_AFTER_S = 15 * 60.0
SETTING = "SHOP_UNPAID_AFTER_S"


def unpaid_after(environ: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """Seconds an order may stay unpaid (SHOP_UNPAID_AFTER_S; 15 minutes when unset)."""
    raw = environ.get(SETTING, "")
    if not raw:
        return DEFAULT_UNPAID_AFTER_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{SETTING}={raw!r}: give a number of seconds above 0, e.g. 900")
    return seconds


try:
    UNPAID_AFTER_S = unpaid_after()
except ValueError as bad:  # one plain line, however the service is started
    raise SystemExit(f"orders: {bad}") from None


def correlate(upstream: Upstream) -> str | None:
    """Orders' events are keyed by order id: the key is the correlation id."""
    return upstream.key


def handle(state: dict[str, Any] | None, upstream: Upstream):
    """(new state or None to end the saga, commands to send now, deadlines to set or cancel).

    Ending the saga cancels its pending deadline, so a settled order is never cancelled.
    """
    order = upstream.key or ""
    if isinstance(upstream.event, Placed):
        cancel = Emit(order, Cancel(order, "unpaid"))
        return {"placed": True}, [], [Deadline("unpaid", UNPAID_AFTER_S, cancel)]
    return None, [], []  # confirmed, rejected or cancelled: settled


saga = Saga(
    "checkout",
    {app_id("orders"): [Placed, Confirmed, Rejected, Cancelled]},
    correlate,
    handle,
    description="Cancels an order still pending UNPAID_AFTER_S seconds after it was placed.",
)
