"""How the loop behaves at every stop, budget, approval, settlement and gateway refusal.

Why it exists: ADR-0004 and the contract name each stop reason, each budget rule and each door a
WRITE must pass; a user notices every one of them. These tests drive the real loop over real
SQLite files with python models and tools whose every call is counted, and assert what a user
would see. Where a rule is proven once here and once more from another side, the second proof
runs on the real PostgreSQL server instead. They must never fake time with sleeps (a fake
monotonic clock is passed to the loop) and never accept a result nobody could observe.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from crashkit import Journal, World
from crashkit.world import LedgerConfirmer
from keelgate.adapters.models.python import PythonModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.audit import AuditEvent, verify
from keelgate.core.gateway import SIDE_EFFECT_NOT_PERMITTED
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores, Tool
from keelgate.core.spec import Budget, LoopSpec, Price
from keelgate.core.state import Step
from keelgate.core.types import (
    KeyState,
    LoopKind,
    RunPhase,
    SideEffect,
    StopReason,
    UnknownAction,
    idempotency_key,
)
from keelgate.errors import InputError, OutcomeUncertain, RunBusy, SettleError, ToolError
from keelgate.stores import open_stores
from keelgate.stores.sqlite import SQLiteStore

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


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "keelgate.db"


@pytest.fixture
def stores(db: Path) -> Iterator[Stores]:
    opened = open_stores(f"sqlite:///{db}")
    yield opened
    opened.close()


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(Journal(tmp_path / "world.jsonl"))


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


# Stop reasons


def test_a_run_that_meets_its_goal_stops_for_good(stores: Stores, world: World) -> None:
    """goal_met: phase Succeeded, not resumable, with the answer; running it again asks the model
    nothing and runs no tool."""
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, world.tools())
    outcome = loop.run_or_resume(spec())
    assert outcome.stop.reason is StopReason.GOAL_MET
    assert outcome.phase is RunPhase.SUCCEEDED
    assert not outcome.resumable
    assert outcome.answer == "ordered"
    assert outcome.iteration == 3
    assert sum(world.effects().values()) == 1
    asked = len(model.requests)
    again = loop.run_or_resume(spec())
    assert again.stop.reason is StopReason.GOAL_MET
    assert len(model.requests) == asked
    assert sum(world.effects().values()) == 1


def test_one_iteration_at_a_time_reaches_the_same_end_with_the_same_effects(
    stores: Stores, world: World
) -> None:
    """What a step pod does: each call with one_iteration ends at the iteration's end (phase
    Running, no stop), the next plans the next iteration, and the run ends exactly as one
    uninterrupted call would: goal met at iteration 3, one order, each plan asked once."""
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, world.tools())
    seen = []
    for _ in range(10):
        outcome = loop.run_or_resume(spec(), one_iteration=True)
        seen.append((outcome.phase, outcome.iteration))
        if outcome.phase is not RunPhase.RUNNING:
            break
    assert seen == [
        (RunPhase.RUNNING, 1),
        (RunPhase.RUNNING, 2),
        (RunPhase.SUCCEEDED, 3),
    ]
    assert sum(world.effects().values()) == 1
    assert model.calls("plan") == [0, 1, 2]
    assert verify("shop", "restock", stores.audit.events("shop", "restock")).ok


def test_a_goal_predicate_ends_the_run_when_the_history_says_so(
    stores: Stores, world: World
) -> None:
    """goal_met through the goal predicate: once an order shows in the history, the run stops
    without asking the model for the rest of its script."""

    def ordered(history: Any) -> bool:
        return any(
            a["tool"] == "place_order" and a["status"] == "ok"
            for entry in history
            for a in entry.get("actions", [])
        )

    model = Recorder([*RESTOCK[:2], {"actions": [PLACE]}, DONE])
    loop = loop_over(stores, model, world.tools(), goal_predicate=ordered)
    outcome = loop.run_or_resume(spec())
    assert outcome.stop.reason is StopReason.GOAL_MET
    assert outcome.iteration == 2
    assert model.calls("plan") == [0, 1]


def test_max_iterations_stops_and_a_resume_with_more_continues_where_it_stopped(
    stores: Stores, world: World
) -> None:
    """max_iterations is a resumable stop that keeps the run's state: raising the limit continues
    with the next iteration, never repeating a planning call or a WRITE."""
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, world.tools())
    first = loop.run_or_resume(spec(max_iterations=2))
    assert first.stop.reason is StopReason.MAX_ITERATIONS
    assert first.phase is RunPhase.STOPPED and first.resumable
    assert first.iteration == 2
    assert sum(world.effects().values()) == 1
    kept = loop.state("shop", "restock")
    assert kept.iteration == 2 and kept.step is Step.PLAN

    # The same limit: still stopped, nothing asked.
    assert loop.run_or_resume(spec(max_iterations=2)).stop.reason is StopReason.MAX_ITERATIONS
    assert model.calls("plan") == [0, 1]

    done = loop.run_or_resume(spec(max_iterations=5))
    assert done.stop.reason is StopReason.GOAL_MET
    assert done.iteration == 3
    assert model.calls("plan") == [0, 1, 2]
    assert sum(world.effects().values()) == 1
    assert done.usage.tokens == first.usage.tokens + 120


def _crossing_script(usage: Mapping[str, int]) -> list[dict[str, Any]]:
    return [
        {"actions": [READ_A1], "usage": {"inputTokens": 100, "outputTokens": 20}},
        {"actions": [PLACE], "usage": dict(usage)},
        {**DONE, "usage": {"inputTokens": 100, "outputTokens": 20}},
    ]


def test_the_call_that_crosses_the_token_budget_is_kept_and_its_plan_runs_after_a_raise(
    stores: Stores, world: World
) -> None:
    """token_budget: the call that crosses is accepted and counted, its plan is saved but nothing
    in it runs; a resume with more tokens runs that saved plan without asking the model again."""
    model = Recorder(_crossing_script({"inputTokens": 100, "outputTokens": 5000}))
    loop = loop_over(stores, model, world.tools())
    stopped = loop.run_or_resume(spec(tokens=2000))
    assert stopped.stop.reason is StopReason.TOKEN_BUDGET
    assert stopped.resumable and stopped.phase is RunPhase.STOPPED
    assert stopped.usage.tokens == 120 + 5100
    assert stopped.iteration == 2
    assert world.effects() == {}
    pending = loop.state("shop", "restock")
    assert pending.step is Step.ACT
    assert pending.plan is not None and [a.tool for a in pending.plan.actions] == ["place_order"]
    assert model.calls("plan") == [0, 1]

    done = loop.run_or_resume(spec(tokens=100_000))
    assert done.stop.reason is StopReason.GOAL_MET
    assert model.calls("plan") == [0, 1, 2]  # call 1 was not asked again
    assert list(world.effects().values()) == [1]
    (effect,) = world.journal.entries("effect")
    assert effect["args"] == ORDER and effect["key"] == pending.plan.actions[0].key


def test_the_call_that_crosses_the_dollar_budget_is_kept_and_its_plan_runs_after_a_raise(
    stores: Stores, world: World
) -> None:
    """dollar_budget, with pricing: the crossing call's cost is counted exactly (decimal), its plan
    waits unrun, and a resume with more dollars runs it without asking the model again."""
    model = Recorder(_crossing_script({"inputTokens": 0, "outputTokens": 2_000_000}))
    price = {"recorder": Price(Decimal("1.00"), Decimal("2.00"))}
    loop = loop_over(stores, model, world.tools(), pricing=price)
    stopped = loop.run_or_resume(spec(dollars=Decimal("1.50")))
    assert stopped.stop.reason is StopReason.DOLLAR_BUDGET
    assert stopped.resumable
    assert stopped.usage.dollars == Decimal("4.00014")  # 100/1e6 + 20*2/1e6 + 4.00
    assert world.effects() == {}
    done = loop.run_or_resume(spec(dollars=Decimal("10")))
    assert done.stop.reason is StopReason.GOAL_MET
    assert model.calls("plan") == [0, 1, 2]
    assert list(world.effects().values()) == [1]


def test_a_call_whose_input_alone_would_cross_the_token_budget_is_not_made(
    stores: Stores, world: World
) -> None:
    """The pre-call refusal: the model is not called, the stopped step is not an iteration, and a
    resume with more tokens retries that same call (a one-iteration limit still gets its one)."""
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, world.tools())
    refused = loop.run_or_resume(spec(tokens=5, max_iterations=1))
    assert refused.stop.reason is StopReason.TOKEN_BUDGET
    assert refused.resumable
    assert refused.iteration == 0
    assert model.requests == []
    assert "input alone" in refused.stop.message
    assert loop.state("shop", "restock").calls == 0

    retried = loop.run_or_resume(spec(tokens=100_000, max_iterations=1))
    assert retried.stop.reason is StopReason.MAX_ITERATIONS
    assert retried.iteration == 1
    assert model.calls("plan") == [0]


def test_a_call_whose_input_alone_would_cross_the_dollar_budget_is_not_made(
    stores: Stores, world: World
) -> None:
    """The pre-call refusal for dollars, given pricing: no model call, no iteration; a resume with
    more dollars retries it and the run completes."""
    model = Recorder(RESTOCK)
    price = {"recorder": Price(Decimal("1000"), Decimal("1000"))}
    loop = loop_over(stores, model, world.tools(), pricing=price)
    refused = loop.run_or_resume(spec(dollars=Decimal("0.01")))
    assert refused.stop.reason is StopReason.DOLLAR_BUDGET
    assert refused.iteration == 0 and refused.resumable
    assert model.requests == []
    assert refused.usage.dollars == 0
    done = loop.run_or_resume(spec(dollars=Decimal("1000")))
    assert done.stop.reason is StopReason.GOAL_MET
    assert model.calls("plan") == [0, 1, 2]


def test_a_dollar_budget_with_an_unknown_price_stops_before_any_model_call(
    stores: Stores, world: World
) -> None:
    """cost_unknown: with a dollar budget and no price for the model, nothing is spent unmetered:
    the model is never called. It is resumable: given a price (price_model names it), it runs."""
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, world.tools(), pricing={"other": Price(Decimal(1), Decimal(1))})
    stopped = loop.run_or_resume(spec(dollars=Decimal("5")))
    assert stopped.stop.reason is StopReason.COST_UNKNOWN
    assert stopped.resumable
    assert model.requests == []
    assert world.effects() == {}
    priced = loop_over(
        stores,
        model,
        world.tools(),
        pricing={"other": Price(Decimal(1), Decimal(1))},
        price_model="other",
    )
    done = priced.run_or_resume(spec(dollars=Decimal("5")))
    assert done.stop.reason is StopReason.GOAL_MET
    assert done.usage.dollars == Decimal(360) / Decimal(1_000_000)


def test_timeout_counts_active_time_and_its_saved_plan_runs_after_a_raise(
    stores: Stores, world: World
) -> None:
    """timeout: active time past the limit stops the run before acting on the latest plan; a
    resume with a longer timeout runs that plan without asking the model again."""
    clock = FakeClock()

    def think(request: dict[str, Any]) -> None:
        if request["phase"] == "plan":
            clock.advance(10)

    model = Recorder(RESTOCK, on_call=think)
    loop = loop_over(stores, model, world.tools(), clock=clock)
    stopped = loop.run_or_resume(spec(timeout_seconds=15))
    assert stopped.stop.reason is StopReason.TIMEOUT
    assert stopped.resumable
    assert stopped.usage.active_seconds == pytest.approx(20)
    assert world.effects() == {}  # the plan with the WRITE waits
    assert model.calls("plan") == [0, 1]
    clock.advance(3600)  # stopped time is not active time
    done = loop.run_or_resume(spec(timeout_seconds=60))
    assert done.stop.reason is StopReason.GOAL_MET
    assert model.calls("plan") == [0, 1, 2]
    assert done.usage.active_seconds == pytest.approx(30)
    assert list(world.effects().values()) == [1]


def test_the_verifier_rejection_limit_stops_for_good_until_it_is_raised(
    stores: Stores, world: World
) -> None:
    """verifier_rejections: not resumable at the same limit (nothing is asked again); raising the
    limit resumes the run, and the model sees the verifier's reasons in its history."""
    script: list[dict[str, Any]] = [
        {"actions": [READ_A1], "verdict": "reject", "reason": "check B2 too"},
        {"actions": [{"tool": "get_inventory", "args": {"sku": "B2"}}], "verdict": "reject"},
        {"actions": [PLACE]},
        DONE,
    ]
    model = Recorder(script)
    loop = loop_over(stores, model, world.tools())
    stopped = loop.run_or_resume(spec(max_verifier_rejections=2))
    assert stopped.stop.reason is StopReason.VERIFIER_REJECTIONS
    assert not stopped.resumable
    assert stopped.phase is RunPhase.FAILED
    asked = len(model.requests)
    assert loop.run_or_resume(spec(max_verifier_rejections=2)).to_json() == stopped.to_json()
    assert len(model.requests) == asked

    done = loop.run_or_resume(spec(max_verifier_rejections=3))
    assert done.stop.reason is StopReason.GOAL_MET
    assert model.calls("plan") == [0, 1, 2, 3]
    reasons = [h.get("reason") for h in model.requests[-1]["history"] if "verdict" in h]
    assert "check B2 too" in reasons
    assert list(world.effects().values()) == [1]


