"""The decision reconcilers (Reconciliations, and the one-decision form of Approvals), without
a cluster: a person's edit recorded in the store, shown Settled, the run woken and
continued (tests/support/operator_rig.py: a fake API server, the real cache, SQLite and real
``keelgate step`` runs).

What a user would notice if these broke: a settled WRITE repeated or never continued, a denial
that runs the action anyway, a decision made with ``keelgate reconcile`` overridden by a later
edit of the object, a refusal that is never told.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from keelgate.core.loop import Loop
from keelgate.core.types import KeyState
from keelgate.kube import resources
from keelgate.kube.controller.outcomes import REST, Requeue
from keelgate.kube.controller.reconciliations import Decided, settled_status
from keelgate.kube.naming import action_object_name, earlier_object_name
from keelgate.kube.times import stamp
from keelgate.testing.deadlines import pass_deadlines
from support import operator_tools
from support.operator_rig import NAMESPACE, ORDER, TOOLS, Operator, agentrun_spec

SETTLE = action_object_name("restock", "1:0", "lost_write")
APPROVE = action_object_name("restock", "1:0", "place_order")


pytestmark = pytest.mark.usefixtures("orders")


def unknown_outcome(kube: Operator) -> str:
    """A run stopped on a WRITE whose outcome nobody knows; the idempotency key it carried."""
    kube.apply("restock", agentrun_spec(tool="lost_write"))
    assert kube.drive("restock") == [3]
    made = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert made is not None
    return str(made["spec"]["idempotencyKey"])


def awaiting_approval(kube: Operator) -> None:
    kube.apply("restock", agentrun_spec(approval=True))
    assert kube.drive("restock") == [3]
    assert kube.api.get("Approval", NAMESPACE, APPROVE) is not None


@pytest.fixture
def late(tmp_path: Path, orders: list[Any]) -> Iterator[tuple[Operator, list[float]]]:
    """An operator whose API server's clock a test sets (``[0]``): ten minutes behind until
    then, so that what the operator creates is older than any deadline a test passes."""
    moment = [time.time() - 600]
    operator = Operator(tmp_path, server_clock=lambda: moment[0])
    yield operator, moment
    operator.close()


def _refused_too_early(kube: Operator, key: str) -> dict[str, Any]:
    """The Reconciliation, refused as written too early: the key still unknown, the object
    Pending and Stalled (``DecidedTooEarly``), a Warning on the run, the run not woken."""
    kube.queued.clear()
    assert isinstance(kube.reconcile(SETTLE, kind="Reconciliation"), Requeue)
    record = kube.stores.idempotency.get(NAMESPACE, key)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    shown = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert shown is not None and shown["status"]["phase"] == "Pending"
    stalled = [c for c in shown["status"]["conditions"] if c["type"] == "Stalled"]
    assert stalled[0]["status"] == "True" and stalled[0]["reason"] == "DecidedTooEarly"
    assert "look again" in shown["status"]["message"]
    assert kube.api.events[-1].type == "Warning"
    assert kube.api.events[-1].reason == "DecidedTooEarly"
    assert not [q for q in kube.queued if q[0][0] == "AgentRun"]
    assert kube.drive("restock") == []  # nothing settled: the run stays stopped
    return shown


def test_not_executed_before_the_deadline_is_held_then_counts_only_once_written_again(
    late: tuple[Operator, list[float]],
) -> None:
    """The Reconciliation says from when "not executed" may be settled (its call may still be
    sent until then). alice patches executed: false before that moment: the key stays unknown
    and the Reconciliation Pending, saying why (one Normal Event, no Warning); the operator
    looks again then. Once the deadline has passed, her decision is still refused: a process
    held up may have sent the call after she looked, so her word is about a moment that
    settles nothing (Stalled, DecidedTooEarly, the run not woken). She looks again and writes
    it again (spec.decidedAt now): abandoned by alice, the run goes on, the WRITE never
    repeats."""
    kube, moment = late
    key = unknown_outcome(kube)
    made = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert made is not None
    after = made["status"]["notExecutedAfter"]
    assert after.endswith("Z") and made["status"]["phase"] == "Pending"
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"executed": False, "by": "alice"})
    held = kube.reconcile(SETTLE, kind="Reconciliation")
    # Looked at again once it counts (the python tool's default limit, 300 s, and the fence's
    # margin, 5 s, to the deadline; the clocks' allowed skew, 5 s, after it).
    assert isinstance(held, Requeue) and 305 < held.after <= 311
    record = kube.stores.idempotency.get(NAMESPACE, key)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    shown = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert shown is not None and shown["status"]["phase"] == "Pending"
    assert f"written before {after}" in shown["status"]["message"]
    assert [e.reason for e in kube.api.events][-1] == "SettlementHeld"
    assert not [e for e in kube.api.events if e.type == "Warning" and "Early" in e.reason]
    events = len(kube.api.events)
    assert isinstance(kube.reconcile(SETTLE, kind="Reconciliation"), Requeue)
    assert len(kube.api.events) == events  # said once
    pass_deadlines(kube.stores)  # the deadline passes
    _refused_too_early(kube, key)
    moment[0] = time.time()  # alice writes again now, well after it

    again = {"executed": False, "by": "alice", "decidedAt": "2030-01-01T00:00:00Z"}
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, again)
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST
    record = kube.stores.idempotency.get(NAMESPACE, key)
    assert record is not None
    assert (record.state, record.settled_by) == (KeyState.ABANDONED, "alice")
    assert kube.drive("restock") == [0, 0]
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == 1  # the lost write's one call, never repeated


def test_a_not_executed_refused_as_early_corrected_to_executed_counts_as_executed(
    late: tuple[Operator, list[float]],
) -> None:
    """alice's "not executed", written before the deadline, is refused once it has passed;
    she looks again, finds that the call did take effect, and corrects it to executed (the
    one change a decision may take, before it is settled): recorded as executed by alice, and
    the WRITE is not sent again."""
    kube, moment = late
    key = unknown_outcome(kube)
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"executed": False, "by": "alice"})
    assert isinstance(kube.reconcile(SETTLE, kind="Reconciliation"), Requeue)  # held
    pass_deadlines(kube.stores)
    _refused_too_early(kube, key)
    moment[0] = time.time()
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"executed": True})
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST
    record = kube.stores.idempotency.get(NAMESPACE, key)
    assert record is not None
    assert (record.state, record.settled_by) == (KeyState.COMPLETED, "alice")
    shown = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert shown is not None and shown["status"]["verdict"] == "executed"
    assert kube.drive("restock") == [0, 0]
    assert len(operator_tools.ORDERS) == 1


@pytest.mark.parametrize("dated", ["by the API server's record", "by the person's own word"])
def test_a_not_executed_written_before_the_deadline_and_first_seen_after_it_is_refused(
    late: tuple[Operator, list[float]], dated: str
) -> None:
    """The operator was away while alice wrote "not executed" (nothing held it), and first
    sees it after the deadline: when it was written is read from the API server's record of
    the object's last write (before the deadline), or from the moment alice states
    (``decidedAt``, before it, though written after): either way it is refused as too early,
    and nothing is settled."""
    kube, moment = late
    key = unknown_outcome(kube)
    decision: dict[str, Any] = {"executed": False, "by": "alice"}
    # The deadline is made a minute ago below: these moments are before and after it.
    if dated == "by the person's own word":
        moment[0] = time.time() + 60  # written after the deadline...
        decision["decidedAt"] = stamp(time.time() - 120)  # ...about a look before
    else:
        moment[0] = time.time() - 120
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, decision)
    pass_deadlines(kube.stores)  # the operator's first look is after the deadline
    shown = _refused_too_early(kube, key)
    assert "alice" in shown["status"]["message"]


@pytest.mark.parametrize(
    ("executed", "verdict", "state"),
    [(True, "executed", KeyState.COMPLETED), (False, "abandoned", KeyState.ABANDONED)],
)
def test_a_person_settles_an_unknown_outcome_and_the_run_goes_on(
    kube: Operator, executed: bool, verdict: str, state: KeyState
) -> None:
    """``kubectl patch reconciliation ... executed/by``: the key is settled in the store as the
    person said, the Reconciliation shows who and how, an Event tells it on the run, the run is
    woken and finishes, and the WRITE never runs again."""
    key = unknown_outcome(kube)
    pass_deadlines(kube.stores)  # "not executed" is taken only once the call can no longer go
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"executed": executed, "by": "alice"})
    kube.queued.clear()
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST
    record = kube.stores.idempotency.get(NAMESPACE, key)
    assert record is not None
    assert (record.state, record.settled_by, record.source) == (state, "alice", "human")
    shown = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert shown is not None
    assert {k: shown["status"][k] for k in ("phase", "verdict", "source", "settledBy")} == {
        "phase": "Settled",
        "verdict": verdict,
        "source": "human",
        "settledBy": "alice",
    }
    assert kube.api.events[-1].reason == "Settled"
    assert kube.api.events[-1].message == (
        f"lost_write (1:0) settled as {verdict} by alice (human): reconciliation {SETTLE}"
    )
    assert kube.queued == [(("AgentRun", NAMESPACE, "restock"), 0.0)]
    assert kube.drive("restock") == [0, 0]  # the iteration settled, then the model's done
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == 1  # the lost write, once: never repeated
    writes = len(kube.api.writes)
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST  # Settled: nothing more
    assert len(kube.api.writes) == writes


def test_an_undecided_reconciliation_waits_for_a_person(kube: Operator) -> None:
    """No ``executed`` yet: nothing is written and the reconcile rests."""
    unknown_outcome(kube)
    writes = len(kube.api.writes)
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST
    assert len(kube.api.writes) == writes


def test_a_settlement_made_in_the_store_is_mirrored_and_stands(kube: Operator) -> None:
    """Settled with ``keelgate reconcile`` (the store) as abandoned by bob, then the object says
    executed by alice: bob's decision stands, the object shows it, and a DecidedElsewhere
    Warning tells alice."""
    unknown_outcome(kube)
    pass_deadlines(kube.stores)
    Loop(stores=kube.stores).reconcile(NAMESPACE, "restock", "1:0", executed=False, by="bob")
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"executed": True, "by": "alice"})
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST
    shown = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert shown is not None
    assert (shown["status"]["verdict"], shown["status"]["settledBy"]) == ("abandoned", "bob")
    warning = next(e for e in kube.api.events if e.reason == "DecidedElsewhere")
    assert (warning.type, warning.about) == ("Warning", "restock")
    assert warning.message == "1:0 was already settled as abandoned by bob; that decision stands"


def test_a_store_settlement_is_found_by_the_run_and_mirrored(kube: Operator) -> None:
    """Nobody edits the object: the run's reconcile sees the key settled in the store and asks
    for the Reconciliation's reconcile, which shows it Settled without any spec."""
    unknown_outcome(kube)
    Loop(stores=kube.stores).reconcile(NAMESPACE, "restock", "1:0", executed=True, by="bob")
    kube.queued.clear()
    kube.reconcile("restock")
    assert (("Reconciliation", NAMESPACE, SETTLE), 0.0) in kube.queued
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST
    shown = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert shown is not None and shown["status"]["settledBy"] == "bob"
    assert "DecidedElsewhere" not in kube.api.reasons()


