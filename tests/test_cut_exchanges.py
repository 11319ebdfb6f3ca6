"""Every exchange ends at its time limit, whatever the server sends (issue 51).

Why it exists: an HTTP client's timeout bounds each connect, read and write, not the exchange.
A server that sends its answer's headers, or its body, a byte a second, or a body that never
ends, kept a WRITE's request open for as long as it liked: past its time limit and past its
write deadline, after which a person may truthfully settle the call "not executed" while the
downstream is still answering it (and may still act). So every request of a WRITE or PROPOSE
(the HTTP tool, the MCP tool, a Keelgate tool a Python tool calls on its threads) is cut at the
call's deadline: the connection is closed, the call reads as an unknown outcome exactly as a
timeout does, and it is never retried. A model's try and the confirmer's question are cut the
same way at their own limits, so none of them holds a step past them.

The servers are real, on loopback (tests/fakes/loopback.py's trickling answers, a real MCP
server whose answers trickle): each notes when the client hung up, so a test sees the cut from
the server's side too.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import keelgate
from fakes.downstream import Shop
from fakes.llm import LlmFake, anthropic_error, anthropic_reply, openai_error, openai_reply
from fakes.loopback import Answer, LoopbackServer, Received
from fakes.mcp_server import McpFake
from keelgate.adapters.confirmers import HttpConfirmer
from keelgate.adapters.models._retry import RetryPolicy
from keelgate.adapters.models.anthropic import AnthropicModel
from keelgate.adapters.models.openai import OpenAIModel
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.http import HttpTool
from keelgate.adapters.tools.mcp import McpServerRef, McpToolSpec, discover
from keelgate.adapters.tools.python import PythonTool
from keelgate.core import clocks
from keelgate.core.cutoff import Cutoff
from keelgate.core.loop import Loop
from keelgate.core.model import ModelRequest
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyState, SideEffect, StopReason, UnknownAction, idempotency_key
from keelgate.errors import ToolError
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing.sim.world import Schedule, World

ORDER = {"sku": "A1", "qty": 20}
SCRIPT: list[dict[str, Any]] = [
    {"actions": [{"tool": "place_order", "args": ORDER}]},
    {"done": True, "answer": "ordered"},
]
SPEC = LoopSpec("shop", "restock", "restock A1", budget=Budget(max_iterations=5))
KEY = idempotency_key("shop", "restock", "place_order", ORDER)
#: A tool's time limit in these tests, and how much later than it a run that was cut may end:
#: the whole run is timed (its store's writes, its threads), on a machine that may be loaded
#: (0.6 s was exceeded at a load of 19 on 2 cores). Uncut, every answer here trickles on for 9 s
#: or more past its limit, and a cut is never early (the lower bounds are exact).
LIMIT = 2.0
SLACK = 2.5


@pytest.fixture
def shop() -> Iterator[Shop]:
    server = Shop().start()
    yield server  # type: ignore[misc]
    server.stop()


def order_tool(shop: Shop, *, timeout: float = LIMIT) -> HttpTool:
    return HttpTool(
        "place_order",
        url=f"{shop.url}/orders",
        method="POST",
        side_effect=SideEffect.WRITE,
        timeout_seconds=timeout,
    )


def run_once(path: Path, tool: Any) -> tuple[Any, float, float, SQLiteStore]:
    """One ``run_or_resume`` of the restock run with ``tool``: its outcome, when it started
    (monotonic), how long it took, and the store (open: the caller closes it)."""
    store = SQLiteStore(path)
    loop = Loop(stores=Stores.of(store), model=ScriptedModel(SCRIPT), tools=[tool])
    started = time.monotonic()
    outcome = loop.run_or_resume(SPEC)
    return outcome, started, time.monotonic() - started, store


def first_hangup(hangups: list[Any]) -> float:
    """When the server first saw its client hang up (monotonic): a trickling server finds out
    at its next piece, so it is waited for a little."""
    waited = time.monotonic() + 3.0
    while not hangups and time.monotonic() < waited:
        time.sleep(0.05)
    assert hangups, "the server never saw the client hang up"
    first = hangups[0]
    return float(getattr(first, "at", first))


def assert_stopped_unknown(outcome: Any, store: SQLiteStore, *, tool: str = "place_order") -> None:
    assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN, outcome.to_json()
    assert [u.tool for u in outcome.unknown_actions] == [tool]
    # For a person. A call cut on a thread of the tool's own ends a moment after the run stopped
    # (the tool gave up waiting for it at the same deadline that cut its request): until that
    # thread has ended, the key is still this process's call in flight.
    settled_by = time.monotonic() + SLACK
    record = store.get("shop", KEY)
    while record is not None and record.state is KeyState.IN_FLIGHT and record.here:
        assert time.monotonic() < settled_by, "the cut call's thread never ended"
        time.sleep(0.05)
        record = store.get("shop", KEY)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN


# The HTTP tool


@pytest.mark.parametrize("trickle", ["body", "headers", "endless"])
def test_an_http_write_whose_answer_trickles_is_cut_at_its_deadline_and_stops_unknown(
    tmp_path: Path, shop: Shop, trickle: str
) -> None:
    """The shop takes the order, then sends its answer a byte a second (the body after its
    headers, or the headers themselves), or a body that never ends. The call is cut at its
    time limit (the shop sees the client hang up), the run stops outcome_unknown naming it
    instead of succeeding, and resuming never sends it again: one order."""
    shop.trickle = trickle
    outcome, started, took, store = run_once(tmp_path / "kg.db", order_tool(shop))
    try:
        assert LIMIT <= took < LIMIT + SLACK, took
        assert_stopped_unknown(outcome, store)
        assert shop.orders == {KEY: 1}
        assert first_hangup(shop.hangups) - started < LIMIT + shop.pace + SLACK
        again = Loop(stores=Stores.of(store), model=ScriptedModel(SCRIPT), tools=[order_tool(shop)])
        assert again.run_or_resume(SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        assert shop.orders == {KEY: 1}
    finally:
        store.close()


def test_a_read_whose_answer_trickles_is_a_tool_error_at_its_time_limit(shop: Shop) -> None:
    """A READ has no write deadline, but its time limit still bounds the whole exchange: the
    model is told the read failed once the limit came."""
    shop.trickle = "body"
    tool = HttpTool("orders_of", url=f"{shop.url}/orders", method="POST", timeout_seconds=1.0)
    started = time.monotonic()
    with pytest.raises(ToolError, match="no whole answer within its time limit") as refused:
        tool.invoke({}, idempotency_key=None)
    assert 1.0 <= time.monotonic() - started < 1.0 + SLACK
    assert "may or may not" not in refused.value.message


def test_a_keelgate_tool_on_a_python_tools_thread_is_cut_at_the_calls_deadline(
    tmp_path: Path, shop: Shop
) -> None:
    """A composite Python tool with a time limit of 2 s calls Keelgate's HTTP tool (its own
    limit 30 s) on a thread of its own, through ``keelgate.fenced``. The shop trickles: the
    request is cut at the call's deadline, not at the HTTP tool's own limit, and the run stops
    outcome_unknown with one order."""
    order = order_tool(shop, timeout=30.0)

    def place_order(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        with ThreadPoolExecutor(max_workers=1) as pool:
            sent = pool.submit(keelgate.fenced(order.invoke), args, idempotency_key=idempotency_key)
            return sent.result()

    shop.trickle = "body"
    tool = PythonTool("place_order", place_order, SideEffect.WRITE, timeout_seconds=LIMIT)
    outcome, started, took, store = run_once(tmp_path / "kg.db", tool)
    try:
        assert LIMIT <= took < LIMIT + SLACK, took
        assert_stopped_unknown(outcome, store)
        assert shop.orders == {KEY: 1}
        # The request itself was cut (the shop saw the hang-up), not merely left running.
        assert first_hangup(shop.hangups) - started < LIMIT + shop.pace + SLACK
    finally:
        store.close()


# The MCP tool


@pytest.fixture
def mcp() -> Iterator[McpFake]:
    server = McpFake().start()
    yield server
    server.stop()


def test_an_mcp_write_whose_answer_trickles_is_cut_at_its_deadline_and_stops_unknown(
    tmp_path: Path, mcp: McpFake
) -> None:
    """The MCP server opens the session slowly (2 s to answer its opening request), runs the
    tool, and sends the ``tools/call`` answer a byte a second. The whole call (the session's
    opening included) ends at the call's time limit, 4 s: the server sees the client hang up,
    the run stops outcome_unknown instead of succeeding, and the order was placed once. (The
    SDK's own read timeout, the limit again for each request, would have ended it at 6 s at
    the earliest: the session's opening plus a whole limit for the call.)"""
    limit = 4.0
    server = McpServerRef(mcp.url, timeout_seconds=30.0)
    [tool] = discover(server, [McpToolSpec("place_order", SideEffect.WRITE, timeout_seconds=limit)])
    mcp.initialize_delay = 2.0
    mcp.trickle_pace = 1.0
    outcome, started, took, store = run_once(tmp_path / "kg.db", tool)
    try:
        assert limit <= took < limit + 1.8, took  # the SDK's own timeouts: 6 s or more
        assert_stopped_unknown(outcome, store)
        assert mcp.orders == {KEY: 1}
        assert first_hangup(mcp.hangups) - started < limit + 1.8
    finally:
        store.close()


# The model adapters and the confirmer


#: What the model tests ask for.
PLAN = ModelRequest(phase="plan", goal="restock", iteration=1, call=0, history=(), tools=())


def _model(flavor: str, llm: LlmFake) -> OpenAIModel | AnthropicModel:
    """``flavor``'s model at the fake: a 1 s time limit, three tries."""
    model_class = OpenAIModel if flavor == "openai" else AnthropicModel
    return model_class(
        "m-test",
        api_key="sk-test",
        base_url=llm.base_url,
        timeout_seconds=1.0,
        retry=RetryPolicy(attempts=3, base_delay=0.01),
    )


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_model_reply_that_trickles_is_cut_at_the_timeout_and_tried_again(flavor: str) -> None:
    """The model server sends its reply's body a byte every half second: the try ends at the
    model's ``timeout_seconds`` and is tried again (a model call saved nothing), and the next,
    prompt reply is the plan. The step is held for the time limit, not for the trickle."""
    reply = openai_reply if flavor == "openai" else anthropic_reply
    llm = LlmFake(flavor).start()
    try:
        llm.add(reply(text="late", trickle="body", pace=0.5), reply(text="on time"))
        model = _model(flavor, llm)
        started = time.monotonic()
        answer = model.call(PLAN)
        assert answer.answer == "on time"
        assert 1.0 <= time.monotonic() - started < 1.0 + SLACK
        assert len(llm.calls()) == 2
    finally:
        llm.stop()


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_model_reply_that_trickles_on_a_connection_an_earlier_try_opened_is_cut(
    flavor: str,
) -> None:
    """The first try is answered at once with a 500 on a connection the server keeps open;
    the second try's reply then trickles a byte every half second. Had the second try gone
    out on the first one's connection, its cutoff would have had no connection to shut and
    the step would have waited minutes for the trickle: it is cut at the time limit like the
    first, and the third, prompt reply is the plan."""
    reply = openai_reply if flavor == "openai" else anthropic_reply
    busy = openai_error if flavor == "openai" else anthropic_error
    llm = LlmFake(flavor).start()
    try:
        llm.add(busy(500, "busy"), reply(text="late", trickle="body", pace=0.5))
        llm.add(reply(text="on time"))
        model = _model(flavor, llm)
        started = time.monotonic()
        answer = model.call(PLAN)
        assert answer.answer == "on time"
        assert len(llm.calls()) == 3
        assert time.monotonic() - started < 1.0 + SLACK  # uncut: minutes
    finally:
        llm.stop()


class Ledger(LoopbackServer):
    """A system of record whose answer to "did it happen?" trickles."""

    def respond(self, received: Received) -> Answer:
        return Answer(200, {"executed": True}, trickle="body", pace=0.5)


def test_a_confirmer_whose_answer_trickles_asks_nothing_at_its_time_limit() -> None:
    """The confirmer's question is cut at its time limit: no answer (a person decides), and
    the step is not held by the trickle."""
    ledger = Ledger().start()
    try:
        confirmer = HttpConfirmer(f"{ledger.url}/confirm/{{idempotencyKey}}", timeout_seconds=1.0)
        started = time.monotonic()
        said = confirmer.confirm("shop", "restock", UnknownAction("1:0", "place_order", KEY), {})
        assert said is None
        assert 1.0 <= time.monotonic() - started < 1.0 + SLACK
    finally:
        ledger.stop()


# The seam


class _Stream:
    """What httpcore's trace hands over for a connection made: its stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, info: str) -> Any:
        return self.sock if info == "socket" else None


def test_a_simulation_rings_the_cut_on_its_own_clock() -> None:
    """The time limit goes through the clocks' seam, so a simulator drives it: under
    ``clocks.simulated`` with the simulated world's alarm, a cutoff's moment is on the world's
    virtual boot clock, nothing happens while the world stands still, and when the world runs
    to it the exchange's connection is shut (its other end reads the end of the stream)."""
    world = World(Schedule(seed=51))
    near, far = socket.socketpair()
    try:
        with clocks.simulated(wall=world.wall, boot=world.boot, alarm=world.alarm):
            with Cutoff.after(5.0) as cutoff:
                cutoff.trace("connection.connect_tcp.complete", {"return_value": _Stream(near)})
                time.sleep(0.1)  # real time passes; the world's does not
                assert not cutoff.cut and cutoff.remaining() == 5.0
                world.run_until(4.9)
                assert not cutoff.cut
                world.run_until(5.0)
                assert cutoff.cut and cutoff.passed
                far.settimeout(1.0)
                assert far.recv(1) == b""
            with Cutoff.after(5.0) as ended:
                pass
            world.run_until(20.0)  # an exchange over in time is never cut
            assert not ended.cut
    finally:
        near.close()
        far.close()


def test_an_alarm_whose_action_fails_badly_never_silences_the_later_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every exchange's end rests on the one alarm thread. An action that raises even what is
    not an ``Exception`` (``SystemExit``, which ends a thread quietly) is told in the log, and
    the alarm set after it, for an exchange already under way, still rings."""
    later = threading.Event()

    def leaves() -> None:
        raise SystemExit(1)

    now = clocks.boot()
    with caplog.at_level(logging.ERROR, logger="keelgate.clocks"):
        clocks.alarm(now + 0.05, leaves)
        clocks.alarm(now + 0.1, later.set)
        assert later.wait(10.0), "the alarm after a failing one never rang"
    told = [r for r in caplog.records if r.name == "keelgate.clocks"]
    assert [(r.getMessage(), r.exc_info and r.exc_info[0]) for r in told] == [
        ("an alarm's action failed", SystemExit)
    ]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_alarm_thread_that_ended_is_started_again_by_the_next_alarm() -> None:
    """If the alarm's thread ever ends (here: the boot clock it reads fails on that thread),
    the next alarm starts it again: an exchange made after that is still cut at its limit."""

    def fails_on_the_alarms_thread() -> float:
        if threading.current_thread().name == "keelgate-alarm":
            raise RuntimeError("the clock cannot be read")
        return time.monotonic()

    with clocks.simulated(wall=time.time, boot=fails_on_the_alarms_thread):
        clocks.alarm(time.monotonic() + 0.05, lambda: None)
        time.sleep(0.3)  # the thread reads the clock, fails, and ends
    rang = threading.Event()
    clocks.alarm(clocks.boot() + 0.05, rang.set)
    assert rang.wait(10.0), "no alarm rang after the thread ended"


# End to end


RUN = textwrap.dedent("""\
    apiVersion: keelgate.dev/v1alpha1
    kind: AgentRun
    metadata: {name: pay-invoice, namespace: shop}
    spec:
      goal: pay the invoice
      model:
        provider: scripted
        script:
          - {actions: [{tool: pay, args: {invoice: INV-7, cents: 4000}}]}
          - {done: true, answer: paid}
      tools:
        - {name: pay, sideEffect: WRITE, timeoutSeconds: 3, http: {url: "URL", method: POST}}
      budget: {maxIterations: 4}
    """)


def test_keelgate_run_with_a_trickling_payment_service_stops_unknown_at_the_deadline(
    tmp_path: Path, shop: Shop
) -> None:
    """`keelgate run -f RUN.yaml` (SQLite) whose ``pay`` (timeoutSeconds 3) meets a service
    that takes the payment, sends its headers at once and then its body a byte a second: the
    run stops outcome_unknown (exit 3) about 3 s in, not 40 s later as a success, with one
    payment; `keelgate resume` does not pay again."""
    shop.trickle = "body"
    manifest = tmp_path / "run.yaml"
    manifest.write_text(RUN.replace("URL", f"{shop.url}/orders"))
    store = f"sqlite:///{tmp_path}/kg.db"

    def keelgate_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "keelgate", *args, "--store", store],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NO_COLOR": "1"},
        )
        return done, time.monotonic() - started

    ran, took = keelgate_cli("run", "-f", str(manifest))
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert "outcome_unknown" in ran.stdout + ran.stderr
    assert 3.0 <= took < 3.0 + 8.0, took  # the interpreter's start included
    assert sum(shop.orders.values()) == 1
    resumed, _ = keelgate_cli("resume", "pay-invoice")
    assert resumed.returncode == 3, resumed.stdout + resumed.stderr
    assert sum(shop.orders.values()) == 1