def test_a_model_that_fails_stops_the_run_as_failed_and_nothing_runs(
    stores: Stores, world: World
) -> None:
    """failed: a model that raises ends the run, not resumable; running it again asks nothing
    and no tool has run."""
    calls = []

    def broken(request: dict[str, Any]) -> Mapping[str, Any]:
        calls.append(request)
        raise RuntimeError("provider exploded")

    loop = Loop(stores=stores, model=PythonModel(broken), tools=world.tools())
    outcome = loop.run_or_resume(spec())
    assert outcome.stop.reason is StopReason.FAILED
    assert outcome.phase is RunPhase.FAILED and not outcome.resumable
    assert "provider exploded" in outcome.stop.message
    assert loop.run_or_resume(spec()).stop.reason is StopReason.FAILED
    assert len(calls) == 1
    assert world.journal.entries() == []


def test_a_model_answer_without_actions_or_done_fails_the_run(stores: Stores, world: World) -> None:
    """failed: an answer the loop cannot read stops the run, naming what was wrong."""
    loop = loop_over(stores, Recorder([{"answer": "I think so"}]), world.tools())
    outcome = loop.run_or_resume(spec())
    assert outcome.stop.reason is StopReason.FAILED
    assert "neither actions nor done" in outcome.stop.message


# Approvals


