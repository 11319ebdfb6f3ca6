"""Hypothesis-generated crash sequences: many deaths and resumes in one run, mixed with budget
stops, verifier rejections and settlements.

Why it exists: the matrix proves one crash at a time; real incidents chain them (a crash, a
resume that hits its budget, a second crash while recovering). Hypothesis generates the script
(plans of READs, WRITEs and PROPOSEs, repeated calls, rejections), the crash sequence and the
budgets; each example drives the run until it stops for good and checks the promise. Runs are
derandomized with no example database, so every CI run executes the same 200 examples. It must
never settle an outcome by anything but what the downstream journal says.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from crashkit import Journal, Rig, World, opener_for, settle_truthfully, tool_calls
from crashkit.rig import assert_no_arguments_in_audit
from crashkit.scripts import MARK
from crashkit.world import DISCONTINUED, model_calls
from keelgate.core.failpoints import NAMES
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import ApprovalRule, KeyState, Outcome, StopReason, idempotency_key
from keelgate.errors import SimulatedCrash

READS = [{"tool": "get_inventory", "args": {"sku": sku}} for sku in ("A1", "B2")]
WRITES = [
    {"tool": "place_order", "args": {"sku": sku, "qty": qty, "note": MARK}}
    for sku in ("A1", "B2")
    for qty in (5, 20)
]
PROPOSALS = [{"tool": "notify", "args": {"to": "buyer", "text": MARK}}]
#: Refused downstream: a definite failure, nothing happens.
REFUSED = {"sku": DISCONTINUED, "qty": 1, "note": MARK}
REFUSALS = [{"tool": "place_order", "args": REFUSED}]

usages = st.fixed_dictionaries(
    {"inputTokens": st.integers(0, 300), "outputTokens": st.integers(0, 100)}
)
entries = st.fixed_dictionaries(
    {
        "actions": st.lists(
            st.sampled_from(WRITES + PROPOSALS + REFUSALS + READS), min_size=1, max_size=3
        ),
        "usage": usages,
    },
    optional={"verdict": st.just("reject")},
)
scripts = st.tuples(st.lists(entries, min_size=1, max_size=4), usages).map(
    lambda parts: [*parts[0], {"done": True, "answer": "all done", "usage": parts[1]}]
)
# The windows where a WRITE's outcome becomes unknown come first: Hypothesis favours early
# elements, and those are the deaths that matter most.
WINDOWS = (
    "mid_tool",
    "after_gateway_call",
    *(n for n in NAMES if n not in ("mid_tool", "after_gateway_call")),
)
crashes = st.lists(st.tuples(st.sampled_from(WINDOWS), st.integers(1, 3)), min_size=1, max_size=6)


@pytest.mark.slow
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    store=st.sampled_from(["memory", "sqlite"]),
    script=scripts,
    deaths=crashes,
    effect=st.sampled_from(["after", "before"]),
    confirm=st.booleans(),
    max_iterations=st.none() | st.integers(1, 3),
    tokens=st.none() | st.integers(50, 1500),
    token_step=st.integers(300, 2000),
    restart_after_stop=st.booleans(),
    gated=st.sampled_from(["", "place_order", "notify"]),
    required=st.sampled_from([1, 2]),
    decisions=st.lists(st.booleans(), min_size=1, max_size=4),
)
def test_any_sequence_of_crashes_and_budget_stops_never_runs_a_write_twice(
    store: str,
    script: list[dict[str, Any]],
    deaths: list[tuple[str, int]],
    effect: str,
    confirm: bool,
    max_iterations: int | None,
    tokens: int | None,
    token_step: int,
    restart_after_stop: bool,
    gated: str,
    required: int,
    decisions: list[bool],
) -> None:
    """Whatever the sequence of deaths (any window, any pass, several per run, some during
    recovery) and budget, verifier or approval stops, driving the run to its end (raising
    budgets, settling unknown outcomes truthfully by a person or a confirmer, approving or
    denying, one person at a time, where a rule may ask two different people) ends goal_met
    with no side effect downstream happening twice or with fewer approvals than it needs, every
    WRITE and PROPOSE key either completed (it happened once), abandoned (it never happened, and
    only because a tool died before its effect or before its refusal was recorded) or absent
    (denied, or refused downstream), the model asked exactly once per planning call and per
    verdict, and an intact audit chain, anchored to the checkpoint, that holds no argument."""
    with tempfile.TemporaryDirectory() as directory:
        # Deaths here are in-process, so the page cache survives them: no fsync needed, which
        # keeps 300 examples fast on a busy CI disk.
        journal = Journal(Path(directory) / "world.jsonl", fsync=False)
        world = World(
            journal,
            effect="before" if effect == "before" else "after",
            approval=frozenset({gated} - {""}),
            rules={gated: ApprovalRule(required=2)} if gated and required == 2 else {},
        )
        spec = LoopSpec(
            "shop",
            "restock",
            "restock",
            budget=Budget(max_iterations=max_iterations, tokens=tokens, max_verifier_rejections=2),
        )
        opener = opener_for(store, Path(directory), lambda: "", synchronous="NORMAL")
        rig = Rig(opener, world, script, confirm=confirm)
        try:
            people = _People(decisions)
            fired = _drive(rig, spec, deaths, token_step, restart_after_stop, people)
            _assert_promise(rig, spec, script, fired, effect, people, gated)
        finally:
            rig.die()


class _People:
    """Approvers deciding in a fixed rotation, one person per decision (a different one for
    each approval an action gets); remembers which keys got all the approvals they need (let
    through) and which were denied."""

    PEOPLE = ("amy", "ben", "cy")

    def __init__(self, decisions: list[bool]) -> None:
        self.decisions = itertools.cycle(decisions)
        self.approved: set[str] = set()
        self.denied: set[str] = set()
        self.approvers: dict[str, list[str]] = {}

    def decide(self, rig: Rig, spec: LoopSpec, outcome: Outcome) -> None:
        plan = rig.loop.state(spec.tenant, spec.run).plan
        assert plan is not None
        keys = {a.id: a.key for a in plan.actions}
        for waiting in outcome.pending_approvals:
            key = keys[waiting.action]
            approved = next(self.decisions)
            given = self.approvers.setdefault(key, [])
            by = self.PEOPLE[len(given) % len(self.PEOPLE)]
            rig.loop.approve(spec.tenant, spec.run, waiting.action, approved=approved, by=by)
            if not approved:
                self.denied.add(key)
            else:
                given.append(by)
                if len(set(given)) >= waiting.required:
                    self.approved.add(key)
            event(f"a person {'approved' if approved else 'denied'} an action")


def _drive(
    rig: Rig,
    spec: LoopSpec,
    deaths: list[tuple[str, int]],
    token_step: int,
    restart_after_stop: bool,
    people: _People,
) -> list[SimulatedCrash]:
    pending = list(deaths)
    fired: list[SimulatedCrash] = []
    for _ in range(80):
        result = rig.attempt(spec, pending.pop(0) if pending else None)
        if isinstance(result, SimulatedCrash):
            fired.append(result)
            event(f"died at {result.failpoint}")
            continue
        reason = result.stop.reason
        event(f"stopped: {reason.value}")
        if reason is StopReason.GOAL_MET:
            assert result.answer == "all done"
            event(f"deaths in one run: {len(fired)}")
            return fired
        if reason is StopReason.OUTCOME_UNKNOWN:
            for _, executed in settle_truthfully(rig.loop, result, rig.world):
                event(f"a person settled it: {'executed' if executed else 'abandoned'}")
        elif reason is StopReason.AWAITING_APPROVAL:
            people.decide(rig, spec, result)
        elif reason is StopReason.MAX_ITERATIONS:
            assert spec.budget.max_iterations is not None
            spec = spec.with_budget(spec.budget.raised(max_iterations=result.iteration + 1))
        elif reason is StopReason.TOKEN_BUDGET:
            assert spec.budget.tokens is not None
            spec = spec.with_budget(spec.budget.raised(tokens=spec.budget.tokens + token_step))
        elif reason is StopReason.VERIFIER_REJECTIONS:
            limit = spec.budget.max_verifier_rejections
            assert limit is not None
            spec = spec.with_budget(spec.budget.raised(max_verifier_rejections=limit + 2))
        else:
            raise AssertionError(f"unexpected stop {result.to_json()}")
        assert result.resumable or reason is StopReason.VERIFIER_REJECTIONS
        if restart_after_stop:
            rig.restart()
    raise AssertionError("the run never finished")


def _assert_promise(
    rig: Rig,
    spec: LoopSpec,
    script: list[dict[str, Any]],
    fired: list[SimulatedCrash],
    effect: str,
    people: _People,
    gated: str,
) -> None:
    effects = rig.world.effects()
    assert all(count == 1 for count in effects.values()), f"a side effect repeated: {effects}"
    calls = [c for c in tool_calls(script, spec.tenant, spec.run) if c.changes_world]
    planned = {c.key for c in calls}
    assert set(effects) <= planned, "a side effect nobody planned"
    refused = idempotency_key(spec.tenant, spec.run, "place_order", REFUSED)
    abandoned = 0
    for row in rig.world.journal.entries("effect"):
        if row["tool"] == gated:
            assert row["key"] in people.approved, f"{gated} ran unapproved"
    for key in planned:
        record = rig.stores.idempotency.get(spec.tenant, key)
        if key == refused:
            # Refused downstream: its key is dropped, or abandoned if a death came between the
            # call and the drop. It never happened either way.
            assert effects[key] == 0
            assert record is None or record.state is KeyState.ABANDONED
            continue
        if record is None:  # never tried: every action with this key was denied
            assert key in people.denied and effects[key] == 0
            continue
        if effects[key] == 1:
            assert record.state is KeyState.COMPLETED
        else:
            assert record.state is KeyState.ABANDONED
            abandoned += 1
            event("a WRITE or PROPOSE was abandoned")
    # Only a tool that died before its effect may leave a WRITE undone.
    died_mid_tool = sum(1 for f in fired if f.failpoint == "mid_tool")
    assert abandoned <= (died_mid_tool if effect == "after" else 0)

    for phase in ("plan", "verify"):
        asked = sorted(row["call"] for row in model_calls(rig.world.journal, phase))
        assert asked == list(range(len(script))), f"{phase} calls {asked}"
    report = rig.loop.verify_audit(spec.tenant, spec.run)
    assert report.ok, report.problems
    assert_no_arguments_in_audit(rig.stores, spec, MARK)
