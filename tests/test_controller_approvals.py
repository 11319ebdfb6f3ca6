"""The Approval reconciler with rules that ask several people, without a cluster
(tests/support/operator_rig.py: a fake API server, the real cache, SQLite and real
``keelgate step`` runs in this process).

What a user would notice if these broke: a payment sent after one approval of two, or twice; a
creator approving their own run; an Approval that does not say "1 of 2" and when the first
approval stops counting; an approval that expired still counting; a decision on other
arguments than the call's counting; a decision nobody is told about.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fakes.event_receiver import EventReceiver
from keelgate.core import clocks
from keelgate.core.audit import AuditEvent
from keelgate.core.loop import Loop
from keelgate.kube import resources
from keelgate.kube.controller.outcomes import REST, Requeue
from keelgate.kube.naming import action_object_name, earlier_object_name
from keelgate.kube.notifications import notifications_of
from keelgate.manifest import notifications as types
from keelgate.manifest.notifications import NotifySettings, Sink
from support import operator_tools
from support.argocd import run_health
from support.operator_rig import NAMESPACE, Operator, agentrun_spec
from support.scripts import ROOT

APPROVE = action_object_name("restock", "1:0", "place_order")
#: The Approval of the same action asked afresh (round 2), once every approval on APPROVE expired.
ROUND_2 = action_object_name("restock", "1:0", "place_order", round=2)
PAYMENTS = ["payments", "system:authenticated"]
RULE = {"required": 2, "groups": ["payments"], "notCreator": True}
CREATED_BY = "keelgate.dev/created-by"

pytestmark = pytest.mark.usefixtures("orders")


def waiting(kube: Operator, rule: dict[str, Any], *, creator: str = "alice") -> dict[str, Any]:
    """A run whose one WRITE waits for its rule; its Approval, as made."""
    kube.api.create_object(
        "AgentRun",
        NAMESPACE,
        {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": "restock", "annotations": {"keelgate.dev/created-by": creator}},
            "spec": agentrun_spec(rule=rule),
        },
    )
    assert kube.drive("restock") == [3]
    made = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert made is not None
    return made


def add(
    kube: Operator,
    by: str,
    approved: bool = True,
    groups: list[str] | None = None,
    *,
    name: str = APPROVE,
) -> None:
    """A person appends their decision to the Approval ``name`` (as admission lets them: their
    own name and groups)."""
    body = kube.api.get("Approval", NAMESPACE, name)
    assert body is not None
    entry = {"by": by, "groups": PAYMENTS if groups is None else groups, "approved": approved}
    decisions = [*body["spec"].get("decisions", []), entry]
    kube.api.patch_spec("Approval", NAMESPACE, name, {"decisions": decisions})


def shown(kube: Operator, name: str = APPROVE) -> dict[str, Any]:
    body = kube.api.get("Approval", NAMESPACE, name)
    assert body is not None
    return dict(body["status"])


def settled(kube: Operator) -> tuple[str, str, str]:
    """The Approval's phase, verdict and who settled it, as its status shows them."""
    status = shown(kube)
    return status["phase"], status["verdict"], status["settledBy"]


def told(kube: Operator, reason: str) -> list[str]:
    return [e.message for e in kube.api.events if e.reason == reason]


def ended_on_a_deny(kube: Operator, by: str) -> list[AuditEvent]:
    """The run went on and succeeded without the order, on ``by``'s deny alone; its chain."""
    assert kube.status("restock")["phase"] == "Succeeded"
    assert operator_tools.ORDERS == []
    events = Loop(stores=kube.stores).audit(NAMESPACE, "restock")
    assert [e.actor for e in events if e.type == "loop.denied"] == [by]
    return events


@contextmanager
def wall_clock_at(start: float) -> Iterator[list[float]]:
    """The wall clock of the operator, the store's decisions and the step pods, moved by the
    test through the list it yields."""
    now = [start]
    with clocks.simulated(wall=lambda: now[0], boot=time.monotonic):
        yield now