def test_an_approved_write_runs_exactly_once(stores: Stores, tmp_path: Path) -> None:
    """awaiting_approval stops before the call (nothing runs); once approved by a named person it
    runs once, however often the run is resumed; the audit names who approved, not what."""
    world = World(Journal(tmp_path / "world.jsonl"), approval=frozenset({"place_order"}))
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, world.tools())
    waiting = loop.run_or_resume(spec())
    assert waiting.stop.reason is StopReason.AWAITING_APPROVAL
    assert waiting.resumable
    assert [(p.action, p.tool) for p in waiting.pending_approvals] == [("2:0", "place_order")]
    assert world.effects() == {}
    assert loop.run_or_resume(spec()).stop.reason is StopReason.AWAITING_APPROVAL
    assert world.effects() == {}

    loop.approve("shop", "restock", "2:0", approved=True, by="alice")
    done = loop.run_or_resume(spec())
    assert done.stop.reason is StopReason.GOAL_MET
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]
    assert model.calls("plan") == [0, 1, 2]
    (approved,) = only(stores.audit.events("shop", "restock"), "loop.approved")
    assert approved.actor == "alice"
    assert approved.data["verdict"] == "approved"
    assert SECRET_NOTE not in events_text(stores, spec())


def test_a_denied_write_never_runs_and_the_model_sees_the_denial(
    stores: Stores, tmp_path: Path
) -> None:
    """A denied action never runs; the model is told in its history that it was denied and by
    whom, and the run carries on."""
    world = World(Journal(tmp_path / "world.jsonl"), approval=frozenset({"place_order"}))
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, world.tools())
    assert loop.run_or_resume(spec()).stop.reason is StopReason.AWAITING_APPROVAL
    loop.approve("shop", "restock", "2:0", approved=False, by="bob")
    done = loop.run_or_resume(spec())
    assert done.stop.reason is StopReason.GOAL_MET
    assert world.effects() == {}
    seen = history_actions(model.requests[-1])
    denied = [a for a in seen if a["tool"] == "place_order"]
    assert denied[0]["status"] == "denied"
    assert "bob" in denied[0]["error"]


