"""The gateway refuses what a loop may not do: a verification loop only reads, a monitor loop
reads unless its spec grants more, and any loop keeps to its ``allowedSideEffects``.

Why it exists: the side-effect class a loop allows is enforced at the one door every tool call
passes, whatever the tool list grants: a refused call never runs, no key or start event is
recorded for it, no person is asked to approve it, and the model sees the refusal. The tests
drive the real loop over real SQLite files (and once over the real PostgreSQL server).
"""

from __future__ import annotations

import pytest

from crashkit import World
from keelgate.core.gateway import SIDE_EFFECT_NOT_PERMITTED
from keelgate.core.protocols import Stores
from keelgate.core.spec import LoopSpec
from keelgate.core.types import (
    LoopKind,
    SideEffect,
    StopReason,
)
from keelgate.stores import open_stores
from support.restock import (
    DONE,
    PLACE,
    READ_A1,
    Recorder,
    history_actions,
    loop_over,
    only,
)


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
