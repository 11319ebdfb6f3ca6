"""Write-ahead planning: a saved action is what runs, whatever the model would say now.

Why it exists: ADR-0004 refuses "re-plan on resume" because a model may answer differently the
second time. These tests use a model that never answers the same way twice, crash after its plan
was saved, and prove the saved action (same tool, arguments and idempotency key) is what runs,
without the model being asked for that step again. They must never use a deterministic model
for this, or the proof would prove nothing.

A saved action is more than its arguments: it keeps the side-effect class its tool had when it
was planned, so a manifest that redeclares the tool before the call cannot weaken it.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from crashkit import Journal, Rig, StoreOpener, World, opener_for
from keelgate.adapters.models.python import PythonModel
from keelgate.core.gateway import SIDE_EFFECT_NOT_PERMITTED
from keelgate.core.model import Model
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import Action, SideEffect, StopReason, idempotency_key
from keelgate.errors import SimulatedCrash


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> StoreOpener:
    return opener_for(request.param, tmp_path, lambda: str(request.getfixturevalue("pg_url")))


class Fickle:
    """A model that answers every call differently: each answer orders a new quantity.

    It outlives in-process restarts on purpose, so a second answer would differ from the first."""

    def __init__(self, writes: int = 1) -> None:
        self.answers = itertools.count(1)
        self.writes = writes
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any]) -> Mapping[str, Any]:
        self.requests.append(request)
        n = next(self.answers)
        if request["phase"] == "verify":
            return {"verdict": "accept"}
        if request["iteration"] == 1:
            return {
                "actions": [
                    {"tool": "place_order", "args": {"sku": f"S{i}", "qty": n * 10 + i}}
                    for i in range(self.writes)
                ]
            }
        return {"done": True, "answer": f"answer number {n}"}

    def asked(self, iteration: int) -> int:
        return sum(1 for r in self.requests if r["phase"] == "plan" and r["iteration"] == iteration)

    def build(self) -> Callable[[], Model]:
        return lambda: PythonModel(self, name="fickle")


def _spec() -> LoopSpec:
    return LoopSpec(
        "shop", f"wa-{uuid.uuid4().hex[:8]}", "order stock", budget=Budget(max_iterations=5)
    )


def test_a_model_that_would_say_something_different_cannot_change_a_saved_action(
    opener: StoreOpener, tmp_path: Path
) -> None:
    """A process dies right after the plan is saved. On resume (every object rebuilt) the saved
    action runs: the same tool, the same arguments and the same idempotency key the first answer
    gave, and the model is not asked for that step again, although it would now answer
    differently."""
    fickle = Fickle()
    world = World(Journal(tmp_path / "world.jsonl"))
    spec = _spec()
    rig = Rig(opener, world, [], model=fickle.build())
    try:
        death = rig.attempt(spec, ("after_plan", 1))
        assert isinstance(death, SimulatedCrash)
        saved = rig.loop.state(spec.tenant, spec.run).plan
        assert saved is not None
        (action,) = saved.actions
        assert (action.tool, dict(action.args)) == ("place_order", {"sku": "S0", "qty": 10})
        assert action.key == idempotency_key(spec.tenant, spec.run, action.tool, action.args)
        assert world.effects() == {}

        outcome = rig.loop.run_or_resume(spec)
        assert outcome.stop.reason is StopReason.GOAL_MET
        (effect,) = world.journal.entries("effect")
        assert (effect["tool"], effect["args"], effect["key"]) == (
            action.tool,
            dict(action.args),
            action.key,
        )
        assert fickle.asked(1) == 1
        # And it really would have said something different:
        again = fickle({"phase": "plan", "iteration": 1, "call": 0})
        assert again["actions"][0]["args"] != dict(action.args)
    finally:
        rig.die()


@pytest.mark.parametrize(
    "crash",
    [("before_action", 2), ("after_action_checkpoint", 1), ("after_gateway_call", 2)],
    ids=lambda crash: f"{crash[0]}@{crash[1]}",
)
def test_a_partly_run_plan_resumes_with_its_saved_actions_not_a_new_answer(
    opener: StoreOpener, tmp_path: Path, crash: tuple[str, int]
) -> None:
    """A plan of three WRITEs cut off part-way (before its 2nd action, or after its 1st was
    recorded, or past the 2nd's gateway call) resumes with exactly the saved actions: each runs
    once with its saved arguments, none from a new answer, and the model is asked for the plan
    once."""
    fickle = Fickle(writes=3)
    world = World(Journal(tmp_path / "world.jsonl"))
    spec = _spec()
    rig = Rig(opener, world, [], model=fickle.build())
    try:
        assert isinstance(rig.attempt(spec, crash), SimulatedCrash)
        saved = rig.loop.state(spec.tenant, spec.run).plan
        assert saved is not None
        outcome = rig.loop.run_or_resume(spec)
        if outcome.stop.reason is StopReason.OUTCOME_UNKNOWN:
            (unknown,) = outcome.unknown_actions
            assert world.happened(unknown.idempotency_key) == 1
            rig.loop.reconcile(spec.tenant, spec.run, unknown.action, executed=True, by="ops")
            outcome = rig.loop.run_or_resume(spec)
        assert outcome.stop.reason is StopReason.GOAL_MET
        ran = sorted((e["key"], e["args"]["qty"]) for e in world.journal.entries("effect"))
        assert ran == sorted((a.key, a.args["qty"]) for a in saved.actions)
        assert fickle.asked(1) == 1
    finally:
        rig.die()


def test_a_different_model_configured_after_a_crash_cannot_change_the_saved_action(
    tmp_path: Path,
) -> None:
    """Even a process restarted with another model altogether (a changed manifest) runs the
    action the first model planned and saved, and asks the new model only about later steps."""
    fickle = Fickle()
    world = World(Journal(tmp_path / "world.jsonl"))
    spec = _spec()
    opener = opener_for("sqlite", tmp_path, lambda: "")
    rig = Rig(opener, world, [], model=fickle.build())
    assert isinstance(rig.attempt(spec, ("after_plan", 1)), SimulatedCrash)
    rig.die()

    other: list[dict[str, Any]] = []

    def replacement(request: dict[str, Any]) -> Mapping[str, Any]:
        other.append(request)
        if request["phase"] == "verify":
            return {"verdict": "accept"}
        return {"actions": [{"tool": "place_order", "args": {"sku": "ZZ", "qty": 999}}]}

    rig = Rig(opener, world, [], model=lambda: PythonModel(replacement, name="other"))
    try:
        rig.loop.run_or_resume(spec.with_budget(Budget(max_iterations=1)))
        (effect,) = world.journal.entries("effect")
        assert effect["args"] == {"sku": "S0", "qty": 10}
        assert all(r["phase"] == "verify" for r in other)
    finally:
        rig.die()


def _planned_then_redeclared_read(rig: Rig, spec: LoopSpec) -> Action:
    """Plan one WRITE, die right after the plan is saved, and come back with a manifest that
    declares the same tool READ; the saved action, as it was planned."""
    assert isinstance(rig.attempt(spec, ("after_plan", 1)), SimulatedCrash)
    saved = rig.loop.state(spec.tenant, spec.run).plan
    assert saved is not None
    (action,) = saved.actions
    assert (action.tool, action.side_effect) == ("place_order", SideEffect.WRITE)
    rig.world = replace(rig.world, as_read=frozenset({"place_order"}))
    rig.restart()
    assert rig.loop.tools["place_order"].side_effect is SideEffect.READ
    return action


def test_a_write_redeclared_read_after_its_plan_was_saved_still_runs_once_under_its_key(
    opener: StoreOpener, tmp_path: Path
) -> None:
    """A WRITE is planned and saved, the process dies, and the manifest now calls the tool READ.
    The saved action keeps the class it was planned under: the tool gets the saved idempotency
    key, and when the process dies again right after the call returned, the resume stops with
    outcome_unknown naming that action instead of calling it a second time. Settled, the run
    ends with the order placed exactly once."""
    fickle = Fickle()
    world = World(Journal(tmp_path / "world.jsonl"))
    spec = _spec()
    rig = Rig(opener, world, [], model=fickle.build())
    try:
        action = _planned_then_redeclared_read(rig, spec)
        assert isinstance(rig.attempt(spec, ("after_gateway_call", 1)), SimulatedCrash)
        assert [e["key"] for e in world.journal.entries("effect")] == [action.key]

        stopped = rig.loop.run_or_resume(spec)
        assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
        assert [(u.action, u.idempotency_key) for u in stopped.unknown_actions] == [
            (action.id, action.key)
        ]
        assert world.happened(action.key) == 1
        rig.loop.reconcile(spec.tenant, spec.run, action.id, executed=True, by="ops")
        done = rig.loop.run_or_resume(spec)
        assert done.stop.reason is StopReason.GOAL_MET
        assert [e["key"] for e in world.journal.entries("effect")] == [action.key]
        assert fickle.asked(1) == 1
    finally:
        rig.die()


def test_a_saved_write_is_refused_by_a_resumed_loop_that_now_allows_only_reads(
    opener: StoreOpener, tmp_path: Path
) -> None:
    """A WRITE is planned and saved, the process dies, and the run is resumed with the tool
    redeclared READ and the loop narrowed to READ. The saved action is still a WRITE: it is
    refused with side_effect_not_permitted, never runs, claims no idempotency key, and the model
    is told it was refused."""
    fickle = Fickle()
    world = World(Journal(tmp_path / "world.jsonl"))
    spec = _spec()
    rig = Rig(opener, world, [], model=fickle.build())
    try:
        action = _planned_then_redeclared_read(rig, spec)
        reads_only = replace(spec, allowed_side_effects=frozenset({SideEffect.READ}))
        done = rig.loop.run_or_resume(reads_only)
        assert done.stop.reason is StopReason.GOAL_MET
        assert world.journal.entries("effect") == []
        assert rig.stores.idempotency.get(spec.tenant, action.key) is None
        seen = [a for h in fickle.requests[-1]["history"] for a in h.get("actions", [])]
        assert [(a["id"], a["status"]) for a in seen] == [(action.id, "refused")]
        assert SIDE_EFFECT_NOT_PERMITTED in seen[0]["error"]
    finally:
        rig.die()