def test_approvals_are_refused_when_nothing_waits_or_already_decided(
    stores: Stores, tmp_path: Path
) -> None:
    """An approval must name a person, an action that waits, and can be decided only once."""
    world = World(Journal(tmp_path / "world.jsonl"), approval=frozenset({"place_order"}))
    loop = loop_over(stores, Recorder(RESTOCK), world.tools())
    loop.run_or_resume(spec())
    with pytest.raises(InputError) as blank:
        loop.approve("shop", "restock", "2:0", approved=True, by="  ")
    assert blank.value.field == "by"
    with pytest.raises(SettleError):
        loop.approve("shop", "restock", "1:0", approved=True, by="alice")
    loop.approve("shop", "restock", "2:0", approved=False, by="alice")
    with pytest.raises(SettleError):
        loop.approve("shop", "restock", "2:0", approved=True, by="mallory")
    loop.run_or_resume(spec())
    assert world.effects() == {}


@pytest.mark.parametrize("happened", [True, False], ids=["executed", "not-executed"])
def test_an_unknown_outcome_is_settled_before_any_approval_is_asked(
    stores: Stores, world: World, happened: bool
) -> None:
    """A manifest edited to require approval while a WRITE waits as outcome_unknown does not
    turn the stop into awaiting_approval: the approver would be asked about a call that may
    already have run. The run stays outcome_unknown until a person settles it; then it goes on
    with no approval asked (the call ran, or it is abandoned) and the WRITE never runs again."""
    flaky = Flaky(world.journal, OutcomeUncertain("timed out"), effect=happened)
    model = Recorder(RESTOCK)
    stopped = loop_over(stores, model, flaky.tools(world)).run_or_resume(spec())
    assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
    read = flaky.tools(world)[0]
    gated = [read, PythonTool("place_order", flaky, SideEffect.WRITE, requires_approval=True)]
    loop = loop_over(stores, model, gated)
    again = loop.run_or_resume(spec())
    assert again.stop.reason is StopReason.OUTCOME_UNKNOWN
    assert again.pending_approvals == ()
    assert [u.action for u in again.unknown_actions] == ["2:0"]
    loop.reconcile("shop", "restock", "2:0", executed=happened, by="alice")
    done = loop.run_or_resume(spec())
    assert done.stop.reason is StopReason.GOAL_MET
    assert flaky.calls == 1
    assert sum(world.effects().values()) == int(happened)
    events = stores.audit.events("shop", "restock")
    assert only(events, "loop.approved") == only(events, "loop.denied") == []
    stops = [e.data["reason"] for e in only(events, "loop.stopped")]
    assert "awaiting_approval" not in stops


