"""The decision inbox's server over plain HTTP: who may read a page and decide, for how long,
and what a slow or malformed client can hold.

A real ``InboxServer`` on a loopback port, driven with ``http.client``, raw sockets and a
standard cookie jar (``http.cookiejar``, which, as browsers do, sends a 127.0.0.1 cookie to
every port). Its reads come from a ``Views`` whose cluster is ``FakeCluster`` (the plugin's
tests' API server as the plugin sees it), so a decision that gets through is a patch that can
be counted. The browser tests (e2e/tests/test_e2e_inbox.py) click through the same server on
the control plane.
"""

from __future__ import annotations

import http.client
import http.cookiejar
import http.server
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import pytest

from keelgate.cli.plugin import main as plugin_main
from keelgate.cli.plugin.target import Target
from keelgate.cli.plugin.ui.server import COOKIE, InboxServer
from keelgate.cli.plugin.ui.views import Recorded, Views, Waiting
from keelgate.errors import InputError
from test_kubectl_plugin import FakeCluster, decision, kubeconfig, run_body

TOOL = "place_order_7f3"  # what a page that was read shows


class ShopViews(Views):
    """The inbox's reads of a cluster holding one approval in shop/restock; decisions go to
    ``cluster``."""

    def __init__(self, config: Path, cluster: FakeCluster) -> None:
        super().__init__(Target(str(config), "me", "shop"))
        self.cluster = cluster

    def user(self) -> str:
        return "alice"

    def all_namespaces(self) -> bool:
        return False

    def inbox(self) -> list[Waiting]:
        return [
            Waiting(
                kind="Approval",
                namespace="shop",
                name="restock-1-place-order",
                run="restock",
                action="1:0",
                tool=TOOL,
                side_effect="WRITE",
                key="kg-1",
                created="2026-12-05T08:00:00Z",
                waited="1m",
                not_executed_after="",
                said="",
                args={"sku": "A1"},
                args_unavailable="",
                may=True,
                why_not="",
            )
        ]

    def runs(self) -> list[Any]:
        return []

    def run_page(self, namespace: str, name: str) -> Any:
        raise InputError("RUN", f"no AgentRun named {name!r}")

    def client(self, namespace: str) -> Any:
        return self.cluster


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Inbox:
    server: InboxServer
    cluster: FakeCluster
    clock: Clock
    told: list[str] = field(default_factory=list)  # the next sign-in addresses printed

    @property
    def port(self) -> int:
        return self.server.port

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        body: str | None = None,
    ) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if body is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        conn.request(method, path, body=body, headers=sent)
        answer = conn.getresponse()
        text = answer.read().decode()
        conn.close()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, text

    def sign_in(self) -> tuple[str, str]:
        """Sign in as a browser would: (the Cookie header it then sends, the page key)."""
        status, headers, _ = self.request(
            "GET", urlsplit(self.server.url)._replace(scheme="", netloc="").geturl()
        )
        assert status == 303, status
        cookie = headers["set-cookie"].split(";", 1)[0]
        key = re.fullmatch(r"/k/([\w-]+)/", headers["location"])
        assert key, headers["location"]
        return cookie, key.group(1)


@pytest.fixture
def inbox(tmp_path: Path) -> Iterator[Inbox]:
    yield from _inbox(tmp_path)


def _one_approval(cluster: FakeCluster) -> None:
    cluster.runs["restock"] = run_body("restock", pendingApprovals=[{"action": "1:0"}])
    cluster.objects["Approval"].append(decision("Approval", "restock", "1:0"))


