"""An approval is for the call as it will be sent: the tool's definition, not only its name.

Why it exists (issue 46, item 1): two people approved ``place_order`` (``POST /orders``); the
run's creator then changed the tool's URL (or its method) and resumed, and the call went out to
the new place under the approved key. What decides a call's effect (an HTTP tool's method, URL,
headers' names; an MCP tool's server and remote tool; a Python tool's callable; the confirmer)
is now part of what a decision is made on: an edit after a decision voids it (the run asks
again, and the chain says what changed and whose approval it voided), and no call goes to a
definition other than the one its action is bound to. A call already made (its outcome known,
unknown or in flight) keeps its definition: its record decides, it is never sent again under its
key, and a confirmer does not vouch for a call made under another definition. The tests run the
real loop over real SQLite files with HTTP tools against two real shops on loopback, and count
what each shop received.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fakes.downstream import Shop
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.http import HttpTool
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.calls import definition_of, fingerprint
from keelgate.core.gateway import Gateway
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import (
    Action,
    ApprovalRule,
    ResultStatus,
    SideEffect,
    StopReason,
    UnknownAction,
    idempotency_key,
)
from keelgate.errors import SettleError
from keelgate.kube.naming import action_object_name
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing.deadlines import pass_deadlines
from support import operator_tools
from support.operator_rig import NAMESPACE, Operator, agentrun_spec

RULE = ApprovalRule(required=2, groups=("payments",), not_creator=True)
PAYMENTS = ("payments",)
ORDER = {"sku": "A1", "qty": 2}
SCRIPT = [
    {"actions": [{"tool": "place_order", "args": ORDER}]},
    {"done": True, "answer": "ordered"},
]
SPEC = LoopSpec("shop", "pay", "Order A1", budget=Budget(max_iterations=5), creator="alice")


@pytest.fixture
def shops() -> Iterator[tuple[Shop, Shop]]:
    """The shop the order was approved for, and another one."""
    first, second = Shop().start(), Shop().start()
    yield first, second  # type: ignore[misc]
    first.stop()
    second.stop()


def order_tool(
    shop: Shop,
    *,
    method: str = "POST",
    path: str = "/orders",
    headers: Mapping[str, str] | None = None,
    timeout: float = 5,
) -> HttpTool:
    return HttpTool(
        "place_order",
        url=f"{shop.url}{path}",
        method=method,
        side_effect=SideEffect.WRITE,
        approval=RULE,
        headers={"Authorization": "Bearer one"} if headers is None else headers,
        timeout_seconds=timeout,
    )


def opened(path: Path, tool: HttpTool, **options: Any) -> tuple[Loop, Stores]:
    """A loop over the SQLite file at ``path`` with ``tool`` as its one tool: a process
    started again, with the manifest as it is now."""
    stores = Stores.of(SQLiteStore(path))
    return Loop(stores=stores, model=ScriptedModel(SCRIPT), tools=[tool], **options), stores


def received(*shops: Shop) -> int:
    return sum(len(shop.received) for shop in shops)


def approve_both(loop: Loop) -> None:
    for person in ("bob", "carol"):
        loop.approve("shop", "pay", "1:0", approved=True, by=person, groups=PAYMENTS)


EDITS = {
    "url": lambda first, second: order_tool(second),
    "method": lambda first, second: order_tool(first, method="PUT"),
    "header": lambda first, second: order_tool(
        first, headers={"Authorization": "Bearer one", "X-Account": "mallory"}
    ),
}
CHANGED = {"url": ["http.url"], "method": ["http.method"], "header": ["http.headers"]}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_after_the_approvals_voids_them_and_nothing_is_sent(
    edit: str, shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """bob and carol approve POST /orders (2 of 2); the run's creator edits the tool (its URL to
    another shop, its method, or a header added) before the call runs. The resumed run sends
    nothing anywhere and asks again (0 of 2), and the chain has ``loop.call_changed`` naming
    the part that changed and whose approvals it voided. Once both approve again, the call
    goes out once, as edited; the first shop gets nothing after the edit."""
    first, second = shops
    db = tmp_path / "kg.db"
    loop, stores = opened(db, order_tool(first))
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    approve_both(loop)
    stores.close()

    edited = EDITS[edit](first, second)
    loop, stores = opened(db, edited)
    again = loop.run_or_resume(SPEC)
    assert again.stop.reason is StopReason.AWAITING_APPROVAL, again.stop.message
    assert received(first, second) == 0, "an approved call was sent as edited, unapproved"
    (pending,) = again.pending_approvals
    assert (pending.tally(), pending.approved_by) == ("0 of 2", ())
    assert pending.definition == fingerprint(definition_of(edited))
    (changed,) = [e for e in loop.audit("shop", "pay") if e.type == "loop.call_changed"]
    assert changed.data == {
        "action": "1:0",
        "tool": "place_order",
        "changed": CHANGED[edit],
        "voided": ["bob", "carol"],
    }
    # Resumed again with nobody deciding: still nothing, and the change is told once.
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    assert [e.type for e in loop.audit("shop", "pay")].count("loop.call_changed") == 1

    approve_both(loop)
    done = loop.run_or_resume(SPEC)
    assert done.stop.reason is StopReason.GOAL_MET, done.stop.message
    target = second if edit == "url" else first
    other = first if edit == "url" else second
    assert len(target.received) == 1 and received(other) == 0
    sent = target.received[0]
    assert sent.method == ("PUT" if edit == "method" else "POST")
    started = [e for e in loop.audit("shop", "pay") if e.type == "loop.action_started"]
    assert [e.data["definition"] for e in started] == [pending.definition]
    stores.close()


def test_an_edit_that_changes_nothing_the_call_does_keeps_the_approvals(
    shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """A header's value rotated (a credential), the description or the time limit changed: the
    call is the same one, so the approvals stand and it goes out once, to the shop approved."""
    first, second = shops
    db = tmp_path / "kg.db"
    loop, stores = opened(db, order_tool(first))
    loop.run_or_resume(SPEC)
    approve_both(loop)
    stores.close()
    rotated = order_tool(first, headers={"Authorization": "Bearer two"}, timeout=9)
    loop, stores = opened(db, rotated)
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.GOAL_MET
    assert (len(first.received), received(second)) == (1, 0)
    assert "loop.call_changed" not in [e.type for e in loop.audit("shop", "pay")]
    stores.close()


def shown_then_edited(shops: tuple[Shop, Shop], db: Path) -> tuple[Loop, Stores, str, str]:
    """The call waits for approval on the first shop's tool (as a person was shown it), then
    the tool is edited to the second shop's: the loop and stores over the edited tool, the
    definition shown before the edit, and the one now."""
    first, second = shops
    loop, stores = opened(db, order_tool(first))
    shown = loop.run_or_resume(SPEC).pending_approvals[0].definition
    stores.close()
    loop, stores = opened(db, order_tool(second))
    now = loop.run_or_resume(SPEC).pending_approvals[0].definition
    assert now and shown and now != shown
    return loop, stores, shown, now


def test_a_decision_on_the_tool_as_it_was_before_an_edit_is_refused(
    shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """A person shown the call before an edit (its definition's fingerprint) decides after the
    run was bound to the edited tool: refused in one line saying the tool changed, nothing
    recorded; a decision naming the definition now is taken."""
    loop, stores, shown, now = shown_then_edited(shops, tmp_path / "kg.db")
    with pytest.raises(SettleError, match="the tool was changed since; look again"):
        loop.approve(
            "shop", "pay", "1:0", approved=True, by="bob", groups=PAYMENTS, definition=shown
        )
    assert loop.state("shop", "pay").approvals == {}
    loop.approve("shop", "pay", "1:0", approved=True, by="bob", groups=PAYMENTS, definition=now)
    assert [d.definition for d in loop.state("shop", "pay").approvals["1:0"]] == [now]
    stores.close()


def test_a_deny_on_the_tool_as_it_was_before_an_edit_still_denies(
    shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """bob denies the call he was shown; alice edits the tool before the deny reaches the
    store (the operator had not recorded it yet): the deny is recorded, with the definition it
    was made on, and denies. carol's approval of the edited call is then refused, and neither
    shop receives the order (the simulator found the deny voided and the call run on one
    approval)."""
    loop, stores, shown, now = shown_then_edited(shops, tmp_path / "kg.db")
    loop.approve("shop", "pay", "1:0", approved=False, by="bob", groups=PAYMENTS, definition=shown)
    decided = loop.state("shop", "pay").approvals["1:0"]
    assert [(d.by, d.approved, d.definition) for d in decided] == [("bob", False, shown)]
    with pytest.raises(SettleError, match="already denied by bob"):
        loop.approve(
            "shop", "pay", "1:0", approved=True, by="carol", groups=PAYMENTS, definition=now
        )
    loop.run_or_resume(SPEC)
    assert received(*shops) == 0
    denied = [e for e in loop.audit("shop", "pay") if e.type == "loop.denied"]
    assert [(e.actor, e.data["definition"]) for e in denied] == [("bob", shown)]
    stores.close()


class CountingConfirmer:
    """A confirmer that asks the shop it was built for, and counts how often it was asked."""

    def __init__(self, shop: Shop, name: str = "shop-confirmer") -> None:
        self.shop = shop
        self.name = name
        self.asked = 0

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        self.asked += 1
        return self.shop.orders[action.idempotency_key] > 0


@pytest.mark.parametrize("settled", [True, False], ids=["executed", "not-executed"])
def test_a_call_whose_outcome_is_unknown_is_never_sent_to_the_edited_tool(
    settled: bool, shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """The approved order goes to the first shop and times out (outcome unknown). The tool is
    then pointed at the second shop, with a confirmer that asks the second shop. The resumed
    run stops outcome_unknown without asking that confirmer (it would ask another system than
    the one the call went to) and sends nothing; a person settles it; the run goes on and the
    second shop never receives the call under its key, whichever way it was settled."""
    first, second = shops
    first.mode, first.delay = "slow", 1.0
    db = tmp_path / "kg.db"
    loop, stores = opened(db, order_tool(first, timeout=0.3))
    loop.run_or_resume(SPEC)
    approve_both(loop)
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.OUTCOME_UNKNOWN
    assert len(first.received) == 1
    stores.close()

    confirmer = CountingConfirmer(second)
    loop, stores = opened(db, order_tool(second), confirmer=confirmer)
    stopped = loop.run_or_resume(SPEC)
    assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
    assert confirmer.asked == 0 and received(second) == 0
    pass_deadlines(stores)
    loop.reconcile("shop", "pay", "1:0", executed=settled, by="dave")
    done = loop.run_or_resume(SPEC)
    assert done.stop.reason is StopReason.GOAL_MET, done.stop.message
    assert received(second) == 0 and len(first.received) == 1
    assert "loop.call_changed" not in [e.type for e in loop.audit("shop", "pay")]
    stores.close()


def test_a_confirmer_changed_after_approval_voids_it(
    shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """The confirmer vouches for a call's outcome: approvals given while one confirmer was in
    force do not carry over to another (asked again, the chain naming the confirmer)."""
    first, _ = shops
    db = tmp_path / "kg.db"
    loop, stores = opened(db, order_tool(first), confirmer=CountingConfirmer(first, "a"))
    loop.run_or_resume(SPEC)
    approve_both(loop)
    stores.close()
    loop, stores = opened(db, order_tool(first), confirmer=CountingConfirmer(first, "b"))
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    assert received(first) == 0
    (changed,) = [e for e in loop.audit("shop", "pay") if e.type == "loop.call_changed"]
    assert changed.data["changed"] == ["confirmer"]
    stores.close()


def test_an_action_and_approvals_saved_before_definitions_still_count(
    shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """A checkpoint written by an earlier release (no definition on its action, none on its
    decisions): the upgraded run binds the action without a word, loses no decision, counts
    each once, and sends the call once."""
    first, second = shops
    db = tmp_path / "kg.db"
    loop, stores = opened(db, order_tool(first))
    loop.run_or_resume(SPEC)
    approve_both(loop)
    store = stores.checkpoints
    checkpoint = store.load("shop", "pay")
    assert checkpoint is not None
    document = json.loads(json.dumps(checkpoint.state))
    for action in document["plan"]["actions"]:
        action.pop("definition")
    for pending in document["pending"]:
        pending.pop("definition", None)
    for decision in document["approvals"]["1:0"]:
        decision.pop("definition")
    assert "definition" not in json.dumps(document)
    assert isinstance(store, SQLiteStore)
    with store._statement() as conn:
        conn.execute(
            "UPDATE keelgate_checkpoints SET state = ? WHERE tenant = ? AND run = ?",
            (json.dumps(document), "shop", "pay"),
        )
    stores.close()
    loop, stores = opened(db, order_tool(first))
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.GOAL_MET
    assert (len(first.received), received(second)) == (1, 0)
    types = [e.type for e in loop.audit("shop", "pay")]
    assert "loop.call_changed" not in types and types.count("loop.approved") == 2
    stores.close()


def test_the_gateway_never_sends_a_call_under_another_definition_than_its_actions(
    shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """The last door: an action bound to the first shop's tool, offered to a gateway whose tool
    now points at the second shop, is refused with the part named; nothing is claimed or
    sent."""
    first, second = shops
    stores = Stores.of(SQLiteStore(tmp_path / "kg.db"))
    before, after = order_tool(first), order_tool(second)
    key = idempotency_key("shop", "pay", "place_order", ORDER)
    action = Action("1:0", "place_order", ORDER, key, definition=definition_of(before))
    gateway = Gateway(
        {"place_order": after},
        stores.idempotency,
        tenant="shop",
        run="pay",
        allowed=frozenset(SideEffect),
        emit=lambda draft: None,
        definitions={"place_order": definition_of(after)},
    )
    result = gateway.call(action)
    assert result.status is ResultStatus.REFUSED
    assert "its definition changed since the call was planned (http.url)" in result.error
    assert stores.idempotency.get("shop", key) is None
    assert received(first, second) == 0
    stores.close()


def _noop(args: dict[str, Any], *, idempotency_key: str | None) -> None:
    return None


def _other(args: dict[str, Any], *, idempotency_key: str | None) -> None:
    return None


def test_each_part_that_decides_a_call_changes_its_fingerprint() -> None:
    """What decides a call, for each kind of tool, moves the fingerprint; what does not (a
    header's value, the description, the time limit) leaves it."""
    base = HttpTool("t", url="http://shop.test/orders", method="POST", headers={"A": "1"})

    def same(a: Any, b: Any) -> bool:
        return fingerprint(definition_of(a)) == fingerprint(definition_of(b))

    assert same(base, HttpTool("t", url="http://shop.test/orders", method="POST",
                               headers={"a": "2"}, description="x", timeout_seconds=3))  # fmt: skip
    assert not same(base, HttpTool("t", url="http://shop.test/steal", method="POST",
                                   headers={"A": "1"}))  # fmt: skip
    assert not same(base, HttpTool("t", url="http://shop.test/orders", method="DELETE",
                                   headers={"A": "1"}))  # fmt: skip
    assert not same(base, HttpTool("t", url="http://shop.test/orders", method="POST"))
    python = PythonTool("t", _noop, reference="shop.tools:place")
    assert same(python, PythonTool("t", _other, reference="shop.tools:place"))
    assert not same(python, PythonTool("t", _noop, reference="shop.tools:steal"))
    assert not same(PythonTool("t", _noop), PythonTool("t", _other))
    confirmed = definition_of(base, CountingConfirmer(Shop(), "a"))
    assert confirmed != definition_of(base, CountingConfirmer(Shop(), "b"))
    assert confirmed != definition_of(base)


def test_a_call_in_flight_is_finished_as_sent_never_sent_to_the_edited_tool(
    tmp_path: Path,
) -> None:
    """An approved WRITE times out while its function still runs (in flight in this process);
    the tool is then pointed at another function. Resuming meanwhile is refused as busy; once
    the first call ends, the resumed run replays its result: the new function is never called,
    and the action keeps the definition its call was made under."""
    import threading

    from keelgate.errors import RunBusy

    go = threading.Event()
    first: list[str | None] = []
    second: list[str | None] = []

    def place(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        first.append(idempotency_key)
        go.wait(10)
        return {"placed": True}

    def steal(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        second.append(idempotency_key)
        return {"stolen": True}

    def tool(function: Any, reference: str) -> PythonTool:
        return PythonTool(
            "place_order",
            function,
            SideEffect.WRITE,
            requires_approval=True,
            timeout_seconds=0.2,
            reference=reference,
        )

    stores = Stores.of(SQLiteStore(tmp_path / "kg.db"))
    loop = Loop(stores=stores, model=ScriptedModel(SCRIPT), tools=[tool(place, "shop:place")])
    plain = replace(SPEC, creator="")
    try:
        loop.run_or_resume(plain)
        loop.approve("shop", "pay", "1:0", approved=True, by="bob")
        assert loop.run_or_resume(plain).stop.reason is StopReason.OUTCOME_UNKNOWN
        edited = Loop(
            stores=stores,
            model=ScriptedModel(SCRIPT),
            tools=[tool(steal, "shop:steal")],
            busy_wait=0.2,
        )
        with pytest.raises(RunBusy):
            edited.run_or_resume(plain)
    finally:
        go.set()
    key = idempotency_key("shop", "pay", "place_order", ORDER)
    deadline = time.monotonic() + 10
    while stores.idempotency.get("shop", key).state.value != "completed":  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    done = edited.run_or_resume(plain)
    assert done.stop.reason is StopReason.GOAL_MET, done.stop.message
    assert (first, second) == ([key], [])
    trail = edited.audit("shop", "pay")
    started = [e.data["definition"] for e in trail if e.type == "loop.action_started"]
    assert started == [fingerprint(definition_of(tool(place, "shop:place")))]
    assert "loop.call_changed" not in [e.type for e in trail]
    stores.close()


def test_a_step_image_edited_after_the_approvals_voids_them_and_nothing_is_sent(
    tmp_path: Path,
) -> None:
    """A Python tool's code is its step image's: bob and carol approve ``place_order`` run from
    ``shop:v1`` (2 of 2); alice points ``spec.step.image`` at ``shop:v2`` (another image may
    hold other code under the same callable's name) before the step runs. The operator's step
    places nothing: no approval on the Approval can count any more, so it is settled as
    expired and a new one (round 2) asks (0 of 2) for the call as it is now, and the chain says
    ``python.image`` changed and whose approvals it voided. An edit that leaves the
    image alone (a longer budget) keeps the approvals. Approved again, one order is placed."""
    approval = action_object_name("restock", "1:0", "place_order")
    payments = ["payments", "system:authenticated"]
    operator_tools.ORDERS.clear()
    kube = Operator(tmp_path)
    try:
        spec = agentrun_spec(
            rule={"required": 2, "groups": ["payments"], "notCreator": True},
            step={"image": "registry.example/shop:v1"},
        )
        kube.apply("restock", spec, annotations={"keelgate.dev/created-by": "alice"})
        assert kube.drive("restock") == [3]

        def decide(*people: str) -> None:
            for person in people:
                body = kube.api.get("Approval", NAMESPACE, approval)
                assert body is not None
                entry = {"by": person, "groups": payments, "approved": True}
                decisions = [*body["spec"].get("decisions", []), entry]
                kube.api.patch_spec("Approval", NAMESPACE, approval, {"decisions": decisions})
            kube.reconcile(approval, kind="Approval")

        def status() -> dict[str, Any]:
            body = kube.api.get("Approval", NAMESPACE, approval)
            assert body is not None
            return dict(body["status"])

        decide("bob", "carol")
        approved = status()
        assert (approved["phase"], approved["progress"]) == ("Settled", "2 of 2")
        v2 = {"step": {"image": "registry.example/shop:v2"}}
        kube.api.patch_spec("AgentRun", NAMESPACE, "restock", v2)
        kube.drive("restock")
        kube.reconcile(approval, kind="Approval")
        assert operator_tools.ORDERS == [], "an approved call ran from another image, unapproved"
        # Nothing on it can count any more: it is settled as expired, and asked afresh.
        old = status()
        assert (old["phase"], old["verdict"]) == ("Settled", "expired")
        assert "made on an earlier definition of the tool" in old["message"]
        approval = old["askedAgainAs"]
        assert approval == action_object_name("restock", "1:0", "place_order", round=2)
        kube.reconcile("restock")
        again = status()
        assert (again["phase"], again["progress"]) == ("Pending", "0 of 2")
        assert again["definition"] != approved["definition"]
        (changed,) = [
            e
            for e in Loop(stores=kube.stores).audit(NAMESPACE, "restock")
            if e.type == "loop.call_changed"
        ]
        assert (changed.data["changed"], changed.data["voided"]) == (
            ["python.image"],
            ["bob", "carol"],
        )

        # The server dates each write in whole seconds: approvals in the second of the change
        # could have been made before it and would not count (the message says to look again).
        time.sleep(1.0 - time.time() % 1.0)
        decide("bob", "carol")
        kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"budget": {"maxIterations": 6}})
        kube.drive("restock")
        assert kube.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
    finally:
        kube.close()
        operator_tools.ORDERS.clear()


def _kubectl_wrote(kube: Operator, name: str, at: float) -> None:
    """The API server's record of a person's spec write of the Approval ``name`` at ``at``
    (``metadata.managedFields``: whole seconds, one entry per manager, its time the latest
    write), as a real one keeps it; the in-memory one keeps none."""
    stored = kube.api.objects[("Approval", NAMESPACE, name)]
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    stored["metadata"]["managedFields"] = [
        {"manager": "kubectl-patch", "operation": "Update", "time": moment,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}},
    ]  # fmt: skip
    kube.cache.put("Approval", stored)


@pytest.mark.parametrize("admission", ["policy", "no-policy"])
def test_a_one_decision_approval_written_before_an_edit_never_counts_after_the_rebind(
    admission: str, tmp_path: Path
) -> None:
    """dave approves ``place_order`` with the one-decision form (``spec.approved``, ``spec.by``:
    no definition in it) while the Approval shows the call from ``shop:v1``; at that moment
    alice points the step at ``shop:v2``, and the step pod binds the call to the edited tool
    before the operator records dave's approval. Where the chart's mutating policy is
    installed it stamped the definition the object showed (``spec.definition``); where it is
    not, the API server's record of dave's write says it was made before the rebind. Either
    way his approval counts for nothing: no order is placed, the Approval still waits (0 of
    1) and says why, and the run asks again. carol's approval of the call as it is now runs it
    once (the simulator, seed 4648476, found dave's approval carried to the edited tool)."""
    from keelgate.core import clocks

    approval = action_object_name("restock", "1:0", "place_order")
    operator_tools.ORDERS.clear()
    now = [1_800_000_000.0]
    with clocks.simulated(wall=lambda: now[0], boot=time.monotonic):
        kube = Operator(tmp_path, clock=lambda: now[0])
        try:
            spec = agentrun_spec(rule={"required": 1}, step={"image": "registry.example/shop:v1"})
            kube.apply("restock", spec, annotations={"keelgate.dev/created-by": "alice"})
            assert kube.drive("restock") == [3]
            kube.reconcile(approval, kind="Approval")
            body = kube.api.get("Approval", NAMESPACE, approval)
            assert body is not None
            shown = body["status"]["definition"]

            now[0] += 10
            decided: dict[str, Any] = {"approved": True, "by": "dave"}
            if admission == "policy":
                decided["definition"] = shown  # as the mutating policy stamps it
            kube.api.patch_spec("Approval", NAMESPACE, approval, decided)
            if admission == "no-policy":
                _kubectl_wrote(kube, approval, now[0])
            kube.api.patch_spec(
                "AgentRun", NAMESPACE, "restock", {"step": {"image": "registry.example/shop:v2"}}
            )
            now[0] += 2
            kube.drive("restock")  # the step binds the call to shop:v2, and asks
            now[0] += 2
            kube.reconcile(approval, kind="Approval")
            kube.drive("restock")
            assert operator_tools.ORDERS == [], "dave's approval of v1's call ran v2's, unapproved"
            state = Loop(stores=kube.stores).state(NAMESPACE, "restock")
            assert state.approvals.get("1:0", ()) == ()
            assert [p.action for p in state.pending] == ["1:0"]
            assert state.pending[0].definition != shown
            body = kube.api.get("Approval", NAMESPACE, approval)
            assert body is not None
            status = body["status"]
            assert (status["phase"], status["progress"]) == ("Pending", "0 of 1")
            assert "dave" in status["message"] and "look again" in status["message"]

            now[0] += 5
            entry = {"by": "carol", "groups": [], "approved": True}
            kube.api.patch_spec("Approval", NAMESPACE, approval, {"decisions": [entry]})
            if admission == "no-policy":
                _kubectl_wrote(kube, approval, now[0])
            kube.reconcile(approval, kind="Approval")
            kube.drive("restock")
            body = kube.api.get("Approval", NAMESPACE, approval)
            assert kube.status("restock")["phase"] == "Succeeded"
            assert len(operator_tools.ORDERS) == 1
        finally:
            kube.close()
            operator_tools.ORDERS.clear()


def test_a_decision_made_under_one_binding_counts_not_after_the_call_is_bound_back_again(
    shops: tuple[Shop, Shop], tmp_path: Path
) -> None:
    """The call is bound to the first shop, then (each edit read by a step) to the second, back
    to the first, and to the second again. bob and carol approved (an Approval's entries,
    stating when they decided) while it went to the first shop, and the operator records their
    decisions only after the last rebind: they were made on a definition the call is no longer
    bound to, and are refused, though the call was bound to the second shop once before (the
    chain tells every rebind, not only the first to each definition). Nothing is sent."""
    from keelgate.core import clocks
    from keelgate.core.audit import utc_now

    first, second = shops
    db = tmp_path / "kg.db"
    now = [1_800_000_000.0]
    with clocks.simulated(wall=lambda: now[0], boot=time.monotonic):
        made = ""
        for number, shop in enumerate((first, second, first, second)):
            loop, stores = opened(db, order_tool(shop))
            assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
            stores.close()
            now[0] += 5
            if number == 2:
                made = utc_now()  # both decide now, on the call to the first shop
            now[0] += 5
        loop, stores = opened(db, order_tool(second))
        rebinds = [e for e in loop.audit("shop", "pay") if e.type == "loop.call_changed"]
        assert len(rebinds) == 3, [e.data for e in rebinds]
        for person in ("bob", "carol"):
            with pytest.raises(SettleError, match="before its tool was changed"):
                loop.approve(
                    "shop", "pay", "1:0", approved=True, by=person, groups=PAYMENTS, at=made
                )
        again = loop.run_or_resume(SPEC)
        stores.close()
    assert again.stop.reason is StopReason.AWAITING_APPROVAL
    assert received(first, second) == 0, "approvals of the first shop's call sent the second's"
