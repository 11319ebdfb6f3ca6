"""A tool call is one unit of knowledge: composite tools, their threads, and the fence (issue 36).

Why it exists: a user's WRITE tool may make several requests (``pay`` charges a card, then sends
the receipt), some of them from threads of its own. Once any request of the call may have left,
no error the call raises can mean "nothing happened": read as a refusal, the key would be
dropped and the model's natural retry (or the fence's own re-claim) would charge the card again.
The fence must follow the call into the threads it starts, refuse a request it cannot fence, and
check an MCP call where the HTTP tool checks: after connecting, before the first byte.

The payment service is a real HTTP server on loopback that counts every charge by its
Idempotency-Key and never deduplicates; the hold-up between the two requests is a pause of the
fence's clock (``fence.now`` moved an hour on), as a stalled process would see it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import pytest

import keelgate
from fakes.downstream import Payments
from fakes.mcp_server import McpFake
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.http import HttpTool
from keelgate.adapters.tools.mcp import McpServerRef, McpToolSpec, discover
from keelgate.adapters.tools.python import PythonTool
from keelgate.core import clocks, failpoints, fence
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyState, Outcome, SideEffect, StopReason, idempotency_key
from keelgate.errors import SimulatedCrash, ToolError
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing.deadlines import pass_deadlines, within_a_call

PAYMENT = {"to": "acme", "cents": 4000}
# The model pays, then (told the payment failed, or not) pays again: its natural retry.
SCRIPT: list[dict[str, Any]] = [
    {"actions": [{"tool": "pay", "args": PAYMENT}]},
    {"actions": [{"tool": "pay", "args": PAYMENT}]},
    {"done": True, "answer": "paid"},
]
SPEC = LoopSpec("shop", "invoice", "pay the invoice once", budget=Budget(max_iterations=6))
KEY = idempotency_key("shop", "invoice", "pay", PAYMENT)
HOUR = 3600.0


class Paused:
    """The fence's clock, moved forward by the pauses a test makes (``fence.now`` plus them)."""

    def __init__(self) -> None:
        self.real = fence.now
        self.paused = 0.0

    def __call__(self) -> float:
        return self.real() + self.paused

    def hold_up(self) -> None:
        """The process stalls for an hour: every deadline taken before now has passed."""
        self.paused += HOUR


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Paused:
    paused = Paused()
    monkeypatch.setattr(fence, "now", paused)
    return paused


@pytest.fixture
def payments() -> Iterator[Payments]:
    server = Payments().start()
    yield server  # type: ignore[misc]
    server.stop()


def requests_of(payments: Payments) -> tuple[HttpTool, HttpTool]:
    """The two requests ``pay`` makes, through Keelgate's own HTTP tool."""
    charge = HttpTool(
        "charge", url=f"{payments.url}/charge", method="POST", side_effect=SideEffect.WRITE
    )
    notify = HttpTool(
        "notify", url=f"{payments.url}/notify", method="POST", side_effect=SideEffect.WRITE
    )
    return charge, notify


def pay_tool(payments: Payments, clock: Paused, *, escape: str) -> PythonTool:
    """``pay``: charge the card, then send the receipt; held up between the two, so that the
    receipt's deadline has passed when it is to be sent. ``escape`` says what leaves ``pay``:
    the fence's ``DeadlinePassed`` itself, or the tool's own ``ToolError`` wrapping it."""
    charge, notify = requests_of(payments)

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        charge.invoke(args, idempotency_key=idempotency_key)
        failpoints.hit("mid_tool")  # a death between the two requests
        clock.hold_up()
        try:
            notify.invoke(args, idempotency_key=idempotency_key)
        except ToolError as error:
            if escape == "deadline":
                raise
            raise ToolError(f"pay: the receipt could not be sent ({error.message})") from None
        return {"paid": args["cents"]}

    return PythonTool("pay", pay, SideEffect.WRITE)


class Process:
    """What one process builds over the run's SQLite file; ``restart`` is a death and a new
    process (the old store closed, as the kernel closes a dead process's locks)."""

    def __init__(self, path: Path, tools: Callable[[], list[Any]]) -> None:
        self.path = path
        self.tools = tools
        self.store = SQLiteStore(path)
        self.loop = self._loop()

    def _loop(self) -> Loop:
        return Loop(
            stores=Stores.of(self.store),
            model=ScriptedModel(SCRIPT),
            tools=self.tools(),
            busy_wait=0.5,
        )

    def restart(self) -> None:
        self.store.close()
        self.store = SQLiteStore(self.path)
        self.loop = self._loop()

    def close(self) -> None:
        self.store.close()


