"""Approvals: a tool that needs one stops the run before its call, and the call runs only once a
named person said yes.

Why it exists: "never runs unapproved" is half of Keelgate's promise. A denial is final and the
model is told; a decision cannot be made twice, and who decided is one printable line on the
audit chain; the rule travels with the saved action, so a manifest edited while the run waits
cannot remove it; a call whose outcome is unknown is settled before anyone is asked to approve
it; waiting for a person is not active time. The tests drive the real loop over real SQLite
files and count every call downstream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from crashkit import Journal, World
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import (
    SideEffect,
    StopReason,
    idempotency_key,
)
from keelgate.errors import InputError, OutcomeUncertain, RunBusy, SettleError, ToolError
from keelgate.testing.deadlines import pass_deadlines
from support.ledger import A1_ORDER, REVIEW_SPEC, Ledger, place_order_tool, scripted, sqlite_stores
from support.restock import (
    ORDER,
    RESTOCK,
    SECRET_NOTE,
    FakeClock,
    Flaky,
    Recorder,
    events_text,
    history_actions,
    loop_over,
    loop_with_look_and_order,
    only,
    spec,
)

SPEC = LoopSpec("shop", "edges", "restock", budget=Budget(max_iterations=5))


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
    if not happened:
        pass_deadlines(stores)  # "not executed" waits for the call's write deadline
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


def test_a_second_decision_on_an_approval_names_the_first(stores: Stores) -> None:
    """Once approved, the action cannot be denied (or approved again); the error says who
    decided, and the stop tells the person to resume."""
    loop = loop_with_look_and_order(
        stores, [{"actions": [{"tool": "order", "args": {"qty": 1}}]}, {"done": True}]
    )
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    after = loop.approve("shop", "edges", "1:0", approved=True, by="bob")
    assert after.pending_approvals == () and "resume to continue" in after.stop.message
    with pytest.raises(SettleError, match="already approved by bob"):
        loop.approve("shop", "edges", "1:0", approved=False, by="mallory")
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.GOAL_MET


@pytest.mark.parametrize("by", ["", "   ", "alice\nkeelgate", "bob\x1b[31m", "x" * 300])
def test_who_decided_must_be_one_printable_line(stores: Stores, by: str) -> None:
    """A name with a newline or a control character would forge lines in the audit trail."""
    loop = loop_with_look_and_order(stores, [{"actions": [{"tool": "order", "args": {"qty": 1}}]}])
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    with pytest.raises(InputError, match="by"):
        loop.approve("shop", "edges", "1:0", approved=True, by=by)
    assert loop.outcome("shop", "edges").pending_approvals != ()


def test_a_denied_write_never_runs_even_after_its_tool_stops_requiring_approval(
    tmp_path: Path,
) -> None:
    """A person denies a WRITE; the manifest is then edited so the tool no longer asks for
    approval. On resume the denied action must still read ``denied``, never be placed."""
    db = tmp_path / "kg.db"
    ledger = Ledger()
    plans = [{"actions": [{"tool": "place_order", "args": A1_ORDER}]}, {"done": True}]
    stores = sqlite_stores(db)
    loop = Loop(
        stores=stores,
        model=scripted(plans),
        tools=[place_order_tool(ledger, requires_approval=True)],
    )
    waiting = loop.run_or_resume(REVIEW_SPEC)
    assert waiting.stop.reason is StopReason.AWAITING_APPROVAL
    loop.approve("shop", "review", "1:0", approved=False, by="alice")
    stores.close()

    stores = sqlite_stores(db)
    try:
        edited = Loop(stores=stores, model=scripted(plans), tools=[place_order_tool(ledger)])
        edited.run_or_resume(REVIEW_SPEC)
        assert ledger.total() == 0, "alice denied this order, yet it was placed"
    finally:
        stores.close()


def test_a_write_planned_under_approval_does_not_run_unapproved_after_a_manifest_edit(
    tmp_path: Path,
) -> None:
    """A WRITE stops awaiting approval; nobody decides; the tool's ``requiresApproval`` is
    removed. The saved action was planned under "ask first" and must still wait for a person,
    as a saved WRITE keeps its side-effect class through a manifest edit."""
    db = tmp_path / "kg.db"
    ledger = Ledger()
    plans = [{"actions": [{"tool": "place_order", "args": A1_ORDER}]}, {"done": True}]
    stores = sqlite_stores(db)
    loop = Loop(
        stores=stores,
        model=scripted(plans),
        tools=[place_order_tool(ledger, requires_approval=True)],
    )
    assert loop.run_or_resume(REVIEW_SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    stores.close()

    stores = sqlite_stores(db)
    try:
        edited = Loop(stores=stores, model=scripted(plans), tools=[place_order_tool(ledger)])
        outcome = edited.run_or_resume(REVIEW_SPEC)
        assert ledger.total() == 0
        assert outcome.stop.reason is StopReason.AWAITING_APPROVAL
    finally:
        stores.close()
