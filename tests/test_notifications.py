"""Being told (issue 41, item 4): the operator's CloudEvents, sent to a real HTTP receiver on
loopback that reads each request with the CloudEvents SDK (tests/fakes/event_receiver.py).

The operator is the rig's (tests/support/operator_rig.py: the real controller, cache, SQLite store
and ``keelgate step`` runs, over a fake API server), with the runtime's own notifier: the
notifications are derived from the objects the controller writes, exactly as in the running
operator.

What a user would notice if these broke: a decision that waits and nobody is told, a message
told twice or never after a receiver's hiccup or the operator's restart, a tool's arguments or a
secret in a chat channel, an operator that stops reconciling because a webhook is down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.event_receiver import EventReceiver, Got, quick
from fakes.loopback import Answer
from keelgate.cli import main
from keelgate.kube.naming import action_object_name
from keelgate.kube.notifications import approval_expired, notifications_of
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.notifier import Notifier
from keelgate.manifest import notifications as types
from keelgate.manifest.notifications import NotifySettings, Sink
from keelgate.testing.deadlines import pass_deadlines
from support import operator_tools
from support.operator_rig import NAMESPACE, Operator, agentrun_spec

pytestmark = pytest.mark.usefixtures("orders")

APPROVE = action_object_name("restock", "1:0", "place_order")
SETTLE = action_object_name("restock", "1:0", "lost_write")
STATE = "keelgate-system/keelgate-notify-state"
#: Arguments no event may carry (unless a sink asks), and a secret none may carry at all.
SECRET = "hunter2-s3cr3t"
ORDER = {"tool": "place_order", "args": {"sku": "WIDGET-77", "qty": 3, "api_token": SECRET}}


def settings(*sinks: Sink, state: str = STATE, queue_size: int = 100) -> NotifySettings:
    return NotifySettings(
        source="keelgate-system/keelgate", state=state, queue_size=queue_size, sinks=list(sinks)
    )


def sink(url: str, name: str = "chat", **extra: Any) -> Sink:
    return Sink.model_validate({"name": name, "url": url, **extra})


@pytest.fixture
def told(tmp_path: Path, receiver: EventReceiver) -> Iterator[Operator]:
    """An operator with one sink: the receiver, structured mode."""
    operator = Operator(tmp_path, notify=settings(sink(receiver.url)), notify_sleep=quick)
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
    assert got[3].data["phase"] == "Succeeded"
    assert got[3].data["message"] == ""  # the model's answer stays in the run's status
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
    assert (
        told.sample("keelgate_notifications_sent_total", sink="chat", type=types.RUN_SUCCEEDED) == 1
    )
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
        wait_until(
            lambda: (
                operator.sample(
                    "keelgate_notifications_dropped_total", sink="chat", reason="refused"
                )
                == 1
            )
        )
        assert len(receiver.received) == 1 and not receiver.accepted
        receiver.down = Answer(status=503)
        operator.apply("two", _spec())
        operator.drive("two")
        wait_until(
            lambda: (
                operator.sample(
                    "keelgate_notifications_dropped_total", sink="chat", reason="gave_up"
                )
                == 1
            )
        )
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
    notifications beyond the queue are dropped and counted, and the run goes on regardless."""
    receiver.down = Answer(delay=8.0, status=503)
    operator = Operator(
        tmp_path,
        notify=settings(sink(receiver.url, timeoutSeconds=4, retryForSeconds=0), queue_size=1),
        notify_sleep=quick,
    )
    try:
        started = time.monotonic()
        for name in ("a", "b", "c"):
            operator.apply(name, _spec())
            operator.drive(name)
            assert operator.status(name)["phase"] == "Succeeded"
        took = time.monotonic() - started
        # A reconcile waiting on the sink: 4 s per notification, 12 s or more.
        assert took < 6.0, took
        assert (
            operator.sample(
                "keelgate_notifications_dropped_total", sink="chat", reason="queue_full"
            )
            >= 1
        )
    finally:
        receiver.down = None
        operator.close()


