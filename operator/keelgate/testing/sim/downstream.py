"""The systems a run's tools change, and the tools that reach them over a simulated network.

Why it exists: the promise is about what happens *downstream*: an order placed at most once per
idempotency key, never after a true "not executed". So the shop here keeps the ground truth the
oracle judges by (``Ledger``: every effect, when, under which key, sent by which process, and
never deduplicated: a second order under one key must show as two). A tool call goes out as a
real tool would send it: each request reports itself right before its first byte with
``keelgate.about_to_send`` (which checks the write deadline, as the HTTP tool does in its
transport), and then the network and the shop do what the schedule says: answer, take the
request and lose the answer, hold it and act later (the call then goes on in the process, as a
timed-out call does, and ends on virtual time), refuse it (the request is withdrawn as sent:
``Send.refused``), or never receive it. ``pay`` is a composite WRITE: it charges, then sends the
receipt, two requests of one call, with a window between them where the process may die or be
held up past its deadline; once the charge may have gone out, no error of the call may read as
"nothing happened" (docs/design.md, "A tool call is one unit of knowledge").
A held request is cut at its call's write deadline, as the real tools cut every request there
(``keelgate.core.cutoff``): the process then hears an unknown outcome, and the shop, which may
not have noticed yet, acts at the latest within the fence's margin after the client hung up
(docs/design.md, "What the fence assumes of the downstream"): never after the store's deadline,
after which a person may truthfully settle the call "not executed". A system that acts later
than that is outside the promise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keelgate.core import fence
from keelgate.core.fence import Send, about_to_send
from keelgate.core.types import ApprovalRule, SideEffect, UnknownAction
from keelgate.errors import OutcomeUncertain, ToolError
from keelgate.testing.sim.world import World

#: The tools every simulated run has: (name, side effect, time limit in seconds).
TOOLS: tuple[tuple[str, SideEffect], ...] = (
    ("check_stock", SideEffect.READ),
    ("place_order", SideEffect.WRITE),
    ("notify", SideEffect.PROPOSE),
    ("pay", SideEffect.WRITE),  # composite: the charge, then the receipt
)
#: The tools that change things, which a spec may ask approval for.
CHANGING = tuple(name for name, side_effect in TOOLS if side_effect is not SideEffect.READ)
#: The requests of each tool's call, in order (one, but for a composite tool).
PARTS: dict[str, tuple[str, ...]] = {"pay": ("charge", "receipt")}
CALL_SECONDS = 30.0


@dataclass(frozen=True)
class Effect:
    """One change a downstream system made."""

    tool: str
    key: str
    at: float
    process: str
    #: How many people's approval the sending process's spec asked for this tool (0: none).
    approval_in_spec: int
    #: Which request of the call made it (a composite tool's charge or receipt).
    part: str = "request"


@dataclass
class Ledger:
    """The systems of record: every effect, in order, and every request that reached them
    (``received``: the effects' and those refused or held; what the network lost or never
    delivered is not there), each as the ``Effect`` it would have been."""

    effects: list[Effect] = field(default_factory=list)
    received: list[Effect] = field(default_factory=list)

    def count(self, key: str, part: str | None = None) -> int:
        """Effects under ``key`` (of one request of the call, if ``part`` is given)."""
        return sum(1 for e in self.effects if e.key == key and (part is None or e.part == part))

    def first(self, key: str) -> Effect | None:
        return next((e for e in self.effects if e.key == key), None)


class Sender:
    """What a tool knows of the process it runs in (``processes.StepProcess``)."""

    name: str
    alive: bool

    def window(self, name: str) -> None:
        """A moment where the process may be held up or die (the world decides)."""
        raise NotImplementedError

    def approval_in_spec(self, tool: str) -> int:
        """How many people's approval the process's spec asks for ``tool`` (0: none)."""
        raise NotImplementedError

    def late(self, call: LateCall) -> None:
        """A call that goes on after the process stopped waiting for it."""
        raise NotImplementedError


class LateCall:
    """A request the shop holds: it acts later, or refuses it in the end (a late 4xx: nothing
    happens, and the request is withdrawn as sent), and ``when_done`` is told how it ended, as a
    timed-out call still running on a worker is; the gateway keeps its key meanwhile. If the
    call's deadline comes first, the client hangs up (``cut``): the process is told the outcome
    is unknown, and whatever the shop does after that, nobody hears."""

    def __init__(
        self,
        world: World,
        sender: Sender,
        effect: Callable[[], Any],
        *,
        sent: Send,
        what: str,
        refused: str = "",
    ) -> None:
        self._world = world
        self._sender = sender
        self._effect = effect
        self._sent = sent
        self._what = what
        self._refused = refused  # the refusal it ends with ("": it acts)
        self._callbacks: list[Callable[[Any, BaseException | None], None]] = []
        self.ended = False  # the process no longer waits for it (answered, or cut)

    def when_done(self, callback: Callable[[Any, BaseException | None], None]) -> None:
        self._callbacks.append(callback)

    def cut(self) -> None:
        """The call's deadline came with no answer: the tool closed the connection."""
        if self.ended:
            return
        self.ended = True
        self._world.say(f"{self._sender.name} {self._what} cut at its deadline")
        self._tell(None, OutcomeUncertain(f"{self._what}: cut at its deadline"))

    def end(self) -> None:
        """The shop acts (or refuses) now; the process, if it still lives and still waits,
        hears the answer."""
        heard = not self.ended
        self.ended = True
        output: Any = None
        error: BaseException | None = None
        if self._refused:
            self._world.say(f"{self._sender.name} {self._refused}")
            if heard:
                self._sent.refused()
            error = ToolError(self._refused)
        else:
            output = self._effect()
        if heard:
            self._tell(output, error)

    def _tell(self, output: Any, error: BaseException | None) -> None:
        if not self._sender.alive:
            return  # its worker died with the process: the key reads unknown
        for callback in self._callbacks:
            callback(output, error)


