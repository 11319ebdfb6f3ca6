"""The simulated network: what becomes of each request a step process sends, on virtual time.

Why it exists: the product's own HTTP tool, MCP tool and model adapters are what a run really
sends with, so they run here unchanged, over transports that carry their requests to the world's
servers (the shop, the model) instead of sockets (``keelgate.adapters.network`` is the seam).
A transport does what httpx's own does with a request: it honours the request's time limits
(its ``timeout`` extension: waiting past ``read`` ends in ``ReadTimeout``), tells the request's
``trace`` callback the moment its headers are about to be written (where the HTTP and MCP tools
check the write deadline), and raises what a broken connection raises (``ConnectError`` before
anything was sent, ``ReadError`` for a reset after). What happens between is drawn from the
schedule (``Fate``): the connection refused, the request lost on the way, refused by the server
(a 4xx), answered with a 5xx, acted on with its answer lost, held and acted on later (within the
write deadline's margin; at its very end with ``late_shop``), or answered. Waiting is the world's
``advance``: the rest of the world runs meanwhile.

Every request that leaves (its headers written) is booked (``Books.sent``) with what the world
reads off it: the call's ``ref`` from its arguments, its endpoint, its Idempotency-Key; and, when
its sender learns for sure what it came to, when (``Sent.known_at``). This module must never
consult the product's records, and never let a request leave that its ``trace`` refused.

Why one module past 500 lines: a request's fate, the moment its server acts on it and the books
of what reached the shop are one model, which the HTTP, MCP and SDK transports must share.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

import httpx
import httpx2

from keelgate.core import fence
from keelgate.errors import SimulatedCrash
from keelgate.testing.sim.books import Books, Sent
from keelgate.testing.sim.world import World

#: The headers' moment, as httpcore's trace names it.
HEADERS = "http11.send_request_headers.started"
#: Seconds a request waits with no time limit given (httpx's default).
DEFAULT_TIMEOUT = 5.0
#: The shortest hold of a request sent from a node in a network incident (half the simulated
#: calls' time limit, ``downstream.CALL_SECONDS``, which this module cannot import).
CONGESTED_HOLD = 15.0


class Sender(Protocol):
    """What the network knows of the process sending (``processes.StepProcess``)."""

    name: str
    alive: bool

    @property
    def congested(self) -> bool:
        """Whether the process's node is in a network incident (its store answers came back
        late a moment ago): its requests are then held long by whatever they reach."""

    def window(self, name: str) -> None:
        """A moment where the process may be held up or die (the world decides)."""

    def late(self, call: Any) -> None:
        """A call that goes on in the process after it stopped waiting for it."""


@dataclass(frozen=True)
class Fate:
    """What becomes of one request: ``kind`` and, for a held one, when the server acts and
    whether it refuses in the end."""

    kind: str  # unreachable | lost | refused | error | answer-lost | held | ok
    reset: bool = False  # a lost request or answer shows as a reset (at once), not silence
    acts: bool = True  # an error (5xx): whether the server acted before it
    delay: float = 0.0  # held: seconds after the send the server acts (or refuses)
    refuses: bool = False  # held: it refuses in the end
    status: int = 0  # refused or error: the answer's status (409, 503 if not given)
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Reply:
    """A server's answer."""

    status: int
    body: Any = None
    headers: Mapping[str, str] | None = None


class Server(Protocol):
    """A system the network reaches (the shop, the model)."""

    def fate(self, request: Request, limit: float) -> Fate: ...

    def handle(self, request: Request, sent: int | None) -> Reply: ...


@dataclass(frozen=True)
class Request:
    """A request as the network carries it."""

    method: str
    url: str  # without its query
    args: Mapping[str, Any]  # its JSON body, or its query
    key: str  # its Idempotency-Key ("" for none)
    part: str = "request"
    headers: Mapping[str, str] | None = None
    #: An MCP call: the server's tool it calls ("" for a plain HTTP request).
    mcp_tool: str = ""

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def path(self) -> str:
        return urlsplit(self.url).path

    @property
    def endpoint(self) -> str:
        """Where it goes, as a tool's definition says it (``books.definition``)."""
        if self.mcp_tool:
            return f"mcp {self.url} {self.mcp_tool}"
        return f"{self.method} {self.url}"


class Unsent(Exception):
    """The request was never sent (the connection was refused)."""


class Silence(Exception):
    """No answer came within the request's time limit (it may or may not have been acted on)."""


