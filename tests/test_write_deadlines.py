"""A pause never spans a settlement: a WRITE held up past its deadline is never sent.

Why it exists: a process can claim a WRITE's key and then be frozen before its request leaves (a
long GC pause, a stalled node, a VM migration). Its store sessions end, the next step reads the
key as unknown, and a person, truthfully finding nothing downstream, settles it as not executed.
If the process then thawed and sent the request, the order would be placed after a truthful
"not executed". The write deadline fences this: "not executed" is refused until the deadline
has passed on the store's clock, and the process never starts sending after its own, earlier
deadline. These tests hold a process up between its claim and its send (in-process, with the
fence's clock moved as a pause would move it; and a real process stopped with SIGSTOP) and count
what reaches the shop.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fakes.downstream import Shop
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.http import HttpTool
from keelgate.adapters.tools.python import PythonTool
from keelgate.core import fence
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyState, SideEffect, StopReason, idempotency_key
from keelgate.errors import OutcomeUncertain
from keelgate.stores.memory import MemoryStore
from keelgate.testing.deadlines import pass_deadlines

ORDER = {"sku": "A1", "qty": 20}
SCRIPT = [
    {"actions": [{"tool": "place_order", "args": ORDER}]},
    {"done": True, "answer": "done"},
]
SPEC = LoopSpec("shop", "restock", "restock A1", budget=Budget(max_iterations=5))
KEY = idempotency_key("shop", "restock", "place_order", ORDER)


@pytest.fixture
def shop() -> Iterator[Shop]:
    server = Shop().start()
    yield server  # type: ignore[misc]
    server.stop()


class Paused:
    """The fence's clock, moved forward by a pause the test makes (``fence.now`` plus it)."""

    def __init__(self) -> None:
        self.real = fence.now
        self.paused = 0.0

    def __call__(self) -> float:
        return self.real() + self.paused


class HeldUpAfterClaim(MemoryStore):
    """A store whose process is held up right after its first claim lands: meanwhile its
    session is lost (others read the key unknown), the deadline passes on the store's clock,
    and alice, finding no order at the shop, settles it as not executed."""

    def __init__(self, clock: Paused, shop: Shop) -> None:
        super().__init__()
        self.clock = clock
        self.shop = shop
        self.settled = False

    def claim(self, tenant: str, key: str, **kwargs: Any) -> Any:
        won = super().claim(tenant, key, **kwargs)
        if won is None and not self.settled:
            self.settled = True
            self.backend.live_owners.discard(self.owner)  # its session ends
            judge = self.reopen()
            try:
                assert self.shop.orders[key] == 0  # truthfully: no order
                pass_deadlines(judge)
                judge.settle(tenant, key, executed=False, by="alice", source="human")
            finally:
                judge.close()
            self.clock.paused += 3600.0  # the thaw: an hour later on a clock that counts pauses
        return won


def test_an_http_write_held_up_past_its_deadline_is_never_sent(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held up between its claim and its send while alice truthfully settled it as not
    executed, the thawed process sends nothing: the shop never sees the order, the key stays
    abandoned by alice, and the run goes on with the abandonment (the model is told)."""
    clock = Paused()
    monkeypatch.setattr(fence, "now", clock)
    store = HeldUpAfterClaim(clock, shop)
    order = HttpTool(
        "place_order",
        url=f"{shop.url}/orders",
        method="POST",
        side_effect=SideEffect.WRITE,
        timeout_seconds=5,
    )
    loop = Loop(stores=Stores.of(store), model=ScriptedModel(SCRIPT), tools=[order])
    try:
        done = loop.run_or_resume(SPEC)
        assert done.stop.reason is StopReason.GOAL_MET
        assert shop.order_requests() == []
        record = store.get("shop", KEY)
        assert record is not None
        assert (record.state, record.settled_by) == (KeyState.ABANDONED, "alice")
        completed = [e.data for e in loop.audit("shop", "restock") if e.type.endswith("completed")]
        assert [(d["action"], d["status"]) for d in completed] == [("1:0", "abandoned")]
    finally:
        store.close()


class PassesWhileConnecting(fence.WriteDeadline):
    """A deadline with time left when the call starts that has passed by the time it sends."""

    def check(self) -> None:
        raise fence.DeadlinePassed(self.key, 0.5)


def test_the_http_tool_checks_its_deadline_after_connecting_and_before_any_byte_leaves() -> None:
    """A deadline that passes while the HTTP tool connects: it raises DeadlinePassed right
    before the request's first byte, after the connection was made: the server reads nothing."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        conn.settimeout(2)
        data = b""
        try:
            while chunk := conn.recv(4096):
                data += chunk
        except OSError:
            pass
        seen.append(data)
        conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    tool = HttpTool(
        "place_order",
        url=f"http://127.0.0.1:{port}/orders",
        method="POST",
        side_effect=SideEffect.WRITE,
        timeout_seconds=5,
    )
    try:
        passed = PassesWhileConnecting("kg-late", fence.now() + 5)
        with fence.invoking(fence.Invocation(passed)), pytest.raises(fence.DeadlinePassed):
            tool.invoke(ORDER, idempotency_key="kg-late")
        tool.close()
        server.join(5)
        assert seen == [b""]  # a connection was made; not one byte of the request was sent
    finally:
        listener.close()


def test_a_python_write_without_a_timeout_is_bounded_by_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A python WRITE whose tool sets no timeout still cannot be waited on for ever: past its
    deadline (the default call limit, here shortened) the run stops with outcome_unknown, and
    the key, still in flight in this live process, cannot be settled meanwhile."""
    monkeypatch.setattr(fence, "DEFAULT_CALL_SECONDS", 0.3)
    release = threading.Event()

    def hang(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        release.wait(10)
        raise OutcomeUncertain("gave up")

    store = MemoryStore()
    loop = Loop(
        stores=Stores.of(store),
        model=ScriptedModel(SCRIPT),
        tools=[PythonTool("place_order", hang, SideEffect.WRITE)],
    )
    try:
        started = time.monotonic()
        stopped = loop.run_or_resume(SPEC)
        assert time.monotonic() - started < 3
        assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
        record = store.get("shop", KEY)
        assert record is not None and record.state is KeyState.IN_FLIGHT
        assert record.deadline_in is not None and 0 < record.deadline_in <= 0.3 + fence.MARGIN
    finally:
        release.set()
        store.close()


# A real process, stopped with SIGSTOP between its claim and its send (PostgreSQL)

SUPPORT = Path(__file__).parent / "support_tools"
PAY = idempotency_key("shop", "pay", "pay", {"to": "acme", "amount": 40})
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
          timeoutSeconds: 2
          python: {callable: "kg_runner_tools:careful_pay"}
      budget: {maxIterations: 5}
    """)