def settle_by_asking(process: Process, outcome: Outcome, payments: Payments) -> None:
    """A person's truthful settlement: look at the payment service, never guess."""
    for unknown in outcome.unknown_actions:
        charged = payments.charges[unknown.idempotency_key]
        assert charged <= 1, f"charged {charged} times under one key"
        if not charged:
            pass_deadlines(process.store)  # "not executed" waits for the deadline
        process.loop.reconcile("shop", "invoice", unknown.action, executed=bool(charged), by="al")


def drive(
    process: Process, payments: Payments, *, rounds: int = 8
) -> tuple[list[Outcome], list[SimulatedCrash]]:
    """Resume, restarting between rounds and settling every unknown outcome truthfully, until
    the run stops for another reason; a simulated death on the way is a restart too."""
    outcomes: list[Outcome] = []
    deaths: list[SimulatedCrash] = []
    for _ in range(rounds):
        try:
            outcome = process.loop.run_or_resume(SPEC)
        except SimulatedCrash as death:
            deaths.append(death)
            process.restart()
            continue
        outcomes.append(outcome)
        if outcome.stop.reason is not StopReason.OUTCOME_UNKNOWN:
            return outcomes, deaths
        assert [u.tool for u in outcome.unknown_actions] == ["pay"], outcome.to_json()
        try:
            settle_by_asking(process, outcome, payments)
        except SimulatedCrash as death:
            deaths.append(death)
        process.restart()
    raise AssertionError(f"the run did not end in {rounds} rounds: {outcomes[-1].to_json()}")


CRASHES = [
    None,
    ("after_plan", 1),
    ("before_action", 1),
    ("mid_tool", 1),
    ("after_settle", 1),
    ("after_action_checkpoint", 1),
    ("after_observe", 1),
]


@pytest.mark.parametrize("escape", ["deadline", "tool_error"])
@pytest.mark.parametrize(
    "crash", CRASHES, ids=lambda c: "no-crash" if c is None else f"{c[0]}@{c[1]}"
)
def test_a_composite_write_held_up_between_its_requests_charges_once_whatever_dies(
    tmp_path: Path,
    payments: Payments,
    clock: Paused,
    escape: str,
    crash: tuple[str, int] | None,
) -> None:
    """``pay`` charges the card, is held up, and its receipt is refused by its passed deadline;
    the refusal leaves ``pay`` as DeadlinePassed or as the tool's own ToolError. Either way the
    charge may have happened: the run stops outcome_unknown naming ``pay``, the fence does not
    call ``pay`` again, the model's retry is never sent, and through a death at any window,
    restarts and a truthful settlement the run ends goal_met with the card charged once."""
    process = Process(tmp_path / "kg.db", lambda: [pay_tool(payments, clock, escape=escape)])
    armed: AbstractContextManager[Any] = (
        nullcontext() if crash is None else failpoints.armed({crash[0]: crash[1]}, mode="raise")
    )
    try:
        with armed:
            outcomes, deaths = drive(process, payments)
        assert [(d.failpoint, d.occurrence) for d in deaths] == ([] if crash is None else [crash])
        assert outcomes[-1].stop.reason is StopReason.GOAL_MET, outcomes[-1].to_json()
        assert any(o.stop.reason is StopReason.OUTCOME_UNKNOWN for o in outcomes)
        assert payments.charges == {KEY: 1}
        record = process.store.get("shop", KEY)
        assert record is not None and record.state is KeyState.COMPLETED
        assert record.settled_by == "al"
    finally:
        process.close()


def test_every_request_of_a_call_checks_the_deadline_not_only_the_first() -> None:
    """A composite call asks for a quote (sent in time), is held up past its write deadline, and
    then would charge: the charge's report refuses it (DeadlinePassed), as the first request's
    did not. A deadline checked only before a call's first request would let the charge leave
    after a person may have settled the call as not executed (issue 48)."""
    now = [1000.0]
    with clocks.simulated(wall=time.time, boot=lambda: now[0]):
        call = fence.Invocation(fence.WriteDeadline.starting_now("kg-pay", 30.0))
        with fence.invoking(call):
            keelgate.about_to_send("kg-pay")  # the quote leaves in time
            now[0] += 31.0  # held up between the two requests, past the deadline
            with pytest.raises(fence.DeadlinePassed):
                keelgate.about_to_send("kg-pay")  # the charge does not
        assert call.end()  # the quote may have taken effect: the call's outcome is unknown