def test_two_people_from_the_group_approve_and_the_write_runs_once(kube: Operator) -> None:
    """The Approval is made for the call's key with an empty list of decisions, Pending "0 of
    2" with the rule in words. The creator's approval is shown as not counted (told once in a
    Warning, and in the Ready condition's reason); bob's counts (1 of 2, told); the run stays
    stopped; carol's settles it approved by both (told too), and the run places one order."""
    made = waiting(kube, RULE)
    plan = Loop(stores=kube.stores).state(NAMESPACE, "restock").plan
    assert plan is not None
    assert made["spec"]["idempotencyKey"] == plan.actions[0].key
    assert made["spec"]["decisions"] == []
    status = shown(kube)
    assert (status["phase"], status["progress"]) == ("Pending", "0 of 2")
    assert status["asks"] == "2 approvals from payments, not the run's creator"
    assert told(kube, "AwaitingApproval") == [
        f"place_order (1:0) needs 2 approvals from payments, not the run's creator: "
        f"approval {APPROVE}"
    ]

    add(kube, "alice")
    assert kube.reconcile(APPROVE, kind="Approval") == Requeue(10.0)
    status = shown(kube)
    assert status["progress"] == "0 of 2"
    assert (
        "not counted: alice:" in status["message"] and "alice created the run" in status["message"]
    )
    assert [c["status"] for c in status["conditions"] if c["type"] == "Stalled"] == ["False"]
    # Not Stalled (it waits for people), but a reason says a decision does not count.
    assert [c["reason"] for c in status["conditions"] if c["type"] == "Ready"] == ["NotCounted"]
    assert len(told(kube, "ApprovalRefused")) == 1

    add(kube, "bob")
    kube.reconcile(APPROVE, kind="Approval")
    status = shown(kube)
    assert (status["progress"], status["approvedBy"]) == ("1 of 2", ["bob"])
    assert told(kube, "Approved") == [
        f"place_order (1:0) approved by bob (1 of 2): approval {APPROVE}"
    ]
    assert kube.drive("restock") == []  # still waiting: no step pod
    assert operator_tools.ORDERS == []

    add(kube, "carol")
    assert kube.reconcile(APPROVE, kind="Approval") == REST
    assert settled(kube) == ("Settled", "approved", "bob, carol")
    assert told(kube, "Approved") == [  # one Event for each approval, with the count
        f"place_order (1:0) approved by bob (1 of 2): approval {APPROVE}",
        f"place_order (1:0) approved by carol (2 of 2): approval {APPROVE}",
    ]
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == 1
    decisions = Loop(stores=kube.stores).state(NAMESPACE, "restock").approvals["1:0"]
    uid = made["metadata"]["uid"]  # no admission stamps here: the object and each place
    assert [(d.by, d.groups, d.ref) for d in decisions] == [
        ("bob", tuple(sorted(PAYMENTS)), f"{uid}#1"),
        ("carol", tuple(sorted(PAYMENTS)), f"{uid}#2"),
    ]


def test_one_deny_among_approvals_denies(kube: Operator) -> None:
    """Bob approves, dave denies: Settled denied by dave; the run goes on without the order;
    the deny is told."""
    waiting(kube, RULE)
    add(kube, "bob")
    add(kube, "dave", approved=False)
    kube.reconcile(APPROVE, kind="Approval")
    assert settled(kube) == ("Settled", "denied", "dave")
    assert told(kube, "Denied") == [f"place_order (1:0) denied by dave: approval {APPROVE}"]
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert operator_tools.ORDERS == []


def test_a_deny_added_before_the_operator_recorded_the_approvals_above_it_denies(
    kube: Operator,
) -> None:
    """bob and carol approve (enough: 2 of 2) and then dave denies, all before the operator
    records any of them (it was away): the object showed "0 of 2" when dave said no, so his no
    denies. Recorded in list order, the two approvals would complete the count first and the
    deny be refused as "already approved by bob, carol" (a no lost; the simulator found it with
    an approval refused under one rule and counted under its edit). Settled denied by dave; the
    order is never placed."""
    waiting(kube, RULE)
    add(kube, "bob")
    add(kube, "carol")
    add(kube, "dave", approved=False)
    kube.reconcile(APPROVE, kind="Approval")
    assert settled(kube) == ("Settled", "denied", "dave")
    kube.drive("restock")
    ended_on_a_deny(kube, "dave")


