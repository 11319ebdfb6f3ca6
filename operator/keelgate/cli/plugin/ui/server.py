"""The decision inbox's web server: 127.0.0.1 only, one user's identity, live pages.

Why it exists: people who approve payments or settle unknown outcomes are often not kubectl
users. This serves the inbox on loopback and acts with the kubeconfig context it was started
with: every read and every decision is a request to the API server as that user, so RBAC and
the admission policy on ``spec.by`` apply unchanged; no service account acts for anyone.

Defences, each for a reason:

- Who: a one-time sign-in address makes a session of a cookie, a page key and a form token
  (``sessions.py``); a page is read only with the cookie and the page key, a decision made only
  with the cookie and the form token, so a cookie that leaked to another loopback port (every
  port of 127.0.0.1 is one site to a browser) reads nothing and decides nothing.
- Where from: the Host header must be the loopback address it listens on (DNS rebinding); a
  decision that says where it came from (``Origin``, ``Sec-Fetch-Site``) must come from here.
- What it loads: the Content-Security-Policy allows nothing from outside.
- How much: a request's head and body must arrive within ``request_timeout`` seconds, a form
  must say its length (``Content-Length``, at most ``MAX_FORM`` bytes), and at most
  ``max_connections`` connections are served at once (one thread each), so slow or silent
  clients cannot hold more than that many threads.
- Who is served first: a connection counts as the person's once a request on it shows a live
  session's cookie (a browser's first request does, within milliseconds). Any local user can
  open connections and send nothing, so when every slot is taken a new connection closes the
  oldest one that has shown no session, and only when all are the person's is it answered
  503; a request without a session is answered (401, a sign-in, a stylesheet) and its
  connection closed, and a form is refused before its body is read. Idle sockets held by
  someone without a credential, however often reopened, never keep the person out.

It must never bind anything but 127.0.0.1, never log a request's form (notes, tokens), and never
act without the session's cookie and its key or form token.

Why one module past 500 lines: the defences above are all in how one request is read and
answered, and are read together, in the order a request meets them (a connection's slot, its
head's deadline, the Host and Origin, the session's cookie and key or token); what is not a
defence is elsewhere: the sessions (``sessions.py``), what a page shows (``views.py``) and how
(``pages.py``).
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from keelgate.cli.plugin import commands
from keelgate.cli.plugin.ui import pages
from keelgate.cli.plugin.ui.sessions import DEFAULT_IDLE, DEFAULT_LIFETIME, Session, Sessions, same
from keelgate.cli.plugin.ui.views import Views
from keelgate.core.redaction import redact_text
from keelgate.errors import KeelgateError
from keelgate.kube.naming import GROUP, RUN_LABEL, VERSION

#: The cookie's name is this and the port: two inboxes in one browser keep their own.
COOKIE = "keelgate_inbox"
#: The header the page's script sends the page key in (``sessions.py``).
KEY_HEADER = "X-Keelgate-Key"
#: Seconds a request's head and body may take to arrive (and a reply to be taken).
REQUEST_TIMEOUT = 10.0
#: Connections served at once (a thread each); event streams, one per open page, among them.
MAX_CONNECTIONS = 32
MAX_STREAMS = 16
BUSY = b"the inbox is busy: too many connections\n"
#: The largest decision form (a note is at most 500 characters).
MAX_FORM = 16384
#: Seconds an idle event stream waits before a keep-alive comment (proxies close silent ones).
KEEPALIVE = 15.0
#: Changes closer together than this are told once (a burst of watch events is one change).
SETTLE = 0.15
STATIC = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class Changes:
    """A counter the watches raise and the event streams wait on."""

    def __init__(self) -> None:
        self._version = 0
        self._cond = threading.Condition()
        self.closed = False

    def bump(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def wait_past(self, seen: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen or self.closed, timeout=timeout)
            return self._version


class Watches:
    """One watch per kind the pages show (runs, their decisions, their step pods), as the user,
    in every namespace they may list or else in the context's; each event raises ``changes``."""

    def __init__(self, views: Views, changes: Changes) -> None:
        self.views, self.changes = views, changes
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for kind in ("agentruns", "reconciliations", "approvals", "pods"):
            thread = threading.Thread(target=self._watch, args=(kind,), daemon=True, name=kind)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, kind: str) -> None:
        from kubernetes import client, watch

        api_client = self.views.client(self.views.target.namespace).client
        custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        make_watch: Any = watch.Watch  # the client's watch module has no type hints
        while not self._stop.is_set():
            everywhere = self.views.all_namespaces()
            namespace = self.views.target.namespace
            extra: dict[str, Any] = {}
            listing: Callable[..., Any]
            if kind == "pods":
                extra["label_selector"] = RUN_LABEL
                listing = (
                    core.list_pod_for_all_namespaces
                    if everywhere
                    else partial(core.list_namespaced_pod, namespace)
                )
            elif everywhere:
                listing = partial(custom.list_cluster_custom_object, GROUP, VERSION, kind)
            else:
                listing = partial(
                    custom.list_namespaced_custom_object, GROUP, VERSION, namespace, kind
                )
            stream: Any = make_watch()
            try:
                for _ in stream.stream(listing, timeout_seconds=60, **extra):
                    self.changes.bump()
                    if self._stop.is_set():
                        stream.stop()
                        return
            except Exception:
                self._stop.wait(1.0)


class InboxServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # Ctrl-C stops it at once; a held connection dies with the process
    allow_reuse_address = True
    # Connections waiting to be accepted: past it the kernel drops them for a second or more,
    # and a page's several connections would wait for that.
    request_queue_size = 64

    def __init__(
        self,
        port: int,
        views: Views,
        *,
        idle: float = DEFAULT_IDLE,
        lifetime: float = DEFAULT_LIFETIME,
        request_timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        clock: Callable[[], float] = time.monotonic,
        signed_in: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.views = views
        self.sessions = Sessions(idle=idle, lifetime=lifetime, clock=clock)
        self.request_timeout = request_timeout
        self.signed_in = signed_in  # told the next sign-in address once one was used
        self.changes = Changes()
        self.watches = Watches(views, self.changes)
        self.max_connections = max_connections
        # The connections served now, oldest first: the socket -> whether it showed a session.
        self._held: dict[socket.socket, bool] = {}
        self._held_lock = threading.Lock()
        self.streams = threading.BoundedSemaphore(min(MAX_STREAMS, max(1, max_connections // 2)))

    # connections: a bounded number, each in its own thread, the person's first

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._held_lock:
            cut = None
            if len(self._held) >= self.max_connections:
                # Full: the oldest connection that showed no session makes room (an idle
                # socket anyone can open); the person's own are never closed for a stranger.
                cut = next((held for held, ours in self._held.items() if not ours), None)
                if cut is not None:
                    del self._held[cut]
            if cut is not None or len(self._held) < self.max_connections:
                self._held[request] = False
                admitted = True
            else:
                admitted = False
        if cut is not None:
            _cut(cut)  # its thread reads the end of the stream and finishes
        if not admitted:
            _busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: socket.socket) -> None:
        with self._held_lock:
            self._held.pop(request, None)

    def showed_session(self, request: socket.socket) -> None:
        """A request on this connection showed a live session: it is the person's from now on."""
        with self._held_lock:
            if request in self._held:
                self._held[request] = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # One line, never a traceback: the request failed, the inbox goes on.
        import sys

        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            return  # a browser that went away mid-answer, or a client too slow
        said = (redact_text(f"{type(error).__name__}: {error}").splitlines() or [""])[0]
        print(f"keelgate: error: a request failed: {said}", file=sys.stderr)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def cookie(self) -> str:
        return f"{COOKIE}_{self.port}"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The sign-in address (it works once; the next is told to ``signed_in``)."""
        return f"{self.origin}/?{urlencode({'token': self.sessions.token})}"

    def hosts(self) -> Iterable[str]:
        return (f"127.0.0.1:{self.port}", f"localhost:{self.port}")

    def close(self) -> None:
        """After ``serve_forever`` returned: stop the watches, end the event streams, close."""
        self.watches.stop()
        self.changes.close()
        self.server_close()


def _busy(request: socket.socket) -> None:
    """Answer a connection past the limit without a thread: 503, and close."""
    try:
        request.settimeout(1.0)
        request.sendall(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
            b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s"
            % (len(BUSY), BUSY)
        )
    except OSError:
        pass


def _cut(request: socket.socket) -> None:
    """End a connection that another's thread serves: both directions shut, so its reads see
    the end at once (the thread closes the socket itself)."""
    with contextlib.suppress(OSError):  # gone already
        request.shutdown(socket.SHUT_RDWR)


class _Deadline(io.RawIOBase):
    """A connection's reading side that gives up at a deadline, however slowly bytes come:
    a socket timeout alone is per read, and a client sending a byte at a time would hold
    its thread for ever."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self.sock, self.timeout = sock, timeout
        self.deadline = time.monotonic() + timeout

    def restart(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        try:
            return self.sock.recv_into(buffer)
        finally:
            self.sock.settimeout(self.timeout)  # for writing the answer


class _Handler(BaseHTTPRequestHandler):
    server: InboxServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self._reading = _Deadline(self.connection, self.server.request_timeout)
        self.rfile = io.BufferedReader(self._reading)
        self.connection.settimeout(self.server.request_timeout)

    def handle_one_request(self) -> None:
        # Each request (and the wait for the next on a kept-alive connection) has its own time.
        self._reading.restart()
        super().handle_one_request()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self._session()[0] is not None:
            self.server.showed_session(self.connection)
        else:
            # No session shown: answered, then closed, so a stranger's connection never
            # waits in a thread for a next request (a sign-in that succeeds shows one).
            self.close_connection = True
        return True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request line may hold the sign-in token or a page key; the inbox logs nothing

    # plumbing

    def _send(
        self,
        status: int,
        body: str | bytes,
        *,
        content_type: str = "text/html; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        # same-origin, not no-referrer: with no-referrer the browser sends "Origin: null" on the
        # inbox's own form posts, and the origin check could not tell them from a stranger's.
        # Either way no other origin (no other port) is ever sent an address of the inbox.
        self.send_header("Referrer-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            self.send_header("Connection", "close")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _text(self, status: int, said: str) -> None:
        self._send(status, said + "\n", content_type="text/plain; charset=utf-8")

    def _redirect(self, where: str, *, session: Session | None = None) -> None:
        headers = {"Location": where}
        if session is not None:
            headers["Set-Cookie"] = (
                f"{self.server.cookie}={session.cookie}; HttpOnly; SameSite=Strict; Path=/; "
                f"Max-Age={int(self.server.sessions.lifetime)}"
            )
        self._send(HTTPStatus.SEE_OTHER, "", headers=headers)

    def _host_ok(self) -> bool:
        return self.headers.get("Host", "") in tuple(self.server.hosts())

    def _cookies(self) -> list[str]:
        found = []
        for header in self.headers.get_all("Cookie") or ():
            for part in header.split(";"):
                name, _, value = part.strip().partition("=")
                if name == self.server.cookie and value:
                    found.append(value)
        return found

    def _session(self) -> tuple[Session | None, bool]:
        """The live session this request's cookie names, and whether it named one at all
        (a cookie of a session that ended, or of none)."""
        cookies = self._cookies()
        for cookie in cookies:
            session = self.server.sessions.find(cookie)
            if session is not None:
                return session, True
        return None, bool(cookies)

    def _signed_out(self, cookie_given: bool) -> None:
        if cookie_given:
            self._text(
                HTTPStatus.UNAUTHORIZED,
                "This session ended (idle too long, or too old) or is not this inbox's: open "
                "the newest sign-in address `kubectl keelgate ui` printed.",
            )
        else:
            self._text(
                HTTPStatus.UNAUTHORIZED,
                "Open the sign-in address `kubectl keelgate ui` printed (it signs this browser "
                "in, once).",
            )

    def _split_key(self, path: str) -> tuple[str, str]:
        """(the page key in the address, the path without it): /k/KEY/runs -> (KEY, /runs)."""
        if not path.startswith("/k/"):
            return "", path
        key, slash, rest = path[3:].partition("/")
        return key, slash + rest

    def _page(self, title: str, current: str, main: str, root: str) -> None:
        if self.headers.get("X-Keelgate-Fragment"):
            # The script fills the header's "signed in as" from this (a shell has none).
            user = quote(self.server.views.user(), safe="")
            self._send(HTTPStatus.OK, main, headers={"X-Keelgate-User": user})
            return
        user = self.server.views.user()
        self._send(
            HTTPStatus.OK,
            pages.layout(title=title, user=user, current=current, main=main, root=root),
        )

    def _refuse_body(self) -> bool:
        """Whether a request that carries no form carries a body anyway: it is not read, so
        the connection is closed after the answer (its bytes are not a next request)."""
        length = self.headers.get("Content-Length", "0").strip()
        return bool(self.headers.get("Transfer-Encoding")) or length not in ("", "0")

    # requests

    def do_GET(self) -> None:
        self.close_connection = self.close_connection or self._refuse_body()
        if not self._host_ok():
            self._text(HTTPStatus.MISDIRECTED_REQUEST, "not this inbox's address")
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path.startswith("/static/"):
            self._static(url.path.removeprefix("/static/"))
            return
        session, cookie_given = self._session()
        if url.path == "/" and "token" in query:
            self._sign_in(query["token"], session)
            return
        if session is None:
            self._signed_out(cookie_given)
            return
        in_address, path = self._split_key(url.path)
        if in_address and not path:
            self._redirect(f"/k/{in_address}/")
            return
        key = in_address or self.headers.get(KEY_HEADER, "")
        if not same(key, session.key):
            if key or path == "/events" or self.headers.get("X-Keelgate-Fragment"):
                self._text(HTTPStatus.UNAUTHORIZED, "this page's key is not this session's")
            else:
                # The cookie alone: a shell the script fills with the key this browser keeps.
                self._send(HTTPStatus.OK, pages.shell())
            return
        if path != "/events" and self.headers.get("X-Keelgate-Fragment") != "change":
            self.server.sessions.touch(session)  # a person read a page (not a live update)
        root = f"/k/{in_address}" if in_address else ""
        try:
            self._route(path, query, root, session)
        except KeelgateError as error:
            self._page("Error", "", pages.flash("", str(error)), root)

    def _sign_in(self, token: str, session: Session | None) -> None:
        found = self.server.sessions.sign_in(token, session.cookie if session else "")
        if found is not None:
            # The browser follows the redirect on this connection, with the new cookie.
            self.server.showed_session(self.connection)
            self.close_connection = self._refuse_body()
        if found is None:
            self._text(
                HTTPStatus.FORBIDDEN,
                "This sign-in address was used already, or is not this inbox's: open the newest "
                "one `kubectl keelgate ui` printed (each works once).",
            )
            return
        if self.server.signed_in is not None:
            self.server.signed_in(self.server.url)
        # The page key goes to the page in its address; the page's script keeps it in this
        # origin's storage and takes it out of the address.
        self._redirect(f"/k/{found.key}/", session=found)

    def _route(self, path: str, query: dict[str, str], root: str, session: Session) -> None:
        views = self.server.views
        if path == "/events":
            self._events(session)
        elif path == "/":
            scope = (
                "every namespace you may list"
                if views.all_namespaces()
                else (f"namespace {views.target.namespace}")
            )
            items = views.inbox()
            if query.get("run"):
                items = [i for i in items if i.run == query["run"]]
            main = pages.inbox(
                items,
                csrf=session.form,
                scope=scope,
                said=query.get("said", ""),
                error=query.get("error", ""),
                root=root,
            )
            self._page("Inbox", "/", main, root)
        elif path == "/runs":
            rows = views.runs()
            namespaces = {r.namespace for r in rows}
            ns, phase = query.get("namespace", ""), query.get("phase", "")
            shown = [
                r for r in rows if (not ns or r.namespace == ns) and (not phase or r.phase == phase)
            ]
            main = pages.runs(shown, namespace=ns, phase=phase, namespaces=namespaces, root=root)
            self._page("Runs", "/runs", main, root)
        elif path.startswith("/runs/") and path.count("/") == 3:
            _, _, namespace, name = path.split("/")
            try:
                page = views.run_page(namespace, name)
            except KeelgateError as error:
                self._page("Not found", "/runs", pages.not_found(str(error), root=root), root)
                return
            self._page(f"Run {namespace}/{name}", "/runs", pages.run_page(page, root=root), root)
        else:
            self._send(HTTPStatus.NOT_FOUND, pages.not_found(f"no page {path}", root=root))

    def _static(self, name: str) -> None:
        if name not in STATIC:
            self._send(HTTPStatus.NOT_FOUND, "")
            return
        body = resources.files("keelgate.cli.plugin.ui").joinpath("static", name).read_bytes()
        self._send(HTTPStatus.OK, body, content_type=STATIC[name])

    def _events(self, session: Session) -> None:
        if not self.server.streams.acquire(blocking=False):
            self.close_connection = True
            self._text(HTTPStatus.SERVICE_UNAVAILABLE, "too many open pages")
            return
        try:
            self._stream(session)
        finally:
            self.server.streams.release()

    def _stream(self, session: Session) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        changes, sessions = self.server.changes, self.server.sessions
        seen = changes.version
        try:
            self.wfile.write(b"event: hello\ndata: 0\n\n")
            self.wfile.flush()
            while not changes.closed:
                live = sessions.find(session.cookie)
                if live is None:
                    # The session ended: the page says so and stops listening.
                    self.wfile.write(b"event: ended\ndata: 0\n\n")
                    self.wfile.flush()
                    return
                left = live.ends_at(sessions.idle, sessions.lifetime) - sessions.clock()
                now = changes.wait_past(seen, max(0.05, min(KEEPALIVE, left)))
                if now == seen:
                    self.wfile.write(b": keep-alive\n\n")
                else:
                    time.sleep(SETTLE)  # the rest of the burst
                    seen = changes.version
                    self.wfile.write(f"event: change\ndata: {seen}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return

    def do_POST(self) -> None:
        # Whatever is refused below, the connection is closed after the answer: a body that
        # was not read must not be read as the next request.
        self.close_connection = True
        if not self._host_ok():
            self._text(HTTPStatus.MISDIRECTED_REQUEST, "not this inbox's address")
            return
        session, cookie_given = self._session()
        if session is None:  # refused before its body: a stranger's form holds no thread
            self._signed_out(cookie_given)
            return
        length = self._form_length()
        if length is None:
            return
        body = self.rfile.read(length)  # within the request's time (``_Deadline``)
        if len(body) < length:
            return  # the client closed the connection mid-form: nothing to answer
        session, cookie_given = self._session()
        if session is None:
            self._signed_out(cookie_given)
            return
        if not self._same_origin():
            self._text(HTTPStatus.FORBIDDEN, "cross-site request refused")
            return
        fields = parse_qs(body.decode(errors="replace"))
        form = {k: v[-1] for k, v in fields.items()}
        if not same(form.get("csrf", ""), session.form):
            self._text(HTTPStatus.FORBIDDEN, "the form's token is not this session's")
            return
        in_address, path = self._split_key(urlsplit(self.path).path)
        if in_address and not same(in_address, session.key):
            self._text(HTTPStatus.FORBIDDEN, "this page's key is not this session's")
            return
        if path not in ("/decide", "/decide-many"):
            self._send(HTTPStatus.NOT_FOUND, "")
            return
        self.server.sessions.touch(session)
        root = f"/k/{in_address}" if in_address else ""
        if path == "/decide-many":
            said, error = self._decide_many(form, fields.get("pick", []))
            shown = {k: v for k, v in (("said", said), ("error", error)) if v}
            self._redirect(f"{root}/?{urlencode(shown)}")
            return
        try:
            said = self._decide(form)
        except KeelgateError as error:
            self._redirect(f"{root}/?{urlencode({'error': str(error)})}")
            return
        self._redirect(f"{root}/?{urlencode({'said': said})}")

    def _form_length(self) -> int | None:
        """The form's length, or None once a request without a usable one was answered: no
        Content-Length (or a chunked body) 411, one that is not a number 400, too large 413."""
        if self.headers.get("Transfer-Encoding"):
            self._text(HTTPStatus.LENGTH_REQUIRED, "send the form with a Content-Length")
            return None
        given = self.headers.get_all("Content-Length") or []
        if not given:
            self._text(HTTPStatus.LENGTH_REQUIRED, "a form needs a Content-Length")
            return None
        values = {v.strip() for v in given}
        value = values.pop() if len(values) == 1 else ""
        if not value.isascii() or not value.isdigit():
            self._text(HTTPStatus.BAD_REQUEST, "Content-Length is not a number of bytes")
            return None
        if int(value) > MAX_FORM:
            self._text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a form is at most {MAX_FORM} bytes")
            return None
        return int(value)

    def _same_origin(self) -> bool:
        origin = self.headers.get("Origin")
        if origin is not None and origin not in (f"http://{h}" for h in self.server.hosts()):
            return False
        site = self.headers.get("Sec-Fetch-Site")
        return site in (None, "same-origin", "none")

    def _decide(self, form: dict[str, str]) -> str:
        kinds = {"Reconciliation": commands.RECONCILIATION, "Approval": commands.APPROVAL}
        choices = {
            "Reconciliation": {"executed": True, "not-executed": False},
            "Approval": {"approve": True, "deny": False},
        }
        kind = kinds.get(form.get("kind", ""))
        decision = choices.get(form.get("kind", ""), {}).get(form.get("choice", ""))
        if kind is None or decision is None:
            raise KeelgateError("the form names no decision this inbox knows")
        namespace = form.get("namespace", "")
        if not namespace:
            raise KeelgateError("the form names no namespace")
        note = form.get("note", "").strip() or None
        run, action, key = form.get("run", ""), form.get("action", ""), form.get("key", "")
        self._same_call(namespace, run, action, key)
        done = commands.decide(
            self.server.views.client(namespace), kind, run, action, decision, note, key=key
        )
        already = "already " if done.already else ""
        return (
            f"{done.run} {done.action} ({done.tool}): {already}{done.verdict} by {done.by}; "
            "the operator carries it out"
        )

    def _decide_many(self, form: dict[str, str], picks: list[str]) -> tuple[str, str]:
        """Several approvals, each its own decision on the call its checkbox showed (its
        Idempotency-Key rides in the checkbox): what was done, and what was not and why."""
        decision = {"approve": True, "deny": False}.get(form.get("choice", ""))
        if decision is None:
            return "", "the form names no decision this inbox knows"
        if not picks:
            return "", "no approval was selected: tick the ones to decide"
        note = form.get("note", "").strip() or None
        done: list[str] = []
        refused: list[str] = []
        for pick in dict.fromkeys(picks):  # each once, in the page's order
            namespace, run, action, key = [*pick.split("|"), "", "", "", ""][:4]
            try:
                if not namespace or not key:
                    raise KeelgateError("the checkbox names no approval and call")
                self._same_call(namespace, run, action, key)
                made = commands.decide(
                    self.server.views.client(namespace),
                    commands.APPROVAL,
                    run,
                    action,
                    decision,
                    note,
                    key=key,
                )
            except KeelgateError as error:
                refused.append(f"{namespace}/{run} {action}: {error}")
                continue
            already = "already " if made.already else ""
            done.append(f"{made.run} {made.action} ({made.tool}) {already}{made.verdict}")
        said = ""
        if done:
            said = f"{'; '.join(done)}, by you; the operator carries each out"
        return said, "; ".join(refused)

    def _same_call(self, namespace: str, run: str, action: str, key: str) -> None:
        """Refuse a decision whose page showed another call than the run's action is now: the
        key the form carries (the Idempotency-Key shown, a digest of the tool and arguments)
        against the run's plan in the store, when the store can be read (the Approval's own key
        is checked by the decision itself)."""
        if not key:
            return
        now = self.server.views.recorded(namespace, run, trail=False).keys.get(action)
        if now is not None and now != key:
            raise KeelgateError(
                f"{run} {action}: its arguments changed since the page showed them (the call "
                f"is now {now}, not {key}): look again"
            )