def test_a_call_still_running_when_approval_is_required_is_waited_for_never_run_unapproved(
    stores: Stores, world: World
) -> None:
    """The same edit while the timed-out WRITE still runs in this process: the run is busy
    (nobody may judge or approve a call that may still change); when the call ends in a
    definite refusal it counts as never made, so a person is asked before it is made again."""
    go = threading.Event()
    calls: list[str | None] = []

    def refuse_late(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        calls.append(idempotency_key)
        go.wait(10)
        raise ToolError("out of stock")

    read = world.tools()[0]
    slow = PythonTool("place_order", refuse_late, SideEffect.WRITE, timeout_seconds=0.2)
    try:
        stopped = loop_over(stores, Recorder(RESTOCK), [read, slow]).run_or_resume(spec())
        assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
        gated = PythonTool(
            "place_order",
            refuse_late,
            SideEffect.WRITE,
            timeout_seconds=0.2,
            requires_approval=True,
        )
        loop = loop_over(stores, Recorder(RESTOCK), [read, gated])
        with pytest.raises(RunBusy):
            loop.run_or_resume(spec())
    finally:
        go.set()
    key = idempotency_key("shop", "restock", "place_order", ORDER)
    deadline = time.monotonic() + 10
    while stores.idempotency.get("shop", key) is not None and time.monotonic() < deadline:
        time.sleep(0.02)  # the late refusal drops the key
    waiting = loop.run_or_resume(spec())
    assert waiting.stop.reason is StopReason.AWAITING_APPROVAL
    assert [p.action for p in waiting.pending_approvals] == ["2:0"]
    assert len(calls) == 1


def test_time_waiting_for_approval_is_not_active_time(stores: Stores, tmp_path: Path) -> None:
    """A run waiting an hour for a person does not time out: only the loop's own working time
    counts against timeoutSeconds."""
    clock = FakeClock()

    def think(request: dict[str, Any]) -> None:
        clock.advance(5)

    world = World(Journal(tmp_path / "world.jsonl"), approval=frozenset({"place_order"}))
    loop = loop_over(stores, Recorder(RESTOCK, on_call=think), world.tools(), clock=clock)
    waiting = loop.run_or_resume(spec(timeout_seconds=60))
    assert waiting.stop.reason is StopReason.AWAITING_APPROVAL
    before = waiting.usage.active_seconds
    clock.advance(3600)
    loop.approve("shop", "restock", "2:0", approved=True, by="alice")
    clock.advance(3600)
    done = loop.run_or_resume(spec(timeout_seconds=60))
    assert done.stop.reason is StopReason.GOAL_MET
    assert before == pytest.approx(15)  # plan, verify, plan: then it waits
    assert done.usage.active_seconds == pytest.approx(30)
    assert list(world.effects().values()) == [1]


# Unknown outcomes, reconciles and the confirmer


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


@pytest.mark.parametrize(
    "error",
    [
        OutcomeUncertain("connection reset after the request was sent"),
        ConnectionResetError("peer reset"),
        OutcomeUncertain("I did place the order, trust me"),
    ],
    ids=["uncertain", "plain-exception", "tool-claims-success"],
)
def test_a_write_whose_outcome_is_unknown_stops_the_run_and_is_never_retried(
    stores: Stores, world: World, error: BaseException
) -> None:
    """outcome_unknown: a WRITE that ended without a definite answer (even one claiming it
    worked) stops the run naming the action and key; resuming never calls it again."""
    flaky = Flaky(world.journal, error)
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, flaky.tools(world))
    stopped = loop.run_or_resume(spec())
    assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
    assert stopped.resumable
    (unknown,) = stopped.unknown_actions
    assert (unknown.action, unknown.tool) == ("2:0", "place_order")
    for _ in range(2):
        again = loop.run_or_resume(spec())
        assert again.stop.reason is StopReason.OUTCOME_UNKNOWN
    assert flaky.calls == 1
    record = stores.idempotency.get("shop", unknown.idempotency_key)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN


def test_a_definite_tool_failure_leaves_no_key_so_the_same_call_may_be_tried_again(
    stores: Stores, world: World
) -> None:
    """A ToolError means nothing happened: the run goes on, the model sees the error, the key is
    dropped rather than recorded, and the same WRITE planned again later is really called."""
    flaky = Flaky(world.journal, ToolError("out of stock"), effect=False)
    model = Recorder(
        [RESTOCK[0], {"actions": [PLACE]}, {"actions": [PLACE]}, DONE],
    )
    loop = loop_over(stores, model, flaky.tools(world))
    done = loop.run_or_resume(spec())
    assert done.stop.reason is StopReason.GOAL_MET
    assert flaky.calls == 2
    orders = [a for a in history_actions(model.requests[-1]) if a["tool"] == "place_order"]
    assert [a["status"] for a in orders] == ["error", "error"]
    assert all("out of stock" in a["error"] for a in orders)
    key = idempotency_key("shop", "restock", "place_order", ORDER)
    assert stores.idempotency.get("shop", key) is None


def test_a_write_planned_twice_in_a_run_runs_once_and_replays(stores: Stores, world: World) -> None:
    """The idempotency key comes from the arguments: the same WRITE planned again later in the
    run replays the stored result and runs nothing."""
    model = Recorder([{"actions": [PLACE]}, {"actions": [PLACE]}, DONE])
    loop = loop_over(stores, model, world.tools())
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]
    completed = only(stores.audit.events("shop", "restock"), "loop.action_completed")
    assert [e.data["replayed"] for e in completed] == [False, True]