def test_a_deny_on_an_approval_deleted_before_the_operator_looked_still_denies(
    kube: Operator,
) -> None:
    """bob denies; the Approval is deleted before the operator's reconcile reads it (alice
    deleted her run and applied it again, and the garbage collector took its Approval; or she
    deleted the Approval), and the run's reconcile makes a fresh Approval of the same name
    first. The deny in the deleted object's last body is recorded all the same: the fresh
    Approval shows Settled denied by bob, dave's approval on it counts for nothing, and the run
    goes on without the order (the simulator found the order placed on dave's approval)."""
    made = waiting(kube, {"required": 1})
    add(kube, "bob", approved=False)
    # Gone at once: a cluster admin forced its finalizer off (or it was made without one).
    kube.api.remove("Approval", NAMESPACE, APPROVE)
    kube.drive("restock")  # the stored run still waits: a fresh Approval is made
    fresh = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert fresh is not None and fresh["metadata"]["uid"] != made["metadata"]["uid"]
    kube.reconcile(APPROVE, kind="Approval")
    assert settled(kube) == ("Settled", "denied", "bob")
    kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"approved": True, "by": "dave"})
    kube.reconcile(APPROVE, kind="Approval")
    kube.drive("restock")
    events = ended_on_a_deny(kube, "bob")
    assert [e for e in events if e.type == "loop.approved"] == []


def test_a_one_decision_deny_denies_and_is_never_read_as_an_approval(kube: Operator) -> None:
    """bob decides a one-approval Approval with the one-decision form, ``approved: false``: it is
    Settled denied by bob, the chain records his deny and no approval, and the run goes on
    without the order (issue 48: a deny read as a yes ran the WRITE)."""
    waiting(kube, {"required": 1})
    kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"approved": False, "by": "bob"})
    kube.reconcile(APPROVE, kind="Approval")
    assert settled(kube) == ("Settled", "denied", "bob")
    kube.drive("restock")
    events = ended_on_a_deny(kube, "bob")
    assert [e for e in events if e.type == "loop.approved"] == []


def test_each_entry_is_recorded_once_however_often_the_object_is_looked_at(
    kube: Operator,
) -> None:
    """Reconciling the same Approval again and again records bob's entry once, tells it once."""
    waiting(kube, {"required": 2})
    add(kube, "bob", groups=[])
    for _ in range(3):
        kube.reconcile(APPROVE, kind="Approval")
    assert len(Loop(stores=kube.stores).state(NAMESPACE, "restock").approvals["1:0"]) == 1
    assert len(told(kube, "Approved")) == 1


def test_a_decision_made_in_the_store_shows_on_the_object(kube: Operator) -> None:
    """``keelgate approve`` (the store) by bob: the run's next look asks for its Approval,
    which shows 1 of 2 and tells bob's approval, never edited itself."""
    waiting(kube, {"required": 2})
    Loop(stores=kube.stores).approve(NAMESPACE, "restock", "1:0", approved=True, by="bob")
    kube.queued.clear()
    kube.reconcile("restock")
    assert (("Approval", NAMESPACE, APPROVE), 0.0) in kube.queued
    kube.reconcile(APPROVE, kind="Approval")
    assert shown(kube)["progress"] == "1 of 2"
    assert told(kube, "Approved") == [
        f"place_order (1:0) approved by bob (1 of 2): approval {APPROVE}"
    ]


