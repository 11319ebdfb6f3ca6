"""The simulated model and the scenario it follows: what each iteration plans, what it costs.

Why it exists: the loop must be driven by something that plans WRITEs the way a model does:
several per iteration, the same call again (the same key), a READ between, a composite WRITE
(``pay``), a verifier that sometimes rejects. The scenario is drawn from the schedule before
anything runs, so a shrunk schedule also shrinks the story (fewer iterations, fewer calls).
The model answers from the scenario alone (the iteration asked about), so a process that died
before its plan was saved gets the same plan from the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keelgate.core.model import ModelReply, ModelRequest, PlannedCall
from keelgate.core.types import Usage
from keelgate.testing.sim.downstream import CHANGING
from keelgate.testing.sim.world import Schedule

SKUS = ("A1", "B2", "C3")


@dataclass(frozen=True)
class Scenario:
    """One run's story: the plans of its iterations (the last is "done"), and its settings."""

    plans: tuple[tuple[PlannedCall, ...], ...]
    rejected: frozenset[int]  # iterations whose verifier says "reject"
    approval: frozenset[str]  # tools asking for approval at the start
    max_iterations: int | None
    tokens: int | None
    confirmer: bool
    input_tokens: int
    output_tokens: int
    #: How many different people each of those tools' calls needs (1 or 2).
    approvers: int = 1

    @classmethod
    def drawn(cls, schedule: Schedule) -> Scenario:
        iterations = 1 + schedule.pick(4)
        plans: list[tuple[PlannedCall, ...]] = []
        for _ in range(iterations):
            calls: list[PlannedCall] = []
            for _ in range(1 + schedule.pick(3)):
                tool = ("place_order", "place_order", "notify", "check_stock", "pay")[
                    schedule.pick(5)
                ]
                args: dict[str, Any] = {"sku": SKUS[schedule.pick(len(SKUS))]}
                if tool == "place_order":
                    args["qty"] = 1 + schedule.pick(2)
                elif tool == "pay":
                    args["amount"] = 10 * (1 + schedule.pick(3))
                calls.append(PlannedCall(tool, args))
            plans.append(tuple(calls))
        rejected = frozenset(i + 1 for i in range(iterations) if schedule.chance(150))
        approval = frozenset(tool for tool in CHANGING if schedule.chance(300))
        limit = schedule.pick(3)
        max_iterations = None if limit == 0 else iterations + len(rejected) - 1 + limit
        tokens = None if not schedule.chance(250) else 1500 + 200 * schedule.pick(10)
        confirmer = schedule.chance(300)
        input_tokens = 80 + 10 * schedule.pick(5)
        output_tokens = 20 + 10 * schedule.pick(4)
        return cls(
            plans=tuple(plans),
            rejected=rejected,
            approval=approval,
            max_iterations=max_iterations,
            tokens=tokens,
            confirmer=confirmer,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            # Read from a choice already made (no new draw: every seed keeps its story): two
            # people for about half the runs that ask for approval.
            approvers=2 if approval and (output_tokens // 10) % 2 == 1 else 1,
        )


class SimModel:
    """Plans from the scenario; verifies with "accept" except where it says "reject" once."""

    name = "sim-model"

    def __init__(self, scenario: Scenario, *, on_plan: Callable[[int], None] | None = None) -> None:
        self.scenario = scenario
        self.on_plan = on_plan  # told of each plan given (its iteration), for the oracle
        self.calls = 0

    def call(self, request: ModelRequest) -> ModelReply:
        self.calls += 1
        scenario = self.scenario
        usage = Usage(input_tokens=scenario.input_tokens, output_tokens=scenario.output_tokens)
        if request.phase == "verify":
            rejected_before = any(
                entry.get("verdict") == "reject" and entry.get("iteration") == request.iteration
                for entry in request.history
            )
            if request.iteration in scenario.rejected and not rejected_before:
                return ModelReply(verdict="reject", reason="try again", usage=usage)
            return ModelReply(usage=usage)
        # Iterations rejected by the verifier are planned again: count the accepted ones.
        done = sum(1 for entry in request.history if "actions" in entry) - sum(
            1 for entry in request.history if entry.get("verdict") == "reject"
        )
        index = max(0, done)
        if self.on_plan is not None:
            self.on_plan(request.iteration)
        if index >= len(scenario.plans):
            return ModelReply(done=True, answer="restocked", usage=usage)
        return ModelReply(actions=scenario.plans[index], usage=usage)