def _waited(result: object) -> float:
    assert isinstance(result, Requeue), result
    return result.after


def test_a_refused_settlement_is_shown_told_once_and_tried_again_later_and_later(
    tmp_path: Path, orders: list[object]
) -> None:
    """A decision the loop refuses (no actor: ``by`` empty): nothing is settled; the object's
    status says why (message, Stalled=True with reason SettleRefused, Ready=False); one
    SettleRefused Warning on the run however often it is tried; back in ten seconds, and then
    after as long as it has been refused (at most five minutes). Once settled, the conditions
    say Ready and not Stalled, and the message is gone."""
    now = [time.time()]
    with closing(Operator(tmp_path, clock=lambda: now[0])) as kube:
        _refused_then_settled(kube, now)


def _refused_then_settled(kube: Operator, now: list[float]) -> None:
    key = unknown_outcome(kube)
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"executed": True, "by": ""})
    assert kube.reconcile(SETTLE, kind="Reconciliation") == Requeue(10.0)
    warning = kube.api.events[-1]
    assert (warning.reason, warning.type, warning.about) == ("SettleRefused", "Warning", "restock")
    record = kube.stores.idempotency.get(NAMESPACE, key)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    shown = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert shown is not None and shown["status"]["phase"] == "Pending"
    assert shown["status"]["message"] == warning.message
    conditions = {c["type"]: c for c in shown["status"]["conditions"]}
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Stalled"]["reason"] == "SettleRefused"
    assert conditions["Ready"]["status"] == "False"
    writes = len(kube.api.writes)
    now[0] += 120.0
    assert 119.0 <= _waited(kube.reconcile(SETTLE, kind="Reconciliation")) <= 122.0
    now[0] += 3600.0
    assert kube.reconcile(SETTLE, kind="Reconciliation") == Requeue(300.0)
    assert kube.api.reasons().count("SettleRefused") == 1
    assert len(kube.api.writes) == writes  # nothing new to show: no patch, no Event
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"by": "alice"})
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST
    settled = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert settled is not None and settled["status"]["phase"] == "Settled"
    conditions = {c["type"]: c for c in settled["status"]["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Stalled"]["status"]) == ("True", "False")
    assert settled["status"]["message"] == ""


