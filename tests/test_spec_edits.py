"""A spec edited while a WRITE's outcome is unknown never turns that WRITE into "refused".

Why it exists: after a run stops with ``outcome_unknown``, a careful person may edit its spec to
be safe (allow only READs, remove the tool, make it a READ, ask for approval, lower a budget).
The call may have happened all the same: what is on record for its key decides, whatever the
spec says now. The run stays stopped with the same unknown outcome, the settlement still
applies, and the new spec governs only what comes next. Each test crashes a real loop over a
real SQLite file mid-WRITE (``after_gateway_call``: the order reached the shop; ``mid_tool``
with the effect after it: it did not), rebuilds everything, resumes with the edited spec and
counts the orders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from crashkit import Journal, Rig, World
from crashkit.rig import OPERATOR, sqlite_opener, wait_for_the_deadline
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyState, SideEffect, StopReason, idempotency_key
from keelgate.errors import SimulatedCrash

ORDER = {"sku": "A1", "qty": 20}
SECOND = {"sku": "B2", "qty": 5}
# Read; order; a second order (what "the new spec governs what comes next" is seen on); done.
USAGE = {"inputTokens": 100, "outputTokens": 20}
SCRIPT: list[dict[str, Any]] = [
    {"actions": [{"tool": "get_inventory", "args": {"sku": "A1"}}], "usage": USAGE},
    {"actions": [{"tool": "place_order", "args": ORDER}], "usage": USAGE},
    {"actions": [{"tool": "place_order", "args": SECOND}]},
    {"done": True, "answer": "ordered"},
]
SPEC = LoopSpec("shop", "restock", "restock A1", budget=Budget(max_iterations=10))
KEY = idempotency_key("shop", "restock", "place_order", ORDER)
SECOND_KEY = idempotency_key("shop", "restock", "place_order", SECOND)

Edit = Callable[[Rig], tuple[Loop, LoopSpec]]


def _loop(rig: Rig, tools: list[Any]) -> Loop:
    return Loop(stores=rig.stores, model=rig.loop.model, tools=tools, busy_wait=0.5)


def read_only(rig: Rig) -> tuple[Loop, LoopSpec]:
    """spec.allowedSideEffects: [READ]."""
    return rig.loop, replace(SPEC, allowed_side_effects=frozenset({SideEffect.READ}))


def tool_removed(rig: Rig) -> tuple[Loop, LoopSpec]:
    """place_order taken out of spec.tools."""
    return _loop(rig, [t for t in rig.world.tools() if t.name != "place_order"]), SPEC


def tool_made_read(rig: Rig) -> tuple[Loop, LoopSpec]:
    """place_order's sideEffect edited from WRITE to READ."""
    tools = [
        replace(t, side_effect=SideEffect.READ) if t.name == "place_order" else t
        for t in rig.world.tools()
    ]
    return _loop(rig, tools), SPEC


def approval_added(rig: Rig) -> tuple[Loop, LoopSpec]:
    """place_order now requiresApproval."""
    tools = [
        replace(t, requires_approval=True) if t.name == "place_order" else t
        for t in rig.world.tools()
    ]
    return _loop(rig, tools), SPEC


def budget_spent(rig: Rig) -> tuple[Loop, LoopSpec]:
    """spec.budget.tokens lowered below what the run has used."""
    return rig.loop, SPEC.with_budget(Budget(max_iterations=10, tokens=1))


EDITS = [read_only, tool_removed, tool_made_read, approval_added, budget_spent]


@pytest.fixture(params=["after_gateway_call", "mid_tool"])
def crashed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Rig, bool]:
    """A run whose first order's outcome is unknown: the process died right after the shop
    took it (``after_gateway_call``) or inside the call before it did (``mid_tool``)."""
    window: str = request.param
    world = World(Journal(tmp_path / "world.jsonl"), effect="after")
    rig = Rig(sqlite_opener(tmp_path / "kg.db"), world, SCRIPT)
    death = rig.attempt(SPEC, (window, 2))  # the READ passes it first
    assert isinstance(death, SimulatedCrash)
    request.addfinalizer(rig.die)
    return rig, world.happened(KEY) == 1


