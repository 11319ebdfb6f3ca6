"""An Approval deleted while no operator watches keeps the decisions made on it: the finalizer
``keelgate.dev/decisions`` holds it until the operator has recorded them.

Why it exists (issue 46, the hole left): the operator's cache keeps a deleted Approval's last
body and records its decisions, but only while it watches. bob denied, alice (namespace
``edit``) deleted the Approval, or deleted and applied again her AgentRun (the garbage collector
took the Approval), before any operator saw bob's write (a rollout, the operator down); the
operator, back, found no Approval, made a fresh one of the same name, dave approved it, and the
WRITE ran. Now a deletion only marks the Approval; the operator records every entry, then lets
it go. Nor does the finalizer hold a deletion for ever: it goes once nothing on the Approval can
count (a finished run, a denied action), and on a deleted one as soon as no deny waits. These
run the real reconciler, cache and ``keelgate step`` runs over SQLite (tests/support/
operator_rig.py), an operator restarted over the same API server and store, and count orders.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keelgate.core.loop import Loop
from keelgate.errors import SettleError
from keelgate.kube.controller.approval_finalizer import FinalizedApprovals
from keelgate.kube.controller.approvals import ApprovalReconciler, Looked
from keelgate.kube.controller.ports import Key
from keelgate.kube.naming import DECISIONS_FINALIZER
from keelgate.kube.runtime.resync import due_for_resync
from support import operator_tools
from support.operator_rig import NAMESPACE, Operator
from test_controller_approvals import (
    APPROVE,
    RULE,
    add,
    ended_on_a_deny,
    settled,
    shown,
    waiting,
    wall_clock_at,
)

pytestmark = pytest.mark.usefixtures("orders")


def restarted(kube: Operator, folder: Path) -> Operator:
    """The operator comes back over the same API server and store: it lists what is there."""
    back = Operator(folder, api=kube.api)
    back.relist("AgentRun", "Pod", "Approval")
    return back


def denied_for_good(kube: Operator) -> None:
    """The run ends without the order, bob's deny on record and no approval; no Approval is
    left for dave, and his approval in the store is refused as already denied."""
    kube.drive("restock")
    assert kube.api.get("Approval", NAMESPACE, APPROVE) is None
    with pytest.raises(SettleError, match="already denied by bob"):
        Loop(stores=kube.stores).approve(NAMESPACE, "restock", "1:0", approved=True, by="dave")
    kube.drive("restock")
    events = ended_on_a_deny(kube, "bob")
    assert [e for e in events if e.type == "loop.approved"] == []


def dave_approves_whatever_is_there(kube: Operator) -> None:
    """dave approves the Approval of the run's action if there is one (a fresh one, made after
    the old one went), and the operator looks."""
    kube.drive("restock")
    if kube.api.get("Approval", NAMESPACE, APPROVE) is not None:
        kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"approved": True, "by": "dave"})
        kube.reconcile(APPROVE, kind="Approval")


def dave_denies_as_alice_deletes(kube: Operator) -> None:
    """Both approve (Settled, the run goes on, between stops); dave's deny lands on the object
    (the status had not yet said Settled) and alice deletes it."""
    waiting(kube, {"required": 2, "expiresAfter": "1m"})
    add(kube, "bob", groups=[])
    add(kube, "carol", groups=[])
    kube.reconcile(APPROVE, kind="Approval")
    assert shown(kube)["phase"] == "Settled"
    add(kube, "dave", approved=False, groups=[])
    kube.api.delete_object("Approval", NAMESPACE, APPROVE)


def daves_deny_stands(kube: Operator) -> None:
    """Whatever Approval the run has is approved by both; the run ends without the order, on
    dave's deny."""
    kube.drive("restock")
    if kube.api.get("Approval", NAMESPACE, APPROVE) is not None:
        add(kube, "bob", groups=[])
        add(kube, "carol", groups=[])
        kube.reconcile(APPROVE, kind="Approval")
        kube.drive("restock")
    ended_on_a_deny(kube, "dave")


def test_the_operator_makes_each_approval_with_its_finalizer(kube: Operator) -> None:
    """A fresh Approval carries keelgate.dev/decisions, and no other finalizer (kopf adds none:
    the operator has event handlers only)."""
    made = waiting(kube, RULE)
    assert made["metadata"]["finalizers"] == [DECISIONS_FINALIZER]


