"""Being told (issue 41, item 4): the operator's CloudEvents, sent to a real HTTP receiver on
loopback that reads each request with the CloudEvents SDK (tests/fakes/event_receiver.py).

The operator is the rig's (tests/support/operator_rig.py: the real controller, cache, SQLite
store and ``keelgate step`` runs, over a fake API server), with the runtime's own notifier: the
notices are derived from the objects the controller writes, exactly as in the running operator.

What a user would notice if these broke: a decision that waits and nobody is told, a message
told twice or never after a receiver's hiccup or the operator's restart, a tool's arguments or a
secret in a chat channel, an operator that stops reconciling because a webhook is down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.event_receiver import EventReceiver, Got
from fakes.loopback import Answer
from keelgate.cli import main
from keelgate.kube.notices import approval_expired, notices_of
from keelgate.kube.runtime.notify import CLOCK_MARGIN
from keelgate.manifest import notifications as types
from keelgate.manifest.notifications import NotifySettings, Sink
from keelgate.testing.deadlines import pass_deadlines
from support import operator_tools
from support.operator_rig import NAMESPACE, Operator, agentrun_spec

pytestmark = pytest.mark.usefixtures("orders")

APPROVE = "restock-1-place-order"
SETTLE = "restock-1-lost-write"
STATE = "keelgate-system/keelgate-notify-state"
#: Arguments no event may carry (unless a sink asks), and a secret none may carry at all.
SECRET = "hunter2-s3cr3t"
ORDER = {"tool": "place_order", "args": {"sku": "WIDGET-77", "qty": 3, "api_token": SECRET}}


def quick(_: float) -> bool:
    """The back-off between tries, cut to a moment (the waits asked for are still counted)."""
    time.sleep(0.01)
    return False


@pytest.fixture
def receiver() -> Iterator[EventReceiver]:
    server = EventReceiver()
    server.start()
    yield server
    server.stop()


def settings(*sinks: Sink, state: str = STATE, queue_size: int = 100) -> NotifySettings:
    return NotifySettings(source="keelgate-system/keelgate", state=state, queue_size=queue_size, sinks=list(sinks))


def sink(url: str, name: str = "chat", **extra: Any) -> Sink:
    return Sink.model_validate({"name": name, "url": url, **extra})


@pytest.fixture
def told(tmp_path: Path, receiver: EventReceiver) -> Iterator[Operator]:
    """An operator with one sink: the receiver, structured mode."""
    operator = Operator(
        tmp_path, notify=settings(sink(receiver.url)), notify_sleep=quick
    )
    yield operator
    operator.close()


def _spec(*, approval: bool = False, tool: str = "place_order") -> dict[str, Any]:
    return agentrun_spec(
        script=[{"actions": [{**ORDER, "tool": tool}]}, {"done": True, "answer": "ordered"}],
        tool=tool,
        approval=approval,
    )


def _no_arguments_nor_secrets(got: list[Got], *also: str) -> None:
    """No request carried a tool's argument value or the secret, in its body or headers."""
    for item in got:
        wire = item.request.body.decode() + repr(item.request.headers)
        for word in ("WIDGET-77", SECRET, "api_token", *also):
            assert word not in wire, (item.type, word)


