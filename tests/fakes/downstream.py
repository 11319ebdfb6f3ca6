"""A downstream shop service on loopback that counts what really arrived, by Idempotency-Key.

``GET /items/{sku}`` reads stock; ``POST /orders`` places an order and counts it under the
request's Idempotency-Key; ``GET /orders/{key}`` tells how many orders arrived with that key (what
a person or a confirmer would ask the system of record). ``mode`` makes ``POST /orders``
misbehave after the order was taken: ``slow`` (answer after ``delay``), ``reset`` (TCP reset
instead of an answer), ``error`` (HTTP 503), ``reject`` before taking it (HTTP 422), or trickle
its answer (``trickle``: ``headers``, ``body`` or ``endless``, a piece every ``pace`` seconds).
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import unquote

from fakes.loopback import Answer, LoopbackServer, Received


class Shop(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.orders: Counter[str] = Counter()
        self.mode = "ok"
        self.delay = 2.0
        self.trickle = ""
        self.pace = 1.0

    def order_requests(self) -> list[Received]:
        return [r for r in self.received if r.method == "POST" and r.path == "/orders"]

    def respond(self, received: Received) -> Answer:
        if received.method == "GET" and received.path.startswith("/items/"):
            sku = unquote(received.path.removeprefix("/items/"))
            if sku == "missing":
                return Answer(404, {"error": "no such item"})
            return Answer(200, {"sku": sku, "count": 3})
        if received.method == "GET" and received.path.startswith("/orders/"):
            key = unquote(received.path.removeprefix("/orders/"))
            return Answer(200, {"key": key, "orders": self.orders[key]})
        if received.method == "POST" and received.path == "/orders":
            if self.mode == "reject":
                return Answer(422, {"error": "qty must be positive"})
            key = received.headers.get("idempotency-key", "")
            self.orders[key] += 1  # the order is taken before anything can go wrong
            if self.trickle:
                return Answer(201, {"placed": True}, trickle=self.trickle, pace=self.pace)
            if self.mode == "slow":
                return Answer(201, {"placed": True}, delay=self.delay)
            if self.mode == "reset":
                return Answer(reset=True)
            if self.mode == "error":
                return Answer(503, "upstream database unavailable")
            return Answer(201, {"placed": True, "key": key})
        return Answer(404, {"error": "no route"})


class Payments(LoopbackServer):
    """A payment service: ``POST /charge`` charges a card and ``POST /notify`` sends the
    receipt, each counted under the request's Idempotency-Key and never deduplicated (a second
    charge under one key must show as two); ``GET /charges/{key}`` is what a person or a
    confirmer asks: how many charges arrived under that key. ``declines`` makes ``/charge``
    answer 402 without charging, ``refuses_receipts`` makes ``/notify`` answer 422 without
    sending: definite refusals that changed nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.charges: Counter[str] = Counter()
        self.receipts: Counter[str] = Counter()
        self.declines = False
        self.refuses_receipts = False

    def respond(self, received: Received) -> Answer:
        key = received.headers.get("idempotency-key", "")
        if received.method == "POST" and received.path == "/charge":
            if self.declines:
                return Answer(402, {"error": "card declined"})
            self.charges[key] += 1
            return Answer(201, {"charged": True})
        if received.method == "POST" and received.path == "/notify":
            if self.refuses_receipts:
                return Answer(422, {"error": "no such address"})
            self.receipts[key] += 1
            return Answer(201, {"sent": True})
        if received.method == "GET" and received.path.startswith("/charges/"):
            asked = unquote(received.path.removeprefix("/charges/"))
            return Answer(200, {"key": asked, "charges": self.charges[asked]})
        return Answer(404, {"error": "no route"})
