"""Adversarial review of the promise: a WRITE never runs twice and never runs unapproved, and not
knowing is a reason to stop, never to retry.

Why it exists: each test here is a scenario found in review where the promise (or a rule around
it: no tracebacks, a truthful audit chain, a live owner never read as gone) does not hold today.
Tests marked ``xfail(strict=True)`` demonstrate a real bug and must start passing once it is
fixed (then the marker goes). They drive the real loop over real SQLite files, a real MCP server
and a real HTTP server on loopback; they must never fake the thing they accuse.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from fakes.loopback import Answer, LoopbackServer, Received
from keelgate.adapters.models.python import PythonModel
from keelgate.adapters.tools.http import HttpTool
from keelgate.adapters.tools.mcp import McpServerRef, McpToolSpec, discover
from keelgate.adapters.tools.python import PythonTool
from keelgate.core import failpoints
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores, Tool
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import (
    KeyState,
    SideEffect,
    StopReason,
    UnknownAction,
    idempotency_key,
)
from keelgate.errors import OutcomeUncertain, SimulatedCrash
from keelgate.stores import open_stores
from keelgate.stores.sqlite import SQLiteStore

SPEC = LoopSpec("shop", "review", "restock A1", budget=Budget(max_iterations=6))
ORDER: dict[str, Any] = {"sku": "A1", "qty": 5}


def scripted(plans: Sequence[object]) -> PythonModel:
    """A model answering the n-th planning call with ``plans[n]`` and accepting every verify."""

    def answer(request: dict[str, Any]) -> Mapping[str, Any]:
        if request["phase"] == "verify":
            return {"verdict": "accept"}
        return cast(Mapping[str, Any], plans[request["call"]])

    return PythonModel(answer, name="review")


def sqlite_stores(path: Path) -> Stores:
    return open_stores(f"sqlite:///{path}")


class Ledger:
    """The downstream system of record: every change that really happened, by key."""

    def __init__(self) -> None:
        self.changes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def record(self, key: str | None) -> None:
        with self.lock:
            self.changes[str(key)] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.changes.values())


def place_order_tool(ledger: Ledger, *, requires_approval: bool = False) -> PythonTool:
    def place(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        ledger.record(idempotency_key)
        return {"placed": args["qty"]}

    return PythonTool("place_order", place, SideEffect.WRITE, requires_approval=requires_approval)


# Approval: a person's "no" and the manifest's "ask first" must bind the saved action


def test_a_denied_write_never_runs_even_after_its_tool_stops_requiring_approval(
    tmp_path: Path,
) -> None:
    """A person denies a WRITE; the manifest is then edited so the tool no longer asks for
    approval. On resume the denied action must still read ``denied``, never be placed."""
    db = tmp_path / "kg.db"
    ledger = Ledger()
    plans = [{"actions": [{"tool": "place_order", "args": ORDER}]}, {"done": True}]
    stores = sqlite_stores(db)
    loop = Loop(
        stores=stores,
        model=scripted(plans),
        tools=[place_order_tool(ledger, requires_approval=True)],
    )
    waiting = loop.run_or_resume(SPEC)
    assert waiting.stop.reason is StopReason.AWAITING_APPROVAL
    loop.approve("shop", "review", "1:0", approved=False, by="alice")
    stores.close()

    stores = sqlite_stores(db)
    try:
        edited = Loop(stores=stores, model=scripted(plans), tools=[place_order_tool(ledger)])
        edited.run_or_resume(SPEC)
        assert ledger.total() == 0, "alice denied this order, yet it was placed"
    finally:
        stores.close()


def test_a_write_planned_under_approval_does_not_run_unapproved_after_a_manifest_edit(
    tmp_path: Path,
) -> None:
    """A WRITE stops awaiting approval; nobody decides; the tool's ``requiresApproval`` is
    removed. The saved action was planned under "ask first" and must still wait for a person,
    as a saved WRITE keeps its side-effect class through a manifest edit."""
    db = tmp_path / "kg.db"
    ledger = Ledger()
    plans = [{"actions": [{"tool": "place_order", "args": ORDER}]}, {"done": True}]
    stores = sqlite_stores(db)
    loop = Loop(
        stores=stores,
        model=scripted(plans),
        tools=[place_order_tool(ledger, requires_approval=True)],
    )
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    stores.close()

    stores = sqlite_stores(db)
    try:
        edited = Loop(stores=stores, model=scripted(plans), tools=[place_order_tool(ledger)])
        outcome = edited.run_or_resume(SPEC)
        assert ledger.total() == 0
        assert outcome.stop.reason is StopReason.AWAITING_APPROVAL
    finally:
        stores.close()


# Tool outputs the checkpoint cannot hold


class NanService(LoopbackServer):
    """A Python service that answers with ``json.dumps`` defaults: NaN is written as ``NaN``."""

    def respond(self, received: Received) -> Answer:
        return Answer(body={"sku": "A1", "fill_ratio": float("nan")})


@pytest.fixture
def nan_service() -> Iterator[NanService]:
    service = NanService().start()
    assert isinstance(service, NanService)
    yield service
    service.stop()


def test_a_nan_in_a_read_output_does_not_wedge_the_run(
    tmp_path: Path, nan_service: NanService
) -> None:
    """An HTTP READ answers ``{"fill_ratio": NaN}`` (what Python's json module writes). The run
    must go on (or stop with a reason), not raise a traceback at every resume."""
    stats = HttpTool("stats", url=f"{nan_service.url}/stats/A1")
    plans = [{"actions": [{"tool": "stats", "args": {}}]}, {"done": True, "answer": "ok"}]
    stores = sqlite_stores(tmp_path / "kg.db")
    try:
        loop = Loop(stores=stores, model=scripted(plans), tools=[stats])
        outcome = loop.run_or_resume(SPEC)
        assert outcome.stop.reason is StopReason.GOAL_MET
    finally:
        stats.close()
        stores.close()


def test_a_write_whose_output_is_not_json_is_recorded_not_raised(tmp_path: Path) -> None:
    """A python WRITE returns a ``datetime`` (the order's timestamp). The order was placed and
    Keelgate saw it succeed: no traceback, and no person should have to reconcile it."""
    db = tmp_path / "kg.db"
    ledger = Ledger()

    def place(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        ledger.record(idempotency_key)
        return {"placed_at": datetime.datetime(2026, 10, 5, 12, 0, tzinfo=datetime.UTC)}

    tools: list[Tool] = [PythonTool("place_order", place, SideEffect.WRITE)]
    plans = [{"actions": [{"tool": "place_order", "args": ORDER}]}, {"done": True}]
    stores = sqlite_stores(db)
    try:
        Loop(stores=stores, model=scripted(plans), tools=tools).run_or_resume(SPEC)
    finally:
        stores.close()
    stores = sqlite_stores(db)
    try:
        outcome = Loop(stores=stores, model=scripted(plans), tools=tools).run_or_resume(SPEC)
        assert outcome.stop.reason is StopReason.GOAL_MET
        assert ledger.total() == 1
    finally:
        stores.close()


# MCP: a tool error reported by the server after its side effect


class ChargingMcpServer:
    """A real MCP server (the SDK's MCPServer, streamable HTTP) whose ``charge`` tool makes its
    change downstream and then fails: FastMCP-style servers turn any exception into isError."""

    def __init__(self) -> None:
        self.charges: Counter[str] = Counter()
        server = MCPServer("review-charging")
        fake = self

        @server.tool()
        async def charge(customer: str, cents: int, ctx: Context) -> dict[str, Any]:
            """Charge a customer's card."""
            meta = dict(ctx.request_context.meta or {})
            fake.charges[str(meta.get("keelgate.dev/idempotency-key", ""))] += 1
            await asyncio.sleep(0)
            # The card network accepted the charge; reading its receipt then timed out.
            raise TimeoutError("receipt lookup timed out")

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/mcp"
        config = uvicorn.Config(
            server.streamable_http_app(), log_level="warning", lifespan="on", access_log=False
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> ChargingMcpServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._uvicorn.started:
            assert time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def test_an_mcp_write_that_errs_after_its_side_effect_is_never_sent_again(tmp_path: Path) -> None:
    """An MCP WRITE's server charges the card, then its tool raises; the SDK answers isError.
    Keelgate cannot know nothing happened, so the model's natural retry of the same call must
    not charge the card a second time."""
    with ChargingMcpServer() as server:
        tools = discover(McpServerRef(server.url), [McpToolSpec("charge", SideEffect.WRITE)])
        call = {"tool": "charge", "args": {"customer": "c-1", "cents": 1999}}
        plans = [{"actions": [call]}, {"actions": [call]}, {"done": True}]
        stores = sqlite_stores(tmp_path / "kg.db")
        try:
            Loop(stores=stores, model=scripted(plans), tools=tools).run_or_resume(SPEC)
        finally:
            stores.close()
        assert sum(server.charges.values()) == 1, f"charged {dict(server.charges)}"


# Owner liveness


def test_a_live_owner_is_not_read_as_gone_through_another_path_to_the_same_file(
    tmp_path: Path,
) -> None:
    """Two stores open the same SQLite file, one through a symlink. While the first holds a
    WRITE's key in flight, the second must read it in flight (busy), never unknown: otherwise a
    person is invited to settle a WRITE that is still running."""
    real = tmp_path / "data" / "kg.db"
    real.parent.mkdir()
    link = tmp_path / "kg-link.db"
    os.symlink(real, link)
    owner = SQLiteStore(real)
    other = SQLiteStore(link)
    try:
        assert owner.claim("shop", "kg-1", run="review", action="1:0", tool="place_order") is None
        seen = other.claim("shop", "kg-1", run="review", action="1:0", tool="place_order")
        assert seen is not None
        assert seen.state is KeyState.IN_FLIGHT, f"a live owner's key read {seen.state.value}"
    finally:
        other.close()
        owner.close()


# The audit chain


def test_a_resume_over_the_langgraph_store_does_not_repeat_audit_events(tmp_path: Path) -> None:
    """A READ runs, its checkpoint is written, the process dies. After the resume the chain
    must show that READ started once, as it did."""
    url = f"langgraph+sqlite:///{tmp_path / 'kg.db'}"
    reads: list[str] = []

    def stock(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        reads.append("stock")
        return {"count": 3}

    tools: list[Tool] = [PythonTool("stock", stock)]
    plans = [{"actions": [{"tool": "stock", "args": {"sku": "A1"}}]}, {"done": True}]
    stores = open_stores(url)
    try:
        loop = Loop(stores=stores, model=scripted(plans), tools=tools)
        with failpoints.armed({"after_action_checkpoint": 1}), pytest.raises(SimulatedCrash):
            loop.run_or_resume(SPEC)
    finally:
        stores.close()
    stores = open_stores(url)
    try:
        loop = Loop(stores=stores, model=scripted(plans), tools=tools)
        assert loop.run_or_resume(SPEC).stop.reason is StopReason.GOAL_MET
        loop.run_or_resume(SPEC)  # asking a finished run again changes nothing
        started = [e for e in loop.audit("shop", "review") if e.type == "loop.action_started"]
        assert len(reads) == 1
        assert len(started) == 1, f"the chain shows {len(started)} starts of one READ"
    finally:
        stores.close()


# Settling unknown outcomes


class LedgerConfirmer:
    """Trusted harness code asking the system of record whether the order arrived."""

    name = "ledger"

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        with self.ledger.lock:
            return self.ledger.changes[action.idempotency_key] > 0


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
    plans = [{"actions": [{"tool": "place_order", "args": ORDER}]}, {"done": True}]
    stores = sqlite_stores(tmp_path / "kg.db")
    try:
        loop = Loop(
            stores=stores,
            model=scripted(plans),
            tools=[tool],
            confirmer=LedgerConfirmer(ledger),
        )
        outcome = loop.run_or_resume(SPEC)
        go.set()
        deadline = time.monotonic() + 10
        while ledger.total() == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ledger.total() == 1  # the order did land
        record = stores.idempotency.get(
            "shop", idempotency_key("shop", "review", "place_order", ORDER)
        )
        assert record is not None
        assert record.state is not KeyState.ABANDONED, (
            f"recorded as not executed (run stopped: {outcome.stop.reason.value}) but placed"
        )
    finally:
        go.set()
        stores.close()


def test_a_person_settling_while_the_confirmer_decides_does_not_break_the_run(
    tmp_path: Path,
) -> None:
    """The confirmer is slow; meanwhile a person reconciles the same unknown WRITE. Whoever
    settles first wins; the run must carry on with that verdict, not raise."""
    calls: list[str | None] = []

    def uncertain(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        calls.append(idempotency_key)
        raise OutcomeUncertain("no answer within 30s")

    plans = [{"actions": [{"tool": "place_order", "args": ORDER}]}, {"done": True}]
    stores = sqlite_stores(tmp_path / "kg.db")
    holder: dict[str, Loop] = {}

    class SlowConfirmer:
        name = "slow-ledger"

        def confirm(
            self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
        ) -> bool | None:
            # While it asks the system of record, a person settles the same key from the CLI.
            holder["loop"].reconcile(tenant, run, action.action, executed=False, by="alice")
            return True

    try:
        loop = Loop(
            stores=stores,
            model=scripted(plans),
            tools=[PythonTool("place_order", uncertain, SideEffect.WRITE)],
            confirmer=SlowConfirmer(),
        )
        holder["loop"] = loop
        # The call that just went uncertain is not put to the confirmer (it may still be
        # running); the resume is.
        assert loop.run_or_resume(SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        outcome = loop.run_or_resume(SPEC)
        assert outcome.stop.reason is StopReason.GOAL_MET
        assert len(calls) == 1
        events = [e for e in loop.audit("shop", "review") if e.type == "loop.reconciled"]
        assert [(e.actor, e.data["verdict"]) for e in events] == [("alice", "abandoned")]
    finally:
        stores.close()