@pytest.mark.parametrize("how", ["the Approval", "the AgentRun, applied again"])
def test_a_deny_on_an_approval_deleted_while_the_operator_is_down_still_denies(
    kube: Operator, tmp_path: Path, how: str
) -> None:
    """The operator stops; bob denies; alice deletes the Approval (or deletes her AgentRun, the
    garbage collector deletes its Approval, and she applies the run again); the operator comes
    back. The Approval was only marked deleted: the operator records bob's deny, then lets it
    go; no fresh Approval is made, dave has nothing to approve, and no order is placed."""
    waiting(kube, {"required": 1})
    kube.api.watch = None  # the operator is down: nobody hears what follows
    add(kube, "bob", approved=False)
    if how == "the Approval":
        kube.api.delete_object("Approval", NAMESPACE, APPROVE)
    else:
        run = kube.run("restock")
        kube.api.delete_object("AgentRun", NAMESPACE, "restock")
        for pod in kube.pods():  # the garbage collector, for the run's children
            kube.api.delete_object("Pod", NAMESPACE, pod)
        kube.api.delete_object("Approval", NAMESPACE, APPROVE)
        kube.apply("restock", run["spec"], annotations=run["metadata"]["annotations"])
    marked = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    back = restarted(kube, tmp_path)
    try:
        back.drive("restock")  # the run's look first: the marked Approval is still there
        assert back.api.writes.count(f"create Approval {APPROVE}") == 1
        back.reconcile(APPROVE, kind="Approval")
        dave_approves_whatever_is_there(back)
        denied_for_good(back)
    finally:
        back.close()


def test_kubectl_delete_approval_while_the_operator_watches_records_then_lets_it_go(
    kube: Operator,
) -> None:
    """bob denies and alice deletes the Approval at once: it stays, marked, until the
    operator's look has recorded bob's deny (told, Settled denied), then it goes, and the run
    ends without the order."""
    waiting(kube, {"required": 1})
    add(kube, "bob", approved=False)
    kube.api.delete_object("Approval", NAMESPACE, APPROVE)
    assert kube.api.get("Approval", NAMESPACE, APPROVE) is not None
    kube.reconcile(APPROVE, kind="Approval")
    assert [e.reason for e in kube.api.events if e.reason == "Denied"] == ["Denied"]
    assert kube.api.get("Approval", NAMESPACE, APPROVE) is None
    dave_approves_whatever_is_there(kube)
    denied_for_good(kube)


def test_a_deleted_approval_with_nothing_to_record_goes_and_is_asked_again(
    kube: Operator,
) -> None:
    """alice deletes an Approval nobody decided: the operator lets it go at its first look,
    and the run, still waiting, gets a fresh one; bob approves that one and the order is placed
    once."""
    made = waiting(kube, {"required": 1})
    kube.api.delete_object("Approval", NAMESPACE, APPROVE)
    kube.reconcile(APPROVE, kind="Approval")
    assert kube.api.get("Approval", NAMESPACE, APPROVE) is None
    kube.drive("restock")
    fresh = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert fresh is not None and fresh["metadata"]["uid"] != made["metadata"]["uid"]
    add(kube, "bob")
    kube.reconcile(APPROVE, kind="Approval")
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == 1


def test_a_refused_deny_does_not_hold_a_deletion(kube: Operator) -> None:
    """A deny the rule refuses while the run asks (erin, in none of its groups) counts for
    nothing, now or later: the Approval deleted with it goes at the operator's look (a
    namespace's deletion never waits on it)."""
    waiting(kube, RULE)
    add(kube, "erin", approved=False, groups=["support"])
    kube.api.delete_object("Approval", NAMESPACE, APPROVE)
    kube.reconcile(APPROVE, kind="Approval")
    assert kube.api.get("Approval", NAMESPACE, APPROVE) is None
    assert Loop(stores=kube.stores).state(NAMESPACE, "restock").approvals.get("1:0", ()) == ()


def test_a_deny_waits_in_a_deleted_approval_until_the_run_asks_again(tmp_path: Any) -> None:
    """expiresAfter 1m: bob and carol approve (Settled, the run goes on); dave's deny lands on
    the object (the status had not yet said Settled) and alice deletes it, while the run is
    between stops: the deny cannot be recorded now, so the Approval stays, marked. The step
    runs past the expiry, the run asks again, and the operator's next look records dave's deny
    and lets the Approval go: no fresh Approval is made, and no order is placed (let go at
    once, a fresh Approval's two approvals would have placed it)."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            dave_denies_as_alice_deletes(kube)
            kube.reconcile(APPROVE, kind="Approval")
            held = kube.api.get("Approval", NAMESPACE, APPROVE)
            assert held is not None and held["metadata"]["finalizers"] == [DECISIONS_FINALIZER]
            now[0] += 120
            assert kube.drive("restock") == [3]  # asked again: the approvals expired
            kube.reconcile(APPROVE, kind="Approval")
            assert kube.api.get("Approval", NAMESPACE, APPROVE) is None
            daves_deny_stands(kube)
        finally:
            kube.close()


class LandsAfterTheLook:
    """The Approval reconciler's look, then a write (``then``) before the finalizer judges."""

    def __init__(self, looks: ApprovalReconciler, then: Callable[[], object]) -> None:
        self._looks, self._then = looks, then

    def look(self, key: Key) -> Looked:
        done = self._looks.look(key)
        self._then()
        return done