def test_a_run_that_waits_for_approval_tells_each_step_of_the_decision_once(
    told: Operator, receiver: EventReceiver
) -> None:
    """A WRITE that needs approval: the receiver is told the approval is asked for and the run
    stopped waiting for it (naming the Approval), then that carol approved it, then that the run
    succeeded; each event once, each a CloudEvent the SDK reads, under one source per run, with
    the object as subject, a distinct id, and no argument or secret of the order."""
    told.apply("restock", _spec(approval=True))
    assert told.drive("restock") == [3]
    got = receiver.wait_for(2)
    assert [g.type for g in got] == [types.APPROVAL_REQUESTED, types.RUN_STOPPED]
    asked, stopped = got
    source = "/keelgate-system/keelgate/namespaces/shop/agentruns/restock"
    assert asked.event.get_source() == source == stopped.event.get_source()
    assert asked.event.get_subject() == f"approvals/{APPROVE}"
    assert asked.data == {
        "namespace": NAMESPACE,
        "run": "restock",
        "name": APPROVE,
        "action": "1:0",
        "tool": "place_order",
    }
    assert stopped.event.get_subject() == "agentruns/restock"
    assert stopped.data["stopReason"] == "awaiting_approval"
    assert stopped.data["waitingFor"] == [
        {"kind": "Approval", "name": APPROVE, "action": "1:0", "tool": "place_order"}
    ]
    assert asked.request.headers["content-type"] == "application/cloudevents+json"

    told.api.patch_spec("Approval", NAMESPACE, APPROVE, {"approved": True, "by": "carol"})
    told.reconcile(APPROVE, kind="Approval")
    told.drive("restock")
    got = receiver.wait_for(4)
    assert [g.type for g in got[2:]] == [types.APPROVAL_APPROVED, types.RUN_SUCCEEDED]
    approved = got[2]
    assert (approved.data["verdict"], approved.data["by"]) == ("approved", "carol")
    assert approved.event.get_subject() == f"approvals/{APPROVE}"
    assert got[3].data["phase"] == "Succeeded" and got[3].data["message"] == "ordered"
    assert len({g.id for g in got}) == 4
    time.sleep(0.2)
    assert len(receiver.accepted) == 4  # nothing told twice (the run was written again)
    assert len(operator_tools.ORDERS) == 1
    _no_arguments_nor_secrets(got)


def test_an_unknown_outcome_tells_who_settled_it_and_how(
    told: Operator, receiver: EventReceiver
) -> None:
    """A WRITE whose outcome is unknown: a reconciliation is asked for and the run stops
    (outcome_unknown, naming it); alice settles it as not executed, and the receiver is told
    the verdict, by whom and from where (a person: human); the run then succeeds."""
    told.apply("restock", _spec(tool="lost_write"))
    assert told.drive("restock") == [3]
    got = receiver.wait_for(2)
    assert [g.type for g in got] == [types.RECONCILIATION_REQUESTED, types.RUN_STOPPED]
    key = told.api.get("Reconciliation", NAMESPACE, SETTLE)["spec"]["idempotencyKey"]  # type: ignore[index]
    assert got[0].data["idempotencyKey"] == key
    assert got[1].data["stopReason"] == "outcome_unknown"
    assert got[1].data["waitingFor"][0]["name"] == SETTLE
    pass_deadlines(told.stores)
    told.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"executed": False, "by": "alice"})
    told.reconcile(SETTLE, kind="Reconciliation")
    told.drive("restock")
    got = receiver.wait_for(4)
    settled = got[2]
    assert settled.type == types.RECONCILIATION_SETTLED
    assert {k: settled.data[k] for k in ("verdict", "by", "source")} == {
        "verdict": "abandoned",
        "by": "alice",
        "source": "human",
    }
    assert got[3].type == types.RUN_SUCCEEDED
    _no_arguments_nor_secrets(got)


