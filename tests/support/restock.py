"""The restock run the loop's behaviour tests drive, and what they drive it with.

A script (read a stock level, place an order, done), argument values that must never reach the
audit chain, a python model that answers from the script and records every request it gets, a
monotonic clock that moves only when a test moves it, and loops over real stores with counted
tools. Nothing here fakes a store or the loop: only the model and the clock are the test's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crashkit import Journal, World
from keelgate.adapters.models.python import PythonModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.audit import AuditEvent
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores, Tool
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect

#: Argument values that must never reach the audit chain.
SECRET_NOTE = "gate-code-4417"
SECRET_SKU = "sku-hidden-9c2e"

ORDER: dict[str, Any] = {"sku": SECRET_SKU, "qty": 20, "note": SECRET_NOTE}
READ_A1: dict[str, Any] = {"tool": "get_inventory", "args": {"sku": "A1"}}
PLACE: dict[str, Any] = {"tool": "place_order", "args": ORDER}
DONE: dict[str, Any] = {"done": True, "answer": "ordered"}

# Read, write, done: the smallest run with a WRITE in it.
RESTOCK: list[dict[str, Any]] = [
    {"actions": [READ_A1], "usage": {"inputTokens": 100, "outputTokens": 20}},
    {"actions": [PLACE], "usage": {"inputTokens": 100, "outputTokens": 20}},
    {**DONE, "usage": {"inputTokens": 100, "outputTokens": 20}},
]


class FakeClock:
    """A monotonic clock that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recorder:
    """A python model answering from a script by call number, recording every request it gets.

    ``on_call`` runs inside each call (e.g. to let fake time pass while the model "thinks")."""

    def __init__(
        self,
        script: list[dict[str, Any]],
        *,
        on_call: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.on_call = on_call

    def __call__(self, request: dict[str, Any]) -> Mapping[str, Any]:
        self.requests.append(request)
        if self.on_call is not None:
            self.on_call(request)
        entry: dict[str, Any] = self.script[request["call"]]
        if request["phase"] == "verify":
            return {"verdict": entry.get("verdict", "accept"), "reason": entry.get("reason", "")}
        return entry

    def calls(self, phase: str = "plan") -> list[int]:
        return [r["call"] for r in self.requests if r["phase"] == phase]


def spec(run: str = "restock", **budget: Any) -> LoopSpec:
    return LoopSpec("shop", run, "restock SKU A1", budget=Budget(**budget))


def loop_over(
    stores: Stores, model: Recorder | None, tools: list[PythonTool] | list[Tool], **options: Any
) -> Loop:
    python = None if model is None else PythonModel(model, name="recorder")
    return Loop(stores=stores, model=python, tools=tools, busy_wait=0.2, **options)


def events_text(stores: Stores, run: LoopSpec) -> str:
    return json.dumps([e.to_json() for e in stores.audit.events(run.tenant, run.run)])


def only(events: list[AuditEvent], kind: str) -> list[AuditEvent]:
    return [e for e in events if e.type == kind]


def history_actions(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [a for entry in request["history"] for a in entry.get("actions", [])]


class Flaky:
    """A WRITE whose call ends in an error after (or before) its effect reached downstream."""

    def __init__(self, journal: Journal, error: BaseException, *, effect: bool = True) -> None:
        self.journal = journal
        self.error = error
        self.effect = effect
        self.calls = 0

    def __call__(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        self.calls += 1
        if self.effect:
            self.journal.record("effect", tool="place_order", key=idempotency_key, args=dict(args))
        raise self.error

    def tools(self, world: World) -> list[PythonTool]:
        read = world.tools()[0]
        return [read, PythonTool("place_order", self, SideEffect.WRITE)]


def loop_with_look_and_order(
    stores: Stores, answers: Sequence[Mapping[str, Any]], **kwargs: Any
) -> Loop:
    """A loop with a READ (``look``) and a WRITE that needs approval (``order``), its
    model answering planning call n with ``answers[n]`` and accepting every verify."""
    replies = list(answers)

    def model(request: dict[str, Any]) -> Mapping[str, Any]:
        if request["phase"] == "verify":
            return {"verdict": "accept"}
        return replies[request["call"]]

    def look(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        return {"inStock": 3}

    def order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        return {"ordered": True}

    return Loop(
        stores=stores,
        model=PythonModel(model),
        tools=[
            PythonTool("look", look),
            PythonTool("order", order, SideEffect.WRITE, requires_approval=True),
        ],
        **kwargs,
    )


def asked(pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the pending approvals ask, less the fingerprint of each call's definition (checked
    to be one: 16 hex digits), which changes with the test's tool paths."""
    for item in pending:
        assert re.fullmatch(r"[0-9a-f]{16}", item["definition"]), item
    return [{k: v for k, v in item.items() if k != "definition"} for item in pending]
