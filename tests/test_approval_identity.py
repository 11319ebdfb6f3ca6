"""A decision is a fact with its own identity: the Approval reconciler records entries by who made
them and which request, never by their place, and a re-created object is another object.

Why it exists (issue 46, item 2; issue 48, item 4): decisions were recorded under refs made of
the Approval's name and their place among their maker's entries (``NAME#bob#1``,
``NAME#spec``). A run deleted and applied again (its stored run goes on, a fresh Approval of the
same name appears) made bob's deny in the new object take his old approval's ref, so it was
skipped as "already recorded", and carol's approval placed the order; the same with the
one-decision form; a byte-equal copy of bob's entry was recorded later as a second "approved by
bob", timed when the operator saw it, renewing an approval that had expired. Entries are now
named by the object's uid and the version of it they were added to (which admission stamps;
without the mutating policy, their place, which admission and the CRD keep), an approval counts
from the earlier of the moment its entry states and the moment the operator first saw it, and
an earlier release's refs still match entries of the objects that existed when they were
recorded. These run the real reconciler and real ``keelgate step`` runs over SQLite
(tests/support/operator_rig.py), and count the orders placed.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from keelgate.core import clocks
from keelgate.core.loop import Loop
from keelgate.kube.controller.approval_entries import entries, written_at
from keelgate.kube.naming import action_object_name
from support import operator_tools
from support.operator_rig import NAMESPACE, Operator, agentrun_spec
from test_controller_approvals import ROUND_2, settled

APPROVE = action_object_name("restock", "1:0", "place_order")
PAYMENTS = ["payments", "system:authenticated"]
RULE = {"required": 2, "groups": ["payments"]}

pytestmark = pytest.mark.usefixtures("orders")


def waiting(kube: Operator, rule: dict[str, Any]) -> dict[str, Any]:
    """alice's run whose one WRITE waits for ``rule``; its Approval, as made."""
    kube.apply(
        "restock", agentrun_spec(rule=rule), annotations={"keelgate.dev/created-by": "alice"}
    )
    assert kube.drive("restock") == [3]
    made = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert made is not None
    return made


def add(
    kube: Operator, entry: dict[str, Any], *, stamp: bool = True, name: str = APPROVE
) -> dict[str, Any]:
    """A person appends ``entry`` to the Approval ``name`` as admission admits it: stamped with
    the version of the object it was added to (the mutating policy), unless ``stamp`` is false
    (a cluster without it). Returns the entry."""
    body = kube.api.get("Approval", NAMESPACE, name)
    assert body is not None
    if stamp:
        entry = {**entry, "id": str(body["metadata"]["resourceVersion"])}
    decisions = [*body["spec"].get("decisions", []), entry]
    kube.api.patch_spec("Approval", NAMESPACE, name, {"decisions": decisions})
    return entry


def decisions(kube: Operator) -> list[tuple[str, bool]]:
    state = Loop(stores=kube.stores).state(NAMESPACE, "restock")
    return [(d.by, d.approved) for d in state.approvals.get("1:0", ())]


def recreated(kube: Operator) -> dict[str, Any]:
    """alice deletes her AgentRun (its Approval goes with it) and applies it again: the stored
    run goes on, and the operator makes a fresh Approval of the same name."""
    run = kube.api.get("AgentRun", NAMESPACE, "restock")
    old = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert run is not None and old is not None
    kube.api.delete_object("Approval", NAMESPACE, APPROVE)
    for pod in kube.pods():  # what the garbage collector does with the run's children
        kube.api.delete_object("Pod", NAMESPACE, pod)
    kube.api.delete_object("AgentRun", NAMESPACE, "restock")
    kube.apply("restock", run["spec"], annotations=run["metadata"]["annotations"])
    # The operator looks at the Approval marked deleted (its finalizer holds it), records what
    # it holds and lets it go.
    kube.reconcile(APPROVE, kind="Approval")
    kube.drive("restock")
    made = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert made is not None and made["metadata"]["uid"] != old["metadata"]["uid"]
    return made


def shown(kube: Operator, name: str = APPROVE) -> dict[str, Any]:
    body = kube.api.get("Approval", NAMESPACE, name)
    assert body is not None
    return dict(body["status"])