def wait_until(check: Callable[[], bool], *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("not within the time")
        time.sleep(0.02)


def test_a_restart_sends_again_what_the_last_leader_had_not_delivered_and_nothing_older(
    tmp_path: Path, receiver: EventReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Operator A tells run one's success, then its receiver goes down: run two stops awaiting
    approval and neither of its notifications gets through. A keeps how far it delivered (as it does
    every few seconds), then dies without a word. Operator B starts on the same cluster and store,
    the receiver back: it sends run two's two notifications again, with the ids A had given them,
    and not run one's, which was delivered."""
    # The least it may be: a test's seconds.
    monkeypatch.setattr("keelgate.kube.runtime.notifier.CLOCK_MARGIN", 1.0)
    first = Operator(tmp_path, notify=settings(sink(receiver.url)), notify_sleep=quick)
    first.apply("one", _spec())
    first.drive("one")
    receiver.wait_for(1)
    time.sleep(1.1)  # as the periodic save finds it, a moment later
    first.notifier.save_state()  # type: ignore[union-attr]
    kept = first.api.read_config_map(*STATE.split("/"))
    assert kept is not None and kept["data"]["through"]
    receiver.down = Answer(status=503)
    first.apply("two", _spec(approval=True))
    first.drive("two")
    wait_until(lambda: len(receiver.received) >= 3)
    pending = {n.id: n.type for n in first.notifier.senders[0].pending()}  # type: ignore[union-attr]
    assert sorted(pending.values()) == [types.APPROVAL_REQUESTED, types.RUN_STOPPED]
    first.notifier.save_state()  # type: ignore[union-attr]
    for sender in first.notifier.senders:  # type: ignore[union-attr]
        sender.stop(timeout=1)  # dies: nothing more sent, nothing more kept
    first.stores.close()
    receiver.down = None
    accepted = len(receiver.accepted)

    second = Operator(
        tmp_path, api=first.api, notify=settings(sink(receiver.url)), notify_sleep=quick
    )
    try:
        second.relist("AgentRun", "Pod", "Reconciliation", "Approval")
        got = receiver.wait_for(accepted + 2)[accepted:]
        time.sleep(0.3)
        assert len(receiver.accepted) == accepted + 2
        assert {g.id: g.type for g in got} == pending
        assert {g.data["run"] for g in got} == {"two"}
    finally:
        second.close()


def test_with_nothing_kept_a_first_start_tells_nothing_of_the_past(
    tmp_path: Path, receiver: EventReceiver
) -> None:
    """Notifications turned on for a cluster that already has finished runs (no state kept
    yet): the new operator lists them and tells none of them; a run that stops afterwards is
    told."""
    before = Operator(tmp_path)
    before.apply("old", _spec())
    before.drive("old")
    before.stores.close()
    after = Operator(
        tmp_path, api=before.api, notify=settings(sink(receiver.url)), notify_sleep=quick
    )
    try:
        after.relist("AgentRun", "Pod", "Reconciliation", "Approval")
        after.apply("new", _spec())
        after.drive("new")
        got = receiver.wait_for(1)
        time.sleep(0.2)
        assert [g.data["run"] for g in receiver.accepted] == ["new"]
        assert got[0].type == types.RUN_SUCCEEDED
    finally:
        after.close()


def test_include_arguments_adds_the_redacted_arguments_for_that_sink_only(
    tmp_path: Path, receiver: EventReceiver
) -> None:
    """A sink with includeArguments gets the arguments of the action the approval is about,
    through the redactor (the token hidden); another sink on the same events gets none."""
    wants = sink(receiver.url + "/wants", name="wants", includeArguments=True)
    plain = sink(receiver.url + "/plain", name="plain", types=[types.APPROVAL_REQUESTED])
    operator = Operator(tmp_path, notify=settings(wants, plain), notify_sleep=quick)
    try:
        operator.apply("restock", _spec(approval=True))
        operator.drive("restock")
        receiver.wait_for(3)
        time.sleep(0.2)
    finally:
        operator.close()
    asked = {g.request.path: g for g in receiver.accepted if g.type == types.APPROVAL_REQUESTED}
    assert asked["/wants"].data["arguments"] == {
        "sku": "WIDGET-77",
        "qty": 3,
        "api_token": "[redacted]",
    }
    assert "arguments" not in asked["/plain"].data
    assert asked["/wants"].id == asked["/plain"].id
    stopped = [g for g in receiver.accepted if g.type == types.RUN_STOPPED]
    assert [g.request.path for g in stopped] == ["/wants"]
    assert "arguments" not in stopped[0].data  # a run's stop is about no one action
    for got in receiver.accepted:
        assert SECRET not in got.request.body.decode()
    _no_arguments_nor_secrets([g for g in receiver.accepted if g.request.path == "/plain"])


def test_an_expired_approval_is_told_once_under_an_id_its_record_gives(
    told: Operator, receiver: EventReceiver
) -> None:
    """What the approvals work calls when an approval was too old to run on and is asked for
    again (``context.notify(approval_expired(...))``): told once however often it is called, with
    the id the approval's record gives (the same in another process), and a later expiry of a
    later approval is another event."""
    told.apply("restock", _spec(approval=True))
    told.drive("restock")
    receiver.wait_for(2)
    approval = told.api.get("Approval", NAMESPACE, APPROVE)
    assert approval is not None

    def expired(at: str) -> Any:
        return approval_expired(
            approval,
            approved_by=("carol", "dave"),
            approved_at=at,
            expired_at="2026-12-05T12:00:00Z",
            expires_after_seconds=3600,
        )

    notify = told.controller.context.notify
    notify(expired("2026-12-05T10:00:00Z"))
    notify(expired("2026-12-05T10:00:00Z"))
    notify(expired("2026-12-05T11:30:00Z"))
    got = receiver.wait_for(4)[2:]
    time.sleep(0.2)
    assert len(receiver.accepted) == 4
    assert [g.type for g in got] == [types.APPROVAL_EXPIRED] * 2
    assert got[0].id == expired("2026-12-05T10:00:00Z").id != got[1].id
    assert got[0].data["approvedBy"] == ["carol", "dave"]
    assert got[0].event.get_subject() == f"approvals/{APPROVE}"


def test_the_same_transition_has_the_same_id_whoever_derives_it(
    told: Operator, receiver: EventReceiver
) -> None:
    """The ids are derived from the objects' durable records: the notifications of each object as
    the cluster holds it, derived again (as another leader would), carry the ids the receiver
    got."""
    told.apply("restock", _spec(approval=True))
    told.drive("restock")
    got = receiver.wait_for(2)
    again = {
        n.id
        for kind in ("AgentRun", "Approval")
        for body in told.api.of_kind(kind)
        for n in notifications_of(kind, body)
    }
    assert {g.id for g in got} == again


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (
            ["--notify-sink", "ftp://chat.example/x"],
            "--notify-sink: 'ftp://chat.example/x': must be an http",
        ),
        (["--notify-state", "no-slash"], "--notify-state"),
    ],
)
def test_bad_notify_flags_are_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    """`keelgate operator` with a sink it cannot use: exit 2, one line naming the flag, before
    anything connects."""
    code = main(
        [
            "operator",
            "--store",
            "postgresql://kg@127.0.0.1:1/kg",
            "--notify-sink",
            "http://a.example/",
            *args,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert problem in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "sinks: [{name: chat, url: 'http://x/', types: [dev.keelgate.run.stoped]}]\n",
            "sinks[0].types[0]: 'dev.keelgate.run.stoped' is not an event type",
        ),
        (
            "sinks: [{name: chat, url: 'http://x/', timeout: 3}]\n",
            "sinks[0].timeout: unknown field",
        ),
        (
            "sinks: [{name: chat, url: 'http://x/', headersDir: /nowhere}]\n",
            "sinks.chat.headersDir: /nowhere: no such folder",
        ),
        ("sinks: [{name: Chat, url: 'http://x/'}]\n", "sinks[0].name"),
    ],
)
def test_a_bad_notify_config_is_one_line_naming_the_file_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, problem: str
) -> None:
    """`keelgate operator --notify-config FILE` (what the chart renders from its values) with
    a wrong field, an event type not in the catalogue or a headers folder that is not there:
    exit 2, one line naming the field."""
    config = tmp_path / "notify.yaml"
    config.write_text(text)
    code = main(
        ["operator", "--store", "postgresql://kg@127.0.0.1:1/kg", "--notify-config", str(config)]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert problem in err and "Traceback" not in err, err


def _reconciliation(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Reconciliation",
        "metadata": {
            "name": SETTLE,
            "namespace": NAMESPACE,
            "uid": "u-1",
            "creationTimestamp": "2026-12-05T10:00:00Z",
        },
        "spec": {
            "runName": "restock",
            "action": "1:0",
            "tool": "lost_write",
            "idempotencyKey": "k",
        },
        "status": status,
    }


def test_what_an_objects_record_tells_and_what_it_does_not() -> None:
    """A Reconciliation just created (no status yet) tells nothing; shown Pending, that it is
    asked for; one a step pod's confirmer settled tells only its settlement (nobody was asked);
    the same object settled at another moment (asked again) is another event."""
    assert notifications_of("Reconciliation", _reconciliation({})) == []
    pending = notifications_of("Reconciliation", _reconciliation({"phase": "Pending"}))
    assert [n.type for n in pending] == [types.RECONCILIATION_REQUESTED]
    settled = {"phase": "Settled", "verdict": "executed", "settledBy": "order-book"}
    by_confirmer = notifications_of(
        "Reconciliation",
        _reconciliation({**settled, "source": "confirmer", "settledAt": "2026-12-05T10:00:01Z"}),
    )
    assert [n.type for n in by_confirmer] == [types.RECONCILIATION_SETTLED]
    assert by_confirmer[0].data["source"] == "confirmer"
    first, later = (
        notifications_of(
            "Reconciliation", _reconciliation({**settled, "source": "human", "settledAt": at})
        )
        for at in ("2026-12-05T10:00:01Z", "2026-12-05T11:00:00Z")
    )
    assert [n.type for n in first] == [types.RECONCILIATION_REQUESTED, types.RECONCILIATION_SETTLED]
    assert first[0].id == later[0].id and first[1].id != later[1].id


def test_an_object_made_again_is_asked_again_and_an_old_ones_expiry_repeats_nothing(
    receiver: EventReceiver,
) -> None:
    """An Approval deleted and made again under its name (a new uid) is a new ask, told; the
    expiry of the old one, told after, is told once and makes the new one's ask not told twice
    when the new object is seen again."""
    notifier = Notifier(settings(sink(receiver.url), state=""), metrics=Metrics(), sleep=quick)
    notifier.begin()
    notifier.live()
    notifier.start()
    try:

        def approval(uid: str) -> dict[str, Any]:
            return {
                "kind": "Approval",
                "metadata": {
                    "name": APPROVE,
                    "namespace": NAMESPACE,
                    "uid": uid,
                    "creationTimestamp": "2026-12-05T10:00:00Z",
                },
                "spec": {"runName": "restock", "action": "1:0", "tool": "place_order"},
                "status": {"phase": "Pending"},
            }

        notifier.observe("Approval", approval("u-1"), False)
        notifier.observe("Approval", approval("u-1"), True)
        notifier.observe("Approval", approval("u-2"), False)
        notifier.notify(
            approval_expired(
                approval("u-1"),
                approved_by=("carol",),
                approved_at="2026-12-05T10:01:00Z",
                expired_at="2026-12-05T11:01:00Z",
                expires_after_seconds=3600,
            )
        )
        notifier.observe("Approval", approval("u-2"), False)
        receiver.wait_for(3)
        time.sleep(0.2)
        assert receiver.types() == [
            types.APPROVAL_REQUESTED,
            types.APPROVAL_REQUESTED,
            types.APPROVAL_EXPIRED,
        ]
    finally:
        notifier.stop()