def test_a_python_tool_that_reported_a_send_is_not_refused_by_its_own_error(
    tmp_path: Path,
) -> None:
    """A Python WRITE that sends by itself says so (``keelgate.about_to_send``) right before it
    sends; its ToolError after that is an unknown outcome, not a refusal: the model's retry of
    the same call does not charge again."""
    charged: list[str | None] = []

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        keelgate.about_to_send(idempotency_key)
        charged.append(idempotency_key)  # the request left
        raise ToolError("pay: the card network answered with nonsense")

    process = Process(tmp_path / "kg.db", lambda: [PythonTool("pay", pay, SideEffect.WRITE)])
    try:
        outcome = process.loop.run_or_resume(SPEC)
        assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN
        assert [u.tool for u in outcome.unknown_actions] == ["pay"]
        process.restart()
        assert process.loop.run_or_resume(SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        assert charged == [KEY]
    finally:
        process.close()


def test_a_python_tool_refused_before_it_reported_a_send_stays_a_refusal(tmp_path: Path) -> None:
    """The other side: a ToolError raised before anything was reported sent is a definite
    refusal, as before: the model sees the error and its retry is made."""
    tries: list[str | None] = []

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        tries.append(idempotency_key)
        if len(tries) == 1:
            raise ToolError("pay: the card was declined")
        keelgate.about_to_send(idempotency_key)
        return {"paid": args["cents"]}

    process = Process(tmp_path / "kg.db", lambda: [PythonTool("pay", pay, SideEffect.WRITE)])
    try:
        outcome = process.loop.run_or_resume(SPEC)
        assert outcome.stop.reason is StopReason.GOAL_MET
        assert tries == [KEY, KEY]
    finally:
        process.close()


# Definite refusals: a request answered 4xx changed nothing


def _composite(payments: Payments) -> PythonTool:
    charge, notify = requests_of(payments)

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        charge.invoke(args, idempotency_key=idempotency_key)
        return notify.invoke(args, idempotency_key=idempotency_key)

    return PythonTool("pay", pay, SideEffect.WRITE)


def test_an_http_write_answered_4xx_is_still_a_refusal_the_model_sees(
    tmp_path: Path, payments: Payments
) -> None:
    """A request answered with a 4xx was sent, but the answer says it changed nothing: the
    call (the HTTP tool alone, or a composite whose first request is declined) is a definite
    refusal the model sees, as before, and its retry is made."""
    payments.declines = True
    alone = HttpTool(
        "pay", url=f"{payments.url}/charge", method="POST", side_effect=SideEffect.WRITE
    )
    for tool in (alone, _composite(payments)):
        process = Process(tmp_path / f"{id(tool)}.db", lambda tool=tool: [tool])
        try:
            outcome = process.loop.run_or_resume(SPEC)
            assert outcome.stop.reason is StopReason.GOAL_MET, outcome.to_json()
            actions = [h["actions"][0] for h in process.loop.state("shop", "invoice").history]
            assert [a["status"] for a in actions] == ["error", "error"]
            assert "HTTP 402" in actions[0]["error"]
            assert process.store.get("shop", KEY) is None  # refused: dropped
        finally:
            process.close()
    assert payments.charges == {}


def test_a_composite_whose_second_request_is_refused_after_the_first_took_effect_is_unknown(
    tmp_path: Path, payments: Payments
) -> None:
    """``pay`` charges the card, then its receipt is answered 422: that request changed
    nothing, but the charge did. The call's ToolError is no refusal: the run stops
    outcome_unknown and the model's retry charges nothing more."""
    payments.refuses_receipts = True
    process = Process(tmp_path / "kg.db", lambda: [_composite(payments)])
    try:
        outcome = process.loop.run_or_resume(SPEC)
        assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN, outcome.to_json()
        process.restart()
        assert process.loop.run_or_resume(SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        assert payments.charges == {KEY: 1}
    finally:
        process.close()


def test_a_python_tool_can_say_its_request_was_refused(tmp_path: Path) -> None:
    """A Python tool that reported its request sent, and was answered with a definite refusal,
    says so (``refused()`` on what ``about_to_send`` returned): its ToolError stays a refusal
    the model sees. One that did not say so stops the run outcome_unknown."""
    for says in (True, False):

        def pay(args: dict[str, Any], *, idempotency_key: str | None, says: bool = says) -> Any:
            sent = keelgate.about_to_send(idempotency_key)
            if says:
                sent.refused()  # the card network answered "declined"
            raise ToolError("pay: the card was declined")

        tool = PythonTool("pay", pay, SideEffect.WRITE)
        process = Process(tmp_path / f"{says}.db", lambda tool=tool: [tool])
        try:
            reason = process.loop.run_or_resume(SPEC).stop.reason
            assert reason is (StopReason.GOAL_MET if says else StopReason.OUTCOME_UNKNOWN)
        finally:
            process.close()


def test_every_request_of_a_composite_call_checks_the_deadline_not_only_the_first(
    tmp_path: Path, payments: Payments, clock: Paused
) -> None:
    """``pay`` sends its own requests (its own HTTP client, no Keelgate tool), each reported
    with ``keelgate.about_to_send``: the charge goes, the process is held up past the call's
    deadline, and the receipt's report must refuse it (``DeadlinePassed``), though a request
    of the same call already went: a person may by now have settled the call "not executed".
    The receipt is never sent, and the charge makes the outcome unknown (issue 48, item 4)."""
    refused: list[str] = []

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        headers = {"Idempotency-Key": str(idempotency_key)}
        keelgate.about_to_send(idempotency_key)
        httpx.post(f"{payments.url}/charge", json=args, headers=headers, timeout=10)
        clock.hold_up()
        try:
            keelgate.about_to_send(idempotency_key)
        except keelgate.DeadlinePassed as late:
            refused.append(late.key)
            raise
        httpx.post(f"{payments.url}/notify", json=args, headers=headers, timeout=10)
        return {"paid": args["cents"]}

    process = Process(tmp_path / "kg.db", lambda: [PythonTool("pay", pay, SideEffect.WRITE)])
    try:
        outcome = process.loop.run_or_resume(SPEC)
        assert refused == [KEY]
        assert payments.charges == {KEY: 1} and payments.receipts == {}
        assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN, outcome.to_json()
        assert [u.tool for u in outcome.unknown_actions] == ["pay"]
    finally:
        process.close()


def test_a_calls_second_request_after_its_deadline_is_refused_and_the_first_still_counts(
    clock: Paused,
) -> None:
    """The fence itself: a call's first request is recorded, the process is held up past the
    deadline, and the call's next request is refused; the call still reads as having sent
    something (its first request), before and after the gateway ends it."""
    call = fence.Invocation(fence.WriteDeadline.starting_now("kg-two", 30.0))
    call.sending()
    clock.hold_up()
    with pytest.raises(fence.DeadlinePassed):
        call.sending()
    assert call.sent and call.end()


# Threads a tool starts


def test_requests_on_a_tools_own_threads_are_fenced_and_count_as_the_calls(
    tmp_path: Path, payments: Payments, clock: Paused
) -> None:
    """``pay`` makes both requests on its own ThreadPoolExecutor, each submitted through
    ``keelgate.fenced``: the charge's thread sends and counts as the call's, the process is
    held up, and the receipt's thread is refused by the passed deadline. The charge may have
    happened, so the run stops outcome_unknown and the retry charges nothing more."""
    charge, notify = requests_of(payments)

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        with ThreadPoolExecutor(max_workers=2) as pool:
            pool.submit(keelgate.fenced(charge.invoke), args, idempotency_key=idempotency_key)
            pool.shutdown(wait=True)
        clock.hold_up()
        with ThreadPoolExecutor(max_workers=1) as pool:
            sent = pool.submit(
                keelgate.fenced(notify.invoke), args, idempotency_key=idempotency_key
            )
            return sent.result()

    process = Process(tmp_path / "kg.db", lambda: [PythonTool("pay", pay, SideEffect.WRITE)])
    try:
        outcome = process.loop.run_or_resume(SPEC)
        assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN, outcome.to_json()
        assert payments.charges == {KEY: 1} and payments.receipts == {}
        process.restart()
        assert process.loop.run_or_resume(SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        assert payments.charges == {KEY: 1}
    finally:
        process.close()


def test_a_fenced_thread_held_up_past_its_deadline_sends_nothing(
    tmp_path: Path, payments: Payments, clock: Paused
) -> None:
    """The deadline follows the call into a thread started with ``keelgate.fenced``: held up
    before its thread charges, ``pay`` sends nothing under that claim (DeadlinePassed in the
    thread); nothing of the call was sent, so the gateway claims afresh, and the next call
    charges once."""
    charge, _ = requests_of(payments)
    held = [False]

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        if not held[0]:
            held[0] = True
            clock.hold_up()
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(
                keelgate.fenced(charge.invoke), args, idempotency_key=idempotency_key
            ).result()

    process = Process(tmp_path / "kg.db", lambda: [PythonTool("pay", pay, SideEffect.WRITE)])
    try:
        outcome = process.loop.run_or_resume(SPEC)
        assert outcome.stop.reason is StopReason.GOAL_MET, outcome.to_json()
        assert payments.charges == {KEY: 1}
    finally:
        process.close()


def test_a_keelgate_tool_on_an_unfenced_thread_refuses_rather_than_sends(
    tmp_path: Path, payments: Payments, clock: Paused
) -> None:
    """A thread started without ``keelgate.fenced`` has no deadline in reach: held up past the
    deadline, it would charge after a person may truthfully have settled "not executed". The
    HTTP tool refuses instead (nothing sent), naming the way to fence the thread, and the model
    sees a definite failure."""
    charge, _ = requests_of(payments)

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        clock.hold_up()
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(charge.invoke, args, idempotency_key=idempotency_key).result()

    process = Process(tmp_path / "kg.db", lambda: [PythonTool("pay", pay, SideEffect.WRITE)])
    try:
        outcome = process.loop.run_or_resume(SPEC)
        assert payments.charges == {}
        first = process.loop.state("shop", "invoice").history[0]["actions"][0]
        assert first["status"] == "error" and "keelgate.fenced" in first["error"], first
        assert outcome.stop.reason is StopReason.GOAL_MET
    finally:
        process.close()


def test_a_thread_left_running_after_its_call_was_refused_sends_nothing(
    tmp_path: Path, payments: Payments
) -> None:
    """``pay`` leaves a fenced thread waiting and fails at once with a ToolError, nothing sent:
    the gateway drops the key (a definite refusal). When the thread wakes, its charge is
    refused unsent (the call has ended): what the gateway concluded stays true."""
    charge, _ = requests_of(payments)
    wake = threading.Event()
    outcomes: list[BaseException | None] = []
    pool = ThreadPoolExecutor(max_workers=1)

    def late_charge(args: dict[str, Any], key: str | None) -> None:
        wake.wait(10)
        try:
            charge.invoke(args, idempotency_key=key)
            outcomes.append(None)
        except ToolError as error:
            outcomes.append(error)

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        pool.submit(keelgate.fenced(late_charge), args, idempotency_key)
        raise ToolError("pay: the card was declined")

    script = [SCRIPT[0], SCRIPT[2]]
    store = SQLiteStore(tmp_path / "kg.db")
    loop = Loop(
        stores=Stores.of(store),
        model=ScriptedModel(script),
        tools=[PythonTool("pay", pay, SideEffect.WRITE)],
    )
    try:
        assert loop.run_or_resume(SPEC).stop.reason is StopReason.GOAL_MET
        assert store.get("shop", KEY) is None  # refused: the key was dropped
        wake.set()
        pool.shutdown(wait=True)
        assert len(outcomes) == 1 and isinstance(outcomes[0], fence.CallEnded)
        assert payments.charges == {}
    finally:
        wake.set()
        pool.shutdown(wait=True)
        store.close()


def test_a_timed_out_call_that_sent_and_then_failed_stays_unknown(
    tmp_path: Path, payments: Payments
) -> None:
    """A composite WRITE passes its timeout after its charge (the run stops outcome_unknown),
    then, still running, fails its receipt with a ToolError. Its late end is no refusal: the key
    stays unknown for a person, and a resume does not charge again."""
    charge, _ = requests_of(payments)
    go_on = threading.Event()
    ended = threading.Event()

    def pay(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        try:
            charge.invoke(args, idempotency_key=idempotency_key)
            go_on.wait(10)
            raise ToolError("pay: the receipt service refused the receipt")
        finally:
            ended.set()

    tool = PythonTool("pay", pay, SideEffect.WRITE, timeout_seconds=0.3)
    process = Process(tmp_path / "kg.db", lambda: [tool])
    try:
        assert process.loop.run_or_resume(SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        go_on.set()
        assert ended.wait(10)
        wait_until(lambda: _state(process.store) is not KeyState.IN_FLIGHT)
        assert _state(process.store) is KeyState.OUTCOME_UNKNOWN
        process.restart()
        assert process.loop.run_or_resume(SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
        assert payments.charges == {KEY: 1}
    finally:
        go_on.set()
        process.close()


def _state(store: SQLiteStore) -> KeyState | None:
    record = store.get("shop", KEY)
    return None if record is None else record.state


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


# MCP: checked after connecting, before the first byte


def test_an_mcp_write_checks_its_deadline_when_its_request_is_sent_not_before(
    clock: Paused, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MCP SDK opens the ``tools/call`` request's connection only when it sends it, after
    ``call_tool`` began: a process held up there (the connect stalls) is past its deadline by
    the time the request would leave. The tool checks right before the request's headers are
    written, so the server receives no call; the session's own requests are not checked."""
    import mcp.client.streamable_http as transport

    sending = transport.stream_within_origin

    def held_up_while_connecting(client: Any, method: str, url: Any, **kwargs: Any) -> Any:
        if (kwargs.get("json") or {}).get("method") == "tools/call":
            clock.hold_up()
        return sending(client, method, url, **kwargs)

    fake = McpFake().start()
    try:
        (order,) = discover(McpServerRef(fake.url), [McpToolSpec("place_order", SideEffect.WRITE)])
        monkeypatch.setattr(transport, "stream_within_origin", held_up_while_connecting)
        with (
            within_a_call("kg-late", seconds=5) as call,
            pytest.raises(fence.DeadlinePassed),
        ):
            order.invoke({"sku": "A1", "qty": 1}, idempotency_key="kg-late")
        assert fake.orders == {} and fake.seen_meta == []
        assert not call.sent
    finally:
        fake.stop()


def test_an_mcp_write_sent_counts_as_its_calls_and_a_bare_thread_is_refused() -> None:
    """An MCP WRITE's request counts as its call's once it is sent; asked from a thread with no
    deadline in reach, the MCP tool refuses and the server sees nothing."""
    fake = McpFake().start()
    try:
        (order,) = discover(McpServerRef(fake.url), [McpToolSpec("place_order", SideEffect.WRITE)])
        with within_a_call("kg-1") as call:
            order.invoke({"sku": "A1", "qty": 1}, idempotency_key="kg-1")
            assert call.sent
            with ThreadPoolExecutor(max_workers=1) as pool:
                bare = pool.submit(order.invoke, {"sku": "A1", "qty": 1}, idempotency_key="kg-1")
                with pytest.raises(ToolError, match="no write deadline in reach"):
                    bare.result()
        assert fake.orders == {"kg-1": 1}
    finally:
        fake.stop()


# A real process dying between the two requests

SUPPORT = Path(__file__).parent / "support_tools"
MANIFEST = textwrap.dedent("""\
    apiVersion: keelgate.dev/v1alpha1
    kind: AgentRun
    metadata: {name: invoice, namespace: shop}
    spec:
      goal: pay the invoice once
      model:
        provider: scripted
        name: demo
        script:
          - actions: [{tool: pay, args: {to: acme, cents: 4000}}]
          - actions: [{tool: pay, args: {to: acme, cents: 4000}}]
          - done: true
            answer: paid
      tools:
        - name: pay
          sideEffect: WRITE
          python: {callable: "kg_runner_tools:composite_pay"}
      budget: {maxIterations: 6}
    """)


def test_a_process_killed_between_charge_and_receipt_is_charged_once(
    tmp_path: Path, payments: Payments
) -> None:
    """`keelgate run` with a composite ``pay`` dies (os._exit(137)) between its charge and its
    receipt. `keelgate resume` stops outcome_unknown without calling ``pay``; after a truthful
    `reconcile --executed`, the run ends goal_met and the card was charged once."""
    manifest = tmp_path / "invoice.yaml"
    manifest.write_text(MANIFEST)
    store = f"sqlite:///{tmp_path}/kg.db"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
        "KG_PAYMENTS_URL": payments.url,
    }

    def keelgate_cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keelgate", *args, "--store", store],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, **extra},
        )

    died = keelgate_cli("run", "-f", str(manifest), KEELGATE_FAILPOINTS="mid_tool")
    assert died.returncode == 137, died.stderr
    assert payments.charges == {KEY: 1} and payments.receipts == {}
    stopped = keelgate_cli("resume", "invoice")
    assert stopped.returncode == 3, stopped.stderr
    settled = keelgate_cli("reconcile", "invoice", "1:0", "--executed", "--by", "al")
    assert settled.returncode == 0, settled.stderr
    done = keelgate_cli("resume", "invoice")
    assert done.returncode == 0, done.stderr
    assert payments.charges == {KEY: 1}
