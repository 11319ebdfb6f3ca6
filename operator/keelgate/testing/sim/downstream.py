"""The shop a run's tools change, reached over the simulated network, and the one tool whose
code is the world's own: ``pay``, a composite Python tool.

Why it exists: the promise is about what happens *downstream*: an order placed at most once,
never after a true "not executed", never unapproved. So the shop books every effect (``Effect``:
when, which call by its ``ref``, which request made it) and never deduplicates: a second order of
one call must show as two. It is a server on the network (``keelgate.testing.sim.network``): the
product's HTTP tool sends ``place_order`` (``POST /orders``), ``notify`` (``POST /notices``) and
``check_stock`` (``GET /stock/{sku}``) to it, its MCP tool sends ``place_order`` to ``/mcp``
in some runs, and what the network makes of each request is drawn there. In some runs the
product's own HTTP confirmer (``keelgate step --confirmer-url``) asks the shop's status endpoint
(``GET /status/{idempotencyKey}``) whether a call took effect; the shop answers from its own
ledger (the requests it received under that key, and the effects of their call), in the wire
format the confirmer's docstring gives (``{"executed": true|false}``), and now and then in the
forms the confirmer must not read as an answer (no ``executed``, a null, a 404 for a key it never
received, a 5xx, slow, or a dropped connection).

``pay`` is a user's Python tool that makes two requests of one call (the charge, then the
receipt), each reported right before it leaves with ``keelgate.about_to_send``, with a window
between where the process may die or be held up past its deadline; once the charge may have
gone out, no error of the call may read as "nothing happened". Keelgate's Python tool runs such a
function on a worker thread and stops waiting at its time limit (the call then goes on); that
thread cannot run on virtual time, so ``SimTool`` stands in for the wrapper: it runs the
function's requests in line, waits for each as the worker's caller would (up to the call's
limit), and hands a request the shop holds longer to the gateway as a call still running
(``LateCall``), which ends on virtual time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

import httpx

from keelgate.adapters.confirmers import TIMEOUT_SECONDS as CONFIRMER_SECONDS
from keelgate.adapters.confirmers import HttpConfirmer
from keelgate.core import fence
from keelgate.core.fence import MARGIN, Send, about_to_send
from keelgate.core.types import ApprovalRule, SideEffect, UnknownAction
from keelgate.errors import OutcomeUncertain, ToolError
from keelgate.testing.sim.books import Books, Decision, Effect, Question
from keelgate.testing.sim.network import (
    Fate,
    Network,
    Reply,
    Request,
    Reset,
    Sender,
    Silence,
    Transport,
    Unsent,
)
from keelgate.testing.sim.world import World

SHOP = "http://shop.sim"
#: The tools every simulated run has: (name, side effect).
TOOLS: tuple[tuple[str, SideEffect], ...] = (
    ("check_stock", SideEffect.READ),
    ("place_order", SideEffect.WRITE),
    ("notify", SideEffect.PROPOSE),
    ("pay", SideEffect.WRITE),  # composite: the charge, then the receipt
)
#: The tools that change things, which a spec may ask approval for.
CHANGING = tuple(name for name, side_effect in TOOLS if side_effect is not SideEffect.READ)
#: The requests of the composite tool's call, in order (in some runs a quote first: a request
#: that changes nothing, as composite tools often make before the one that does).
PAY_PARTS = (("charge", f"{SHOP}/charges"), ("receipt", f"{SHOP}/receipts"))
QUOTE = ("quote", f"{SHOP}/quotes")
#: Every tool's time limit (``timeoutSeconds``).
CALL_SECONDS = 30.0
PAY_CALLABLE = "keelgate.testing.sim.downstream:pay"
MCP_URL = f"{SHOP}/mcp"
#: Another ordering tool of the shop's MCP server: ``place_order`` pointed at it (``Desk.edit``'s
#: "place_order remote") makes a call nobody approved where people approved ``place_order``.
RUSH = "place_rush_order"
#: The tools the shop's MCP server offers (``tools/list``): name -> description.
MCP_TOOLS: Mapping[str, str] = {
    "place_order": "place an order",
    "notify": "tell the shop's staff",
    RUSH: "place an order, delivered first",
}
#: The shop's status endpoint, as the confirmer's URL template names it (``--confirmer-url``).
STATUS_PATH = "/status/"
STATUS_URL = f"{SHOP}{STATUS_PATH}{{idempotencyKey}}?tool={{tool}}&action={{action}}"
#: The HTTP confirmer's time limit, as ``keelgate step`` makes it.
STATUS_SECONDS = CONFIRMER_SECONDS


def http_tool(name: str) -> dict[str, Any]:
    """A tool's manifest entry as an HTTP tool of the shop."""
    method, path = {
        "check_stock": ("GET", "/stock/{sku}"),
        "place_order": ("POST", "/orders"),
        "notify": ("POST", "/notices"),
    }[name]
    return {"http": {"method": method, "url": f"{SHOP}{path}"}}


