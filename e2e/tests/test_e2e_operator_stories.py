"""Three stories of the operator no other test pinned down (issue 31), told on the control plane.

Each was a planted bug the whole suite once let through: a second unknown outcome in one run
pointing at the wrong Reconciliation, failpoints armed by an operator started without
--allow-failpoints, and `executed: false` read as "not decided yet". Each test here fails on such
a bug (the run stays stopped, a step pod dies, the run hangs) and passes on the correct code.
They must never depend on objects outside their own namespace, and leave the session's operator
running.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from keelgate.kube.naming import action_object_name, earlier_object_name
from keelgate.kube.times import parse_time

from keelgate_e2e import runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import OperatorPod, OperatorProcess
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.runs import agentrun, apply, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, condition, wait_for

pytestmark = pytest.mark.e2e

RECONCILIATIONS = "/apis/keelgate.dev/v1alpha1/namespaces/{ns}/reconciliations/{name}"


def _events(admin: Kube, namespace: str, name: str) -> list[JSON]:
    listed = admin.get(
        f"/api/v1/namespaces/{namespace}/events",
        {"fieldSelector": f"involvedObject.name={name},involvedObject.kind=AgentRun"},
    )
    return list(listed["items"])


def _unknown_names(admin: Kube, namespace: str, run: str, reconciliation: str) -> JSON:
    """The run, once stopped with OutcomeUnknown naming ``reconciliation``, which exists."""

    def stopped() -> JSON | None:
        current = runs.get_run(admin, namespace, run)
        unknown = condition(current, "OutcomeUnknown")
        if unknown and unknown["status"] == "True" and reconciliation in unknown["message"]:
            return current
        return None

    found = wait_for(stopped, timeout=120, interval=0.5, what=f"OutcomeUnknown on {reconciliation}")
    path = RECONCILIATIONS.format(ns=namespace, name=reconciliation)
    wait_for(lambda: admin.exists(path), timeout=30, what=f"the Reconciliation {reconciliation}")
    return found


def _settle(alice: Kubectl, name: str, executed: bool) -> None:
    body = {"spec": {"executed": executed, "by": "alice"}}
    alice("patch", "reconciliation", name, "--type=merge", "-p", json.dumps(body))


def test_two_unknown_outcomes_in_one_run_each_get_their_own_reconciliation(
    operator: OperatorPod, tenant: str, admin: Kube, alice: Kubectl
) -> None:
    """A shop that answers after the tool's 10 s limit: the run's first order times out (its
    outcome unknown), the run stops naming its Reconciliation; alice checks the shop and
    settles it executed with `kubectl patch`; the run goes on, and its second order times out
    too. The second stop names its own Reconciliation, of action 2:0 (the first is
    Settled), alice settles that one too, and the run succeeds with each order placed once."""
    slow = ShopServer().start()
    slow.shop.delay = 12
    try:
        run = agentrun("restock", slow, [[order("T1", 1)], [order("T2", 1)]])
        apply(alice, run)
        one, two = (action_object_name("restock", a, "place_order") for a in ("1:0", "2:0"))
        _unknown_names(admin, tenant, "restock", one)
        wait_for(lambda: slow.shop.count() == 1, timeout=30, what="the first order")
        _settle(alice, one, True)
        stopped = _unknown_names(admin, tenant, "restock", two)
        unknown = condition(stopped, "OutcomeUnknown")
        assert unknown is not None and one not in unknown["message"]
        first = admin.get(RECONCILIATIONS.format(ns=tenant, name=one))
        assert first["status"]["phase"] == "Settled"
        second = admin.get(RECONCILIATIONS.format(ns=tenant, name=two))
        assert second["status"]["phase"] == "Pending" and second["spec"]["action"] == "2:0"
        wait_for(lambda: slow.shop.count() == 2, timeout=30, what="the second order")
        _settle(alice, two, True)
        done = wait_phase(admin, tenant, "restock", "Succeeded", timeout=120)
        assert condition(done, "OutcomeUnknown")["status"] == "False"  # type: ignore[index]
        counts = slow.shop.by_key()
        assert len(counts) == 2 and max(counts.values()) == 1
        reconciled = [
            (e.actor, e.data["verdict"])
            for e in runs.audit_events(operator.cluster.dsn, tenant, "restock")
            if e.type == "loop.reconciled"
        ]
        assert reconciled == [("alice", "executed"), ("alice", "executed")]
    finally:
        slow.stop()


def test_not_executed_settled_with_kubectl_abandons_the_action_and_the_run_finishes(
    operator: OperatorPod, tenant: str, admin: Kube, alice: Kubectl
) -> None:
    """A request lost on its way (the shop holds it past the tool's limit and drops it untaken):
    the outcome is unknown. alice waits until the Reconciliation's `notExecutedAfter` (until
    then the call may still be sent, and a "not executed" written earlier is refused), asks the
    shop (no order under the key) and patches `executed: false`; the operator records it, the
    action is abandoned in the store and on the audit chain, the run
    plans again (the model is told the order did not run) and succeeds; no order was placed,
    and none is retried under the abandoned key."""
    lossy = ShopServer().start()
    lossy.shop.swallow = 12
    try:
        apply(alice, agentrun("lost", lossy, [[order("L1", 1)]]))
        lost = action_object_name("lost", "1:0", "place_order")
        stopped = _unknown_names(admin, tenant, "lost", lost)
        assert stopped["status"]["stopReason"] == "outcome_unknown"
        rec = admin.get(RECONCILIATIONS.format(ns=tenant, name=lost))
        key = rec["spec"]["idempotencyKey"]
        wait_for(lambda: lossy.shop.swallowed == 1, timeout=30, what="the request to be dropped")
        path = RECONCILIATIONS.format(ns=tenant, name=lost)
        shown = wait_for(
            lambda: (admin.get(path).get("status") or {}).get("notExecutedAfter"),
            timeout=30,
            what="notExecutedAfter",
        )
        after = parse_time(str(shown))
        assert after is not None
        wait_for(
            lambda: time.time() > after.timestamp() + 1,
            timeout=120,
            what="notExecutedAfter to pass",
        )
        assert lossy.shop.by_key()[key] == 0
        _settle(alice, lost, False)
        done = wait_phase(admin, tenant, "lost", "Succeeded", timeout=120)
        assert condition(done, "OutcomeUnknown")["status"] == "False"  # type: ignore[index]
        settled = admin.get(RECONCILIATIONS.format(ns=tenant, name=lost))
        assert (settled["status"]["verdict"], settled["status"]["settledBy"]) == (
            "abandoned",
            "alice",
        )
        events = runs.audit_events(operator.cluster.dsn, tenant, "lost")
        reconciled = [e for e in events if e.type == "loop.reconciled"]
        assert [(e.actor, e.data["verdict"]) for e in reconciled] == [("alice", "abandoned")]
        assert reconciled[0].data["idempotencyKey"] == key
        assert lossy.shop.count() == 0 and lossy.shop.swallowed == 1
    finally:
        lossy.stop()


def test_a_reconciliation_made_before_an_upgrade_is_kept_and_settles_its_run(
    operator: OperatorPod, tenant: str, admin: Kube, alice: Kubectl, shop: ShopServer
) -> None:
    """A run stopped on an unknown outcome under an earlier release, whose Reconciliation has
    the name that release gave it (no digest): while the operator is down for the upgrade, the
    object is as that release left it. The upgraded operator, at its start, finds it for this
    very run, action and tool: it makes none under today's name and names the earlier one in
    OutcomeUnknown; alice settles it there, and the run succeeds with the order placed once."""
    crash = {"keelgate.dev/failpoints": "after_gateway_call@1"}
    apply(alice, agentrun("upgraded", shop, [[order("G1", 1)]], annotations=crash))
    today = action_object_name("upgraded", "1:0", "place_order")
    earlier = earlier_object_name("upgraded", "1:0", "place_order")
    assert earlier == "upgraded-1-place-order" and today != earlier
    _unknown_names(admin, tenant, "upgraded", today)
    made = admin.get(RECONCILIATIONS.format(ns=tenant, name=today))
    key = str(made["spec"]["idempotencyKey"])
    operator.stop()
    try:
        admin.delete(RECONCILIATIONS.format(ns=tenant, name=today))
        wait_for(
            lambda: not admin.exists(RECONCILIATIONS.format(ns=tenant, name=today)),
            what=f"{today} gone",
        )
        meta = {k: made["metadata"][k] for k in ("labels", "ownerReferences")}
        admin.create(
            f"/apis/keelgate.dev/v1alpha1/namespaces/{tenant}/reconciliations",
            {"apiVersion": made["apiVersion"], "kind": "Reconciliation",
             "metadata": {"name": earlier, **meta}, "spec": made["spec"]},
        )  # fmt: skip
        admin.patch(
            RECONCILIATIONS.format(ns=tenant, name=earlier) + "/status",
            {"status": made["status"]},
        )
    finally:
        operator.start()
    _unknown_names(admin, tenant, "upgraded", earlier)
    assert not admin.exists(RECONCILIATIONS.format(ns=tenant, name=today))
    _settle(alice, earlier, True)
    done = wait_phase(admin, tenant, "upgraded", "Succeeded", timeout=120)
    assert condition(done, "OutcomeUnknown")["status"] == "False"  # type: ignore[index]
    settled = admin.get(RECONCILIATIONS.format(ns=tenant, name=earlier))
    assert (settled["status"]["verdict"], settled["status"]["settledBy"]) == ("executed", "alice")
    assert not admin.exists(RECONCILIATIONS.format(ns=tenant, name=today))
    assert shop.shop.by_key()[key] == 1


@pytest.fixture
def strict_operator(operator_process: OperatorPod, cluster: Cluster) -> Iterator[OperatorProcess]:
    """The operator as production runs it: without --allow-failpoints (the session's operator,
    which has the flag, is stopped meanwhile)."""
    operator_process.stop()
    strict = OperatorProcess(
        cluster,
        operator_process.kubeconfig,
        name="operator-strict",
        env=dict(operator_process.env),
        allow_failpoints=False,
    )
    strict.start()
    try:
        yield strict
    finally:
        strict.stop()
        operator_process.start()


def test_an_operator_without_the_flag_ignores_failpoints_and_says_so(
    strict_operator: OperatorProcess,
    tenant: str,
    admin: Kube,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """alice (who may edit AgentRuns) annotates her run with `keelgate.dev/failpoints:
    after_gateway_call@1`, which on a development cluster would kill its step pod right after
    the order. An operator started without --allow-failpoints posts one FailpointsIgnored
    Warning and arms nothing: no step pod carries the failpoints, none dies, the run succeeds
    with its one order and no unknown outcome."""
    run = agentrun(
        "armed",
        shop,
        [[order("F1", 1)]],
        annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
    )
    apply(alice, run)
    done = wait_phase(admin, tenant, "armed", "Succeeded", timeout=120)
    assert done["status"]["failpointsSeen"] == "after_gateway_call@1"
    events = _events(admin, tenant, "armed")
    ignored = [e for e in events if e["reason"] == "FailpointsIgnored"]
    assert len(ignored) == 1 and ignored[0]["type"] == "Warning"
    assert not [e for e in events if e["reason"] == "StepEnded"], "a step pod died"
    pods = admin.get(
        f"/api/v1/namespaces/{tenant}/pods", {"labelSelector": "keelgate.dev/run=armed"}
    )["items"]
    assert pods
    for pod in pods:
        env = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
        assert "KEELGATE_FAILPOINTS" not in env
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert shop.shop.count() == 1
    assert condition(done, "OutcomeUnknown")["status"] == "False"  # type: ignore[index]