def test_binary_mode_a_type_filter_and_headers_from_a_secret(
    tmp_path: Path, receiver: EventReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Two sinks on one receiver: a pager that wants only failures and successes, in binary
    mode (attributes in ce- headers), with an Authorization header from a mounted Secret's
    folder; and a chat channel that wants everything. Each gets what it asked for, the same
    transition under the same id in both modes, and the header's value is in no log line."""
    secret = tmp_path / "pager-headers"
    secret.mkdir()
    (secret / "Authorization").write_text("Bearer pager-token-123\n")
    (secret / "..data").mkdir()  # a mounted Secret's own bookkeeping: not a header
    pager = sink(
        receiver.url + "/pager",
        name="pager",
        mode="binary",
        types=[types.RUN_SUCCEEDED, types.RUN_FAILED],
        headersDir=str(secret),
    )
    chat = sink(receiver.url + "/chat", name="chat")
    caplog.set_level(logging.DEBUG)
    operator = Operator(tmp_path / "op", notify=settings(pager, chat), notify_sleep=quick)
    try:
        (tmp_path / "op").mkdir(exist_ok=True)
        operator.apply("restock", _spec())
        operator.drive("restock")
        got = receiver.wait_for(2)
        time.sleep(0.2)
        got = list(receiver.accepted)
    finally:
        operator.close()
    by_path: dict[str, list[Got]] = {}
    for item in got:
        by_path.setdefault(item.request.path, []).append(item)
    assert [g.type for g in by_path["/pager"]] == [types.RUN_SUCCEEDED]
    assert [g.type for g in by_path["/chat"]] == [types.RUN_SUCCEEDED]
    paged, chatted = by_path["/pager"][0], by_path["/chat"][0]
    assert paged.request.headers["authorization"] == "Bearer pager-token-123"
    assert "authorization" not in chatted.request.headers
    assert paged.request.headers["ce-type"] == types.RUN_SUCCEEDED
    assert paged.request.headers["content-type"] == "application/json"
    assert paged.id == chatted.id and paged.data == chatted.data
    assert "pager-token-123" not in caplog.text
    _no_arguments_nor_secrets(got)


def test_a_receiver_that_fails_then_recovers_gets_the_event_once(
    told: Operator, receiver: EventReceiver
) -> None:
    """The receiver answers 503, then drops the connection, then 429, then takes it: the
    event is tried again (backing off) and delivered once; the failures are counted, nothing
    is dropped."""
    receiver.failures = [Answer(status=503), Answer(drop=True), Answer(status=429)]
    told.apply("restock", _spec())
    told.drive("restock")
    got = receiver.wait_for(1)
    time.sleep(0.2)
    assert [g.type for g in receiver.accepted] == [types.RUN_SUCCEEDED]
    assert len(receiver.received) == 4
    assert told.sample("keelgate_notifications_failed_total", sink="chat") == 3
    assert told.sample("keelgate_notifications_sent_total", sink="chat", type=types.RUN_SUCCEEDED) == 1
    assert told.sample("keelgate_notifications_dropped_total", sink="chat", reason="gave_up") == 0
    assert told.sample("keelgate_notifications_queued", sink="chat") == 0
    _no_arguments_nor_secrets(got)


def test_a_refusal_is_not_asked_again_and_a_receiver_that_stays_down_is_given_up(
    tmp_path: Path, receiver: EventReceiver
) -> None:
    """A 400 will not change by being asked again: dropped at once (refused). A receiver that
    keeps answering 503 is tried for retryForSeconds, then the event is dropped (gave_up); the
    next event is then tried, and delivered once the receiver is back."""
    operator = Operator(
        tmp_path,
        notify=settings(sink(receiver.url, retryForSeconds=2.5)),
        notify_sleep=quick,
    )
    try:
        receiver.failures = [Answer(status=400)]
        operator.apply("one", _spec())
        operator.drive("one")
        wait_until(lambda: operator.sample("keelgate_notifications_dropped_total", sink="chat", reason="refused") == 1)
        assert len(receiver.received) == 1 and not receiver.accepted
        receiver.down = Answer(status=503)
        operator.apply("two", _spec())
        operator.drive("two")
        wait_until(lambda: operator.sample("keelgate_notifications_dropped_total", sink="chat", reason="gave_up") == 1)
        # Tried at once, then after waits of 1 s and 2 s (asked for, cut short here): the next
        # wait, 4 s, would pass the 2.5 s the sink allows.
        assert len(receiver.received) == 1 + 3
        receiver.down = None
        operator.apply("three", _spec())
        operator.drive("three")
        got = receiver.wait_for(1)
        assert got[0].data["run"] == "three"
    finally:
        operator.close()


def test_a_sink_that_hangs_never_holds_up_reconciling_and_a_full_queue_drops_the_newest(
    tmp_path: Path, receiver: EventReceiver
) -> None:
    """A receiver that answers nothing for longer than the sink's timeout, and a queue of one:
    runs are driven to their end at full speed meanwhile (no reconcile waits on a sink), the
    notices beyond the queue are dropped and counted, and the run goes on regardless."""
    receiver.down = Answer(delay=3.0, status=503)
    operator = Operator(
        tmp_path,
        notify=settings(sink(receiver.url, timeoutSeconds=1, retryForSeconds=0), queue_size=1),
        notify_sleep=quick,
    )
    try:
        started = time.monotonic()
        for name in ("a", "b", "c"):
            operator.apply(name, _spec())
            operator.drive(name)
            assert operator.status(name)["phase"] == "Succeeded"
        took = time.monotonic() - started
        assert took < 3.0, took
        assert operator.sample("keelgate_notifications_dropped_total", sink="chat", reason="queue_full") >= 1
    finally:
        receiver.down = None
        operator.close()


def wait_until(check: Callable[[], bool], *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("not within the time")
        time.sleep(0.02)