class Reset(Exception):
    """The connection broke after the request left (it may or may not have been acted on)."""


class Network:
    """The world's network: servers by host, senders by name, and the books."""

    def __init__(self, world: World, books: Books, *, late_shop: bool = False) -> None:
        self.world = world
        self.books = books
        self.late_shop = late_shop
        self.servers: dict[str, Server] = {}
        self.senders: dict[str, Sender] = {}

    def sender(self) -> Sender:
        sender = self.senders.get(self.world.actor)
        if sender is None:
            raise AssertionError(f"{self.world.actor!r} sends, but is no process")
        return sender

    def exchange(
        self,
        request: Request,
        *,
        limit: float,
        before_headers: Callable[[], None] = lambda: None,
        book: bool = True,
        late: Callable[[Fate, int | None], None] | None = None,
    ) -> Reply:
        """Send ``request`` and wait for its answer up to ``limit`` seconds (what the sender
        would wait). ``before_headers`` runs right before its headers are written (it may refuse:
        then nothing left). ``late``, given a held request, takes it over instead of the request
        timing out (a Python tool's worker that goes on: ``downstream.LateCall``). Raises
        ``Unsent``, ``Silence`` or ``Reset`` as the connection does."""
        world = self.world
        asked = world.now  # the client's wait (``limit``) counts from its asking
        sender = self.sender()
        server = self.servers[request.host]
        fate = server.fate(request, limit)
        if fate.kind == "ok" and sender.congested:
            # One incident slows every connection of the node: the answer takes most of a
            # call's time limit, or longer, whatever the client said it would wait.
            schedule = world.schedule
            held_for = schedule.between(CONGESTED_HOLD, CONGESTED_HOLD * 2 + fence.MARGIN)
            fate = Fate("held", delay=held_for, refuses=schedule.chance(250))
        if fate.kind == "unreachable":
            world.say(f"{sender.name} {request.endpoint} {request.part}: connection refused")
            raise Unsent(request.endpoint)
        sender.window("before_send")  # connected; held up before the first byte leaves
        before_headers()
        index = self._booked(sender, request) if book else None
        where = f"{sender.name} {request.endpoint}{_part(request)}"
        if fate.kind == "lost":
            world.say(f"{where} lost on the way")
            return self._nothing_back(sender, limit, fate.reset)
        if fate.kind == "refused":
            self._reached(index)
            reply = Reply(fate.status or 409, {"error": {"message": "refused"}}, fate.headers)
            self._known(index, refused=True)
            world.say(f"{where} refused by the server")
            return reply
        if fate.kind == "held":
            self._reached(index)
            delay = self._held_for(fate, limit, asked)
            past = " (past its sender's wait)" if delay >= limit else ""
            world.say(f"{where} held by the server for {delay:.1f}s{past}")
            if delay < limit:
                # The server acts at its moment, whatever holds its client up meanwhile (a hold
                # run inside its wait, its death): the client hears it when its wait ends.
                answered: list[Reply] = []

                def act() -> None:
                    with world.acting(sender.name):
                        answered.append(self._answer(server, request, index, refused=fate.refuses))

                world.at(delay, f"answer {request.endpoint}", act)
                self._wait(sender, delay)
                return answered[0]
            if late is not None:
                # A worker that goes on: the caller stops waiting at its limit.
                late(Fate("held", delay=delay, refuses=fate.refuses), index)
                self._wait(sender, limit)
                raise Silence(request.endpoint)
            world.at(
                delay,
                f"late {request.endpoint}",
                lambda: self._late(server, request, index, refused=fate.refuses),
            )
            return self._nothing_back(sender, limit, False)
        self._reached(index)
        if fate.kind == "error":
            if fate.acts:
                server.handle(request, index)
            world.say(f"{where} answered {fate.status or 503}")
            return Reply(fate.status or 503, {"error": {"message": "unavailable"}})
        reply = server.handle(request, index)
        if fate.kind == "answer-lost":
            world.say(f"{where} answer lost")
            raise Reset(request.endpoint)
        self._known(index, refused=not 200 <= reply.status < 300)
        return reply

    # What a held request comes to

    def _held_for(self, fate: Fate, limit: float, asked: float) -> float:
        """When a held request is acted on: within the sender's wait, or after it but before
        the margin after its client hung up ends: the fence's assumption about a downstream
        (docs/design.md, "What the fence assumes of the downstream"). The client hangs up when
        the wait it asked for is over (``asked`` + ``limit``: the HTTP and MCP tools ask up to
        their cut-off, at the write deadline; a Python tool's caller up to the deadline too),
        so a product that keeps its requests open past the deadline meets a shop that acts past
        the store's deadline. With ``late_shop`` a request held past its sender's wait is acted
        on at the last moment that assumption allows (issue 48: a shop that acted later, any
        time in the call's limit, is one the fence does not cover, and no faithful model of one
        it does). A READ with no deadline in reach (every READ but one let through on
        approvals that expire) is answered within its wait."""
        if fence.current() is None:
            return min(fate.delay, limit * 0.9)
        ends = asked + limit + fence.MARGIN - 1.0 - self.world.now
        if self.late_shop and fate.delay >= limit:
            return max(0.1, ends)
        return max(0.1, min(fate.delay, ends))

    def _answer(
        self, server: Server, request: Request, index: int | None, *, refused: bool
    ) -> Reply:
        if refused:
            self._known(index, refused=True)
            return Reply(409, {"error": "refused"})
        reply = server.handle(request, index)
        self._known(index, refused=not 200 <= reply.status < 300)
        return reply

    def _late(self, server: Server, request: Request, index: int | None, *, refused: bool) -> None:
        if refused:
            self.world.say(f"{request.endpoint}{_part(request)} refused late")
        else:
            server.handle(request, index)

    def _nothing_back(self, sender: Sender, limit: float, reset: bool) -> Reply:
        if reset:
            raise Reset("reset")
        self._wait(sender, limit)
        raise Silence("timeout")

    def _wait(self, sender: Sender, seconds: float) -> None:
        self.world.advance(seconds)
        if not sender.alive:
            raise SimulatedCrash("waiting for an answer", 1)

    # The books

    def _booked(self, sender: Sender, request: Request) -> int:
        books = self.books
        books.sent.append(
            Sent(
                self.world.now,
                sender.name,
                str(request.args.get("ref", "")),
                request.part,
                request.endpoint,
                dict(request.args),
                request.key,
                order=books.next_order(),
            )
        )
        return len(books.sent) - 1

    def _reached(self, index: int | None) -> None:
        if index is not None:
            self.books.sent[index].reached = True

    def known(self, index: int | None, *, refused: bool) -> None:
        """The request's sender learned for sure what it came to (an answer that it took
        effect, or a definite refusal), now."""
        self._known(index, refused=refused)

    def _known(self, index: int | None, *, refused: bool) -> None:
        if index is None:
            return
        sent = self.books.sent[index]
        if sent.known_at is None:
            sent.known_at = self.world.now
            sent.refused = refused