def mcp_tool(name: str) -> dict[str, Any]:
    """A tool's manifest entry as a tool of the shop's MCP server (its schema given, so the
    server is not asked for it before the run starts)."""
    return {"mcp": {"url": MCP_URL, "tool": name}, "inputSchema": {"type": "object"}}


class Shop:
    """The shop's systems of record, as a server on the network."""

    def __init__(self, world: World, books: Books, *, late_shop: bool = False) -> None:
        self.world = world
        self.books = books
        self.late_shop = late_shop
        #: The call each process's confirmer is asking about now (by the process's name): its
        #: confirmer's name, the action's label and the call's ref, as the product handed them
        #: to its confirmer (``ProductConfirmer``).
        self.asking: dict[str, tuple[str, str, str]] = {}

    def fate(self, request: Request, limit: float) -> Fate:
        """What the network and the shop make of one request (drawn)."""
        if request.path.startswith(STATUS_PATH):
            return self._status_fate()
        schedule = self.world.schedule
        pick = schedule.pick(16)
        if pick == 1:
            return Fate("unreachable")
        if pick == 2:
            return Fate("refused")
        if pick == 3:
            return Fate("lost", reset=schedule.chance(500))
        if pick in (4, 5):
            # Held: acted on (or refused) a while after it came, often after its sender gave up
            # waiting; the network keeps that within the write deadline's margin (with
            # ``late_shop``, at its very end once its sender gave up).
            delay = schedule.between(0.5, CALL_SECONDS + MARGIN)
            return Fate("held", delay=delay, refuses=schedule.chance(250))
        if pick == 6:
            return Fate("answer-lost", reset=schedule.chance(500))
        if pick == 7:
            return Fate("error", acts=schedule.chance(500))
        return Fate("ok")

    def _status_fate(self) -> Fate:
        """What becomes of a confirmer's question (drawn): answered (the calm one); the
        connection refused; dropped after the question left; no answer within the confirmer's
        time limit (a slow server is, to its client, silence until it hangs up); a 5xx;
        answered after a while, within the limit; answered, the answer lost on its way back."""
        schedule = self.world.schedule
        pick = schedule.pick(10)
        if pick == 1:
            return Fate("unreachable")
        if pick == 2:
            return Fate("lost", reset=True)
        if pick == 3:
            return Fate("lost")
        if pick == 4:
            return Fate("error", acts=False, status=(500, 503)[schedule.pick(2)])
        if pick == 5:
            return Fate("held", delay=schedule.between(0.5, STATUS_SECONDS - 1.0))
        if pick == 6:
            return Fate("answer-lost", reset=True)
        return Fate("ok")

    def _status(self, request: Request) -> Reply:
        """The status endpoint: the shop finds the requests it received under the key, as a
        real shop's ledger does, and says whether their call (the ref it read off them: the
        world's identity of the call) took effect by now. A key it never received is "not
        found" (404), or, as another kind of shop says it, not executed; now and then it
        answers without saying (no ``executed``, or a null: its ledger behind, say)."""
        schedule = self.world.schedule
        key = unquote(request.path[len(STATUS_PATH) :])
        refs = {s.ref for s in self.books.sent if key and s.reached and s.key == key}
        body: dict[str, Any] = {"idempotencyKey": key}
        if not refs:
            if schedule.chance(500):
                return Reply(404, {"error": "no order under that key"})
            return Reply(200, {**body, "executed": False})
        shape = schedule.pick(6)
        if shape == 1:
            return Reply(200, {**body, "state": "unknown"})
        if shape == 2:
            return Reply(200, {**body, "executed": None})
        executed = any(self.books.happened(ref, self.world.now) for ref in refs)
        return Reply(200, {**body, "executed": executed})

    def heard(self, status: int, content: bytes) -> None:
        """The shop's answer reached the confirmer of the process acting now: an answer that
        says ``executed`` true or false (as the confirmer's wire format has it) goes into the
        books as that confirmer's decision about the call it was asked, as a person's does;
        any other says nothing."""
        world = self.world
        asked = self.asking.get(world.actor)
        if asked is None:
            return
        name, action, ref = asked
        try:
            executed = json.loads(content).get("executed") if status == 200 else None
        except (ValueError, AttributeError):
            executed = None
        world.say(f"{name} hears about {action}: HTTP {status} {content.decode(errors='replace')}")
        if not isinstance(executed, bool):
            return
        self.books.questions.append(Question(world.now, name, action, ref))
        self.books.decisions.append(
            Decision(
                world.now,
                "settle",
                name,
                name,
                action,
                ref,
                executed,
                truthful=executed == self.books.happened(ref, world.now),
                source="confirmer",
            )
        )

    def handle(self, request: Request, sent: int | None) -> Reply:
        """The shop acts on a request that reached it (a read changes nothing)."""
        if request.path.startswith(STATUS_PATH):
            return self._status(request)
        if request.method == "GET":
            return Reply(200, {"sku": request.args.get("sku"), "count": 3})
        ref = str(request.args.get("ref", ""))
        self.books.effects.append(Effect(self.world.now, ref, request.part, sent or 0))
        what = request.endpoint if request.part == "request" else request.part
        self.world.say(f"EFFECT {what} {ref} by {self.world.actor or 'the shop'}")
        done = sum(1 for e in self.books.effects if e.ref == ref and e.part == request.part)
        return Reply(201, {"done": request.path, "ref": ref, "n": done})


