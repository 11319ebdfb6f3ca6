"""A downstream shop on loopback that counts what really arrived, by Idempotency-Key.

Why it exists: the e2e tests and `make demo` prove "a WRITE never runs twice" where it matters,
at the system the WRITE changes. Step pods call it over HTTP: `GET /items/{sku}` reads stock,
`POST /orders` takes an order and books it under the request's `Idempotency-Key` header,
`GET /orders` lists every order taken, `GET /orders/{key}` counts one key's orders (what a
person checks before settling a Reconciliation), `GET /confirm/{key}` answers a confirmer
(`{"executed": true|false}`). It never deduplicates on its own: only Keelgate
keeps an order from being placed twice. `python -m keelgate_e2e.shop --port P` serves it alone.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote


class Shop:
    """The order book; `book` (a file) makes it survive the process, for the demo."""

    def __init__(self, book: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.orders: list[dict[str, Any]] = []
        self.book = book
        self.delay = 0.0  # seconds to wait after taking an order, before answering
        # Seconds to hold an order request and then drop it untaken, unanswered: a request lost
        # on its way (a proxy that died), so the caller cannot know and nothing happened.
        self.swallow = 0.0
        self.swallowed = 0
        if book is not None and book.exists():
            self.orders = [json.loads(x) for x in book.read_text().splitlines() if x.strip()]

    def take(self, key: str, body: Any, traceparent: str = "") -> dict[str, Any]:
        with self.lock:
            order = {"number": len(self.orders) + 1, "key": key, "at": time.time(), "body": body}
            if traceparent:  # the caller's span, when its run is traced
                order["traceparent"] = traceparent
            self.orders.append(order)
            if self.book is not None:
                with self.book.open("a") as out:
                    out.write(json.dumps(order) + "\n")
        return order

    def by_key(self) -> Counter[str]:
        with self.lock:
            return Counter(order["key"] for order in self.orders)

    def count(self) -> int:
        with self.lock:
            return len(self.orders)


class ShopServer:
    def __init__(self, shop: Shop | None = None, port: int = 0) -> None:
        self.shop = shop or Shop()
        shop_ = self.shop

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                return

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path.startswith("/items/"):
                    self._send(200, {"sku": unquote(path[len("/items/") :]), "count": 3})
                elif path == "/orders":
                    with shop_.lock:
                        self._send(200, {"orders": list(shop_.orders)})
                elif path.startswith("/confirm/"):
                    # What a confirmer asks: did an order under this key arrive?
                    key = unquote(path[len("/confirm/") :])
                    self._send(200, {"executed": shop_.by_key()[key] > 0})
                elif path.startswith("/orders/"):
                    key = unquote(path[len("/orders/") :])
                    self._send(200, {"key": key, "orders": shop_.by_key()[key]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                if self.path.split("?", 1)[0] != "/orders":
                    self._send(404, {"error": "not found"})
                    return
                if shop_.swallow:
                    time.sleep(shop_.swallow)
                    with shop_.lock:
                        shop_.swallowed += 1
                    self.close_connection = True
                    return
                order = shop_.take(
                    self.headers.get("Idempotency-Key", ""),
                    json.loads(raw),
                    self.headers.get("traceparent", ""),
                )
                if shop_.delay:
                    time.sleep(shop_.delay)
                self._send(201, {"order": order["number"]})

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ShopServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keelgate_e2e.shop", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--book", type=Path, default=None, help="order book file (kept)")
    args = parser.parse_args(argv)
    server = ShopServer(Shop(args.book), args.port)
    print(f"shop on {server.url}", flush=True)
    server.server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
