"""A small threaded HTTP/1.1 server on 127.0.0.1 that the fakes build on.

Real sockets, real HTTP: the clients under test (the official SDKs, httpx) cannot tell it from a
real service. Each fake answers requests through ``respond``; this base adds the misbehaviour
tests need: a slow answer, a connection closed without an answer, a TCP reset, and an answer
that trickles (its headers, or its body, a byte at a time; or a body that never ends), which
stops, and is noted in ``hangups``, when the client hangs up.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Answer:
    """What to do with a request: answer (after ``delay``), close silently, or reset."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False  # close the connection without any answer
    reset: bool = False  # send a TCP RST instead of an answer
    #: "headers": the status line and headers a byte at a time, then the body; "body": the
    #: headers at once, then the body a byte at a time; "endless": the headers at once, then a
    #: chunked body that never ends. One piece every ``pace`` seconds.
    trickle: str = ""
    pace: float = 1.0


@dataclass(frozen=True)
class Hangup:
    """A client that hung up on a trickling answer: when the server found out (monotonic
    time), and how many bytes of the answer it had sent by then."""

    at: float
    sent: int


class LoopbackServer:
    """Subclasses implement ``respond(received) -> Answer``."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.hangups: list[Hangup] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                got = Received(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with fake._lock:
                    fake.received.append(got)
                answer = fake.respond(got)
                if answer.delay:
                    time.sleep(answer.delay)
                if answer.reset:
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.close_connection = True
                    self.connection.close()
                    return
                if answer.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if isinstance(answer.body, bytes | str):
                    data = answer.body.encode() if isinstance(answer.body, str) else answer.body
                    ctype = "text/plain"
                else:
                    data = json.dumps(answer.body).encode() if answer.body is not None else b""
                    ctype = "application/json"
                if answer.trickle:
                    self.close_connection = True
                    fake._trickle(self.connection, answer, data, ctype)
                    return
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in answer.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    self.close_connection = True  # the client gave up waiting

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def respond(self, received: Received) -> Answer:
        raise NotImplementedError

    def _trickle(self, conn: socket.socket, answer: Answer, data: bytes, ctype: str) -> None:
        """Send ``answer`` as it says, a piece every ``pace`` seconds, until it is all sent or
        the client hangs up (noted in ``hangups``)."""
        endless = answer.trickle == "endless"
        length = "Transfer-Encoding: chunked" if endless else f"Content-Length: {len(data)}"
        head = (
            f"HTTP/1.1 {answer.status} OK\r\nContent-Type: {ctype}\r\n{length}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        sent = 0

        def pieces() -> Any:
            if answer.trickle == "headers":
                yield from (head[i : i + 1] for i in range(len(head)))
                yield data
            elif answer.trickle == "body":
                yield head
                yield from (data[i : i + 1] for i in range(len(data)))
            else:
                yield head
                while True:
                    yield b"1\r\n \r\n"

        try:
            for number, piece in enumerate(pieces()):
                if number:
                    time.sleep(answer.pace)
                conn.sendall(piece)
                sent += len(piece)
            # All sent: wait for the client to read it and go (or to hang up early).
            conn.settimeout(30)
            conn.recv(1)
        except OSError:
            with self._lock:
                self.hangups.append(Hangup(time.monotonic(), sent))

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
