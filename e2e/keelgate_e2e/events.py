"""A CloudEvents receiver on loopback for the e2e suite: where the operator's notification sinks
point (the operator's pod shares the host's network, so 127.0.0.1 reaches it).

Why it exists: what the operator tells is checked as a receiver reads it, with the CloudEvents
SDK, never by reading the operator's logs. It must never accept what the SDK cannot read as a
CloudEvent (kept as a failure instead).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat


def data(event: BaseCloudEvent) -> dict[str, Any]:
    """An event's data, which the operator always sends as a JSON object."""
    found = event.get_data()
    assert isinstance(found, dict), found
    return found


class Receiver:
    """A CloudEvents receiver on 127.0.0.1 (the operator's pod shares the host's network): it
    refuses its first request with 503 (a receiver restarting), then accepts, parsing each
    request with the SDK; a request it cannot parse is kept as a failure."""

    def __init__(self) -> None:
        self.events: list[tuple[BaseCloudEvent, dict[str, str], bytes]] = []
        self.unreadable: list[str] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._lock:
                    receiver.requests += 1
                    first = receiver.requests == 1
                status = 503 if first else receiver.accept(headers, body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/events"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def accept(self, headers: dict[str, str], body: bytes) -> int:
        try:
            event = from_http(HTTPMessage(headers, body), JSONFormat())
        except Exception as error:
            with self._lock:
                self.unreadable.append(f"{type(error).__name__}: {error}")
            return 400
        with self._lock:
            self.events.append((event, headers, body))
        return 202

    def of(self, namespace: str) -> list[tuple[BaseCloudEvent, dict[str, str], bytes]]:
        with self._lock:
            return [e for e in self.events if data(e[0]).get("namespace") == namespace]

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
