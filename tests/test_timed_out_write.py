"""A WRITE that times out but keeps running in a long-lived process (issue 7).

An operator or a worker drives many runs from one process. When a python WRITE passes its
timeout, its call goes on in a worker thread: until it ends, nobody may judge its outcome. These
tests drive the run the way such a process does (``LocalRunner().run`` again and again in the
test process) and settle from another process with the real ``keelgate`` command, on SQLite and
on PostgreSQL. The effect is counted in a ledger file the tool writes. Nor may a resume or a
confirmer, asked while the call still runs, record it as not executed: "not found yet" is no
answer; the process that runs it says so of itself, never "another live process".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from keelgate.adapters.tools import python as python_tools
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.types import KeyState, SideEffect, StopReason, idempotency_key
from keelgate.errors import OutcomeUncertain, RunBusy
from keelgate.manifest import load_agentrun
from keelgate.runners import LocalRunner
from keelgate.stores import open_stores
from keelgate.testing.deadlines import pass_deadlines
from support.ledger import (
    A1_ORDER,
    REVIEW_SPEC,
    ROUND2_SPEC,
    Ledger,
    LedgerConfirmer,
    scripted,
    sqlite_stores,
)

SUPPORT = Path(__file__).parent / "support_tools"
ARGS = {"to": "acme", "amount": 40}

MANIFEST = textwrap.dedent("""\
    apiVersion: keelgate.dev/v1alpha1
    kind: AgentRun
    metadata: {name: pay, namespace: shop}
    spec:
      goal: pay the invoice once
      model:
        provider: scripted
        name: demo
        script:
          - actions: [{tool: pay, args: {to: acme, amount: 40}}]
          - done: true
            answer: paid
      tools:
        - name: pay
          sideEffect: WRITE
          timeoutSeconds: 1
          python: {callable: "kg_runner_tools:slow_pay"}
      budget: {maxIterations: 5}
    """)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/keelgate.db"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """The ledger the tool writes and the gate file that lets it finish."""
    monkeypatch.syspath_prepend(str(SUPPORT))
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    gate = tmp_path / "gate"
    monkeypatch.setenv("KG_RUNNER_LEDGER", str(ledger))
    monkeypatch.setenv("KG_PAY_GATE", str(gate))
    try:
        yield {"ledger": ledger, "gate": gate}
    finally:
        gate.touch()  # never leave a worker thread waiting past the test


def payments(ledger: Path) -> int:
    return sum(1 for line in ledger.read_text().splitlines() if '"tool": "pay"' in line)


def keelgate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line, in another process."""
    return subprocess.run(
        [sys.executable, "-m", "keelgate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def key_state(url: str) -> KeyState | None:
    stores = open_stores(url)
    try:
        record = stores.idempotency.get("shop", idempotency_key("shop", "pay", "pay", ARGS))
        return None if record is None else record.state
    finally:
        stores.close()


def wait_until(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def test_a_write_still_running_after_its_timeout_cannot_be_settled_and_runs_once(
    store_url: str, world: dict[str, Path]
) -> None:
    """The run stops outcome_unknown while the call still runs; a person's truthful
    `--not-executed` from another process is refused as still in flight (the runner closed its
    stores, but a call it started keeps its owner alive). The call then pays; its late end is
    recorded (the key completed, a loop.late_result on the chain), and the next drive of the run
    replays it: one payment, a chain that verifies."""
    spec = load_agentrun(MANIFEST).to_loop_spec()
    first = LocalRunner(store=store_url).run(spec)
    assert first.stop is not None and first.stop.reason is StopReason.OUTCOME_UNKNOWN
    assert payments(world["ledger"]) == 0  # the call has not paid yet: it waits at the gate

    refused = keelgate(
        "reconcile", "pay", "1:0", "--not-executed", "--by", "ops", "--store", store_url
    )
    assert refused.returncode != 0, refused.stdout
    assert "in flight" in refused.stderr
    assert key_state(store_url) is KeyState.IN_FLIGHT

    world["gate"].touch()
    wait_until(lambda: key_state(store_url) is KeyState.COMPLETED)
    assert payments(world["ledger"]) == 1

    second = LocalRunner(store=store_url).run(spec)
    assert second.stop is not None and second.stop.reason is StopReason.GOAL_MET
    assert payments(world["ledger"]) == 1

    stores = open_stores(store_url)
    try:
        loop = Loop(stores=stores)
        late = [e for e in loop.audit("shop", "pay") if e.type == "loop.late_result"]
        assert [(e.data["status"], e.data["recorded"]) for e in late] == [("ok", "completed")]
        assert "amount" not in json.dumps([e.data for e in late])  # never the arguments
        assert loop.verify_audit("shop", "pay").ok
    finally:
        stores.close()


def test_a_process_that_exits_while_its_write_runs_leaves_it_unknown_for_a_person(
    store_url: str, world: dict[str, Path]
) -> None:
    """`keelgate run` exits (code 3) while the timed-out call still waits: the process ends and
    the call with it, before it paid. The key then reads unknown, a truthful `--not-executed`
    settles it, and the resumed run never pays under that key: no payment at all, on the
    record."""
    manifest = world["ledger"].parent / "pay.yaml"
    manifest.write_text(MANIFEST)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
    }
    ran = keelgate("run", "-f", str(manifest), "--store", store_url, env=env)
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert key_state(store_url) is KeyState.OUTCOME_UNKNOWN

    world["gate"].touch()
    settle = ("reconcile", "pay", "1:0", "--not-executed", "--by", "ops", "--store", store_url)
    early = keelgate(*settle)  # a held-up process could still send it until its deadline
    assert early.returncode == 4, early.stderr
    assert "cannot be settled as not executed yet" in early.stderr
    assert key_state(store_url) is KeyState.OUTCOME_UNKNOWN
    stores = open_stores(store_url)
    try:
        assert pass_deadlines(stores) == 1  # ops waits until then
    finally:
        stores.close()
    settled = keelgate(*settle)
    assert settled.returncode == 0, settled.stderr
    assert key_state(store_url) is KeyState.ABANDONED

    resumed = keelgate("resume", "pay", "--store", store_url, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert payments(world["ledger"]) == 0


def test_a_write_still_running_after_its_timeout_is_not_settled_as_not_executed(
    tmp_path: Path,
) -> None:
    """A python WRITE passes its timeout but is still running; the confirmer, asked at once,
    finds nothing yet. The order then lands. Keelgate must not have recorded it as not
    executed (abandoned) and told the model it did not happen."""
    ledger = Ledger()
    go = threading.Event()

    def slow_place(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        go.wait(10)
        ledger.record(idempotency_key)
        return {"placed": True}

    tool = PythonTool("place_order", slow_place, SideEffect.WRITE, timeout_seconds=0.2)
    plans = [{"actions": [{"tool": "place_order", "args": A1_ORDER}]}, {"done": True}]
    stores = sqlite_stores(tmp_path / "kg.db")
    try:
        loop = Loop(
            stores=stores,
            model=scripted(plans),
            tools=[tool],
            confirmer=LedgerConfirmer(ledger),
        )
        outcome = loop.run_or_resume(REVIEW_SPEC)
        go.set()
        deadline = time.monotonic() + 10
        while ledger.total() == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ledger.total() == 1  # the order did land
        record = stores.idempotency.get(
            "shop", idempotency_key("shop", "review", "place_order", A1_ORDER)
        )
        assert record is not None
        assert record.state is not KeyState.ABANDONED, (
            f"recorded as not executed (run stopped: {outcome.stop.reason.value}) but placed"
        )
    finally:
        go.set()
        stores.close()


def test_a_resume_right_after_a_timeout_does_not_abandon_a_write_still_running(
    stores: Stores,
) -> None:
    """A python WRITE passes its timeout but keeps running; the run stops outcome_unknown. The
    operator (or a person) resumes at once, in the same process, while the call still runs. The
    confirmer must not be asked yet: "not in the ledger" is premature. Otherwise the key is
    settled abandoned, the model is told the order did not happen, and then it lands."""
    ledger = Ledger()
    go = threading.Event()

    def slow_place(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        go.wait(10)
        ledger.record(idempotency_key)
        return {"placed": True}

    tool = PythonTool("place_order", slow_place, SideEffect.WRITE, timeout_seconds=0.2)
    plans = [{"actions": [{"tool": "place_order", "args": A1_ORDER}]}, {"done": True}]
    confirmer = LedgerConfirmer(ledger)
    loop = Loop(
        stores=stores,
        model=scripted(plans),
        tools=[tool],
        confirmer=confirmer,
        busy_wait=0.3,
    )
    try:
        assert loop.run_or_resume(ROUND2_SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        # The call still runs in its worker, in this very process: nobody judges it, and the
        # process does not call itself another one.
        with pytest.raises(RunBusy, match=r"still running in this process"):
            loop.run_or_resume(ROUND2_SPEC)
    finally:
        go.set()
    deadline = time.monotonic() + 10
    while ledger.total() == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ledger.total() == 1  # the order did land
    key = idempotency_key("shop", "round2", "place_order", A1_ORDER)
    record = stores.idempotency.get("shop", key)
    while record is not None and record.state is KeyState.IN_FLIGHT and time.monotonic() < deadline:
        time.sleep(0.02)
        record = stores.idempotency.get("shop", key)
    assert record is not None and record.state is KeyState.COMPLETED  # its late end recorded
    assert loop.run_or_resume(ROUND2_SPEC).stop.reason is StopReason.GOAL_MET
    assert ledger.total() == 1


def test_a_call_still_running_after_its_timeout_never_holds_up_the_next_call() -> None:
    """Bounded calls share kept worker threads, yet one that hangs keeps its thread to itself:
    the next call (of the same tool or another) starts at once and returns its own result, and
    the hung call's late end is still reported to whoever waits for it."""
    release = threading.Event()
    seen: list[object] = []

    def hang(args: Mapping[str, Any], *, idempotency_key: str | None) -> str:
        release.wait(30)
        return "late"

    def quick(args: Mapping[str, Any], *, idempotency_key: str | None) -> int:
        return int(args["n"]) * 2

    hung = PythonTool("hang", hang, side_effect=SideEffect.WRITE, timeout_seconds=0.2)
    fast = PythonTool("quick", quick, side_effect=SideEffect.WRITE, timeout_seconds=5)
    with pytest.raises(OutcomeUncertain) as raised:
        hung.invoke({}, idempotency_key="k1")
    still_running = raised.value.still_running
    assert still_running is not None, "the timed-out call must stay reachable for its late end"
    started = time.monotonic()
    assert [fast.invoke({"n": n}, idempotency_key=f"q{n}") for n in range(50)] == [
        n * 2 for n in range(50)
    ]
    assert time.monotonic() - started < 2, "a hung call held up the calls after it"
    still_running.when_done(lambda result, error: seen.append(result))
    release.set()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == ["late"]


class _InLine:
    """Workers that run a call in line and say whether it ended within its wait as told."""

    def __init__(self, *, ended: bool) -> None:
        self.ended = ended
        self.waited: list[float] = []

    def run(self, name: str, job: Callable[[], None]) -> None:
        job()

    def wait(self, call: Any, seconds: float) -> bool:
        self.waited.append(seconds)
        return self.ended


def test_where_a_bounded_call_runs_is_a_seam_and_its_timeout_is_still_the_tools() -> None:
    """A simulation may run a Python tool's function elsewhere and wait for it on its own clock
    (``python.simulated``: the simulator runs it in line, on virtual time); what the tool makes
    of a call that outlived its wait stays the tool's: an unknown outcome with the call still
    reachable (never a definite failure), its end told to whoever waits for it. A call that
    ended in time returns its result; the wait is the tool's limit. Outside the block, calls
    run on the kept threads again, in real time."""
    ran: list[str | None] = []

    def pay(args: Mapping[str, Any], *, idempotency_key: str | None) -> str:
        ran.append(idempotency_key)
        return "paid"

    tool = PythonTool("pay", pay, side_effect=SideEffect.WRITE, timeout_seconds=7)
    late = _InLine(ended=False)
    with (
        python_tools.simulated(late),
        pytest.raises(OutcomeUncertain, match="did not return within 7") as raised,
    ):
        tool.invoke({}, idempotency_key="k1")
    assert late.waited == [7]
    seen: list[object] = []
    assert raised.value.still_running is not None, "the call must stay reachable for its end"
    raised.value.still_running.when_done(lambda result, error: seen.append(result))
    assert seen == ["paid"] and ran == ["k1"]
    with python_tools.simulated(_InLine(ended=True)):
        assert tool.invoke({}, idempotency_key="k2") == "paid"
    slow = PythonTool("slow", lambda a, **k: time.sleep(1.0), timeout_seconds=0.1)
    with pytest.raises(OutcomeUncertain):
        slow.invoke({}, idempotency_key=None)  # the real threads and clock again