class LateCall:
    """A request of ``pay`` the shop holds past the tool's wait: it acts (or refuses) later,
    and ``when_done`` is told how it ended, as a timed-out call still running on a worker is;
    the gateway keeps its key meanwhile."""

    def __init__(
        self,
        world: World,
        network: Network,
        sender: Sender,
        act: Callable[[], Any],
        *,
        send: Send,
        index: int | None,
        refuses: bool,
        what: str,
    ) -> None:
        self._world = world
        self._network = network
        self._sender = sender
        self._act = act
        self._send = send
        self._index = index
        self._refuses = refuses
        self._what = what
        self._callbacks: list[Callable[[Any, BaseException | None], None]] = []
        self.ended = False
        self._heard: tuple[Any, BaseException | None] | None = None

    def when_done(self, callback: Callable[[Any, BaseException | None], None]) -> None:
        if self._heard is not None:
            callback(*self._heard)  # it ended already: told at once, as a worker's call is
        else:
            self._callbacks.append(callback)

    def end(self) -> None:
        """The shop acts (or refuses) now; the process, if it still lives, hears the answer."""
        self.ended = True
        output: Any = None
        error: BaseException | None = None
        with self._world.acting(self._sender.name):
            if self._refuses:
                self._world.say(f"{self._sender.name} {self._what} refused late by the shop")
            else:
                output = self._act()
        if not self._sender.alive:
            return  # its worker died with the process: the key reads unknown
        self._network.known(self._index, refused=self._refuses)
        if self._refuses:
            self._send.refused()
            error = ToolError(f"{self._what}: the shop refused it")
        self._heard = (output, error)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(output, error)


