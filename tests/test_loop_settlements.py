"""What a WRITE came to, and how an unknown outcome is settled.

Why it exists: a WRITE never runs twice. A definite failure (``ToolError``) leaves no key, so the
same call may be made again; a completed one replays; anything else is an unknown outcome that
stops the run and is never retried, until a person (``reconcile``) or a trusted confirmer settles
it, on the record and without its arguments. The tests drive the real loop over real SQLite
files and count every change downstream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from crashkit import World
from crashkit.world import LedgerConfirmer
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.audit import verify
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.types import (
    KeyState,
    SideEffect,
    StopReason,
    UnknownAction,
    idempotency_key,
)
from keelgate.errors import (
    InputError,
    OutcomeUncertain,
    RunBusy,
    SettleError,
    SettleTooEarly,
    ToolError,
)
from keelgate.testing.deadlines import pass_deadlines
from support.ledger import A1_ORDER, REVIEW_SPEC, scripted, sqlite_stores
from support.restock import (
    DONE,
    ORDER,
    PLACE,
    RESTOCK,
    SECRET_NOTE,
    SECRET_SKU,
    Flaky,
    Recorder,
    events_text,
    history_actions,
    loop_over,
    only,
    spec,
)


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
    decided, on whose authority and which way, and no argument value anywhere. "Not executed"
    is refused until the call's write deadline has passed, saying when."""
    flaky = Flaky(world.journal, OutcomeUncertain("timed out"), effect=happened)
    model = Recorder(RESTOCK)
    loop = loop_over(stores, model, flaky.tools(world))
    stopped = loop.run_or_resume(spec())
    (unknown,) = stopped.unknown_actions
    assert unknown.not_executed_after  # the stop says when "not executed" becomes possible
    if not happened:
        with pytest.raises(SettleTooEarly) as early:
            loop.reconcile("shop", "restock", unknown.action, executed=False, by="alice")
        assert early.value.not_before == unknown.not_executed_after
        assert unknown.not_executed_after in str(early.value)
        assert pass_deadlines(stores) == 1  # alice waits until then
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
    loop.reconciled with the confirmer as actor, source confirmer, and no arguments. Its False
    counts only once the call's write deadline has passed (a held-up process might still send
    it until then): a resume before that stops again."""
    flaky = Flaky(world.journal, OutcomeUncertain("timed out"), effect=happened)
    confirmer = LedgerConfirmer(world, name="orders-db")
    loop = loop_over(stores, Recorder(RESTOCK), flaky.tools(world), confirmer=confirmer)
    assert loop.run_or_resume(spec()).stop.reason is StopReason.OUTCOME_UNKNOWN
    if not happened:
        early = loop.run_or_resume(spec())
        assert early.stop.reason is StopReason.OUTCOME_UNKNOWN
        assert early.unknown_actions[0].not_executed_after
        pass_deadlines(stores)
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


def test_a_person_settling_while_the_confirmer_decides_does_not_break_the_run(
    tmp_path: Path,
) -> None:
    """The confirmer is slow; meanwhile a person reconciles the same unknown WRITE. Whoever
    settles first wins; the run must carry on with that verdict, not raise."""
    calls: list[str | None] = []

    def uncertain(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        calls.append(idempotency_key)
        raise OutcomeUncertain("no answer within 30s")

    plans = [{"actions": [{"tool": "place_order", "args": A1_ORDER}]}, {"done": True}]
    stores = sqlite_stores(tmp_path / "kg.db")
    holder: dict[str, Loop] = {}

    class SlowConfirmer:
        name = "slow-ledger"

        def confirm(
            self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
        ) -> bool | None:
            # While it asks the system of record, a person settles the same key from the CLI.
            holder["loop"].reconcile(tenant, run, action.action, executed=False, by="alice")
            return True

    try:
        loop = Loop(
            stores=stores,
            model=scripted(plans),
            tools=[PythonTool("place_order", uncertain, SideEffect.WRITE)],
            confirmer=SlowConfirmer(),
        )
        holder["loop"] = loop
        # The call that just went uncertain is not put to the confirmer (it may still be
        # running); the resume is, once its deadline has passed (alice may settle it then).
        assert loop.run_or_resume(REVIEW_SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        pass_deadlines(stores)
        outcome = loop.run_or_resume(REVIEW_SPEC)
        assert outcome.stop.reason is StopReason.GOAL_MET
        assert len(calls) == 1
        events = [e for e in loop.audit("shop", "review") if e.type == "loop.reconciled"]
        assert [(e.actor, e.data["verdict"]) for e in events] == [("alice", "abandoned")]
    finally:
        stores.close()
