"""Container log files, and the kubelet's HTTPS log endpoint that `kubectl logs` reaches.

Why it exists: `kubectl logs` asks the API server, which calls the kubelet's
`/containerLogs/{namespace}/{pod}/{container}` over TLS with its kubelet-client certificate. The
agent writes each container run's output to a file in the CRI log format (`<RFC3339Nano time>
<stream> <F|P> <text>`) and serves it with `follow`, `previous`, `tailLines`, `limitBytes`,
`sinceSeconds`, `sinceTime` and `timestamps`, as the kubelet does.

It must never serve a request whose client certificate is not the API server's kubelet client
(issued by the cluster CA with the configured common name), and never listen beyond 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO
from urllib.parse import parse_qs, unquote, urlparse

_FRACTION = re.compile(r"^([^.]+)\.(\d+)(.*)$")


def rfc3339nano(ts: float | None = None) -> str:
    """Time as the CRI log format writes it: UTC with nanosecond digits."""
    now = dt.datetime.fromtimestamp(time.time() if ts is None else ts, dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def _parse_time(text: str) -> dt.datetime:
    """Parse RFC 3339 with up to nanosecond digits (Python keeps microseconds); naive is UTC."""
    match = _FRACTION.match(text.strip())
    if match is not None:  # Python's parser wants at most 6 fractional digits
        text = f"{match.group(1)}.{match.group(2)[:6]}{match.group(3)}"
    parsed = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def pump(stream: IO[bytes], log: Path, stream_name: str = "stdout") -> None:
    """Copy `stream` into `log` line by line in CRI format until EOF (runs in its own thread)."""
    with log.open("ab", buffering=0) as out:
        for raw in iter(stream.readline, b""):
            partial = not raw.endswith(b"\n")
            text = raw[:-1] if not partial else raw
            tag = b"P" if partial else b"F"
            out.write(
                rfc3339nano().encode()
                + b" "
                + stream_name.encode()
                + b" "
                + tag
                + b" "
                + text
                + b"\n"
            )
    stream.close()


@dataclass(frozen=True)
class Entry:
    """One decoded log line."""

    time: str
    text: bytes
    partial: bool


def read_entries(log: Path, offset: int = 0) -> tuple[list[Entry], int]:
    """Decode complete lines of `log` from byte `offset`; return them and the next offset."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    entries: list[Entry] = []
    consumed = 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # half-written; pick it up next time
        consumed += len(line)
        parts = line[:-1].split(b" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else b""
        entries.append(Entry(parts[0].decode(), text, parts[2] == b"P"))
    return entries, offset + consumed


@dataclass(frozen=True)
class LogQuery:
    """The kubelet's container-log options."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since: dt.datetime | None = None

    @classmethod
    def from_query(cls, query: str) -> LogQuery:
        """Parse the query string the API server forwards."""
        q = {k: v[-1] for k, v in parse_qs(query).items()}

        def flag(name: str) -> bool:
            return q.get(name, "false").lower() in ("true", "1")

        since: dt.datetime | None = None
        if "sinceTime" in q:
            since = _parse_time(q["sinceTime"])
        elif "sinceSeconds" in q:
            since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=int(q["sinceSeconds"]))
        return cls(
            follow=flag("follow"),
            previous=flag("previous"),
            timestamps=flag("timestamps"),
            tail_lines=int(q["tailLines"]) if "tailLines" in q else None,
            limit_bytes=int(q["limitBytes"]) if "limitBytes" in q else None,
            since=since,
        )


def render(entries: list[Entry], query: LogQuery) -> Iterator[bytes]:
    """Format entries for output, honouring since and timestamps (tail is applied by caller)."""
    for entry in entries:
        if query.since is not None and _parse_time(entry.time) < query.since:
            continue
        prefix = entry.time.encode() + b" " if query.timestamps else b""
        yield prefix + entry.text + (b"" if entry.partial else b"\n")


@dataclass(frozen=True)
class LogSource:
    """Where a container's log is and whether more may still be written to it."""

    path: Path
    still_writing: Callable[[], bool]


#: Resolves (namespace, pod, container, previous) to a log, or an error message for a 404.
Resolver = Callable[[str, str, str, bool], LogSource | str]


def stream_log(source: LogSource, query: LogQuery, write: Callable[[bytes], None]) -> None:
    """Write the log of `source` per `query`, following it while it is still being written."""
    budget = query.limit_bytes

    def emit(chunk: bytes) -> bool:
        nonlocal budget
        if budget is not None:
            chunk = chunk[:budget]
            budget -= len(chunk)
        if chunk:
            write(chunk)
        return budget is None or budget > 0

    entries, offset = read_entries(source.path)
    if query.tail_lines is not None:
        entries = entries[-query.tail_lines :] if query.tail_lines > 0 else []
    for chunk in render(entries, query):
        if not emit(chunk):
            return
    while query.follow:
        writing = source.still_writing()
        entries, offset = read_entries(source.path, offset)
        for chunk in render(entries, query):
            if not emit(chunk):
                return
        if not entries:
            if not writing:
                return
            time.sleep(0.1)


class _Handler(BaseHTTPRequestHandler):
    server: LogServer

    def log_message(self, format: str, *args: object) -> None:
        return  # the API server's own logs already record these requests

    def _reply(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _allowed(self) -> bool:
        cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        if not cert:
            return False
        names = [
            str(attr[1])
            for rdn in cert.get("subject", ())
            for attr in rdn
            if isinstance(attr, tuple) and attr[0] == "commonName"
        ]
        return bool(names) and names[-1] in self.server.allowed_clients

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/healthz":
            self._reply(200, "ok")
            return
        if not self._allowed():
            self._reply(403, "forbidden: only the API server's kubelet client may call this")
            return
        parts = [unquote(p) for p in url.path.split("/") if p]
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._reply(404, "this node agent serves only /containerLogs and /healthz")
            return
        try:
            query = LogQuery.from_query(url.query)
        except ValueError as exc:
            self._reply(400, f"bad query: {exc}")
            return
        found = self.server.resolve(parts[1], parts[2], parts[3], query.previous)
        if isinstance(found, str):
            self._reply(404, found)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()

        def write(chunk: bytes) -> None:
            self.wfile.write(chunk)
            self.wfile.flush()

        try:
            stream_log(found, query, write)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return  # the client went away (e.g. kubectl logs -f interrupted)


class LogServer(ThreadingHTTPServer):
    """HTTPS server for the kubelet endpoints the agent supports (logs and health)."""

    daemon_threads = True

    def __init__(
        self,
        port: int,
        cert: Path,
        key: Path,
        client_ca: Path,
        allowed_clients: frozenset[str],
        resolve: Resolver,
    ) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL  # /healthz needs none; logs check it in the handler
        # The handshake runs in the request's thread, so a slow client never blocks accept().
        self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.allowed_clients = allowed_clients
        self.resolve = resolve

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.server_address[1])

    def start(self) -> threading.Thread:
        """Serve in a daemon thread."""
        thread = threading.Thread(target=self.serve_forever, name="log-server", daemon=True)
        thread.start()
        return thread