def _part(request: Request) -> str:
    return "" if request.part == "request" else f" ({request.part})"


def read_request(request: Any) -> Request:
    """The network's view of an httpx (or httpx2) request: its endpoint, its arguments, its
    key."""
    url = str(request.url).split("?", 1)[0]
    args: dict[str, Any] = dict(parse_qsl(request.url.query.decode()))
    content = request.content
    if content:
        try:
            body = json.loads(content)
        except ValueError:
            body = None
        if isinstance(body, Mapping):
            args.update(body)
    key = request.headers.get("Idempotency-Key", "")
    return Request(request.method, url, args, key, headers=dict(request.headers))


def _carried(network: Network, library: Any, request: Any, *, book: bool) -> Any:
    """One request of a synchronous client of ``library`` (httpx or httpx2, the same API)
    carried over the network, answered or failed as that library's own transport would."""
    seen = read_request(request)
    timeout = request.extensions.get("timeout") or {}
    limit = float(timeout.get("read") or DEFAULT_TIMEOUT)
    trace = request.extensions.get("trace")

    def headers() -> None:
        if trace is not None:
            trace(HEADERS, {"request": request})

    try:
        reply = network.exchange(seen, limit=limit, before_headers=headers, book=book)
    except Unsent:
        raise library.ConnectError("connection refused", request=request) from None
    except Silence:
        raise library.ReadTimeout("timed out", request=request) from None
    except Reset:
        raise library.ReadError("connection reset by peer", request=request) from None
    # A body still to be read, as a real transport's answer is (``stream=True`` readers, the
    # HTTP tool's among them, iterate it; one built from ``json=`` reads as already consumed).
    body = json.dumps(reply.body).encode()
    head = {"content-type": "application/json", "content-length": str(len(body))}
    return library.Response(
        reply.status,
        headers={**head, **dict(reply.headers or {})},
        stream=library.ByteStream(body),
        request=request,
    )


