"""The crash check: each system dies inside its WRITE, right after the side effect and before
any durable record of it, and a new process resumes the run; how many times did the WRITE run?

Why it exists: speed is only half of a comparison; what a system promises about a WRITE when the
process dies at the worst moment is the other half, and it is shown here, measured, not claimed.
The side effect increments a counter in a file (fsynced), then the process ends with
``os._exit(137)`` (nothing flushed, no ``finally``), the window Keelgate's failpoint ``mid_tool``
names, for every system alike. Expected: DBOS Transact and LangGraph run the step or node again
on recovery (two side effects; neither dedupes them), Keelgate does not run it again and stops
the run with OUTCOME_UNKNOWN for a person or a confirmer to settle (one side effect).

It must never settle anything, nor arm the crash any other way than in the worker it starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peersbench.places import Database, Place

ENTRY = Path(__file__).resolve().parent.parent / "peers.py"
SYSTEMS = ("keelgate", "dbos", "langgraph sync", "langgraph async")
RUN = "crash"


@dataclass(frozen=True)
class CrashResult:
    store: str
    system: str
    effects: int  # side effects of the one WRITE, counted in the file
    outcome: str  # how the resumed run ended


def check(place: Place, workdir: Path, systems: tuple[str, ...] = SYSTEMS) -> list[CrashResult]:
    results = []
    for system in systems:
        database = place.database(f"crash_{system.replace(' ', '_')}")
        counter = workdir / f"{place.name}-{system.replace(' ', '_')}.effects"
        counter.write_text("0")
        job = {"system": system, "store": database.store, "target": database.target}
        first = _worker({**job, "counter": str(counter), "crash": True})
        if first.returncode != 137:
            raise SystemExit(f"bench: the {system} worker did not die mid-WRITE: {_said(first)}")
        second = _worker({**job, "counter": str(counter), "crash": False})
        if second.returncode != 0:
            raise SystemExit(f"bench: the {system} resume failed: {_said(second)}")
        outcome = json.loads(second.stdout.strip().splitlines()[-1])["outcome"]
        results.append(CrashResult(place.name, system, int(counter.read_text()), outcome))
    return results


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}: {(done.stdout + done.stderr)[-2000:]}"


def _worker(job: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ENTRY), "--crash-worker", json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def work(job: dict[str, Any]) -> str:
    """In the worker process: run (crash=True) or resume (crash=False) the one-WRITE run."""
    counter = Path(job["counter"])
    crash = bool(job["crash"])

    def effect() -> None:
        with open(counter, "r+") as file:
            count = int(file.read() or "0") + 1
            file.seek(0)
            file.write(str(count))
            file.truncate()
            file.flush()
            os.fsync(file.fileno())
        if crash:
            os._exit(137)  # after the side effect, before anything records it

    database = Database(job["store"], job["target"], lambda: 0, lambda: 0)
    system = job["system"]
    if system == "keelgate":
        return _keelgate(database, effect)
    if system == "dbos":
        return _dbos(database, effect, crash=crash)
    return _langgraph(database, effect, crash=crash, asynchronous=system == "langgraph async")


def _keelgate(database: Database, effect: Any) -> str:
    from commitbench.loop import TENANT
    from keelgate.core.spec import Budget, LoopSpec
    from peersbench.keelgate_peer import loop, open_store

    store = open_store(database)
    try:
        spec = LoopSpec(TENANT, RUN, "benchmark", budget=Budget(max_iterations=1))
        outcome = loop(store, effect, None).run_or_resume(spec)
        unknown = ", ".join(a.tool for a in outcome.unknown_actions)
        return f"stopped: {outcome.stop.reason.value}" + (f" ({unknown})" if unknown else "")
    finally:
        store.close()


def _dbos(database: Database, effect: Any, *, crash: bool) -> str:
    from dbos import DBOS, SetWorkflowID

    from peersbench import dbos_peer

    dbos_peer.HOOKS.effect = effect
    dbos_peer.launch(database)  # a launch recovers the workflows left pending
    try:
        if crash:
            with SetWorkflowID(RUN):
                dbos_peer.iterations_workflow(1)
        handle: Any = DBOS.retrieve_workflow(RUN)
        handle.get_result()
        return f"workflow {handle.get_status().status}, write step re-run on recovery"
    finally:
        DBOS.destroy()


def _langgraph(database: Database, effect: Any, *, crash: bool, asynchronous: bool) -> str:
    from peersbench import langgraph_peer

    peer: Any = (
        langgraph_peer.LangGraphAsync(database)
        if asynchronous
        else langgraph_peer.LangGraphSync(database)
    )
    peer.hooks.effect = effect
    cfg = langgraph_peer.config(RUN, 1)
    given = {"n": 0, "target": 1} if crash else None  # None: resume from the last checkpoint
    try:
        if asynchronous:
            state = peer.runner.run(peer.graph.ainvoke(given, cfg, durability="sync"))
        else:
            state = peer.graph.invoke(given, cfg, durability="sync")
        return f"run finished (writes recorded: {state.get('writes')}), act node re-run"
    finally:
        peer.close()