@pytest.mark.parametrize("stamp", [True, False], ids=["stamped", "unstamped"])
def test_a_deny_in_an_approval_made_again_is_recorded_and_denies(
    kube: Operator, stamp: bool
) -> None:
    """bob approves (1 of 2); alice deletes and re-applies her run; in the fresh Approval bob
    denies: the deny is recorded (never taken for his old approval), the Approval is Settled
    denied by bob, carol's approval counts for nothing, and no order is placed."""
    waiting(kube, RULE)
    add(kube, {"by": "bob", "groups": PAYMENTS, "approved": True}, stamp=stamp)
    kube.reconcile(APPROVE, kind="Approval")
    assert decisions(kube) == [("bob", True)]
    recreated(kube)
    add(kube, {"by": "bob", "groups": PAYMENTS, "approved": False}, stamp=stamp)
    add(kube, {"by": "carol", "groups": PAYMENTS, "approved": True}, stamp=stamp)
    kube.reconcile(APPROVE, kind="Approval")
    assert decisions(kube) == [("bob", True), ("bob", False)]
    assert settled(kube) == ("Settled", "denied", "bob")
    kube.drive("restock")
    assert operator_tools.ORDERS == []
    assert kube.condition("restock", "Denied")["message"] == "place_order (1:0) denied by bob"


def test_a_one_decision_deny_in_an_approval_made_again_is_recorded_and_denies(
    kube: Operator,
) -> None:
    """The one-decision form: bob sets approved: true (1 of 2); the run is deleted and applied
    again; carol sets approved: false on the fresh Approval: a deny, recorded, and no order."""
    waiting(kube, {"required": 2})
    kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"approved": True, "by": "bob"})
    kube.reconcile(APPROVE, kind="Approval")
    assert decisions(kube) == [("bob", True)]
    recreated(kube)
    kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"approved": False, "by": "carol"})
    kube.reconcile(APPROVE, kind="Approval")
    assert decisions(kube) == [("bob", True), ("carol", False)]
    assert shown(kube)["verdict"] == "denied"
    kube.drive("restock")
    assert operator_tools.ORDERS == []


def test_a_one_decision_approved_false_is_a_deny_never_an_approval(kube: Operator) -> None:
    """``approved: false`` in the one-decision form (issue 48, item 4): read as a deny, recorded
    as one (``loop.denied`` by carol, no ``loop.approved``), shown Settled denied, the run
    marked Denied, and the WRITE never runs; an entry with a stamp the same."""
    waiting(kube, {"required": 1})
    kube.api.patch_spec(
        "Approval", NAMESPACE, APPROVE, {"approved": False, "by": "carol", "decisionId": "u-1"}
    )
    body = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert body is not None
    (entry,) = entries(body)
    assert (entry.approved, entry.by, entry.ref) == (
        False,
        "carol",
        f"{body['metadata']['uid']}/u-1",
    )
    kube.reconcile(APPROVE, kind="Approval")
    assert decisions(kube) == [("carol", False)]
    trail = Loop(stores=kube.stores).audit(NAMESPACE, "restock")
    assert [(e.type, e.actor) for e in trail if e.type in ("loop.approved", "loop.denied")] == [
        ("loop.denied", "carol")
    ]
    assert (shown(kube)["phase"], shown(kube)["verdict"]) == ("Settled", "denied")
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert kube.condition("restock", "Denied")["status"] == "True"
    assert operator_tools.ORDERS == []


@contextmanager
def wall_clock_at(start: float) -> Iterator[list[float]]:
    now = [start]
    with clocks.simulated(wall=lambda: now[0], boot=time.monotonic):
        yield now


