"""Write-ahead planning: a saved action is what runs, whatever the model would say now.

Why it exists: ADR-0004 refuses "re-plan on resume" because a model may answer differently the
second time. These tests use a model that never answers the same way twice, crash after its plan
was saved, and prove the saved action (same tool, arguments and idempotency key) is what runs,
without the model being asked for that step again. They must never use a deterministic model
for this, or the proof would prove nothing.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from crashkit import Journal, Rig, StoreOpener, World, opener_for
from keelgate.adapters.models.python import PythonModel
from keelgate.core.model import Model
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import StopReason, idempotency_key
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
