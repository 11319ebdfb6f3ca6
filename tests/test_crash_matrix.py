"""The crash-test matrix of ADR-0004, with in-process restarts.

Why it exists: the promise (a WRITE never runs twice, an unknown outcome is a reason to stop) must
hold whichever window a process dies in. Each case kills the "process" at one window's Nth pass,
closes its stores (what a death does) and rebuilds every object over the same files, then resumes,
settling any unknown outcome truthfully from the downstream journal. It must never settle by
guessing or look at Keelgate's own records to decide what happened downstream.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crashkit import (
    RESTOCK,
    Journal,
    Rig,
    StoreOpener,
    World,
    assert_promise,
    drive,
    expected_crash,
    opener_for,
    tool_calls,
    url_opener,
)
from crashkit.scripts import RUN_WINDOWS, crash_cases, fresh_spec, occurrences
from keelgate.core.types import StopReason
from keelgate.errors import SimulatedCrash

CASES = crash_cases()


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> StoreOpener:
    """Stores to restart over: every call opens a fresh session on the same data."""
    return opener_for(request.param, tmp_path, lambda: str(request.getfixturevalue("pg_url")))


@pytest.mark.parametrize(("window", "occurrence", "effect"), CASES)
def test_a_crash_at_any_window_leaves_every_write_done_exactly_once(
    opener: StoreOpener, tmp_path: Path, window: str, occurrence: int, effect: str
) -> None:
    """A process dying at a window's 1st, 2nd or 3rd pass, restarted over the same stores and
    resumed, ends goal_met with every WRITE and PROPOSE done exactly once (or never, when the
    tool died before its effect and the run abandoned it). A WRITE cut off past the gateway call
    or mid-body stops the run with outcome_unknown, naming that action, and stays stopped
    without running it again until someone settles it; the model is never asked twice."""
    world = World(
        Journal(tmp_path / "world.jsonl"), effect="before" if effect == "before" else "after"
    )
    spec = fresh_spec()
    calls = tool_calls(RESTOCK, spec.tenant, spec.run)
    unknown, happened = expected_crash(calls, window, occurrence, effect)
    rig = Rig(opener, world, RESTOCK)
    try:
        death = rig.attempt(spec, (window, occurrence))
        assert isinstance(death, SimulatedCrash), f"{window}@{occurrence} never fired"
        assert (death.failpoint, death.occurrence) == (window, occurrence)

        if unknown is not None:
            effects = world.effects()
            stopped = rig.loop.run_or_resume(spec)
            assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
            assert stopped.resumable
            assert [u.action for u in stopped.unknown_actions] == [unknown.action]
            assert [u.idempotency_key for u in stopped.unknown_actions] == [unknown.key]
            # Not knowing is a reason to stop, again and again: nothing runs until settled.
            rig.restart()
            again = rig.loop.run_or_resume(spec)
            assert again.stop.reason is StopReason.OUTCOME_UNKNOWN
            assert world.effects() == effects

        outcomes, settled = drive(rig, spec)
        assert outcomes[-1].stop.reason is StopReason.GOAL_MET
        assert outcomes[-1].answer == "restocked A1, B2 and C3"
        if unknown is None:
            assert settled == []
            assert len(outcomes) == 1
        else:
            assert settled == [(unknown.action, happened)]
        gone = {unknown.key} if unknown is not None and not happened else set()
        assert_promise(rig, spec, calls, abandoned=gone)
    finally:
        rig.die()


@pytest.mark.parametrize("window", RUN_WINDOWS)
def test_the_last_pass_of_each_window_can_crash_and_one_past_it_never_fires(
    tmp_path: Path, window: str
) -> None:
    """The matrix's script passes every window at least three times, and exactly as often as the
    crash expectations assume: a crash armed at the last pass fires there, and one armed a pass
    later never fires, so that run simply completes with the promise intact."""
    last = occurrences(RESTOCK)[window]
    assert last >= 3
    for occurrence, fires in ((last, True), (last + 1, False)):
        world = World(Journal(tmp_path / f"world-{occurrence}.jsonl"))
        spec = fresh_spec()
        rig = Rig(url_opener(f"sqlite:///{tmp_path}/k-{occurrence}.db"), world, RESTOCK)
        try:
            first = rig.attempt(spec, (window, occurrence))
            assert isinstance(first, SimulatedCrash) is fires
            outcomes, _ = drive(rig, spec)
            assert outcomes[-1].stop.reason is StopReason.GOAL_MET
            calls = tool_calls(RESTOCK, spec.tenant, spec.run)
            unknown, happened = expected_crash(calls, window, occurrence, "before")
            gone = {unknown.key} if fires and unknown is not None and not happened else set()
            assert_promise(rig, spec, calls, abandoned=gone)
        finally:
            rig.die()