def test_an_object_pointed_at_another_call_counts_for_nothing(kube: Operator) -> None:
    """An Approval whose idempotency key is not the action's (the arguments are not those it
    was made for) counts no decision: each is shown refused, nothing is recorded."""
    waiting(kube, {"required": 1})
    kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"idempotencyKey": "kg-other"})
    add(kube, "bob", groups=[])
    kube.reconcile(APPROVE, kind="Approval")
    assert "its arguments are not the ones shown" in shown(kube)["message"]
    assert Loop(stores=kube.stores).state(NAMESPACE, "restock").approvals == {}


def asked_afresh(kube: Operator) -> None:
    """The old round's Approval settled as expired, naming the new one (a look again writes
    nothing), which the run's reconcile has made Pending (0 of 2) and the run's status names."""
    status = shown(kube)
    assert (status["phase"], status["verdict"], status["askedAgainAs"]) == (
        "Settled",
        "expired",
        ROUND_2,
    )
    assert "asked afresh as approval" in status["message"]
    version = kube.api.get("Approval", NAMESPACE, APPROVE)["metadata"]["resourceVersion"]
    kube.reconcile(APPROVE, kind="Approval")  # looked at again: nothing new, nothing written
    assert kube.api.get("Approval", NAMESPACE, APPROVE)["metadata"]["resourceVersion"] == version
    kube.reconcile("restock")
    fresh = kube.api.get("Approval", NAMESPACE, ROUND_2)
    assert fresh is not None and fresh["metadata"]["labels"]["keelgate.dev/round"] == "2"
    assert (shown(kube, ROUND_2)["phase"], shown(kube, ROUND_2)["progress"]) == (
        "Pending",
        "0 of 2",
    )
    (pending,) = kube.status("restock")["pendingApprovals"]
    assert pending["round"] == 2
    assert any(
        "is asked afresh, round 2" in m and ROUND_2 in m for m in told(kube, "AwaitingApproval")
    )


def test_an_approval_that_expires_while_waiting_is_shown_told_and_asked_afresh(
    tmp_path: Any,
) -> None:
    """expiresAfter 1m: bob approves; the Approval says when his approval stops counting and
    asks to be looked at then; a minute later nothing on it can count: ApprovalExpired is told,
    it is settled as expired and the action is asked afresh on a new Approval (round 2); bob
    approves again there, carol too, and the order goes out once."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            waiting(kube, {"required": 2, "expiresAfter": "1m"})
            add(kube, "bob", groups=[])
            again = kube.reconcile(APPROVE, kind="Approval")
            assert isinstance(again, Requeue) and 60.0 <= again.after <= 61.0
            assert shown(kube)["expiresAt"] == "2030-03-17T17:47:40Z"
            now[0] += 90
            kube.reconcile(APPROVE, kind="Approval")
            assert told(kube, "ApprovalExpired") == [
                f"place_order (1:0): the approval of bob expired (0 of 2 count now): "
                f"approval {APPROVE}"
            ]
            asked_afresh(kube)
            add(kube, "bob", groups=[], name=ROUND_2)
            add(kube, "carol", groups=[], name=ROUND_2)
            kube.reconcile(ROUND_2, kind="Approval")
            assert shown(kube, ROUND_2)["phase"] == "Settled"
            kube.drive("restock")
            assert kube.status("restock")["phase"] == "Succeeded"
            assert len(operator_tools.ORDERS) == 1
            events = Loop(stores=kube.stores).audit("shop" if False else NAMESPACE, "restock")
            assert [e.data["round"] for e in events if e.type == "loop.asked_again"] == [2]
        finally:
            kube.close()


def test_approvals_too_old_when_the_step_runs_ask_afresh_on_a_new_approval(
    tmp_path: Any,
) -> None:
    """Both approve (Settled), but the step pod runs two minutes later, past expiresAfter: the
    run stops awaiting approval again, nothing on the Approval can count any more, so it is
    settled as expired and the action asked afresh (round 2, ApprovalExpired told); approved
    there, the order goes out once, and only the new round's decisions are on the checkpoint."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            waiting(kube, {"required": 2, "expiresAfter": "1m"})
            add(kube, "bob", groups=[])
            add(kube, "carol", groups=[])
            kube.reconcile(APPROVE, kind="Approval")
            assert shown(kube)["phase"] == "Settled"
            now[0] += 120
            assert kube.drive("restock") == [3]
            assert operator_tools.ORDERS == []
            kube.reconcile(APPROVE, kind="Approval")
            assert told(kube, "ApprovalExpired") == [
                f"place_order (1:0): the approval of bob, carol expired (0 of 2 count now): "
                f"approval {APPROVE}"
            ]
            asked_afresh(kube)
            add(kube, "bob", groups=[], name=ROUND_2)
            add(kube, "carol", groups=[], name=ROUND_2)
            kube.reconcile(ROUND_2, kind="Approval")
            kube.drive("restock")
            assert kube.status("restock")["phase"] == "Succeeded"
            assert len(operator_tools.ORDERS) == 1
            decisions = Loop(stores=kube.stores).state(NAMESPACE, "restock").approvals["1:0"]
            assert [d.by for d in decisions] == ["bob", "carol"]
            assert all(
                d.ref.startswith(kube.api.get("Approval", NAMESPACE, ROUND_2)["metadata"]["uid"])
                for d in decisions
            )
        finally:
            kube.close()