def test_a_copy_of_an_expired_approval_renews_nothing(tmp_path: Path) -> None:
    """expiresAfter 1m: bob approves; it expires; carol approves; alice appends a byte-equal
    copy of bob's entry (its stamp included, which admission would refuse): the operator
    records nothing for the copy (it is the same entry), the Approval stays 1 of 2, and no
    order is placed."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            waiting(kube, {"required": 2, "expiresAfter": "1m"})
            bobs = add(kube, {"by": "bob", "groups": [], "approved": True})
            kube.reconcile(APPROVE, kind="Approval")
            now[0] += 90
            add(kube, {"by": "carol", "groups": [], "approved": True})
            kube.reconcile(APPROVE, kind="Approval")
            add(kube, bobs, stamp=False)  # the copy, stamp and all
            kube.reconcile(APPROVE, kind="Approval")
            assert decisions(kube) == [("bob", True), ("carol", True)]
            assert (shown(kube)["progress"], shown(kube)["approvedBy"]) == ("1 of 2", ["carol"])
            assert kube.drive("restock") == []
            assert operator_tools.ORDERS == []
        finally:
            kube.close()


def test_an_approval_counts_from_when_it_was_made_not_when_it_was_seen(tmp_path: Path) -> None:
    """expiresAfter 1m. bob's entry says he decided 50 s ago (his client's word): it counts
    for 10 s more, not a minute. carol's entry, seen while the run was between stops and
    refused until then, counts from when the operator first saw it. An entry claiming a time
    still to come counts from now."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            waiting(kube, {"required": 3, "expiresAfter": "1m"})
            said = dt.datetime.fromtimestamp(now[0] - 50, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            add(kube, {"by": "bob", "groups": [], "approved": True, "at": said})
            later = dt.datetime.fromtimestamp(now[0] + 3600, dt.UTC)
            add(kube, {"by": "dave", "approved": True, "at": later.strftime("%Y-%m-%dT%H:%M:%SZ")})
            kube.reconcile(APPROVE, kind="Approval")
            state = Loop(stores=kube.stores).state(NAMESPACE, "restock")
            moments = {d.by: d.at for d in state.approvals["1:0"]}
            assert moments["bob"].startswith(said[:-1])
            assert moments["dave"] == dt.datetime.fromtimestamp(now[0], dt.UTC).isoformat(
                timespec="milliseconds"
            ).replace("+00:00", "Z")
            assert shown(kube)["expiresAt"] == dt.datetime.fromtimestamp(
                now[0] + 10, dt.UTC
            ).strftime("%Y-%m-%dT%H:%M:%SZ")
            now[0] += 11
            kube.reconcile(APPROVE, kind="Approval")
            assert shown(kube)["approvedBy"] == ["dave"]
        finally:
            kube.close()


def test_an_entry_seen_late_counts_from_the_objects_last_write_not_from_when_seen(
    tmp_path: Path,
) -> None:
    """expiresAfter 1m. bob appends his approval by hand (no moment stated) while the operator
    is down; the API server records the write 50 s before the operator, started again, first
    sees the entry: bob's approval counts from the write (10 s more), not from the look. A
    field manager's record claiming a time still to come bounds nothing: then the look does."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            waiting(kube, {"required": 2, "expiresAfter": "1m"})
            add(kube, {"by": "bob", "groups": [], "approved": True})

            def written(seconds: float, name: str = APPROVE) -> None:
                written_by_hand(kube, seconds, now[0], name)

            written(now[0] - 50)
            kube.reconcile(APPROVE, kind="Approval")
            assert shown(kube)["expiresAt"] == dt.datetime.fromtimestamp(
                now[0] + 10, dt.UTC
            ).strftime("%Y-%m-%dT%H:%M:%SZ")
            now[0] += 11
            kube.reconcile(APPROVE, kind="Approval")
            # Nothing on it counts any more: asked afresh (round 2), on a new Approval.
            assert (shown(kube)["verdict"], shown(kube)["askedAgainAs"]) == ("expired", ROUND_2)
            kube.reconcile("restock")

            add(kube, {"by": "carol", "groups": [], "approved": True}, name=ROUND_2)
            written(now[0] + 3600, ROUND_2)
            kube.reconcile(ROUND_2, kind="Approval")
            assert shown(kube, ROUND_2)["expiresAt"] == dt.datetime.fromtimestamp(
                now[0] + 60, dt.UTC
            ).strftime("%Y-%m-%dT%H:%M:%SZ")
        finally:
            kube.close()


def written_by_hand(kube: Operator, seconds: float, now: float, name: str = APPROVE) -> None:
    """The API server's record that the Approval ``name``'s decisions were last written at
    ``seconds`` (a client's patch), and its status at ``now`` (the operator's own write)."""
    stored = kube.api.objects[("Approval", NAMESPACE, name)]
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    later = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    stored["metadata"]["managedFields"] = [
        {"manager": "kubectl-patch", "operation": "Update", "time": moment,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:decisions": {}}}},
        {"manager": "keelgate", "operation": "Update", "subresource": "status", "time": later},
    ]  # fmt: skip
    # The status write, later, is the operator's own: never a decision's.
    assert written_at(stored) == seconds
    kube.cache.put("Approval", stored)


def test_an_entry_refused_at_first_then_written_over_counts_from_the_write_before_its_first_look(
    tmp_path: Path,
) -> None:
    """expiresAfter 1m. bob appends his approval by hand while the operator is behind (the API
    server records the write 50 s before the operator's first look); that look refuses it (the
    object points at another call: a refusal that passes, as a run held by another operator
    until its lease lapses); 5 s later the object is written again (the pointer put back, an
    entry added) and bob's approval is recorded: it counts from the write before the first look
    (10 s more), not from that look (a minute) nor the later write."""
    with wall_clock_at(1_900_000_000.0) as now:
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            made = waiting(kube, {"required": 2, "expiresAfter": "1m"})
            key = made["spec"]["idempotencyKey"]
            kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"idempotencyKey": "kg-other"})
            add(kube, {"by": "bob", "groups": [], "approved": True})
            written_by_hand(kube, now[0] - 50, now[0])
            kube.reconcile(APPROVE, kind="Approval")
            assert "not counted" in shown(kube)["message"]
            assert Loop(stores=kube.stores).state(NAMESPACE, "restock").approvals == {}

            first_look = now[0]
            now[0] += 5
            kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"idempotencyKey": key})
            written_by_hand(kube, now[0], now[0])
            kube.reconcile(APPROVE, kind="Approval")
            assert shown(kube)["progress"] == "1 of 2"
            assert shown(kube)["expiresAt"] == dt.datetime.fromtimestamp(
                first_look + 10, dt.UTC
            ).strftime("%Y-%m-%dT%H:%M:%SZ")
            now[0] += 6
            kube.reconcile(APPROVE, kind="Approval")
            # bob's approval stopped counting 60 s after his write: nothing on it counts.
            assert shown(kube)["verdict"] == "expired"
            assert operator_tools.ORDERS == []
        finally:
            kube.close()


def test_decisions_an_earlier_release_recorded_are_neither_lost_nor_recorded_twice(
    kube: Operator,
) -> None:
    """A run upgraded mid-way: bob's entry (no stamp) was recorded by an earlier release under
    ``NAME#bob#1``, and the object it came from is still there: it is recognised, not recorded
    again, and still counts. The same ref met in an object made after that decision (the run
    deleted and applied again) is a new entry: recorded."""
    waiting(kube, RULE)
    add(kube, {"by": "bob", "groups": PAYMENTS, "approved": True}, stamp=False)
    body = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert body is not None
    # The earlier release's record of bob's entry, after the object was made.
    Loop(stores=kube.stores).approve(
        NAMESPACE, "restock", "1:0", approved=True, by="bob", groups=PAYMENTS,
        ref=f"{APPROVE}#bob#1",
    )  # fmt: skip
    kube.reconcile(APPROVE, kind="Approval")
    assert decisions(kube) == [("bob", True)]
    assert shown(kube)["progress"] == "1 of 2"
    made = recreated(kube)
    stored = kube.api.objects[("Approval", NAMESPACE, APPROVE)]
    future = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    stored["metadata"]["creationTimestamp"] = future.strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.cache.put("Approval", stored)
    assert made["metadata"]["uid"] == stored["metadata"]["uid"]
    add(kube, {"by": "bob", "groups": PAYMENTS, "approved": False}, stamp=False)
    kube.reconcile(APPROVE, kind="Approval")
    assert decisions(kube) == [("bob", True), ("bob", False)]


def test_an_entry_added_to_a_settled_approval_is_told_once_and_counts_for_nothing(
    kube: Operator,
) -> None:
    """bob and carol settle the Approval (2 of 2); erin's entry, added after (where no
    admission policy refused it), is recorded nowhere, and the Approval says so once, in its
    message and one NotCounted Warning, however often it is looked at."""
    waiting(kube, RULE)
    add(kube, {"by": "bob", "groups": PAYMENTS, "approved": True})
    add(kube, {"by": "carol", "groups": PAYMENTS, "approved": True})
    kube.reconcile(APPROVE, kind="Approval")
    assert (shown(kube)["phase"], shown(kube)["progress"]) == ("Settled", "2 of 2")
    add(kube, {"by": "erin", "groups": PAYMENTS, "approved": False})
    for _ in range(3):
        kube.reconcile(APPROVE, kind="Approval")
    assert decisions(kube) == [("bob", True), ("carol", True)]
    message = shown(kube)["message"]
    assert message.startswith("approved by bob, carol (2 of 2); not counted: erin (added after")
    warned = [e.message for e in kube.api.events if e.reason == "NotCounted"]
    assert len(warned) == 1 and "a decision cannot change" in warned[0]
    assert shown(kube)["verdict"] == "approved"