@pytest.mark.parametrize(("happened", "verdict"), [(True, "executed"), (False, "abandoned")])
def test_a_person_settles_an_unknown_outcome_attributed_and_audited_without_arguments(
    stores: Stores, world: World, happened: bool, verdict: str
) -> None:
    """Loop.reconcile: executed=True records the WRITE done, executed=False abandons it for good;
    either way the run continues without calling the tool again, and the audit chain records who
    decided, on whose authority and which way, and no argument value anywhere."""
    flaky = Flaky(world.journal, OutcomeUncertain("timed out"), effect=happened)
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, flaky.tools(world))
    stopped = loop.run_or_resume(spec())
    (unknown,) = stopped.unknown_actions
    record = loop.reconcile("shop", "restock", unknown.action, executed=happened, by="alice")
    assert record.state is (KeyState.COMPLETED if happened else KeyState.ABANDONED)
    assert (record.settled_by, record.source) == ("alice", "human")
    done = loop.run_or_resume(spec())
    assert done.stop.reason is StopReason.GOAL_MET
    assert flaky.calls == 1
    assert sum(world.effects().values()) == int(happened)
    seen = [a for a in history_actions(model.requests[-1]) if a["tool"] == "place_order"]
    assert seen[0]["status"] == ("ok" if happened else "abandoned")

    events = stores.audit.events("shop", "restock")
    (settled,) = only(events, "loop.reconciled")
    assert settled.actor == "alice"
    assert settled.data["source"] == "human"
    assert settled.data["verdict"] == verdict
    assert settled.data["action"] == unknown.action
    text = events_text(stores, spec())
    assert SECRET_NOTE not in text and SECRET_SKU not in text
    assert verify("shop", "restock", events).ok


def test_a_reconcile_must_name_a_person_and_cannot_be_changed(stores: Stores, world: World) -> None:
    """A reconcile without a person is bad input naming ``by``; a settled outcome cannot be
    settled again (either way); a completed or unknown action cannot be reconciled."""
    flaky = Flaky(world.journal, OutcomeUncertain("timed out"))
    loop = loop_over(stores, Recorder(RESTOCK), flaky.tools(world))
    loop.run_or_resume(spec())
    with pytest.raises(InputError) as blank:
        loop.reconcile("shop", "restock", "2:0", executed=True, by="")
    assert blank.value.field == "by"
    with pytest.raises(SettleError):
        loop.reconcile("shop", "restock", "9:9", executed=True, by="alice")
    loop.reconcile("shop", "restock", "2:0", executed=True, by="alice")
    for executed in (True, False):
        with pytest.raises(SettleError):
            loop.reconcile("shop", "restock", "2:0", executed=executed, by="mallory")
    plan = loop.state("shop", "restock").plan
    assert plan is not None
    record = stores.idempotency.get("shop", plan.actions[0].key)
    assert record is not None and record.settled_by == "alice"


class Confirms:
    """A confirmer that answers a fixed verdict (or raises), recording what it was asked."""

    def __init__(self, verdict: Any, *, name: str = "orders-db") -> None:
        self.verdict = verdict
        self.name = name
        self.asked: list[tuple[UnknownAction, Mapping[str, Any]]] = []

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        self.asked.append((action, dict(args)))
        if isinstance(self.verdict, BaseException):
            raise self.verdict
        return self.verdict  # type: ignore[no-any-return]


@pytest.mark.parametrize(("happened", "verdict"), [(True, "executed"), (False, "abandoned")])
def test_a_definite_confirmer_answer_settles_the_unknown_outcome(
    stores: Stores, world: World, happened: bool, verdict: str
) -> None:
    """A confirmer asking the system of record settles an unknown outcome on the next resume
    (never in the call that just went uncertain: it may still be running): True records it done,
    False abandons it; no person is needed, the tool is never called again, and the audit has
    loop.reconciled with the confirmer as actor, source confirmer, and no arguments."""
    flaky = Flaky(world.journal, OutcomeUncertain("timed out"), effect=happened)
    confirmer = LedgerConfirmer(world, name="orders-db")
    loop = loop_over(stores, Recorder(RESTOCK), flaky.tools(world), confirmer=confirmer)
    assert loop.run_or_resume(spec()).stop.reason is StopReason.OUTCOME_UNKNOWN
    done = loop.run_or_resume(spec())
    assert done.stop.reason is StopReason.GOAL_MET
    assert flaky.calls == 1
    assert sum(world.effects().values()) == int(happened)
    (settled,) = only(stores.audit.events("shop", "restock"), "loop.reconciled")
    assert settled.actor == "orders-db"
    assert (settled.data["source"], settled.data["verdict"]) == ("confirmer", verdict)
    text = events_text(stores, spec())
    assert SECRET_NOTE not in text and SECRET_SKU not in text


