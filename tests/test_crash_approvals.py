"""Crashes around WRITEs that need two people's approval: never with fewer, never twice.

Why it exists: a rule of several approvals adds a state between "asked" and "approved" (1 of 2)
that a crash must not turn into either. Every WRITE of the crash tests' script needs two
different people here. The "process" dies at each window's 1st, 2nd and 3rd pass, before the
first approval and again after it, in-process (stores closed, every object rebuilt over the
same files) and as a real process killed by ``os._exit(137)``; people approve one at a time,
and after each approval the run is resumed. The downstream journal, not Keelgate's records,
says what happened: no WRITE takes effect before its second approval is in the store, none
twice, and every one exactly once by the end (unless truthfully abandoned after a death inside
the tool).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashkit import (
    RESTOCK,
    Journal,
    Rig,
    StoreOpener,
    World,
    assert_promise,
    opener_for,
    settle_truthfully,
    tool_calls,
    url_opener,
)
from crashkit.scripts import RUN_WINDOWS, crash_cases, fresh_spec
from keelgate.core import failpoints
from keelgate.core.spec import LoopSpec
from keelgate.core.types import ApprovalRule, KeyState, Outcome, StopReason
from keelgate.errors import SimulatedCrash
from test_crash_subprocess import report, run_worker

TWO = ApprovalRule(required=2)
PEOPLE = ("alice", "bob")
CASES = crash_cases()


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> StoreOpener:
    return opener_for(request.param, tmp_path, lambda: str(request.getfixturevalue("pg_url")))


class Approvers:
    """Two people approving each waiting WRITE one at a time; they remember, for each key,
    how many approvals were in the store when its effect was first seen downstream."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.given: dict[str, int] = {}  # key -> approvals recorded so far

    def check_nothing_ran(self, keys: dict[str, str], outcome: Outcome) -> None:
        """A WRITE waiting for its approvals has not taken effect."""
        for pending in outcome.pending_approvals:
            assert pending.required == 2
            assert pending.approvals == self.given.get(keys[pending.action], 0)
            assert self.world.happened(keys[pending.action]) == 0, (
                f"{pending.action} ran with {pending.approvals} of 2 approvals"
            )

    def approve_one(self, approve: Callable[[str, str], None], keys: dict[str, str],
                    outcome: Outcome) -> None:  # fmt: skip
        """The next person approves each waiting action (alice first, bob second)."""
        for pending in outcome.pending_approvals:
            key = keys[pending.action]
            count = self.given.get(key, 0)
            approve(pending.action, PEOPLE[count])
            self.given[key] = count + 1


def _keys(rig: Rig, spec: LoopSpec) -> dict[str, str]:
    plan = rig.loop.state(spec.tenant, spec.run).plan
    assert plan is not None
    return {a.id: a.key for a in plan.actions}


class Deaths:
    """Where the "process" dies: at the window's Nth pass over the whole test (every attempt
    counts), and again at the window's first pass after each first approval."""

    def __init__(self, window: str, occurrence: int) -> None:
        self.window = window
        self.occurrence = occurrence
        self.passes = 0
        self.again = False
        self.fired = 0

    def __call__(self, name: str) -> None:
        if name != self.window:
            return
        self.passes += 1
        if self.passes == self.occurrence or self.again:
            self.again = False
            self.fired += 1
            raise SimulatedCrash(name, self.passes)