@pytest.mark.parametrize("edit", EDITS, ids=lambda edit: edit.__name__)
def test_an_edit_at_outcome_unknown_keeps_the_write_unknown_and_settleable(
    crashed: tuple[Rig, bool], edit: Edit
) -> None:
    """Resumed under the edited spec, the run stops again with the same unknown outcome (never
    ``refused``, ``error: unknown tool``, an approval or a budget stop), the key stays
    unknown, the person's settlement is accepted, and the order is on record exactly as it
    happened: once if the shop took it, never if not."""
    rig, happened = crashed
    loop, spec = edit(rig)
    stopped = loop.run_or_resume(spec)
    assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN, stopped.to_json()
    assert [(u.action, u.idempotency_key) for u in stopped.unknown_actions] == [("2:0", KEY)]
    record = rig.stores.idempotency.get("shop", KEY)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    if not happened:
        wait_for_the_deadline(loop, "shop", "restock", "2:0", by=OPERATOR)
    loop.reconcile("shop", "restock", "2:0", executed=happened, by=OPERATOR)
    settled = rig.stores.idempotency.get("shop", KEY)
    want = KeyState.COMPLETED if happened else KeyState.ABANDONED
    assert settled is not None and settled.state is want
    loop.run_or_resume(spec)
    assert rig.world.happened(KEY) == int(happened)
    events = rig.stores.audit.events("shop", "restock")
    first = [
        e.data for e in events if e.type == "loop.action_completed" and e.data["action"] == "2:0"
    ]
    assert [d["status"] for d in first] == ["ok" if happened else "abandoned"]
    assert rig.loop.verify_audit("shop", "restock").ok


def test_after_the_settlement_the_edited_spec_governs_what_comes_next(
    crashed: tuple[Rig, bool],
) -> None:
    """Once the unknown order is settled, the READ-only spec refuses the next planned order
    (side_effect_not_permitted) and the run ends: the settled order counts as it happened,
    the refused one never reaches the shop."""
    rig, happened = crashed
    loop, spec = read_only(rig)
    assert loop.run_or_resume(spec).stop.reason is StopReason.OUTCOME_UNKNOWN
    if not happened:
        wait_for_the_deadline(loop, "shop", "restock", "2:0", by=OPERATOR)
    loop.reconcile("shop", "restock", "2:0", executed=happened, by=OPERATOR)
    done = loop.run_or_resume(spec)
    assert done.stop.reason is StopReason.GOAL_MET
    assert rig.world.happened(SECOND_KEY) == 0
    assert rig.stores.idempotency.get("shop", SECOND_KEY) is None
    completed = {
        e.data["action"]: e.data["status"]
        for e in rig.stores.audit.events("shop", "restock")
        if e.type == "loop.action_completed"
    }
    assert completed["3:0"] == "refused"
    assert completed["2:0"] == ("ok" if happened else "abandoned")


def test_an_edit_while_the_write_runs_in_a_live_process_waits_for_it(tmp_path: Path) -> None:
    """The edit lands while the WRITE still runs in another live process (a step pod mid-call):
    a resume under the edited spec is busy (it waits, then says so) instead of recording the
    call refused, and once that call has ended its result is replayed, never refused."""
    import threading

    from keelgate.errors import RunBusy

    world = World(Journal(tmp_path / "world.jsonl"), effect="after")
    opener = sqlite_opener(tmp_path / "kg.db")
    go, entered = threading.Event(), threading.Event()

    def slow_order(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        entered.set()
        go.wait(10)
        world.journal.record("effect", tool="place_order", key=idempotency_key, args=args)
        return {"placed": True}

    first = Rig(opener, world, SCRIPT)
    tools = [t for t in world.tools() if t.name != "place_order"]
    first.loop = Loop(
        stores=first.stores,
        model=first.loop.model,
        tools=[*tools, PythonTool("place_order", slow_order, SideEffect.WRITE)],
        busy_wait=0.3,
    )
    driver = threading.Thread(target=first.loop.run_or_resume, args=(SPEC,), kwargs={})
    driver.start()
    try:
        assert entered.wait(10)
        second = Rig(opener, world, SCRIPT)
        loop, spec = read_only(second)
        # The first process still drives the run: the second cannot even start it.
        with pytest.raises(RunBusy):
            loop.run_or_resume(spec)
        record = second.stores.idempotency.get("shop", KEY)
        assert record is not None and record.state is KeyState.IN_FLIGHT
    finally:
        go.set()
        driver.join(10)
    record = second.stores.idempotency.get("shop", KEY)
    assert record is not None and record.state is KeyState.COMPLETED
    assert world.happened(KEY) == 1
    first.die()
    second.die()