@pytest.mark.parametrize(
    "answer",
    [None, "yes", 1, 0, RuntimeError("orders-db is down")],
    ids=["none", "truthy-string", "one", "zero", "raises"],
)
def test_anything_but_a_definite_confirmer_answer_leaves_it_for_a_person(
    stores: Stores, world: World, answer: Any
) -> None:
    """None, a raising confirmer, or anything not exactly True or False (a truthy string, 1, 0)
    is never trusted: the run stops with outcome_unknown, and a person settles it afterwards."""
    flaky = Flaky(world.journal, OutcomeUncertain("timed out"))
    confirmer = Confirms(answer)
    loop = loop_over(stores, Recorder(RESTOCK), flaky.tools(world), confirmer=confirmer)
    assert loop.run_or_resume(spec()).stop.reason is StopReason.OUTCOME_UNKNOWN
    assert confirmer.asked == []  # not while the uncertain call may still be running
    stopped = loop.run_or_resume(spec())
    assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
    (unknown,) = stopped.unknown_actions
    assert confirmer.asked[0][0] == unknown
    assert confirmer.asked[0][1] == ORDER  # trusted code may look the order up by its details
    assert only(stores.audit.events("shop", "restock"), "loop.reconciled") == []
    loop.reconcile("shop", "restock", unknown.action, executed=True, by="alice")
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert flaky.calls == 1