def test_a_reconciliation_whose_run_the_store_does_not_have_says_so(
    tmp_path: Path, orders: list[object]
) -> None:
    """A Reconciliation naming a run the store has never seen (applied by hand, or its run's
    rows removed): its status says the run does not exist (Stalled=True, reason RunNotFound),
    one Warning, and it is tried again with a back-off, not every ten seconds for ever."""
    now = [time.time()]
    with closing(Operator(tmp_path, clock=lambda: now[0])) as kube:
        _run_not_found(kube, now)


def _run_not_found(kube: Operator, now: list[float]) -> None:
    unknown_outcome(kube)
    kube.api.patch_spec(
        "Reconciliation", NAMESPACE, SETTLE, {"runName": "nobody", "executed": True, "by": "al"}
    )
    assert kube.reconcile(SETTLE, kind="Reconciliation") == Requeue(10.0)
    shown = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert shown is not None
    stalled = next(c for c in shown["status"]["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "RunNotFound")
    assert "nobody" in shown["status"]["message"]
    now[0] += 60.0
    assert 59.0 <= _waited(kube.reconcile(SETTLE, kind="Reconciliation")) <= 62.0
    assert kube.api.reasons().count("RunNotFound") == 1


@pytest.mark.parametrize("approved", [True, False])
def test_a_person_decides_an_approval_and_the_run_goes_on(kube: Operator, approved: bool) -> None:
    """``kubectl patch approval ... approved/by``: recorded in the run's checkpoint, the Approval
    shows it Settled, Approved or Denied is told on the run; an approved action runs once, a
    denied one never."""
    awaiting_approval(kube)
    kube.api.patch_spec("Approval", NAMESPACE, APPROVE, {"approved": approved, "by": "carol"})
    assert kube.reconcile(APPROVE, kind="Approval") == REST
    shown = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert shown is not None
    verdict = "approved" if approved else "denied"
    assert {k: shown["status"][k] for k in ("phase", "verdict", "settledBy")} == {
        "phase": "Settled",
        "verdict": verdict,
        "settledBy": "carol",
    }
    assert "source" not in shown["status"]
    event = kube.api.events[-1]
    assert (event.reason, event.message) == (
        "Approved" if approved else "Denied",
        f"place_order (1:0) {verdict} by carol: approval {APPROVE}",
    )
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == (1 if approved else 0)


def test_an_approval_decided_in_the_store_is_mirrored(kube: Operator) -> None:
    """Approved with ``keelgate approve`` (the store); the run's next look asks for the
    Approval's, and the object, never edited, shows it (so Argo CD stops showing it
    Suspended)."""
    awaiting_approval(kube)
    Loop(stores=kube.stores).approve(NAMESPACE, "restock", "1:0", approved=True, by="dave")
    kube.queued.clear()
    kube.reconcile("restock")
    assert (("Approval", NAMESPACE, APPROVE), 0.0) in kube.queued
    assert kube.reconcile(APPROVE, kind="Approval") == REST
    shown = kube.api.get("Approval", NAMESPACE, APPROVE)
    assert shown is not None
    assert (shown["status"]["verdict"], shown["status"]["settledBy"]) == ("approved", "dave")


def test_a_refused_approval_is_told_and_tried_again_later(kube: Operator) -> None:
    """An approval for an action the run does not wait on is refused by the loop: an
    ApprovalRefused Warning, nothing recorded, back in ten seconds."""
    awaiting_approval(kube)
    kube.api.patch_spec(
        "Approval", NAMESPACE, APPROVE, {"action": "9:0", "approved": True, "by": "carol"}
    )
    assert kube.reconcile(APPROVE, kind="Approval") == Requeue(10.0)
    assert kube.api.events[-1].reason == "ApprovalRefused"
    assert Loop(stores=kube.stores).state(NAMESPACE, "restock").approvals == {}


def test_a_decision_object_that_is_gone_is_nothing_to_do(kube: Operator) -> None:
    """A key for an object no longer in the cache (deleted with its run) rests."""
    assert kube.reconcile("nothing-1-x", kind="Reconciliation") == REST
    assert kube.reconcile("nothing-1-x", kind="Approval") == REST
    assert kube.api.writes == []


def test_a_settlement_shows_its_verdict_and_its_source() -> None:
    """The verdicts and the source a Reconciliation shows for a settlement."""
    yes, no = Decided(True, "alice", "confirmer"), Decided(False, "bob")
    assert (yes.verdict, no.verdict) == ("executed", "abandoned")
    assert settled_status(yes, {})["source"] == "confirmer"
    assert settled_status(no, {})["source"] == "human"


def test_a_second_unknown_outcome_gets_its_own_reconciliation_and_is_settled_too(
    kube: Operator,
) -> None:
    """Issue 31's first story: a run stops on an unknown WRITE, alice settles it, the run goes
    on, and a later WRITE's outcome is unknown too. The second stop names its own
    Reconciliation (not the settled first one), which exists and is Pending; settling it (here
    as not executed) lets the run finish, and each WRITE went out once."""
    lost = {"tool": "lost_write", "args": {"sku": "A1", "qty": 2}}
    again = {"tool": "lost_write", "args": {"sku": "B7", "qty": 1}}
    script = [{"actions": [lost]}, {"actions": [again]}, {"done": True, "answer": "ordered"}]
    kube.apply("restock", agentrun_spec(tool="lost_write", script=script))
    assert kube.drive("restock") == [3]
    pass_deadlines(kube.stores)
    kube.api.patch_spec("Reconciliation", NAMESPACE, SETTLE, {"executed": True, "by": "alice"})
    assert kube.reconcile(SETTLE, kind="Reconciliation") == REST
    assert kube.drive("restock") == [0, 3]  # the first iteration's end, then the second stop
    second = action_object_name("restock", "2:0", "lost_write")
    made = kube.api.get("Reconciliation", NAMESPACE, second)
    assert made is not None and made["status"]["phase"] == "Pending"
    assert made["spec"]["action"] == "2:0"
    first = kube.api.get("Reconciliation", NAMESPACE, SETTLE)
    assert first is not None and first["status"]["phase"] == "Settled"
    unknown = kube.condition("restock", "OutcomeUnknown")
    assert unknown["status"] == "True"
    assert second in unknown["message"] and SETTLE not in unknown["message"]
    assert kube.status("restock")["phase"] == "Stopped"
    pass_deadlines(kube.stores)
    kube.api.patch_spec("Reconciliation", NAMESPACE, second, {"executed": False, "by": "bob"})
    assert kube.reconcile(second, kind="Reconciliation") == REST
    record = kube.stores.idempotency.get(NAMESPACE, str(made["spec"]["idempotencyKey"]))
    assert record is not None and (record.state, record.settled_by) == (KeyState.ABANDONED, "bob")
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded"
    assert kube.condition("restock", "OutcomeUnknown")["status"] == "False"
    assert len(operator_tools.ORDERS) == 2  # each lost write's one call, never repeated


def _made_by_an_earlier_release(kube: Operator, run: str) -> str:
    """The run's step has stopped on an unknown outcome, and the operator of an earlier
    release made its Reconciliation, under the name it gave (no digest), Pending; the name."""
    (unknown,) = Loop(stores=kube.stores).state(NAMESPACE, run).unknown
    name = earlier_object_name(run, unknown.action, unknown.tool)
    kube.api.create_object("Reconciliation", NAMESPACE, resources.reconciliation(
        kube.run(run), unknown, name=name))  # fmt: skip
    kube.api.patch_status("Reconciliation", NAMESPACE, name, {"phase": "Pending"})
    return name


def test_reconciliation_names_never_collide_and_one_made_before_an_upgrade_is_kept(
    kube: Operator,
) -> None:
    """Run ``pay-1`` stopped on its action 1:0 under an earlier release, which made its
    Reconciliation pay-1-1-lost-write; the operator is upgraded. Run ``pay`` then stops on
    its action 1:1, whose name without a digest is the same. The upgraded operator keeps
    pay-1's (never makes it again, names it in the run's condition), gives pay's one of its
    own (never takes pay-1's), and each settlement settles its own call only: pay's abandoned,
    pay-1's executed through the object it had before the upgrade; each run finishes, each
    WRITE sent once."""
    kube.apply("pay-1", agentrun_spec(tool="lost_write"))
    kube.reconcile("pay-1")
    assert kube.run_step("pay-1") == 3
    earlier = _made_by_an_earlier_release(kube, "pay-1")
    assert earlier == "pay-1-1-lost-write"
    kube.reconcile("pay-1")
    assert kube.status("pay-1")["stopReason"] == "outcome_unknown"
    assert kube.condition("pay-1", "OutcomeUnknown")["message"] == (
        f"lost_write (1:0): see reconciliation {earlier}"
    )

    spec = agentrun_spec(
        tool="lost_write",
        script=[
            {"actions": [ORDER, {"tool": "lost_write", "args": {"sku": "B2", "qty": 1}}]},
            {"done": True, "answer": "ordered"},
        ],
    )
    spec["tools"].append({**spec["tools"][0], "name": "place_order",
                          "python": {"callable": f"{TOOLS}:place_order"}})  # fmt: skip
    kube.apply("pay", spec)
    assert kube.drive("pay") == [3]
    own = action_object_name("pay", "1:1", "lost_write")
    assert own != earlier and earlier_object_name("pay", "1:1", "lost_write") == earlier
    made = kube.api.get("Reconciliation", NAMESPACE, own)
    assert made is not None and made["spec"]["runName"] == "pay"
    assert kube.api.get("Reconciliation", NAMESPACE, earlier)["spec"]["runName"] == "pay-1"  # type: ignore[index]
    assert kube.condition("pay", "OutcomeUnknown")["message"] == (
        f"lost_write (1:1): see reconciliation {own}"
    )
    assert sorted(o["metadata"]["name"] for o in kube.api.of_kind("Reconciliation")) == sorted(
        [earlier, own]
    )

    pass_deadlines(kube.stores)
    kube.api.patch_spec("Reconciliation", NAMESPACE, own, {"executed": False, "by": "bob"})
    assert kube.reconcile(own, kind="Reconciliation") == REST
    assert kube.status("pay-1")["stopReason"] == "outcome_unknown"  # not settled with pay's
    kube.drive("pay")
    assert kube.status("pay")["phase"] == "Succeeded"
    kube.api.patch_spec("Reconciliation", NAMESPACE, earlier, {"executed": True, "by": "alice"})
    assert kube.reconcile(earlier, kind="Reconciliation") == REST
    settled = kube.api.get("Reconciliation", NAMESPACE, earlier)
    assert settled is not None
    assert (settled["status"]["phase"], settled["status"]["verdict"]) == ("Settled", "executed")
    kube.drive("pay-1")
    assert kube.status("pay-1")["phase"] == "Succeeded"
    assert kube.condition("pay-1", "OutcomeUnknown")["status"] == "False"
    assert sorted(o["metadata"]["name"] for o in kube.api.of_kind("Reconciliation")) == sorted(
        [earlier, own]
    )
    # Each WRITE went out once: pay's order and its lost write, pay-1's lost write.
    assert len(operator_tools.ORDERS) == 3