def expired_round_1(kube: Operator, now: list[float]) -> None:
    """Rule 2 of 2, expiresAfter 1m: bob approved on round 1, it expired, round 2 is asked."""
    waiting(kube, {"required": 2, "expiresAfter": "1m"})
    add(kube, "bob", groups=[])
    kube.reconcile(APPROVE, kind="Approval")
    now[0] += 90
    kube.reconcile(APPROVE, kind="Approval")
    asked_afresh(kube)


def test_an_approval_added_to_the_old_round_never_counts_and_is_told(tmp_path: Any) -> None:
    """Insider moves on an expired round: alice appends a copy of bob's old approval to the
    round-1 Approval, and carol approves there too (admission would refuse both; without it
    they land): neither is recorded, the old object says who was not counted and why, once in
    a Warning; on round 2 carol's own approval is 1 of 2 and the order does not go out."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            expired_round_1(kube, now)
            body = kube.api.get("Approval", NAMESPACE, APPROVE)
            copy = dict(body["spec"]["decisions"][0])
            kube.api.patch_spec(
                "Approval", NAMESPACE, APPROVE, {"decisions": [*body["spec"]["decisions"], copy]}
            )
            add(kube, "carol", groups=[])
            kube.reconcile(APPROVE, kind="Approval")
            state = Loop(stores=kube.stores).state(NAMESPACE, "restock")
            assert state.approvals["1:0"] == ()
            status = shown(kube)
            assert status["verdict"] == "expired"
            assert "approvals on it count no more (bob, carol)" in status["message"]
            assert len(told(kube, "NotCounted")) == 1
            add(kube, "carol", groups=[], name=ROUND_2)
            kube.reconcile(ROUND_2, kind="Approval")
            assert shown(kube, ROUND_2)["progress"] == "1 of 2"
            kube.drive("restock")
            assert operator_tools.ORDERS == []
        finally:
            kube.close()


def test_a_deny_added_to_the_old_round_still_denies(tmp_path: Any) -> None:
    """bob denies on the round-1 Approval after round 2 was asked (in the moment before its
    status said expired, or where admission is not installed): the deny is recorded and
    denies; round 2 shows Settled denied, carol's approval there counts for nothing, and the
    order never goes out. The same from a deleted round-1 object's last body."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            expired_round_1(kube, now)
            add(kube, "bob", approved=False, groups=[])
            kube.reconcile(APPROVE, kind="Approval")
            assert "the deny of bob added here is recorded" in shown(kube)["message"]
            kube.reconcile("restock")
            kube.reconcile(ROUND_2, kind="Approval")
            assert settled(kube) == ("Settled", "expired", "")
            status = shown(kube, ROUND_2)
            assert (status["phase"], status["verdict"], status["settledBy"]) == (
                "Settled",
                "denied",
                "bob",
            )
            kube.drive("restock")
            assert operator_tools.ORDERS == []
        finally:
            kube.close()


