"""Tools the operator's unit tests name in manifests (``support.operator_tools:...``): the step
pods of those tests run in the test's process, so what the tools did is counted here."""

from __future__ import annotations

import threading
from typing import Any

from keelgate.errors import ToolError

_lock = threading.Lock()
#: Every order that really went out: (idempotency key, arguments).
ORDERS: list[tuple[str | None, dict[str, Any]]] = []


def place_order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """A WRITE that takes effect."""
    with _lock:
        ORDERS.append((idempotency_key, dict(args)))
    return {"order": f"o-{len(ORDERS)}"}


def lost_write(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """A WRITE whose connection drops after sending: nobody knows whether it took effect."""
    with _lock:
        ORDERS.append((idempotency_key, dict(args)))
    raise ConnectionResetError("connection reset after the request was sent")


#: Set: the order ``refused_late`` holds is answered, with a refusal.
ANSWER = threading.Event()
#: Every call ``refused_late`` got, by idempotency key.
CALLS: list[str | None] = []


def refused_late(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """A WRITE whose first call outlives its time limit and is answered, once ``ANSWER`` is
    set, with a refusal (nothing happened); every later call takes effect."""
    with _lock:
        first = not CALLS
        CALLS.append(idempotency_key)
    if first:
        ANSWER.wait(30)
        raise ToolError("out of stock")
    return place_order(args, idempotency_key=idempotency_key)


class OrderBook:
    """A confirmer (``--confirmer support.operator_tools:OrderBook``): asks the system of record,
    here the orders that went out, whether a WRITE with that key took effect."""

    name = "order-book"

    def confirm(self, tenant: str, run: str, action: Any, args: dict[str, Any]) -> bool | None:
        with _lock:
            return any(key == action.idempotency_key for key, _ in ORDERS)


#: Set: the order ``held_order`` holds returns (the paused step pod thaws).
THAW = threading.Event()


def held_order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """A WRITE that takes effect at once, and whose caller is then held (a paused process, its
    answer not yet recorded) until ``THAW`` is set."""
    placed = place_order(args, idempotency_key=idempotency_key)
    THAW.wait(30)
    return placed