def _keelgate(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keelgate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_process_frozen_before_it_pays_never_pays_after_a_truthful_not_executed(
    pg_url: str, tmp_path: Path
) -> None:
    """`keelgate run` claims the payment and is frozen (SIGSTOP) before it pays; its PostgreSQL
    sessions end. `keelgate resume` elsewhere finds the outcome unknown; ops, finding no
    payment, settles `--not-executed`: refused (exit 4) until the deadline the stop names, then
    accepted. Thawed (SIGCONT), the process checks its deadline before paying and pays nothing.
    """
    ledger, ready, gate = tmp_path / "ledger.jsonl", tmp_path / "ready", tmp_path / "gate"
    ledger.touch()
    manifest = tmp_path / "pay.yaml"
    manifest.write_text(MANIFEST)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
        "KG_RUNNER_LEDGER": str(ledger),
        "KG_PAY_READY": str(ready),
        "KG_PAY_GATE": str(gate),
    }
    frozen = subprocess.Popen(
        [sys.executable, "-m", "keelgate", "run", "-f", str(manifest), "--store", pg_url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):
            if ready.exists() or frozen.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), frozen.communicate()
        os.kill(frozen.pid, signal.SIGSTOP)
        with psycopg.connect(pg_url, autocommit=True) as admin:  # its sessions end
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        resumed = _keelgate("resume", "pay", "--store", pg_url, "-o", "json", env=env)
        assert resumed.returncode == 3, resumed.stdout + resumed.stderr
        (unknown,) = json.loads(resumed.stdout.splitlines()[-1])["unknownActions"]
        after = datetime.strptime(unknown["notExecutedAfter"], "%Y-%m-%dT%H:%M:%SZ")
        settle = ("reconcile", "pay", "1:0", "--not-executed", "--by", "ops", "--store", pg_url)
        early = _keelgate(*settle, env=env)
        assert early.returncode == 4, early.stderr
        assert unknown["notExecutedAfter"] in early.stderr
        wait = after.replace(tzinfo=UTC).timestamp() - time.time()
        assert 0 < wait <= 2 + fence.MARGIN + 1
        time.sleep(wait + 0.5)  # ops waits until the deadline the stop named
        settled = _keelgate(*settle, env=env)
        assert settled.returncode == 0, settled.stderr
        gate.touch()
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        gate.touch()
        frozen.communicate(timeout=60)
    assert ledger.read_text() == ""  # never paid
    done = _keelgate("resume", "pay", "--store", pg_url, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ledger.read_text() == ""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT state, settled_by FROM keelgate_keys WHERE key = %s", (PAY,)
        ).fetchone()
    assert row == ("abandoned", "ops")


def test_a_call_that_ends_after_someone_settled_its_key_is_remembered_by_the_run() -> None:
    """A timed-out python WRITE keeps running; its owner's session is lost meanwhile, so bob
    settles it as executed. When the call finally ends (it was refused after all), bob's record
    stands, and the run remembers what really came (outcome ``lateResults``, its checkpoint)
    with a ``loop.late_result`` event on a chain that verifies: never dropped silently."""
    from keelgate.errors import ToolError

    go = threading.Event()

    def slow(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        go.wait(10)
        raise ToolError("the shop refused it after all")

    store = MemoryStore()
    judge = store.reopen()
    loop = Loop(
        stores=Stores.of(store),
        model=ScriptedModel(SCRIPT),
        tools=[PythonTool("place_order", slow, SideEffect.WRITE, timeout_seconds=0.2)],
    )
    try:
        stopped = loop.run_or_resume(SPEC)
        assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
        store.backend.live_owners.discard(store.owner)  # its session is lost
        judge.settle("shop", KEY, executed=True, by="bob", source="human")
        go.set()
        for _ in range(200):
            if loop.outcome("shop", "restock").late_results:
                break
            time.sleep(0.05)
        (late,) = loop.outcome("shop", "restock").late_results
        assert (late.action, late.status, late.recorded, late.settled_by) == (
            "1:0",
            "refused",
            "completed",
            "bob",
        )
        events = [e.data for e in loop.audit("shop", "restock") if e.type == "loop.late_result"]
        assert [(d["status"], d["settledBy"]) for d in events] == [("refused", "bob")]
        assert loop.verify_audit("shop", "restock").ok
        record = judge.get("shop", KEY)
        assert record is not None and record.state is KeyState.COMPLETED  # bob's stands
    finally:
        go.set()
        store.close()
        judge.close()