@pytest.mark.parametrize(("window", "occurrence", "effect"), CASES)
def test_a_crash_before_or_between_two_approvals_never_runs_a_write_early_or_twice(
    opener: StoreOpener, tmp_path: Path, window: str, occurrence: int, effect: str
) -> None:
    """Each WRITE needs alice and bob. A death at the window's Nth pass, and again at its next
    pass after each first approval, with a restart each time: a WRITE waiting with 0 or 1 of 2
    approvals has not happened; after the second it happens once; the run ends goal_met with
    every WRITE and PROPOSE done exactly once (never, when a death inside the tool left it
    undone and it was truthfully abandoned), and the trail holds each approval."""
    world = World(Journal(tmp_path / "world.jsonl"), effect=effect, rules={"place_order": TWO})
    spec = fresh_spec()
    calls = tool_calls(RESTOCK, spec.tenant, spec.run)
    rig = Rig(opener, world, RESTOCK)
    people = Approvers(world)
    deaths = Deaths(window, occurrence)
    abandoned: set[str] = set()

    def approve(action: str, by: str) -> None:
        rig.loop.approve(spec.tenant, spec.run, action, approved=True, by=by)

    try:
        for _ in range(60):
            try:
                with failpoints.observed(deaths):
                    result = rig.loop.run_or_resume(spec)
            except SimulatedCrash:
                rig.restart()
                continue
            reason = result.stop.reason
            if reason is StopReason.GOAL_MET:
                break
            if reason is StopReason.OUTCOME_UNKNOWN:
                for action, happened in settle_truthfully(rig.loop, result, world):
                    if not happened:
                        abandoned.add(_keys(rig, spec)[action])
                continue
            assert reason is StopReason.AWAITING_APPROVAL, result.to_json()
            keys = _keys(rig, spec)
            people.check_nothing_ran(keys, result)
            people.approve_one(approve, keys, result)
            deaths.again = any(people.given[keys[p.action]] == 1 for p in result.pending_approvals)
        else:
            raise AssertionError("the run never finished")
        assert deaths.fired >= 1, f"{window}@{occurrence} never fired"
        writes = [c for c in calls if c.tool == "place_order"]
        assert {people.given.get(c.key) for c in writes} == {2}
        assert_promise(rig, spec, calls, abandoned=abandoned)
        approved = [
            e for e in rig.stores.audit.events(spec.tenant, spec.run) if e.type == "loop.approved"
        ]
        assert sorted((e.data["action"], e.actor) for e in approved) == sorted(
            (c.action, person) for c in writes for person in PEOPLE
        )
    finally:
        rig.die()


@pytest.mark.slow
@pytest.mark.parametrize("window", RUN_WINDOWS)
def test_a_process_killed_around_two_approvals_never_runs_a_write_early_or_twice(
    tmp_path: Path, window: str
) -> None:
    """The same with real deaths on SQLite: a worker dies by os._exit(137) at the window's
    first pass, then again after each first approval; the people approve in processes of their own;
    no WRITE takes effect before its second approval, none twice, and the run ends goal_met
    with each done once (or truthfully abandoned)."""
    store = f"sqlite:///{tmp_path}/keelgate.db"
    journal = tmp_path / "world.jsonl"
    spec = fresh_spec()
    job: dict[str, Any] = {
        "store": store,
        "journal": str(journal),
        "tenant": spec.tenant,
        "run": spec.run,
        "effect": "before",
        "required": 2,
    }
    world = World(Journal(journal), rules={"place_order": TWO})
    given: dict[str, int] = {}
    armed, fired = True, 0
    for _ in range(60):
        done = run_worker({**job, "mode": "drive"}, failpoints=f"{window}@1" if armed else "")
        if done.returncode == 137:
            fired += 1
            armed = False
            continue
        last = report(done)["outcomes"][-1]
        if last["stopReason"] == "goal_met":
            break
        assert last["stopReason"] == "awaiting_approval", last
        keys = {p["action"]: p["idempotencyKey"] for p in last["pendingApprovals"]}
        for action, key in keys.items():
            assert world.happened(key) == 0, f"{action} ran before its second approval"
            count = given.get(key, 0)
            approved = report(
                run_worker({**job, "mode": "approve", "action": action, "by": PEOPLE[count]})
            )
            assert approved["outcomes"] == []
            given[key] = count + 1
        armed = any(given[k] == 1 for k in keys.values())
    else:
        raise AssertionError("the run never finished")
    assert fired >= 1
    effects = world.effects()
    assert all(count == 1 for count in effects.values()), effects
    rig = Rig(url_opener(store), world, RESTOCK)
    try:
        for call in tool_calls(RESTOCK, spec.tenant, spec.run):
            if not call.changes_world:
                continue
            record = rig.stores.idempotency.get(spec.tenant, call.key)
            assert record is not None
            assert record.state in (KeyState.COMPLETED, KeyState.ABANDONED)
            assert effects.get(call.key, 0) == (1 if record.state is KeyState.COMPLETED else 0)
        assert rig.loop.verify_audit(spec.tenant, spec.run).ok
    finally:
        rig.die()
    writes = [c.key for c in tool_calls(RESTOCK, spec.tenant, spec.run) if c.tool == "place_order"]
    assert {given.get(key) for key in writes} == {2}, json.dumps(given)