def test_a_write_that_times_out_is_unknown_and_never_retried(stores: Stores, world: World) -> None:
    """A python WRITE past its timeout_seconds is outcome_unknown. While it still runs in this
    process nobody may judge it (a resume is busy, not retried); when it ends, its late result is
    recorded and the resume replays it: it ran once."""
    release = threading.Event()
    started: list[str | None] = []

    def slow(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        started.append(idempotency_key)
        release.wait(10)
        return {"placed": True}

    tools = [
        world.tools()[0],
        PythonTool("place_order", slow, SideEffect.WRITE, timeout_seconds=0.2),
    ]
    loop = loop_over(stores, Recorder(RESTOCK), tools)
    try:
        stopped = loop.run_or_resume(spec())
        assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
        (unknown,) = stopped.unknown_actions
        assert unknown.tool == "place_order"
        with pytest.raises(RunBusy):
            loop.run_or_resume(spec())
        with pytest.raises(SettleError, match="still in flight"):
            loop.reconcile("shop", "restock", unknown.action, executed=False, by="alice")
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        record = stores.idempotency.get("shop", unknown.idempotency_key)
        if record is not None and record.state is KeyState.COMPLETED:
            break
        time.sleep(0.02)
    done = loop.run_or_resume(spec())
    assert done.stop.reason is StopReason.GOAL_MET
    assert started == [unknown.idempotency_key]


# The gateway and loop kinds


def test_a_verification_loop_refuses_writes_and_proposals_even_when_granted(
    stores: Stores, world: World
) -> None:
    """A verification loop is READ-only by construction: with WRITE and PROPOSE granted anyway,
    they fail with side_effect_not_permitted, the tools never run, no person is asked to approve
    them, the model sees the refusal, and it is only ever offered READ tools."""
    granted = World(world.journal, approval=frozenset({"place_order"}))
    model = Recorder(
        [
            {"actions": [READ_A1, PLACE, {"tool": "notify", "args": {"to": "x", "text": "y"}}]},
            DONE,
        ]
    )
    run = LoopSpec(
        "shop",
        "check",
        "check stock",
        kind=LoopKind.VERIFICATION,
        allowed_side_effects=frozenset(SideEffect),
    )
    done = loop_over(stores, model, granted.tools()).run_or_resume(run)
    assert done.stop.reason is StopReason.GOAL_MET
    assert world.journal.entries() == []
    seen = {a["tool"]: a for a in history_actions(model.requests[-1])}
    assert seen["get_inventory"]["status"] == "ok"
    for tool in ("place_order", "notify"):
        assert seen[tool]["status"] == "refused"
        assert SIDE_EFFECT_NOT_PERMITTED in seen[tool]["error"]
    offered = {t["name"] for r in model.requests for t in r["tools"]}
    assert offered == {"get_inventory"}


@pytest.mark.postgres
def test_a_verification_loop_on_postgres_refuses_proposals_and_writes_before_any_key(
    pg_url: str, world: World
) -> None:
    """The same READ-only rule on the PostgreSQL store, with WRITE and PROPOSE granted and both
    tools asking for approval: both are refused with side_effect_not_permitted before anything
    about them is recorded (no idempotency key, no start on the audit chain) and without a
    person being asked, neither tool runs, and the chain shows each completed as refused."""
    gated = World(world.journal, approval=frozenset({"place_order", "notify"}))
    model = Recorder(
        [{"actions": [{"tool": "notify", "args": {"to": "x", "text": "y"}}, PLACE, READ_A1]}, DONE]
    )
    run = LoopSpec(
        "shop",
        "check",
        "check stock",
        kind=LoopKind.VERIFICATION,
        allowed_side_effects=frozenset(SideEffect),
    )
    stores = open_stores(pg_url)
    try:
        done = loop_over(stores, model, gated.tools()).run_or_resume(run)
        assert done.stop.reason is StopReason.GOAL_MET
        assert world.journal.entries() == []
        plan = loop_over(stores, None, []).state("shop", "check").plan
        assert plan is not None
        for action in plan.actions[:2]:
            assert stores.idempotency.get("shop", action.key) is None, action.tool
        events = stores.audit.events("shop", "check")
        started = [e.data["tool"] for e in only(events, "loop.action_started")]
        assert started == ["get_inventory"]
        completed = {
            e.data["tool"]: e.data["status"] for e in only(events, "loop.action_completed")
        }
        assert completed == {"notify": "refused", "place_order": "refused", "get_inventory": "ok"}
        seen = {a["tool"]: a for a in history_actions(model.requests[-1])}
        for tool in ("notify", "place_order"):
            assert SIDE_EFFECT_NOT_PERMITTED in seen[tool]["error"]
    finally:
        stores.close()


def test_a_monitor_loop_only_reads_by_default_and_writes_only_when_granted(
    stores: Stores, world: World
) -> None:
    """A monitor loop is READ-only unless its spec grants more: by default a WRITE is refused with
    side_effect_not_permitted and never runs; granted explicitly, it runs once."""
    script = [{"actions": [READ_A1, PLACE]}, DONE]
    default = LoopSpec("shop", "watch.tick-1", "watch stock", kind=LoopKind.MONITOR)
    model = Recorder(script)
    assert loop_over(stores, model, world.tools()).run_or_resume(default).stop.reason is (
        StopReason.GOAL_MET
    )
    refused = [a for a in history_actions(model.requests[-1]) if a["tool"] == "place_order"]
    assert refused[0]["status"] == "refused"
    assert SIDE_EFFECT_NOT_PERMITTED in refused[0]["error"]
    assert world.effects() == {}

    granted = LoopSpec(
        "shop",
        "watch.tick-2",
        "watch stock",
        kind=LoopKind.MONITOR,
        allowed_side_effects=frozenset({SideEffect.READ, SideEffect.WRITE}),
    )
    loop_over(stores, Recorder(script), world.tools()).run_or_resume(granted)
    assert list(world.effects().values()) == [1]


def test_a_task_loop_restricted_to_reads_refuses_a_write(stores: Stores, world: World) -> None:
    """allowed_side_effects is enforced at the gateway for any loop kind: a task limited to READ
    refuses a WRITE it has a tool for, and the tool never runs."""
    run = LoopSpec("shop", "restock", "restock", allowed_side_effects=frozenset({SideEffect.READ}))
    model = Recorder([{"actions": [PLACE]}, DONE])
    loop_over(stores, model, world.tools()).run_or_resume(run)
    assert world.effects() == {}
    (order,) = history_actions(model.requests[-1])
    assert order["status"] == "refused" and SIDE_EFFECT_NOT_PERMITTED in order["error"]


# The audit chain


def _finished_run(db: Path, world: World) -> None:
    stores = open_stores(f"sqlite:///{db}")
    try:
        outcome = loop_over(stores, Recorder(RESTOCK), world.tools()).run_or_resume(spec())
        assert outcome.stop.reason is StopReason.GOAL_MET
    finally:
        stores.close()


def _chain(db: Path) -> tuple[bool, tuple[str, ...]]:
    store = SQLiteStore(db)
    try:
        report = Loop(stores=Stores.of(store)).verify_audit("shop", "restock")
    finally:
        store.close()
    return report.ok, report.problems


def test_the_audit_chain_detects_an_edited_event(db: Path, world: World, tmp_path: Path) -> None:
    """Editing any stored event (here: rewriting who settled what in the SQLite file directly)
    breaks the chain, and verify names the altered event."""
    _finished_run(db, world)
    assert _chain(db) == (True, ())
    with sqlite3.connect(db) as raw:
        (data,) = raw.execute(
            "SELECT data FROM keelgate_audit WHERE tenant='shop' AND run='restock' AND seq=3"
        ).fetchone()
        edited = json.dumps({**json.loads(data), "forged": True})
        raw.execute(
            "UPDATE keelgate_audit SET data=? WHERE tenant='shop' AND run='restock' AND seq=3",
            (edited,),
        )
    ok, problems = _chain(db)
    assert not ok
    assert any("event 3" in p and "altered" in p for p in problems)


def test_the_audit_chain_detects_a_removed_event(db: Path, world: World, tmp_path: Path) -> None:
    """Deleting an event from the SQLite file (the last one, or one in the middle) breaks the
    chain and verify says which is missing."""
    _finished_run(db, world)
    middle = tmp_path / "middle.db"
    shutil.copy(db, middle)
    with sqlite3.connect(middle) as raw:
        raw.execute("DELETE FROM keelgate_audit WHERE tenant='shop' AND run='restock' AND seq=4")
    ok, problems = _chain(middle)
    assert not ok
    assert any("event 4 is missing" in p for p in problems)


def test_the_audit_chain_detects_its_newest_event_removed(db: Path, world: World) -> None:
    """Deleting the newest event (the run's final stop) must be detected too: the contract says
    verify detects any removed event."""
    _finished_run(db, world)
    with sqlite3.connect(db) as raw:
        raw.execute(
            "DELETE FROM keelgate_audit WHERE tenant='shop' AND run='restock' AND seq="
            "(SELECT MAX(seq) FROM keelgate_audit WHERE tenant='shop' AND run='restock')"
        )
    ok, _ = _chain(db)
    assert not ok