class Transport(httpx.BaseTransport):
    """An httpx transport onto the simulated network: what the HTTP tool sends through
    (``keelgate.adapters.network``)."""

    def __init__(self, network: Network, *, book: bool = True) -> None:
        self.network = network
        self.book = book

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = _carried(self.network, httpx, request, book=self.book)
        return response


class SdkTransport(httpx2.BaseTransport):
    """An httpx2 transport onto the simulated network: what the model SDKs send through."""

    def __init__(self, network: Network, *, book: bool = False) -> None:
        self.network = network
        self.book = book

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response: httpx2.Response = _carried(self.network, httpx2, request, book=self.book)
        return response


#: The MCP protocol version the shop's server speaks, and the JSON-RPC code of a refusal.
MCP_VERSION = "2025-06-18"
INVALID_PARAMS = -32602


class McpTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport onto the shop's MCP server (streamable HTTP, JSON answers, no
    session): the MCP SDK's ``initialize``, its notifications and ``tools/call``, which goes
    out through the network's fates like any request (``keelgate.adapters.network``)."""

    def __init__(self, network: Network, tools: Mapping[str, str]) -> None:
        self.network = network
        self.tools = tools  # the server's tools: name -> description

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method != "POST":
            return httpx2.Response(405, request=request)
        message = json.loads(request.content or b"{}")
        method = message.get("method")
        if "id" not in message:
            return httpx2.Response(202, request=request)  # a notification
        if method == "initialize":
            params = message.get("params") or {}
            return _rpc(
                request,
                message,
                {
                    "protocolVersion": params.get("protocolVersion", MCP_VERSION),
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": "shop", "version": "1"},
                },
            )
        if method == "tools/list":
            listed = [
                {"name": n, "description": d, "inputSchema": {"type": "object"}}
                for n, d in self.tools.items()
            ]
            return _rpc(request, message, {"tools": listed})
        if method != "tools/call":
            return _rpc_error(request, message, -32601, f"no method {method}", status=404)
        return self._call(request, message)

    def _call(self, request: httpx2.Request, message: Mapping[str, Any]) -> httpx2.Response:
        params = message.get("params") or {}
        meta = params.get("_meta") or {}
        seen = Request(
            "POST",
            str(request.url).split("?", 1)[0],
            dict(params.get("arguments") or {}),
            str(meta.get("keelgate.dev/idempotency-key", "")),
            headers=dict(request.headers),
            mcp_tool=str(params.get("name", "")),
        )
        timeout = request.extensions.get("timeout") or {}
        limit = float(timeout.get("read") or DEFAULT_TIMEOUT)
        trace = request.extensions.get("trace")

        def headers() -> None:
            if trace is not None:
                _at_once(trace(HEADERS, {"request": request}))

        try:
            reply = self.network.exchange(seen, limit=limit, before_headers=headers)
        except Unsent:
            raise httpx2.ConnectError("connection refused", request=request) from None
        except Silence:
            raise httpx2.ReadTimeout("timed out", request=request) from None
        except Reset:
            raise httpx2.ReadError("connection reset by peer", request=request) from None
        if 400 <= reply.status < 500:
            return _rpc_error(request, message, INVALID_PARAMS, "the shop refused it", status=400)
        if reply.status >= 500:
            return httpx2.Response(reply.status, text="unavailable", request=request)
        result = {
            "content": [{"type": "text", "text": json.dumps(reply.body)}],
            "structuredContent": reply.body,
            "isError": False,
        }
        return _rpc(request, message, result)


def _at_once(step: Coroutine[Any, Any, Any]) -> None:
    """Run a coroutine that never waits (the MCP tool's trace callback) to its end, here."""
    try:
        step.send(None)
    except StopIteration:
        return
    step.close()
    raise AssertionError("the trace callback waited")


def _rpc(request: httpx2.Request, message: Mapping[str, Any], result: Any) -> httpx2.Response:
    return httpx2.Response(
        200,
        json={"jsonrpc": "2.0", "id": message.get("id"), "result": result},
        request=request,
    )


def _rpc_error(
    request: httpx2.Request, message: Mapping[str, Any], code: int, text: str, *, status: int
) -> httpx2.Response:
    return httpx2.Response(
        status,
        json={"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": code, "message": text}},
        request=request,
    )