class SimTool:
    """One tool of one process: the manifest's name, class and approval rule, sending to the
    simulated shop."""

    def __init__(
        self,
        world: World,
        ledger: Ledger,
        sender: Sender,
        *,
        name: str,
        side_effect: SideEffect,
        requires_approval: bool,
        timeout_seconds: float | None,
        approval: ApprovalRule | None = None,
    ) -> None:
        self.name = name
        self.side_effect = side_effect
        self.requires_approval = requires_approval
        self.approval = approval
        self.description = f"the shop's {name}"
        self.input_schema: Mapping[str, Any] = {"type": "object"}
        self.timeout_seconds = timeout_seconds
        self._world = world
        self._ledger = ledger
        self._sender = sender

    def invoke(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        if idempotency_key is None:  # a READ: nothing changes downstream
            return {"sku": args.get("sku"), "count": 3}
        key = idempotency_key
        # Held up between the claim and the send (the fence's window).
        self._sender.window("before_send")
        parts = PARTS.get(self.name, ("request",))
        output: Any = None
        for number, part in enumerate(parts):
            if number:
                # Between two requests of one call: the process may die here, or be held up
                # past its deadline (the next request's report then refuses to send it).
                self._sender.window("mid_tool")
            output = self._request(key, part, last=number == len(parts) - 1)
        return output

    def _request(self, key: str, part: str, *, last: bool) -> Any:
        """One request of the call: reported right before its first byte (the deadline is
        checked there), then what the network and the shop make of it."""
        world, schedule = self._world, self._world.schedule
        sent = about_to_send(key)
        what = self.name if part == "request" else f"{self.name} {part}"
        fate = schedule.pick(12)
        if fate == 1:  # never received (the connection was refused): a definite failure
            world.say(f"{self._sender.name} {what} refused by the network (nothing sent)")
            sent.refused()
            raise ToolError(f"{what}: connection refused")
        if fate not in (1, 3):  # it reaches the shop (the network neither refuses nor loses it)
            approval = self._sender.approval_in_spec(self.name)
            request = Effect(self.name, key, world.now, self._sender.name, approval, part)
            self._ledger.received.append(request)
        if fate == 2:  # the shop refuses it (a 4xx): nothing happens
            world.say(f"{self._sender.name} {what} refused by the shop")
            sent.refused()
            raise ToolError(f"{what}: the shop refused it")
        if fate == 3:  # sent, lost on the way: nothing happens, but nobody can tell
            world.say(f"{self._sender.name} {what} lost before the shop")
            raise OutcomeUncertain(f"{what}: connection reset")
        if fate == 4:  # held by the shop, acted on later (or refused)
            # The tool hangs up at the call's deadline; the shop acts at the latest within the
            # margin after that (the fence's assumption about the downstream).
            deadline = fence.current()
            assert deadline is not None  # a keyed request runs inside its call
            cut = deadline.remaining()
            delay = schedule.between(0.5, max(0.5, cut + fence.MARGIN * 0.9))
            refused = f"{what} refused late by the shop" if schedule.chance(250) else ""
            call = LateCall(
                world,
                self._sender,
                lambda: self._effect(key, part),
                sent=sent,
                what=what,
                refused=refused,
            )
            world.say(f"{self._sender.name} {what} held by the shop for {delay:.1f}s")
            world.at(delay, f"late {what}", call.end)
            if delay > cut:
                world.at(cut, f"cut {what}", call.cut)
            self._sender.late(call)
            raise OutcomeUncertain(f"{what} did not return in time", still_running=call)
        output = self._effect(key, part)
        if last:
            self._sender.window("mid_tool")
        if fate == 5:  # taken, answer lost
            world.say(f"{self._sender.name} {what} answer lost")
            raise OutcomeUncertain(f"{what}: connection reset after the request")
        return output

    def _effect(self, key: str, part: str) -> Any:
        world = self._world
        approval = self._sender.approval_in_spec(self.name)
        effect = Effect(self.name, key, world.now, self._sender.name, approval, part)
        self._ledger.effects.append(effect)
        shown = self.name if part == "request" else f"{self.name} {part}"
        world.say(f"EFFECT {shown} {key[:12]} by {self._sender.name}")
        return {"done": self.name, "n": self._ledger.count(key, part)}


class ShopConfirmer:
    """Trusted code that asks the shop whether an unknown call took effect (the ADR's
    confirmer): True or False from the ledger, or None when the shop does not answer."""

    name = "shop-confirmer"

    def __init__(self, world: World, ledger: Ledger) -> None:
        self._world = world
        self._ledger = ledger

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        if self._world.schedule.chance(300):
            return None
        return self._ledger.count(action.idempotency_key) > 0
