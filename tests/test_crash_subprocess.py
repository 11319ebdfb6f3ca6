"""The crash matrix with real process deaths.

Why it exists: an in-process restart closes its stores politely; a real death does not. Here a
worker process arms one failpoint through ``KEELGATE_FAILPOINTS`` and dies by ``os._exit(137)``
(no buffer flushed, no ``finally`` run, no connection closed), then a fresh process resumes and
settles any unknown outcome truthfully from the downstream journal. This module must never
settle anything itself or arm a failpoint any other way than the environment.

Also: two live processes driving one run at once (exactly one acts), and a settlement whose
process died before its audit event was written (the event is on the chain after the resume).

Coverage: on SQLite and on Postgres, every window at its 1st, 2nd and 3rd pass (mid-tool with the
effect before and after the crash): 24 cases each, two process starts per case (about 0.3 s each;
a Postgres case takes about 1 s in all). Marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashkit import (
    RESTOCK,
    Journal,
    Rig,
    World,
    assert_promise,
    expected_crash,
    tool_calls,
    url_opener,
)
from crashkit.rig import OPERATOR
from crashkit.scripts import crash_cases, fresh_spec
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyState, utc_iso

TESTS = Path(__file__).resolve().parent
#: Every window at its 1st, 2nd and 3rd pass, on each store.
CASES = crash_cases()


def _environment(failpoints: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    env.pop("KEELGATE_FAILPOINTS", None)
    if failpoints:
        env["KEELGATE_FAILPOINTS"] = failpoints
    return env


def start_worker(job: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "crashkit.worker", json.dumps(job)],
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(worker: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        stdout, stderr = worker.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.communicate()
        raise
    return report(subprocess.CompletedProcess(worker.args, worker.returncode, stdout, stderr))


def run_worker(job: dict[str, Any], *, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = _environment(failpoints)
    return subprocess.run(
        [sys.executable, "-m", "crashkit.worker", json.dumps(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def crash_and_recover(
    store: str, tmp_path: Path, window: str, occurrence: int, effect: str
) -> None:
    journal = tmp_path / "world.jsonl"
    spec = fresh_spec()
    job = {
        "store": store,
        "journal": str(journal),
        "tenant": spec.tenant,
        "run": spec.run,
        "effect": effect,
    }
    calls = tool_calls(RESTOCK, spec.tenant, spec.run)
    unknown, happened = expected_crash(calls, window, occurrence, effect)

    died = run_worker({**job, "mode": "run"}, failpoints=f"{window}@{occurrence}")
    assert died.returncode == 137, (died.returncode, died.stderr)
    assert died.stdout == ""  # it died before reporting anything

    recovered = report(run_worker({**job, "mode": "drive"}))
    reasons = [o["stopReason"] for o in recovered["outcomes"]]
    if unknown is None:
        assert reasons == ["goal_met"]
        assert recovered["settled"] == []
    else:
        assert reasons == ["outcome_unknown", "goal_met"]
        (named,) = recovered["outcomes"][0]["unknownActions"]
        # It may be settled as not executed only once its write deadline has passed.
        assert named.pop("notExecutedAfter") > utc_iso(time.time())
        assert named == {
            "action": unknown.action,
            "tool": unknown.tool,
            "idempotencyKey": unknown.key,
        }
        assert recovered["settled"] == [[unknown.action, happened]]
    assert recovered["outcomes"][-1]["answer"] == "restocked A1, B2 and C3"

    world = World(Journal(journal), effect="before" if effect == "before" else "after")
    rig = Rig(url_opener(store), world, RESTOCK)
    try:
        gone = {unknown.key} if unknown is not None and not happened else set()
        assert_promise(rig, spec, calls, abandoned=gone)
    finally:
        rig.die()


@pytest.mark.slow
@pytest.mark.parametrize(("window", "occurrence", "effect"), CASES)
def test_a_process_killed_at_any_window_never_runs_a_write_twice_sqlite(
    tmp_path: Path, window: str, occurrence: int, effect: str
) -> None:
    """A worker killed with os._exit(137) at a window's 1st, 2nd or 3rd pass, on a SQLite file:
    a fresh process resumes; a WRITE cut off past the gateway call or mid-body is reported as
    outcome_unknown naming that action, settled from downstream, and the run ends goal_met with
    every WRITE and PROPOSE done exactly once (never, when abandoned) and the model asked once
    per step."""
    crash_and_recover(f"sqlite:///{tmp_path}/keelgate.db", tmp_path, window, occurrence, effect)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize(("window", "occurrence", "effect"), CASES)
def test_a_process_killed_at_any_window_never_runs_a_write_twice_postgres(
    pg_url: str, tmp_path: Path, window: str, occurrence: int, effect: str
) -> None:
    """The same real-death recovery on PostgreSQL: the dead process's session ends with it, so
    its in-flight WRITE reads as outcome_unknown to the next process, and every WRITE and
    PROPOSE is done exactly once (never, when abandoned)."""
    crash_and_recover(pg_url, tmp_path, window, occurrence, effect)


def test_a_bad_failpoint_setting_is_one_clear_line_and_runs_nothing(tmp_path: Path) -> None:
    """KEELGATE_FAILPOINTS naming an unknown window is reported as one line naming the variable,
    and the worker runs nothing (no WRITE downstream)."""
    journal = tmp_path / "world.jsonl"
    job = {
        "store": f"sqlite:///{tmp_path}/keelgate.db",
        "journal": str(journal),
        "tenant": "shop",
        "run": "restock",
        "mode": "drive",
    }
    done = run_worker(job, failpoints="after_lunch@1")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("KEELGATE_FAILPOINTS:")
    assert "after_lunch" in lines[0]
    assert Journal(journal).entries() == []


def _holding(journal: Journal, pid: int) -> bool:
    return any(row["pid"] == pid for row in journal.entries("holding"))


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("held", ["place_order", "get_inventory"])
def test_two_processes_resuming_one_run_at_once_exactly_one_acts(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, held: str
) -> None:
    """Two live processes drive the same run at the same moment. With the first one inside a
    WRITE or a READ, the second sees the run is busy before it runs anything, that READ
    included (RunBusy): it neither touches a WRITE in flight nor repeats a READ. Exactly one
    finishes the run, every WRITE happens once, and the model is asked once per step."""
    url = (
        f"sqlite:///{tmp_path}/keelgate.db"
        if store == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )
    journal = Journal(tmp_path / "world.jsonl")
    release = tmp_path / "release"
    spec = LoopSpec(
        "shop", f"race-{uuid.uuid4().hex[:8]}", "restock", budget=Budget(max_iterations=10)
    )
    job = {
        "store": url,
        "journal": str(journal.path),
        "tenant": spec.tenant,
        "run": spec.run,
        "mode": "drive",
        "hold": str(release),
        "hold_tool": held,
    }
    first = start_worker(job)
    second: subprocess.Popen[str] | None = None
    try:
        _wait_until(lambda: _holding(journal, first.pid), f"the first process is in {held}")
        second = start_worker(job)
        lost = finish(second)
        assert lost == {"outcomes": [], "settled": [], "lost": "RunBusy"}
        assert not _holding(journal, second.pid)  # it ran nothing, not even the READ
        release.touch()
        results = [finish(first), lost]
    finally:
        release.touch()
        for worker in (first, second):
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.communicate()

    winners = [r for r in results if r["outcomes"]]
    losers = [r for r in results if not r["outcomes"]]
    assert len(winners) == 1 and len(losers) == 1, results
    assert [o["stopReason"] for o in winners[0]["outcomes"]] == ["goal_met"]
    assert losers[0]["lost"] == "RunBusy"

    rig = Rig(url_opener(url), World(journal), RESTOCK)
    try:
        assert_promise(rig, spec, tool_calls(RESTOCK, spec.tenant, spec.run))
    finally:
        rig.die()


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize(
    ("source", "actor"),
    [("human", OPERATOR), ("confirmer", "ledger-confirmer")],
    ids=["person", "confirmer"],
)
def test_a_settlement_whose_process_died_before_its_event_is_on_the_chain_after_the_resume(
    request: pytest.FixtureRequest, tmp_path: Path, store: str, source: str, actor: str
) -> None:
    """A WRITE's outcome is unknown after a real death. A person's reconcile (or, on resume, the
    confirmer) settles its key, and that process is killed (os._exit) right after the
    settlement. A confirmer's loop.reconciled event is not written yet; a person's is, since it
    commits with the settlement (``settle_with_event``: the settler writes it, never the run's
    next process). The settlement stands, and once the run resumes the chain holds that event
    exactly once, naming who settled it, on whose authority and which way; the WRITE happened
    once, nothing is settled twice, and the chain verifies."""
    url = (
        f"sqlite:///{tmp_path}/keelgate.db"
        if store == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )
    journal = tmp_path / "world.jsonl"
    spec = LoopSpec(
        "shop", f"settle-{uuid.uuid4().hex[:8]}", "restock", budget=Budget(max_iterations=10)
    )
    job = {
        "store": url,
        "journal": str(journal),
        "tenant": spec.tenant,
        "run": spec.run,
        "confirm": source == "confirmer",
    }
    calls = tool_calls(RESTOCK, spec.tenant, spec.run)
    unknown, happened = expected_crash(calls, "after_gateway_call", 2, "before")
    assert unknown is not None and happened

    died = run_worker({**job, "mode": "run"}, failpoints="after_gateway_call@2")
    assert died.returncode == 137, (died.returncode, died.stderr)
    settling = run_worker({**job, "mode": "drive"}, failpoints="after_settle@1")
    assert settling.returncode == 137, (settling.returncode, settling.stderr)
    assert settling.stdout == ""

    rig = Rig(url_opener(url), World(Journal(journal)), RESTOCK)
    try:
        # The window was hit: the key is settled; a confirmer's event is not on the chain yet,
        # a person's came with the settlement.
        record = rig.stores.idempotency.get(spec.tenant, unknown.key)
        assert record is not None
        assert (record.state, record.settled_by, record.source) == (
            KeyState.COMPLETED,
            actor,
            source,
        )
        events = rig.loop.audit(spec.tenant, spec.run)
        written = [e.actor for e in events if e.type == "loop.reconciled"]
        assert written == ([actor] if source == "human" else [])
    finally:
        rig.die()

    recovered = report(run_worker({**job, "mode": "drive"}))
    assert [o["stopReason"] for o in recovered["outcomes"]] == ["goal_met"]
    assert recovered["settled"] == []

    rig = Rig(url_opener(url), World(Journal(journal)), RESTOCK)
    try:
        reconciled = [
            (e.actor, e.data["source"], e.data["verdict"], e.data["action"])
            for e in rig.loop.audit(spec.tenant, spec.run)
            if e.type == "loop.reconciled"
        ]
        assert reconciled == [(actor, source, "executed", unknown.action)]
        assert_promise(rig, spec, calls)
    finally:
        rig.die()
