"""How a run stops: every stop reason and every budget rule, and a resume that raises a limit.

Why it exists: ADR-0004 and the contract name each stop reason and each budget rule, and a user
notices every one of them: goal met, iteration, token, dollar and time limits, a price unknown,
the verifier's limit, a model that fails or answers nonsense, a goal predicate that raises. These
tests drive the real loop over real SQLite files with python models and tools whose every call is
counted. They must never fake time with sleeps (a fake monotonic clock is passed to the loop) and
never accept a result nobody could observe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from crashkit import World
from keelgate.adapters.models.python import PythonModel
from keelgate.core.audit import verify
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec, Price
from keelgate.core.state import Step
from keelgate.core.types import (
    RunPhase,
    StopReason,
)
from support.restock import (
    DONE,
    ORDER,
    PLACE,
    READ_A1,
    RESTOCK,
    FakeClock,
    Recorder,
    loop_over,
    loop_with_look_and_order,
    spec,
)

SPEC = LoopSpec("shop", "edges", "restock", budget=Budget(max_iterations=5))


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


def test_a_goal_predicate_that_raises_fails_the_run_with_its_message(stores: Stores) -> None:
    """A broken goal predicate is the run's failure, told in one line, not a traceback."""

    def predicate(history: Sequence[Mapping[str, Any]]) -> bool:
        raise KeyError("inStock")

    loop = loop_with_look_and_order(
        stores, [{"actions": [{"tool": "look", "args": {}}]}], goal_predicate=predicate
    )
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.FAILED and not outcome.resumable
    assert "goal predicate" in outcome.stop.message and "inStock" in outcome.stop.message


def test_arguments_that_are_not_json_fail_the_run_and_nothing_runs(stores: Stores) -> None:
    """A model asking for a call with NaN in its arguments: no key can be derived, so the run
    fails with a clear message and the tool is never called."""
    loop = loop_with_look_and_order(
        stores, [{"actions": [{"tool": "look", "args": {"ratio": math.nan}}]}]
    )
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.FAILED
    assert "not valid JSON" in outcome.stop.message
    assert [e.type for e in loop.audit("shop", "edges")][-1] == "loop.stopped"
