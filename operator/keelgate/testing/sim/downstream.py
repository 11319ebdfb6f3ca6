"""The systems a run's tools change, and the tools that reach them over a simulated network.

Why it exists: the promise is about what happens *downstream*: an order placed at most once per
idempotency key, never after a true "not executed". So the shop here keeps the ground truth the
oracle judges by (``Ledger``: every effect, when, under which key, sent by which process, and
never deduplicated: a second order under one key must show as two). A tool call goes out as a
real tool would send it: it checks its write deadline right before its first byte (as the HTTP
tool does in its transport), and then the network and the shop do what the schedule says: answer,
take the request and lose the answer, hold it and act later (the call then goes on in the
process, as a timed-out call does, and ends on virtual time), refuse it, or never receive it.
A late effect lands within the call's own time limit: a system that acts after the client gave
up is outside the promise (docs/design.md, "What is left of each window").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keelgate.core import fence
from keelgate.core.types import ApprovalRule, SideEffect, UnknownAction
from keelgate.errors import OutcomeUncertain, ToolError
from keelgate.testing.sim.world import World

#: The tools every simulated run has: (name, side effect, time limit in seconds).
TOOLS: tuple[tuple[str, SideEffect], ...] = (
    ("check_stock", SideEffect.READ),
    ("place_order", SideEffect.WRITE),
    ("notify", SideEffect.PROPOSE),
)
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


@dataclass
class Ledger:
    """The systems of record: every effect, in order."""

    effects: list[Effect] = field(default_factory=list)

    def count(self, key: str) -> int:
        return sum(1 for effect in self.effects if effect.key == key)

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
    """A request the shop holds: it acts later (``when_done`` is told how it ended), as a
    timed-out call still running on a worker does; the gateway keeps its key meanwhile."""

    def __init__(self, world: World, sender: Sender, effect: Callable[[], Any]) -> None:
        self._world = world
        self._sender = sender
        self._effect = effect
        self._callbacks: list[Callable[[Any, BaseException | None], None]] = []
        self.ended = False

    def when_done(self, callback: Callable[[Any, BaseException | None], None]) -> None:
        self._callbacks.append(callback)

    def end(self) -> None:
        """The shop acts now; the process, if it still lives, hears the answer."""
        self.ended = True
        output = self._effect()
        if not self._sender.alive:
            return  # its worker died with the process: the key reads unknown
        for callback in self._callbacks:
            callback(output, None)


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
        world, schedule = self._world, self._world.schedule
        if idempotency_key is None:  # a READ: nothing changes downstream
            return {"sku": args.get("sku"), "count": 3}
        key = idempotency_key
        # Held up between the claim and the send (the fence's window), then the deadline is
        # checked right before the first byte leaves, as the HTTP tool's transport does.
        self._sender.window("before_send")
        deadline = fence.current()
        if deadline is not None:
            deadline.check()
        fate = schedule.pick(12)
        if fate == 1:  # never received (the connection was refused): a definite failure
            world.say(f"{self._sender.name} {self.name} refused by the network (nothing sent)")
            raise ToolError(f"{self.name}: connection refused")
        if fate == 2:  # the shop refuses the order: nothing happens
            world.say(f"{self._sender.name} {self.name} refused by the shop")
            raise ToolError(f"{self.name}: the shop refused it")
        if fate == 3:  # sent, lost on the way: nothing happens, but nobody can tell
            world.say(f"{self._sender.name} {self.name} lost before the shop")
            raise OutcomeUncertain(f"{self.name}: connection reset")
        if fate == 4:  # held by the shop, acted on later, within the call's time limit
            delay = schedule.between(0.5, (self.timeout_seconds or CALL_SECONDS) * 0.9)
            call = LateCall(world, self._sender, lambda: self._effect(key))
            world.say(f"{self._sender.name} {self.name} held by the shop for {delay:.1f}s")
            world.at(delay, f"late {self.name}", call.end)
            self._sender.late(call)
            raise OutcomeUncertain(f"{self.name} did not return in time", still_running=call)
        output = self._effect(key)
        self._sender.window("mid_tool")
        if fate == 5:  # taken, answer lost
            world.say(f"{self._sender.name} {self.name} answer lost")
            raise OutcomeUncertain(f"{self.name}: connection reset after the request")
        return output

    def _effect(self, key: str) -> Any:
        world = self._world
        approval = self._sender.approval_in_spec(self.name)
        self._ledger.effects.append(Effect(self.name, key, world.now, self._sender.name, approval))
        world.say(f"EFFECT {self.name} {key[:12]} by {self._sender.name}")
        return {"done": self.name, "n": self._ledger.count(key)}


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