def test_a_round_not_asked_yet_records_nothing(tmp_path: Any) -> None:
    """alice makes the round-2 Approval herself while round 1 still waits, and bob approves
    on it: nothing on it is recorded (the run asks in round 1), it says so; round 1 is
    decided as usual."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            made = waiting(kube, {"required": 2, "expiresAfter": "1m"})
            early = {
                **made,
                "metadata": {"name": ROUND_2, "namespace": NAMESPACE},
                "status": None,
            }
            early.pop("status")
            kube.api.create_object("Approval", NAMESPACE, early)
            add(kube, "bob", groups=[], name=ROUND_2)
            kube.reconcile(ROUND_2, kind="Approval")
            assert "round 2 of this action is not asked" in shown(kube, ROUND_2)["message"]
            assert Loop(stores=kube.stores).state(NAMESPACE, "restock").approvals == {}
        finally:
            kube.close()


def test_an_approval_that_expires_is_told_to_a_sink_once_as_a_cloudevent(tmp_path: Any) -> None:
    """expiresAfter 1m: bob's approval expires while carol's is awaited; the operator's
    notifier sends dev.keelgate.approval.expired to a receiver on loopback, once however often
    the Approval is looked at, naming bob, when he approved and when it expired (from the
    record), and carrying no argument."""
    receiver = EventReceiver()
    receiver.start()
    try:
        with wall_clock_at(1_900_000_000.0) as now:
            kube = Operator(
                tmp_path,
                clock=lambda: now[0],
                notify=NotifySettings(
                    source="keelgate-system/keelgate",
                    state="",
                    queue_size=100,
                    sinks=[Sink.model_validate({"name": "chat", "url": receiver.url})],
                ),
                notify_sleep=lambda _: False,
            )
            try:
                waiting(kube, {"required": 2, "expiresAfter": "1m"})
                add(kube, "bob", groups=[])
                kube.reconcile(APPROVE, kind="Approval")
                # Read now: once it expires, its round is asked afresh and the checkpoint keeps
                # the new round's decisions only (the chain keeps it).
                state = Loop(stores=kube.stores).state(NAMESPACE, "restock")
                (decision,) = state.approvals["1:0"]
                now[0] += 90
                for _ in range(3):
                    kube.reconcile(APPROVE, kind="Approval")
                expired = [g for g in receiver.wait_for(3) if g.type == types.APPROVAL_EXPIRED]
                time.sleep(0.3)
                assert [g.type for g in receiver.accepted].count(types.APPROVAL_EXPIRED) == 1
                (got,) = expired
                assert got.data["approvedBy"] == ["bob"]
                assert got.data["approvedAt"] == decision.at
                assert got.data["expiredAt"] == "2030-03-17T17:47:40Z"
                assert got.data["expiresAfterSeconds"] == 60.0
                assert "A1" not in got.request.body.decode()
            finally:
                kube.close()
    finally:
        receiver.stop()


def test_an_approval_made_before_an_upgrade_is_kept_and_its_decisions_count(
    kube: Operator,
) -> None:
    """The run's step stopped for two approvals under an earlier release, which made the
    Approval under the name it gave (no digest); the operator is upgraded. It makes no second
    Approval, names the earlier one in the run's condition, counts bob's and carol's decisions
    there, and the order is placed once."""
    kube.apply("restock", agentrun_spec(rule=RULE), annotations={CREATED_BY: "alice"})
    kube.reconcile("restock")
    assert kube.run_step("restock") == 3
    (pending,) = Loop(stores=kube.stores).state(NAMESPACE, "restock").pending
    earlier = earlier_object_name("restock", pending.action, pending.tool)
    body = resources.approval(kube.run("restock"), pending, "", name=earlier)
    kube.api.create_object("Approval", NAMESPACE, body)
    kube.api.patch_status("Approval", NAMESPACE, earlier, {"phase": "Pending"})
    kube.reconcile("restock")
    assert kube.condition("restock", "AwaitingApproval")["message"] == (
        f"place_order (1:0): see approval {earlier}"
    )
    assert [o["metadata"]["name"] for o in kube.api.of_kind("Approval")] == [earlier]
    for person in ("bob", "carol"):
        found = kube.api.get("Approval", NAMESPACE, earlier)
        assert found is not None
        entry = {"by": person, "groups": PAYMENTS, "approved": True}
        decisions = [*found["spec"]["decisions"], entry]
        kube.api.patch_spec("Approval", NAMESPACE, earlier, {"decisions": decisions})
        kube.reconcile(earlier, kind="Approval")
    settled = kube.api.get("Approval", NAMESPACE, earlier)
    assert settled is not None and settled["status"]["progress"] == "2 of 2"
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert [o["metadata"]["name"] for o in kube.api.of_kind("Approval")] == [earlier]
    assert len(operator_tools.ORDERS) == 1


def test_argo_cd_and_notifications_show_an_approval_asked_afresh_as_done_and_the_new_one(
    tmp_path: Any,
) -> None:
    """Argo CD's health of the Approvals (deploy/argocd's health.lua) over the operator's own
    objects: the expired round's is Healthy and names the round's Approval, which is Suspended
    waiting for people. The notifications derived from them: the expired one tells no decision
    (nobody denied it), the new one is a request of its own."""
    lua = ROOT / "deploy" / "argocd" / "keelgate.dev" / "Approval"
    script = (lua / "health.lua").read_text()
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            expired_round_1(kube, now)
            old = run_health(script, kube.api.get("Approval", NAMESPACE, APPROVE))
            assert old == {
                "status": "Healthy",
                "message": f"Expired: place_order (1:0) of run restock is asked afresh as "
                f"approval {ROUND_2} (no approval on this one counts)",
            }
            fresh = run_health(script, kube.api.get("Approval", NAMESPACE, ROUND_2))
            assert fresh["status"] == "Suspended" and "0 of 2" in fresh["message"]
            # Nobody decided the expired one: its notifications ask, never tell a decision;
            # the new one asks afresh, under its own name.
            old_told = notifications_of("Approval", kube.api.get("Approval", NAMESPACE, APPROVE))
            assert [n.type for n in old_told] == [types.APPROVAL_REQUESTED]
            new_told = notifications_of("Approval", kube.api.get("Approval", NAMESPACE, ROUND_2))
            assert [(n.type, n.subject) for n in new_told] == [
                (types.APPROVAL_REQUESTED, f"approvals/{ROUND_2}")
            ]
        finally:
            kube.close()


def test_an_approval_holding_all_the_entries_it_takes_is_asked_afresh(kube: Operator) -> None:
    """64 people outside the rule's groups fill the Approval (where admission lets them): none
    counts, and nobody could add a decision that would. The action is asked afresh on a round-2
    Approval with room, where bob and carol approve and one order goes out."""
    made = waiting(kube, RULE)
    outsiders = [{"by": f"p{i}", "groups": [], "approved": True} for i in range(64)]
    kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"decisions": outsiders})
    kube.reconcile(APPROVE, kind="Approval")
    status = shown(kube)
    assert (status["verdict"], status["askedAgainAs"]) == ("expired", ROUND_2)
    (event,) = [
        e
        for e in Loop(stores=kube.stores).audit(NAMESPACE, "restock")
        if e.type == "loop.asked_again"
    ]
    assert event.data["why"] == "full"
    kube.reconcile("restock")
    assert (
        made["metadata"]["uid"] != kube.api.get("Approval", NAMESPACE, ROUND_2)["metadata"]["uid"]
    )
    add(kube, "bob", name=ROUND_2)
    add(kube, "carol", name=ROUND_2)
    kube.reconcile(ROUND_2, kind="Approval")
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == 1
