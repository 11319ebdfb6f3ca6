"""The decision inbox's web server: 127.0.0.1 only, one user's identity, live pages.

Why it exists: people who approve payments or settle unknown outcomes are often not kubectl
users. This serves the inbox on loopback and acts with the kubeconfig context it was started
with: every read and every decision is a request to the API server as that user, so RBAC and
the admission policy on ``spec.by`` apply unchanged; no service account acts for anyone.

Defences, each for a reason: the address it prints carries a sign-in token that becomes an
HttpOnly, SameSite=Strict cookie (another local user cannot borrow the session); the Host header
must be the loopback address it listens on (DNS rebinding); a decision must carry the page's
CSRF token and, when the browser says where the request came from, come from this origin
(cross-site forms); the Content-Security-Policy allows nothing from outside.

It must never bind anything but 127.0.0.1, never log a request's form (notes, tokens), and never
act without the cookie and the CSRF token.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from keelgate.cli.plugin import commands
from keelgate.cli.plugin.ui import pages
from keelgate.cli.plugin.ui.views import Views
from keelgate.errors import KeelgateError
from keelgate.kube.naming import GROUP, RUN_LABEL, VERSION
from keelgate.core.redaction import redact_text

COOKIE = "keelgate_inbox"
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
    allow_reuse_address = True

    def __init__(self, port: int, views: Views) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.views = views
        self.login = secrets.token_urlsafe(24)  # in the printed address
        self.session = secrets.token_urlsafe(32)  # the cookie it becomes
        self.csrf = secrets.token_urlsafe(32)  # in every form
        self.changes = Changes()
        self.watches = Watches(views, self.changes)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # One line, never a traceback: the request failed, the inbox goes on.
        import sys

        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            return  # a browser that went away mid-answer
        said = (redact_text(f"{type(error).__name__}: {error}").splitlines() or [""])[0]
        print(f"keelgate: error: a request failed: {said}", file=sys.stderr)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/?{urlencode({'token': self.login})}"

    def hosts(self) -> Iterable[str]:
        return (f"127.0.0.1:{self.port}", f"localhost:{self.port}")

    def close(self) -> None:
        """After ``serve_forever`` returned: stop the watches, end the event streams, close."""
        self.watches.stop()
        self.changes.close()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: InboxServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request line may hold the login token; the inbox logs nothing

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
        self.send_header("Referrer-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _redirect(self, where: str, *, cookie: str = "") -> None:
        headers = {"Location": where}
        if cookie:
            headers["Set-Cookie"] = (
                f"{COOKIE}={cookie}; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200"
            )
        self._send(HTTPStatus.SEE_OTHER, "", headers=headers)

    def _host_ok(self) -> bool:
        return self.headers.get("Host", "") in tuple(self.server.hosts())

    def _signed_in(self) -> bool:
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and hmac.compare_digest(value, self.server.session):
                return True
        return False

    def _page(self, title: str, current: str, main: str) -> None:
        if self.headers.get("X-Keelgate-Fragment") == "1":
            self._send(HTTPStatus.OK, main)
            return
        user = self.server.views.user()
        self._send(
            HTTPStatus.OK,
            pages.layout(title=title, user=user, current=current, main=main, csrf=self.server.csrf),
        )

    # requests

    def do_GET(self) -> None:
        if not self._host_ok():
            self._send(HTTPStatus.MISDIRECTED_REQUEST, "not this inbox's address")
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        token = query.get("token")
        if token is not None:
            if hmac.compare_digest(token, self.server.login):
                self._redirect("/", cookie=self.server.session)
            else:
                self._send(HTTPStatus.FORBIDDEN, "this address's token is not this inbox's")
            return
        if url.path.startswith("/static/"):
            self._static(url.path.removeprefix("/static/"))
            return
        if not self._signed_in():
            self._send(
                HTTPStatus.UNAUTHORIZED,
                "Open the address `kubectl keelgate ui` printed (it signs this browser in).",
                content_type="text/plain; charset=utf-8",
            )
            return
        try:
            self._route(url.path, query)
        except KeelgateError as error:
            self._page("Error", "", pages.flash("", str(error)))

    def _route(self, path: str, query: dict[str, str]) -> None:
        views = self.server.views
        if path == "/events":
            self._events()
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
                csrf=self.server.csrf,
                scope=scope,
                said=query.get("said", ""),
                error=query.get("error", ""),
            )
            self._page("Inbox", "/", main)
        elif path == "/runs":
            rows = views.runs()
            namespaces = {r.namespace for r in rows}
            ns, phase = query.get("namespace", ""), query.get("phase", "")
            shown = [
                r for r in rows if (not ns or r.namespace == ns) and (not phase or r.phase == phase)
            ]
            self._page(
                "Runs", "/runs", pages.runs(shown, namespace=ns, phase=phase, namespaces=namespaces)
            )
        elif path.startswith("/runs/") and path.count("/") == 3:
            _, _, namespace, name = path.split("/")
            try:
                page = views.run_page(namespace, name)
            except KeelgateError as error:
                self._page("Not found", "/runs", pages.not_found(str(error)))
                return
            self._page(f"Run {namespace}/{name}", "/runs", pages.run_page(page))
        else:
            self._send(HTTPStatus.NOT_FOUND, pages.not_found(f"no page {path}"))

    def _static(self, name: str) -> None:
        if name not in STATIC:
            self._send(HTTPStatus.NOT_FOUND, "")
            return
        body = resources.files("keelgate.cli.plugin.ui").joinpath("static", name).read_bytes()
        self._send(HTTPStatus.OK, body, content_type=STATIC[name])

    def _events(self) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        changes = self.server.changes
        seen = changes.version
        try:
            self.wfile.write(b"event: hello\ndata: 0\n\n")
            self.wfile.flush()
            while not changes.closed:
                now = changes.wait_past(seen, KEEPALIVE)
                if now == seen:
                    self.wfile.write(b": keep-alive\n\n")
                else:
                    time.sleep(SETTLE)  # the rest of the burst
                    seen = changes.version
                    self.wfile.write(f"event: change\ndata: {seen}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return

    def do_POST(self) -> None:
        if not self._host_ok():
            self._send(HTTPStatus.MISDIRECTED_REQUEST, "not this inbox's address")
            return
        if not self._signed_in():
            self._send(HTTPStatus.UNAUTHORIZED, "not signed in", content_type="text/plain")
            return
        if not self._same_origin():
            self._send(
                HTTPStatus.FORBIDDEN, "cross-site request refused", content_type="text/plain"
            )
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > 16384:
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "", content_type="text/plain")
            return
        form = {k: v[-1] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
        if not hmac.compare_digest(form.get("csrf", ""), self.server.csrf):
            self._send(
                HTTPStatus.FORBIDDEN,
                "the form's CSRF token is not this inbox's",
                content_type="text/plain",
            )
            return
        if urlsplit(self.path).path != "/decide":
            self._send(HTTPStatus.NOT_FOUND, "")
            return
        try:
            said = self._decide(form)
        except KeelgateError as error:
            self._redirect(f"/?{urlencode({'error': str(error)})}")
            return
        self._redirect(f"/?{urlencode({'said': said})}")

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
        done = commands.decide(
            self.server.views.client(namespace),
            kind,
            form.get("run", ""),
            form.get("action", ""),
            decision,
            note,
        )
        already = "already " if done.already else ""
        return (
            f"{done.run} {done.action} ({done.tool}): {already}{done.verdict} by {done.by}; "
            "the operator carries it out"
        )