def _inbox(
    tmp_path: Path,
    *,
    fill: Callable[[FakeCluster], None] = _one_approval,
    views: Callable[[Path, FakeCluster], Any] = ShopViews,
    **options: Any,
) -> Iterator[Inbox]:
    """An inbox server on loopback over a fake cluster ``fill`` sets up, its clock the one
    the test moves."""
    config = kubeconfig(tmp_path / "kubeconfig", server="https://127.0.0.1:9", me="shop")
    cluster = FakeCluster(target=Target(str(config), "me", "shop"))
    fill(cluster)
    clock = Clock()
    told: list[str] = []
    server = InboxServer(0, views(config, cluster), clock=clock, signed_in=told.append, **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield Inbox(server, cluster, clock, told)
    finally:
        server.shutdown()
        server.close()
        thread.join(5)


def _form(token: str | None) -> str:
    fields = {"kind": "Approval", "namespace": "shop", "run": "restock", "action": "1:0"}
    fields["choice"] = "approve"
    if token is not None:
        fields["csrf"] = token
    return urlencode(fields)


def _form_token(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


class Listener(http.server.ThreadingHTTPServer):
    """Another local user's server on another loopback port: it keeps the Cookie headers the
    browser sends it."""

    def __init__(self) -> None:
        self.cookies: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.cookies.extend(self.headers.get_all("Cookie") or ())
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_a_cookie_replayed_from_another_port_reads_no_page_and_decides_nothing(
    inbox: Inbox,
) -> None:
    """A browser signed in to the inbox sends its cookie to a listener on another loopback
    port too (a standard cookie jar does the same). Replayed to the inbox by a plain client,
    that cookie gets a shell with no item, no argument and no form token; a page fragment, a
    page with a wrong key and the event stream are refused; and no decision form it can send
    (without the form token, with a guessed one) changes anything. The page's own origin,
    holding the key, reads the item and decides once."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with browser.open(inbox.server.url, timeout=10) as landed:
        page = landed.read().decode()
        own_key = re.fullmatch(r"/k/([\w-]+)/", urlsplit(landed.url).path)
    assert own_key and TOOL in page  # the signed-in browser reads its inbox
    listener = Listener()
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        browser.open(f"http://127.0.0.1:{listener.server_address[1]}/", timeout=10).read()
    finally:
        listener.shutdown()
        listener.server_close()
    (stolen,) = listener.cookies
    assert stolen.startswith(f"{COOKIE}_{inbox.port}=")

    cookie = {"Cookie": stolen}
    for path in ("/", "/runs", "/runs/shop/restock", "/?run=restock"):
        status, _, text = inbox.request("GET", path, headers=cookie)
        assert status == 200 and "not signed in" in text
        assert TOOL not in text and 'name="csrf"' not in text and "alice" not in text
    for path, extra in (
        ("/", {"X-Keelgate-Fragment": "load"}),
        ("/", {"X-Keelgate-Key": "guessed"}),
        ("/k/guessed/", {}),
        ("/events", {}),
        ("/k/guessed/events", {}),
    ):
        status, _, text = inbox.request("GET", path, headers={**cookie, **extra})
        assert status == 401 and TOOL not in text, (path, status)
    for token in (None, "", "guessed"):
        status, _, _ = inbox.request("POST", "/decide", headers=cookie, body=_form(token))
        assert status == 403
    assert inbox.cluster.patches == []

    # The page's own origin: the key (in the header, as the script sends it) reads the page,
    # and its form token decides.
    own = {**cookie, "X-Keelgate-Key": own_key.group(1), "X-Keelgate-Fragment": "load"}
    status, headers, fragment = inbox.request("GET", "/", headers=own)
    assert status == 200 and TOOL in fragment and headers["x-keelgate-user"] == "alice"
    status, headers, _ = inbox.request(
        "POST", "/decide", headers=cookie, body=_form(_form_token(fragment))
    )
    assert status == 303 and "approved+by+alice" in headers["location"]
    entry = {"by": "alice", "groups": ["system:authenticated"], "approved": True}
    assert inbox.cluster.patches == [
        ("Approval", "restock-1-place-order", {"decisions+": entry, "first": True})
    ]


def test_a_page_without_javascript_carries_its_key_in_its_address(inbox: Inbox) -> None:
    """Signing in lands on /k/KEY/: the page's links and its decision form stay under it, so a
    browser without script reads every page and decides; the answer to a decision is the
    inbox under the same key, saying what was done."""
    cookie, key = inbox.sign_in()
    status, _, page = inbox.request("GET", f"/k/{key}/", headers={"Cookie": cookie})
    assert status == 200 and TOOL in page
    links = re.findall(r'(?:href|action)="([^"]+)"', page)
    own = [link for link in links if not link.startswith(("/static/", "#"))]
    assert own and all(link.startswith(f"/k/{key}/") for link in own), own
    status, headers, _ = inbox.request(
        "POST",
        f"/k/{key}/decide",
        headers={"Cookie": cookie, "Origin": f"http://127.0.0.1:{inbox.port}"},
        body=_form(_form_token(page)),
    )
    assert status == 303 and headers["location"].startswith(f"/k/{key}/?said=")
    status, _, after = inbox.request("GET", headers["location"], headers={"Cookie": cookie})
    assert status == 200 and "approved by alice" in after
    assert len(inbox.cluster.patches) == 1


def test_a_form_without_its_token_or_from_another_origin_decides_nothing(inbox: Inbox) -> None:
    """With a live session, a decision without the form token, with another session's, or
    from another origin is refused, and nothing is patched."""
    cookie, key = inbox.sign_in()
    other_cookie, other_key = inbox.sign_in()
    _, _, other_page = inbox.request("GET", f"/k/{other_key}/", headers={"Cookie": other_cookie})
    _, _, page = inbox.request("GET", f"/k/{key}/", headers={"Cookie": cookie})
    mine = _form_token(page)
    for headers, body in (
        ({"Cookie": cookie}, _form(None)),
        ({"Cookie": cookie}, _form(_form_token(other_page))),
        ({"Cookie": cookie, "Origin": "http://127.0.0.1:1"}, _form(mine)),
        ({"Cookie": cookie, "Sec-Fetch-Site": "same-site"}, _form(mine)),
        ({"Cookie": cookie}, _form(mine).replace("csrf=", "csrf=x")),
    ):
        status, _, _ = inbox.request("POST", f"/k/{key}/decide", headers=headers, body=body)
        assert status == 403
    assert inbox.cluster.patches == []


class _DecisionForm(HTMLParser):
    """The first decision form of a page, as a browser reads it: where it posts, and its
    hidden fields."""

    def __init__(self) -> None:
        super().__init__()
        self.action = ""
        self.fields: dict[str, str] = {}
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        given = {k: v or "" for k, v in attrs}
        if tag == "form" and "decide" in given.get("class", "") and not self.action:
            self.action, self._inside = given.get("action", ""), True
        elif tag == "input" and self._inside and given.get("type") == "hidden":
            self.fields[given["name"]] = given.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._inside = False


def test_the_pages_own_form_without_its_csrf_field_decides_nothing(inbox: Inbox) -> None:
    """A browser without JavaScript (a cookie jar following the sign-in address and its
    redirects) posts the page's own decision form, every hidden field as the page gave it but
    the CSRF field left out altogether: 403, and nothing is patched. The same form with the
    field is carried out (one patch, the approval in alice's name), so the refusal is the
    missing field's doing."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with browser.open(inbox.server.url, timeout=10) as signed_in:
        page, at = signed_in.read().decode(), signed_in.geturl()
    assert len(jar) == 1  # the session cookie
    form = _DecisionForm()
    form.feed(page)
    assert form.action and "csrf" in form.fields, page[:400]
    target = urljoin(at, form.action)
    choice = {"choice": "approve", "note": "ok"}
    without = {k: v for k, v in form.fields.items() if k != "csrf"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        browser.open(target, data=urlencode({**without, **choice}).encode(), timeout=10)
    assert refused.value.code == 403
    assert inbox.cluster.patches == []
    with browser.open(target, data=urlencode({**form.fields, **choice}).encode(), timeout=10):
        pass
    assert [
        (kind, spec["decisions+"]["approved"], spec["decisions+"]["by"])
        for kind, _, spec in inbox.cluster.patches
    ] == [("Approval", True, "alice")]


def test_the_sign_in_address_works_once_and_the_next_is_printed(inbox: Inbox) -> None:
    """The printed address signs one browser in; used again it is refused; the inbox then
    tells the next address, which works once too."""
    first = urlsplit(inbox.server.url)._replace(scheme="", netloc="").geturl()
    status, headers, _ = inbox.request("GET", first)
    assert status == 303 and "set-cookie" in headers
    status, headers, text = inbox.request("GET", first)
    assert status == 403 and "used already" in text and "set-cookie" not in headers
    (told,) = inbox.told
    assert told == inbox.server.url
    again = urlsplit(told)._replace(scheme="", netloc="").geturl()
    assert again != first
    assert inbox.request("GET", again)[0] == 303
    assert inbox.request("GET", again)[0] == 403


def test_a_browser_signed_in_already_keeps_its_session_when_it_signs_in_again(
    inbox: Inbox,
) -> None:
    """A second tab of the same browser opening a new sign-in address joins its session: the
    cookie and key stay, so the first tab goes on working."""
    cookie, key = inbox.sign_in()
    status, headers, _ = inbox.request(
        "GET",
        urlsplit(inbox.server.url)._replace(scheme="", netloc="").geturl(),
        headers={"Cookie": cookie},
    )
    assert status == 303 and headers["location"] == f"/k/{key}/"
    assert headers["set-cookie"].split(";", 1)[0] == cookie


def test_a_session_ends_after_its_idle_time_and_after_its_lifetime(tmp_path: Path) -> None:
    """A page read or a decision keeps a session; the live updates an open page fetches by
    itself do not. Idle past --session-idle, or past --session-lifetime since sign-in however
    busy, the session ends: pages, updates and the event stream are refused."""
    for inbox in _inbox(tmp_path, idle=60, lifetime=300):
        cookie, key = inbox.sign_in()
        read = {"Cookie": cookie, "X-Keelgate-Key": key, "X-Keelgate-Fragment": "load"}
        update = {**read, "X-Keelgate-Fragment": "change"}
        inbox.clock.now += 59
        assert inbox.request("GET", "/", headers=read)[0] == 200  # read at 59: idle from here
        inbox.clock.now += 40
        assert inbox.request("GET", "/", headers=update)[0] == 200  # 99: live, but not a read
        inbox.clock.now += 20
        status, _, text = inbox.request("GET", "/", headers=update)  # 119: idle 60 s
        assert status == 401 and "session ended" in text
        assert inbox.request("GET", f"/k/{key}/events", headers={"Cookie": cookie})[0] == 401

        cookie, key = inbox.sign_in()
        read = {"Cookie": cookie, "X-Keelgate-Key": key, "X-Keelgate-Fragment": "load"}
        for _ in range(5):
            inbox.clock.now += 50
            assert inbox.request("GET", "/", headers=read)[0] == 200
        inbox.clock.now += 50  # 300 s after its sign-in
        assert inbox.request("GET", "/", headers=read)[0] == 401


def test_an_open_event_stream_ends_when_its_session_ends(tmp_path: Path) -> None:
    """An open page's event stream says "ended" once its session is over, and closes."""
    for inbox in _inbox(tmp_path, idle=60, lifetime=300):
        cookie, key = inbox.sign_in()
        conn = socket.create_connection(("127.0.0.1", inbox.port), timeout=10)
        conn.sendall(
            f"GET /k/{key}/events HTTP/1.1\r\nHost: 127.0.0.1:{inbox.port}\r\n"
            f"Cookie: {cookie}\r\n\r\n".encode()
        )
        seen = b""
        while b"event: hello" not in seen:
            seen += conn.recv(4096)
        inbox.clock.now += 61
        inbox.server.changes.bump()
        while chunk := conn.recv(4096):
            seen += chunk
        conn.close()
        assert seen.rstrip().endswith(b"event: ended\ndata: 0")


def _raw(inbox: Inbox, request: bytes, *, wait: float = 5.0) -> tuple[bytes, float, bool]:
    """Send raw bytes; (the answer, seconds until it came, whether the server then closed)."""
    conn = socket.create_connection(("127.0.0.1", inbox.port), timeout=wait)
    started = time.monotonic()
    conn.sendall(request)
    answer = b""
    closed = False
    try:
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                closed = True
                break
            answer += chunk
    except TimeoutError:
        pass
    finally:
        conn.close()
    return answer, time.monotonic() - started, closed


@pytest.mark.parametrize(
    ("length_lines", "status"),
    [
        ("", 411),
        ("Content-Length: -1\r\n", 400),
        ("Content-Length: abc\r\n", 400),
        ("Content-Length: 1e3\r\n", 400),
        ("Content-Length: 5\r\nContent-Length: 6\r\n", 400),
        ("Transfer-Encoding: chunked\r\n", 411),
        ("Content-Length: 20000\r\n", 413),
    ],
    ids=["missing", "negative", "not a number", "exponent", "two", "chunked", "too large"],
)
def test_a_form_with_a_bad_or_missing_length_is_refused_at_once(
    inbox: Inbox, length_lines: str, status: int
) -> None:
    """A decision whose Content-Length is missing, negative, not a number, given twice or too
    large (or a chunked body) is answered at once with the reason, and the connection closed:
    no thread waits for a body that will not come."""
    cookie, _ = inbox.sign_in()
    request = (
        f"POST /decide HTTP/1.1\r\nHost: 127.0.0.1:{inbox.port}\r\nCookie: {cookie}\r\n"
        f"{length_lines}\r\n"
    ).encode()
    answer, took, closed = _raw(inbox, request)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:80]
    assert took < 2 and closed


def test_a_client_that_stops_sending_is_cut_off_at_the_request_timeout(tmp_path: Path) -> None:
    """A form shorter than its length, a head that never ends, and a connection that sends
    nothing are each closed after the request timeout, with nothing decided."""
    for inbox in _inbox(tmp_path, request_timeout=0.5):
        cookie, _ = inbox.sign_in()
        head = f"POST /decide HTTP/1.1\r\nHost: 127.0.0.1:{inbox.port}\r\nCookie: {cookie}\r\n"
        for request in (
            f"{head}Content-Length: 100\r\n\r\ncsrf=".encode(),
            head.encode(),
            b"",
        ):
            answer, took, closed = _raw(inbox, request)
            assert closed and answer == b"" and 0.4 < took < 2.5, (request, took)
        assert inbox.cluster.patches == []


def test_slow_clients_hold_at_most_a_bounded_number_of_threads(tmp_path: Path) -> None:
    """Twelve clients that connect and then send a request a byte at a time: four are served
    at once (a thread each), the newest four; each new one past the limit closed the oldest
    that had shown no session, so the other eight are closed; each slow one is cut off at the
    request timeout however steadily it trickles, and then the inbox answers again."""
    for inbox in _inbox(tmp_path, request_timeout=1.0, max_connections=4):
        before = _serving()  # threads of servers other tests left behind are not this one's
        conns = [socket.create_connection(("127.0.0.1", inbox.port), timeout=5) for _ in range(12)]
        for conn in conns:
            conn.setblocking(False)
        # The closes come as the connections are accepted; on a busy machine that can take a
        # while, so wait for them (at most 5 s) rather than for a fixed time.
        closed: list[socket.socket] = []
        held = list(conns)
        waited = time.monotonic()
        while len(closed) < 8 and time.monotonic() - waited < 5:
            for conn in list(held):
                if _ended(conn):
                    held.remove(conn)
                    closed.append(conn)
            time.sleep(0.02)
        time.sleep(0.2)  # a ninth close, were there one, would have come by now
        held = [conn for conn in held if not _ended(conn)]
        assert held == conns[8:], [conns.index(c) for c in held]
        waited = time.monotonic()
        while _serving() - before != 4 and time.monotonic() - waited < 5:
            time.sleep(0.02)  # the closed ones' threads read the end and finish
        assert _serving() - before == 4
        started, cut = time.monotonic(), 0.0
        while held and time.monotonic() - started < 5:
            for conn in list(held):
                try:
                    conn.send(b"x")
                    gone = _ended(conn)
                except OSError:
                    gone = True
                if gone:
                    held.remove(conn)
                    cut = time.monotonic() - started
            time.sleep(0.05)
        for conn in conns:
            conn.close()
        assert held == [] and cut < 2.5, "a slow client was not cut off in time"
        assert inbox.request("GET", "/")[0] == 401  # answering again


def _ended(conn: socket.socket) -> bool:
    """Whether the server ended a non-blocking connection (it reads its end, or a reset)."""
    try:
        return conn.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Stranger:
    """Another local user without any credential who keeps ``count`` idle connections to the
    inbox open at all times: each one the inbox closes is opened again at once (the issue's
    attack reopened them every 10 s)."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def __enter__(self) -> Stranger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _hold(self) -> None:
        conns: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                conns = [c for c in conns if not (_ended(c) and c.close() is None)]
                while len(conns) < self.count:
                    conn = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    conn.setblocking(False)
                    conns.append(conn)
                    self.opened += 1
                time.sleep(0.01)
        finally:
            for conn in conns:
                conn.close()


def test_idle_sockets_held_by_a_stranger_never_keep_the_person_out(tmp_path: Path) -> None:
    """A local user with no credential holds every connection slot with idle sockets, opening
    a new one as soon as one is closed. The person still signs in and reads page after page,
    on new connections and on a kept-alive one, and decides: nothing is answered 503 (it was,
    throughout); the stranger's sockets are what gets closed."""
    for inbox in _inbox(tmp_path, request_timeout=2.0, max_connections=4):
        with Stranger(inbox.port, 8) as stranger:
            waited = time.monotonic()
            while stranger.opened < 8 and time.monotonic() - waited < 5:
                time.sleep(0.02)
            cookie, key = inbox.sign_in()
            pages = {"Cookie": cookie, "X-Keelgate-Key": key}
            statuses = [inbox.request("GET", "/", headers=pages)[0] for _ in range(20)]
            kept = http.client.HTTPConnection("127.0.0.1", inbox.port, timeout=10)
            for _ in range(10):  # one connection, kept alive while strangers come and go
                kept.request("GET", "/", headers={"Host": f"127.0.0.1:{inbox.port}", **pages})
                answer = kept.getresponse()
                statuses.append(answer.status)
                html = answer.read().decode()
                time.sleep(0.05)
            kept.close()
            status, _, _ = inbox.request(
                "POST",
                "/decide",
                headers={"Cookie": cookie, "Origin": f"http://127.0.0.1:{inbox.port}"},
                body=_form(_form_token(html)),
            )
            assert stranger.opened > 8  # the inbox closed the stranger's idle sockets
        assert statuses == [200] * 30, statuses
        assert status == 303 and len(inbox.cluster.patches) == 1


def test_a_stranger_cannot_close_the_persons_connections_and_is_told_503_when_all_are_hers(
    tmp_path: Path,
) -> None:
    """Every slot held by the person's kept-alive connections: a stranger's new connection is
    answered 503 and closed, and each of her connections still answers."""
    for inbox in _inbox(tmp_path, max_connections=3):
        cookie, key = inbox.sign_in()
        headers = {"Host": f"127.0.0.1:{inbox.port}", "Cookie": cookie, "X-Keelgate-Key": key}
        hers = [http.client.HTTPConnection("127.0.0.1", inbox.port, timeout=10) for _ in range(3)]
        for conn in hers:
            conn.request("GET", "/", headers=headers)
            first = conn.getresponse()
            assert first.status == 200 and first.read()
        answer, took, closed = _raw(inbox, b"", wait=3)
        assert answer.startswith(b"HTTP/1.1 503 ") and closed and took < 2, answer
        for conn in hers:
            conn.request("GET", "/", headers=headers)
            reply = conn.getresponse()
            assert reply.status == 200 and reply.read()
            conn.close()


def test_a_request_without_a_session_is_answered_and_its_connection_closed_at_once(
    inbox: Inbox,
) -> None:
    """A request that shows no session never waits in a thread: a page is answered 401 and the
    connection closed (no keep-alive for a stranger), and a form is refused before its body,
    which never comes, is waited for."""
    page = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{inbox.port}\r\n\r\n".encode()
    answer, took, closed = _raw(inbox, page)
    assert answer.startswith(b"HTTP/1.1 401 ") and b"Connection: close" in answer
    assert closed and took < 2
    form = (
        f"POST /decide HTTP/1.1\r\nHost: 127.0.0.1:{inbox.port}\r\nContent-Length: 100\r\n\r\ncsrf="
    ).encode()
    answer, took, closed = _raw(inbox, form)
    assert answer.startswith(b"HTTP/1.1 401 ") and closed and took < 2, (answer, took)
    assert inbox.cluster.patches == []


def _serving() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def test_session_flags_refuse_a_duration_that_is_not_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--session-idle and --session-lifetime take a duration such as 30m or 12h; anything else
    is one line naming the flag (exit 2)."""
    for flag in ("--session-idle", "--session-lifetime"):
        assert plugin_main(["ui", flag, "soon"]) == 2
        err = capsys.readouterr().err
        assert f"{flag}: 'soon': give a duration" in err and len(err.strip().splitlines()) == 1


class BatchViews(ShopViews):
    """Three approvals in shop, each for its call (their keys); the store's plan says each
    call's key as ``plan`` holds it."""

    def __init__(self, config: Path, cluster: FakeCluster) -> None:
        super().__init__(config, cluster)
        self.plan = {"a": "kg-a", "b": "kg-b", "c": "kg-c"}

    def inbox(self) -> list[Waiting]:
        (one,) = super().inbox()
        return [
            replace(one, name=f"{run}-1-place-order", run=run, key=key)
            for run, key in (("a", "kg-a"), ("b", "kg-b"), ("c", "kg-c"))
        ]

    def recorded(self, namespace: str, run: str, *, trail: bool) -> Recorded:
        return Recorded(keys={"1:0": self.plan[run]})


def _three_approvals(cluster: FakeCluster) -> None:
    for run in ("a", "b", "c"):
        cluster.runs[run] = run_body(run, pendingApprovals=[{"action": "1:0"}])
        cluster.objects["Approval"].append(
            decision("Approval", run, "1:0", idempotencyKey=f"kg-{run}", decisions=[])
        )


@pytest.fixture
def batch(tmp_path: Path) -> Iterator[Inbox]:
    yield from _inbox(tmp_path, fill=_three_approvals, views=BatchViews)


def _batch_form(token: str, choice: str, *picks: str, note: str = "") -> str:
    fields = [("csrf", token), ("choice", choice), ("note", note)]
    return urlencode([*fields, *(("pick", p) for p in picks)])


def test_ticked_approvals_are_decided_together_each_as_its_own_decision(batch: Inbox) -> None:
    """Approve selected, for the two ticked of three: each becomes a decision of its own (one
    patch each, in the user's name, with the note), the third is untouched, and the page says
    which were done; deny selected works the same way."""
    cookie, key = batch.sign_in()
    _, _, page = batch.request("GET", f"/k/{key}/", headers={"Cookie": cookie})
    picks = re.findall(r'name="pick" id="[^"]+" value="([^"]+)"', page)
    assert picks == ["shop|a|1:0|kg-a", "shop|b|1:0|kg-b", "shop|c|1:0|kg-c"]
    status, headers, _ = batch.request(
        "POST",
        f"/k/{key}/decide-many",
        headers={"Cookie": cookie},
        body=_batch_form(_form_token(page), "approve", picks[0], picks[2], note="both fine"),
    )
    assert status == 303 and "error=" not in headers["location"]
    assert [(name, spec["decisions+"]) for _, name, spec in batch.cluster.patches] == [
        (
            "a-1-place-order",
            {
                "by": "alice",
                "groups": ["system:authenticated"],
                "approved": True,
                "note": "both fine",
            },
        ),
        (
            "c-1-place-order",
            {
                "by": "alice",
                "groups": ["system:authenticated"],
                "approved": True,
                "note": "both fine",
            },
        ),
    ]
    _, _, after = batch.request("GET", headers["location"], headers={"Cookie": cookie})
    assert "a 1:0 (place_order) approved; c 1:0 (place_order) approved, by you" in after
    batch.request(
        "POST",
        f"/k/{key}/decide-many",
        headers={"Cookie": cookie},
        body=_batch_form(_form_token(page), "deny", picks[1]),
    )
    assert batch.cluster.patches[-1][1:] == (
        "b-1-place-order",
        {
            "decisions+": {"by": "alice", "groups": ["system:authenticated"], "approved": False},
            "first": False,
        },
    )


def test_a_ticked_approval_whose_call_changed_is_refused_and_the_others_are_done(
    batch: Inbox,
) -> None:
    """A box carries the key of the call it showed: when the run's plan now holds another call
    for that action (other arguments), or the Approval is for another call, that one is
    refused, saying so, and the rest of the batch is decided."""
    cookie, key = batch.sign_in()
    _, _, page = batch.request("GET", f"/k/{key}/", headers={"Cookie": cookie})
    views = batch.server.views
    assert isinstance(views, BatchViews)
    views.plan["a"] = "kg-a2"  # the store's plan changed after the page was read
    batch.cluster.objects["Approval"][1]["spec"]["idempotencyKey"] = "kg-b2"
    status, headers, _ = batch.request(
        "POST",
        f"/k/{key}/decide-many",
        headers={"Cookie": cookie},
        body=_batch_form(
            _form_token(page), "approve", "shop|a|1:0|kg-a", "shop|b|1:0|kg-b", "shop|c|1:0|kg-c"
        ),
    )
    assert status == 303
    _, _, after = batch.request("GET", headers["location"], headers={"Cookie": cookie})
    assert [name for _, name, _ in batch.cluster.patches] == ["c-1-place-order"]
    assert "its arguments changed since the page showed them" in after
    assert "its arguments are not the ones shown" in after


def test_a_batch_without_the_forms_token_or_with_the_cookie_alone_decides_nothing(
    batch: Inbox,
) -> None:
    """The batch keeps the inbox's session rules: no form token, another's, or a request from
    another origin is refused (403) and nothing is patched; nothing ticked decides nothing."""
    cookie, key = batch.sign_in()
    _, _, page = batch.request("GET", f"/k/{key}/", headers={"Cookie": cookie})
    mine = _form_token(page)
    pick = "shop|a|1:0|kg-a"
    for headers, body in (
        ({"Cookie": cookie}, _batch_form("", "approve", pick)),
        ({"Cookie": cookie}, _batch_form("x" + mine, "approve", pick)),
        ({"Cookie": cookie, "Origin": "http://127.0.0.1:1"}, _batch_form(mine, "approve", pick)),
        ({}, _batch_form(mine, "approve", pick)),
    ):
        status, _, _ = batch.request("POST", f"/k/{key}/decide-many", headers=headers, body=body)
        assert status in (401, 403)
    status, headers, _ = batch.request(
        "POST",
        f"/k/{key}/decide-many",
        headers={"Cookie": cookie},
        body=_batch_form(mine, "approve"),
    )
    assert status == 303 and "no+approval+was+selected" in headers["location"]
    assert batch.cluster.patches == []


def _alices_own(cluster: FakeCluster) -> None:
    """alice's run restock needs 2 of payments, not her, a reason to deny; its Approval."""
    rule = {"required": 2, "groups": ["payments"], "notCreator": True, "reasonToDeny": True}
    body = run_body("restock", phase="Stopped", pendingApprovals=[{"action": "1:0", "rule": rule}])
    body["metadata"]["annotations"] = {"keelgate.dev/created-by": "alice"}
    cluster.runs["restock"] = body
    cluster.groups = ("payments", "system:authenticated")
    cluster.objects["Approval"].append(decision("Approval", "restock", "1:0", decisions=[]))


def test_a_decision_the_rule_in_force_would_not_count_is_refused_with_the_judges_words(
    tmp_path: Path,
) -> None:
    """alice's own run's approval (her page shows it apart, with a Deny alone: see
    test_inbox_pages): a form that approves it anyway (crafted, or from a page read before)
    is refused with the one judge's words and nothing is patched; a deny without a reason is
    refused too; with one it goes."""
    for inbox in _inbox(tmp_path, fill=_alices_own):
        cookie, key = inbox.sign_in()
        _, _, page = inbox.request("GET", f"/k/{key}/", headers={"Cookie": cookie})
        token = _form_token(page)
        said = []
        for choice, note in (("approve", ""), ("deny", ""), ("deny", "not this month")):
            fields = {"kind": "Approval", "namespace": "shop", "run": "restock", "action": "1:0",
                      "choice": choice, "note": note, "csrf": token}  # fmt: skip
            status, headers, _ = inbox.request(
                "POST", f"/k/{key}/decide", headers={"Cookie": cookie}, body=urlencode(fields)
            )
            assert status == 303
            _, _, after = inbox.request("GET", headers["location"], headers={"Cookie": cookie})
            said.append(after)
        assert "alice created the run, and its rule asks for someone else" in said[0]
        assert "its rule asks a reason to deny" in said[1]
        assert "Not done" in said[0] and "Not done" in said[1]
        assert "denied by alice" in said[2]
        entry = {"by": "alice", "groups": ["payments", "system:authenticated"],
                 "approved": False, "note": "not this month"}  # fmt: skip
        assert inbox.cluster.patches == [
            ("Approval", "restock-1-place-order", {"decisions+": entry, "first": False})
        ]