def test_a_deny_refused_between_stops_holds_even_if_the_run_asks_again_before_the_judging(
    tmp_path: Any,
) -> None:
    """As above, but the step that asks again lands between the look (which refused dave's
    deny: the run was between stops) and the finalizer's judgment, and the operator restarts
    before its next look: the finalizer judged by the state the deny was tried against, so
    the Approval stayed, and the operator back records the deny from it. Judged by a fresh
    read, it let the Approval go with the deny unrecorded (kept only in the old process's
    memory of the deleted object): the operator back made a fresh Approval, and its two
    approvals placed the order."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            dave_denies_as_alice_deletes(kube)
            asked_again: list[list[int]] = []

            def step() -> None:
                now[0] += 120
                asked_again.append(kube.drive("restock"))

            context = kube.controller.context
            racing = FinalizedApprovals(
                context, LandsAfterTheLook(ApprovalReconciler(context), step)
            )
            racing.reconcile(("Approval", NAMESPACE, APPROVE))
            assert asked_again == [[3]]  # the step ran between the look and the judgment
        finally:
            kube.close()
        back = Operator(tmp_path, api=kube.api, clock=lambda: now[0])
        try:
            back.relist("AgentRun", "Pod", "Approval")
            back.reconcile(APPROVE, kind="Approval")
            daves_deny_stands(back)
        finally:
            back.close()


def test_a_deny_added_as_the_approval_is_deleted_during_a_look_is_recorded_before_it_goes(
    tmp_path: Path,
) -> None:
    """The run asks; while the operator looks at its Approval (finding nothing), dave denies on
    it and alice deletes it, and the operator restarts after that look: the finalizer judged
    only what the look had tried, so the Approval stayed, and the operator back records dave's
    deny from it. Judging the object as it was after the look, it let it go with dave's deny
    never tried (kept only in the old process's memory of the deleted object): the operator
    back made a fresh Approval, and two approvals placed the order."""
    kube = Operator(tmp_path)
    waiting(kube, {"required": 2})

    def dave_denies_as_alice_deletes_it() -> None:
        add(kube, "dave", approved=False, groups=[])
        kube.api.delete_object("Approval", NAMESPACE, APPROVE)

    context = kube.controller.context
    racing = FinalizedApprovals(
        context, LandsAfterTheLook(ApprovalReconciler(context), dave_denies_as_alice_deletes_it)
    )
    try:
        racing.reconcile(("Approval", NAMESPACE, APPROVE))
        held = kube.api.get("Approval", NAMESPACE, APPROVE)
        assert held is not None and held["metadata"]["finalizers"] == [DECISIONS_FINALIZER]
    finally:
        kube.close()
    back = restarted(kube, tmp_path)
    try:
        back.reconcile(APPROVE, kind="Approval")
        assert back.api.get("Approval", NAMESPACE, APPROVE) is None
        daves_deny_stands(back)
    finally:
        back.close()


def test_a_finished_runs_approval_loses_its_finalizer(kube: Operator) -> None:
    """bob approves, the order is placed, the run succeeds: the Approval's next look removes
    the finalizer (nothing on it can count any more), so deleting the namespace or
    uninstalling with no operator left does not wait on it; the Approval itself stays,
    Settled approved by bob. Settled but still held, the resync looks at it again (a look the
    operator missed does not leave the finalizer for ever); let go, it does not."""
    waiting(kube, {"required": 1})
    add(kube, "bob")
    kube.reconcile(APPROVE, kind="Approval")
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert settled(kube)[0] == "Settled"
    assert ("Approval", NAMESPACE, APPROVE) in due_for_resync(kube.cache)
    kube.reconcile(APPROVE, kind="Approval")
    body = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert body is not None and not body["metadata"].get("finalizers")
    assert ("Approval", NAMESPACE, APPROVE) not in due_for_resync(kube.cache)
    assert settled(kube) == ("Settled", "approved", "bob")
    kube.api.delete_object("Approval", NAMESPACE, APPROVE)
    assert kube.api.get("Approval", NAMESPACE, APPROVE) is None
    assert len(operator_tools.ORDERS) == 1


def test_an_approval_made_before_the_finalizer_gets_it(kube: Operator) -> None:
    """An Approval an earlier release made (no finalizer) that still waits gets
    keelgate.dev/decisions at the operator's next look; another finalizer on it is kept."""
    waiting(kube, RULE)
    body = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert body is not None
    kube.api.set_finalizers(
        "Approval",
        NAMESPACE,
        APPROVE,
        ["example.com/audit"],
        resource_version=body["metadata"]["resourceVersion"],
    )
    kube.reconcile(APPROVE, kind="Approval")
    body = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert body is not None
    assert body["metadata"]["finalizers"] == ["example.com/audit", DECISIONS_FINALIZER]