class SimTool:
    """``pay``, as Keelgate's Python tool runs it: the manifest's name, class and approval rule,
    the function's requests made in line (see the module's docstring)."""

    def __init__(
        self,
        world: World,
        network: Network,
        sender: Sender,
        *,
        name: str,
        side_effect: SideEffect,
        requires_approval: bool,
        timeout_seconds: float | None,
        approval: ApprovalRule | None = None,
        quote: bool = False,
    ) -> None:
        self.name = name
        self.side_effect = side_effect
        self.requires_approval = requires_approval
        self.approval = approval
        self.parts = ((QUOTE,) if quote else ()) + PAY_PARTS
        self.description = "charge, then send the receipt"
        self.input_schema: Mapping[str, Any] = {"type": "object"}
        self.timeout_seconds = timeout_seconds
        self._world = world
        self._network = network
        self._sender = sender

    def invoke(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        if idempotency_key is None:
            raise ToolError(f"{self.name}: called as a READ")
        output: Any = None
        for number, (part, url) in enumerate(self.parts):
            if number:
                # Between two requests of one call: the process may die here, or be held up
                # past its deadline (the next request's report then refuses to send it).
                self._sender.window("mid_tool")
            body: dict[str, Any] = {"ref": args.get("ref")}
            if part in ("quote", "charge"):
                body["amount"] = args.get("amount")
            method = "GET" if part == "quote" else "POST"
            output = self._request(Request(method, url, body, idempotency_key, part))
        self._sender.window("mid_tool")
        return output

    def _limit(self) -> float:
        """How long the worker's caller waits (``PythonTool.invoke``): the tool's time limit,
        and never past the call's write deadline."""
        limit = self.timeout_seconds
        deadline = fence.current()
        if deadline is not None:
            left = deadline.remaining()
            limit = left if limit is None else min(limit, left)
        return CALL_SECONDS if limit is None else limit

    def _request(self, request: Request) -> Any:
        sends: list[Send] = []
        what = f"{self.name} {request.part}"
        held: list[LateCall] = []

        def late(fate: Fate, index: int | None) -> None:
            call = LateCall(
                self._world,
                self._network,
                self._sender,
                lambda: self._network.servers["shop.sim"].handle(request, index),
                send=sends[-1],
                index=index,
                refuses=fate.refuses,
                what=what,
            )
            self._world.at(fate.delay, f"late {what}", call.end)
            self._sender.late(call)
            held.append(call)

        try:
            reply = self._network.exchange(
                request,
                limit=self._limit(),
                before_headers=lambda: sends.append(about_to_send(request.key)),
                late=late,
            )
        except Unsent:
            raise ToolError(f"{what}: connection refused") from None
        except Silence:
            if held:
                raise OutcomeUncertain(
                    f"{what} did not return in time", still_running=held[0]
                ) from None
            raise OutcomeUncertain(f"{what}: no answer in time") from None
        except Reset:
            raise OutcomeUncertain(f"{what}: connection reset after the request") from None
        if 400 <= reply.status < 500:
            sends[-1].refused()
            raise ToolError(f"{what}: the shop refused it")
        if reply.status >= 500:
            raise OutcomeUncertain(f"{what}: HTTP {reply.status}")
        return reply.body


class ShopConfirmer:
    """Trusted code that asks the shop whether an unknown call took effect (the ADR's
    confirmer): True or False from the shop's books, or None when the shop does not answer.
    Its questions and answers go into the world's books, as a person's do."""

    name = "shop-confirmer"

    def __init__(self, world: World, books: Books) -> None:
        self._world = world
        self._books = books

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        world = self._world
        ref = str(args.get("ref", ""))
        self._books.questions.append(Question(world.now, self.name, action.action, ref))
        if world.schedule.chance(300):
            return None
        happened = self._books.happened(ref, world.now)
        self._books.decisions.append(
            Decision(
                world.now,
                "settle",
                self.name,
                self.name,
                action.action,
                ref,
                happened,
                source="confirmer",
            )
        )
        return happened


class ProductConfirmer:
    """The product's own HTTP confirmer (``HttpConfirmer``, as ``keelgate step --confirmer-url``
    makes it), asking the shop's status endpoint over the simulated network. The world only
    notes which call the product asked it about (the ref of the arguments the gateway handed
    over, which the confirmer never sends), so that the shop's answer, as it reaches the
    confirmer (``StatusTransport``), goes into the books as a decision about that call; the
    confirmer's verdict is the product's reading, passed on untouched."""

    def __init__(self, world: World, shop: Shop) -> None:
        self._world = world
        self._shop = shop
        self._confirmer = HttpConfirmer(STATUS_URL, timeout_seconds=STATUS_SECONDS)
        self.name = self._confirmer.name

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        world = self._world
        ref = str(args.get("ref", ""))
        world.say(f"{world.actor} asks {self.name} about {action.action} {ref}")
        self._shop.asking[world.actor] = (self.name, action.action, ref)
        try:
            verdict = self._confirmer.confirm(tenant, run, action, args)
        finally:
            self._shop.asking.pop(world.actor, None)
        world.say(f"{world.actor}'s {self.name} says {verdict} of {action.action}")
        return verdict


class StatusTransport(Transport):
    """The confirmer's way to the shop's status endpoint: carried over the network like any
    request (its fates drawn by the shop), never booked as a request of a call; the answer
    that reaches the confirmer is told to the shop (``Shop.heard``)."""

    def __init__(self, network: Network, shop: Shop) -> None:
        super().__init__(network, book=False)
        self._shop = shop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        content = response.read()
        self._shop.heard(response.status_code, content)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=httpx.ByteStream(content),
            request=request,
        )


#: The world's function for ``pay`` while a simulation runs the product's own Python tool
#: (``keelgate.testing.sim.pay``): the innermost is the simulation's.
PAYING: list[Callable[..., Any]] = []


def pay(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
    """The manifest's callable for ``pay`` (what a step pod loads): the world's function where
    a simulation runs the product's Python tool (``sim.pay.Payer``); elsewhere the kept seeds'
    worlds run ``SimTool`` in its place, and nothing runs it outside a simulation."""
    if not PAYING:
        raise ToolError("pay runs only in a simulation")
    return PAYING[-1](args, idempotency_key=idempotency_key)


def mcp_reply(message: Mapping[str, Any], result: Any) -> dict[str, Any]:
    """A JSON-RPC answer to an MCP request."""
    return {"jsonrpc": "2.0", "id": message.get("id"), "result": result}


def tool_result(body: Any) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": json.dumps(body)}],
        "structuredContent": body,
        "isError": False,
    }
