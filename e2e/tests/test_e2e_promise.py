"""The promise under what production clusters do: spec edits, drains and lost nodes.

Each test runs the operator as it ships against the real kube-apiserver, breaks nothing that dies
of itself, and does what a cluster does every day: a person edits a stopped run's spec to be
safe, a step pod is evicted as `kubectl drain` evicts it, a node stops reporting while its step
pod is in the middle of an order. What they check is what the shop and a person see: how many
orders the shop took, whether anyone was asked to settle an outcome, and the run's end.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from keelgate.kube.naming import action_object_name

from keelgate_e2e import procs, runs
from keelgate_e2e.cluster import NODE_NAME, Cluster
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.node.pod import kill_container
from keelgate_e2e.runs import agentrun, apply, look, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, condition, wait_for

pytestmark = pytest.mark.e2e


def _reasons(admin: Kube, namespace: str, name: str) -> list[str]:
    listed = admin.get(
        f"/api/v1/namespaces/{namespace}/events",
        {"fieldSelector": f"involvedObject.name={name},involvedObject.kind=AgentRun"},
    )
    return [e["reason"] for e in listed["items"]]


def _step_pods(admin: Kube, namespace: str, run: str) -> list[JSON]:
    listed = admin.get(
        f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": f"keelgate.dev/run={run}"}
    )
    return list(listed["items"])


def _running_step_pod(admin: Kube, namespace: str, run: str) -> JSON:
    def running() -> JSON | None:
        for pod in _step_pods(admin, namespace, run):
            if pod.get("status", {}).get("phase") == "Running":
                return pod
        return None

    found = wait_for(running, timeout=90, what=f"a running step pod of {run}")
    assert found is not None
    return found


def _order_taken(shop: ShopServer, count: int = 1) -> None:
    wait_for(lambda: shop.shop.count() >= count, timeout=90, what="the shop to take the order")


def _audit_statuses(dsn: str, namespace: str, run: str, action: str) -> list[str]:
    return [
        e.data["status"]
        for e in runs.audit_events(dsn, namespace, run)
        if e.type == "loop.action_completed" and e.data["action"] == action
    ]


def test_a_read_only_edit_at_outcome_unknown_keeps_the_order_unknown_and_settleable(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """The step pod dies right after the shop took the order: OutcomeUnknown. A careful person
    patches spec.allowedSideEffects to [READ]. The run stays OutcomeUnknown (the order is not
    recorded as refused, the run does not succeed past it), its Reconciliation is still there
    and alice settles it as executed; the run then succeeds with the shop's one order, and the
    audit says executed, never refused."""
    run = agentrun(
        "edit-ro",
        shop,
        [[order("E1", 1)]],
        annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
    )
    apply(kubectl, run)
    stopped = wait_phase(admin, tenant, "edit-ro", "Stopped", timeout=90)
    assert stopped["status"]["stopReason"] == "outcome_unknown"
    assert shop.shop.count() == 1
    before = len(_step_pods(admin, tenant, "edit-ro"))
    kubectl(
        "patch",
        "agentrun",
        "edit-ro",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"allowedSideEffects": ["READ"]}}),
    )

    def resumed_under_the_edit() -> bool:
        finished = [
            p
            for p in _step_pods(admin, tenant, "edit-ro")
            if p.get("status", {}).get("phase") in ("Succeeded", "Failed")
        ]
        status = runs.get_run(admin, tenant, "edit-ro").get("status", {})
        return len(finished) > before and status.get("observedGeneration") == 2

    wait_for(resumed_under_the_edit, timeout=90, what="a step under the edited spec")
    time.sleep(2)  # it stays there: no step goes past the order
    edited = runs.get_run(admin, tenant, "edit-ro")
    assert edited["status"]["phase"] == "Stopped", edited["status"]
    assert edited["status"]["stopReason"] == "outcome_unknown"
    assert condition(edited, "OutcomeUnknown")["status"] == "True"  # type: ignore[index]
    rec = action_object_name("edit-ro", "1:0", "place_order")
    patch = {"spec": {"executed": True, "by": "alice", "note": "it is in the book"}}
    alice("patch", "reconciliation", rec, "--type=merge", "-p", json.dumps(patch))
    done = wait_phase(admin, tenant, "edit-ro", "Succeeded", timeout=90)
    assert condition(done, "OutcomeUnknown")["status"] == "False"  # type: ignore[index]
    assert shop.shop.count() == 1
    statuses = _audit_statuses(operator.cluster.dsn, tenant, "edit-ro", "1:0")
    assert "refused" not in statuses and statuses[-1] == "ok"


def test_an_edit_that_undeclares_the_orders_tool_keeps_it_unknown_beside_the_stall(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """The step pod dies right after the shop took the order: OutcomeUnknown. Someone edits
    spec.tools so the script names a tool the spec no longer declares: the run is Stalled
    saying so, and OutcomeUnknown stays True naming the order and its Reconciliation (never
    "NoUnknownOutcome"). alice settles it there; with the tool declared again the run succeeds
    with the shop's one order."""
    run = agentrun(
        "edit-gone",
        shop,
        [[order("U1", 1)]],
        annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
    )
    apply(kubectl, run)
    stopped = wait_phase(admin, tenant, "edit-gone", "Stopped", timeout=90)
    assert stopped["status"]["stopReason"] == "outcome_unknown"
    rec = action_object_name("edit-gone", "1:0", "place_order")
    declared = run["spec"]["tools"]
    reads = [t for t in declared if t["name"] != "place_order"]
    kubectl(
        "patch",
        "agentrun",
        "edit-gone",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"tools": reads}}),
    )

    def stalled_and_unknown() -> JSON | None:
        current = runs.get_run(admin, tenant, "edit-gone")
        stall = condition(current, "Stalled") or {}
        if (
            current.get("status", {}).get("observedGeneration") != 2
            or stall.get("status") != "True"
        ):
            return None
        return current

    edited = wait_for(stalled_and_unknown, timeout=60, what="Stalled under the edited spec")
    assert edited is not None
    assert "'place_order' is not declared" in condition(edited, "Stalled")["message"]  # type: ignore[index]
    unknown = condition(edited, "OutcomeUnknown")
    assert unknown is not None and unknown["status"] == "True", edited["status"]
    assert unknown["message"] == f"place_order (1:0): see reconciliation {rec}"
    patch = {"spec": {"executed": True, "by": "alice"}}
    alice("patch", "reconciliation", rec, "--type=merge", "-p", json.dumps(patch))
    wait_for(
        lambda: (
            (condition(runs.get_run(admin, tenant, "edit-gone"), "OutcomeUnknown") or {}).get(
                "status"
            )
            == "False"
        ),
        timeout=60,
        what="OutcomeUnknown cleared by the settlement",
    )
    kubectl(
        "patch",
        "agentrun",
        "edit-gone",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"tools": declared}}),
    )
    wait_phase(admin, tenant, "edit-gone", "Succeeded", timeout=90)
    assert shop.shop.count() == 1


def test_an_edit_while_its_pod_is_killed_mid_order_still_asks_for_a_reconciliation(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
) -> None:
    """The shop has taken the order but not yet answered when the spec is edited to allow only
    READs and the step pod is killed. The next attempt does not record the order as refused:
    it stops OutcomeUnknown with a Reconciliation, alice settles it (the shop has it: executed),
    and the run succeeds with one order."""
    shop.shop.delay = 20.0
    run = agentrun("edit-mid", shop, [[look("G1"), order("G1", 1)]])
    apply(kubectl, run)
    pod = _running_step_pod(admin, tenant, "edit-mid")
    _order_taken(shop)
    kubectl(
        "patch",
        "agentrun",
        "edit-mid",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"allowedSideEffects": ["READ"]}}),
    )
    kill_container(cluster.node_state_dir, pod["metadata"]["uid"], "step")
    stopped = wait_phase(admin, tenant, "edit-mid", "Stopped", timeout=120)
    assert stopped["status"]["stopReason"] == "outcome_unknown", stopped["status"]
    rec = action_object_name("edit-mid", "1:1", "place_order")
    rec_path = f"/apis/keelgate.dev/v1alpha1/namespaces/{tenant}/reconciliations/{rec}"
    wait_for(lambda: admin.exists(rec_path), what="the Reconciliation")
    patch = {"spec": {"executed": True, "by": "alice"}}
    alice("patch", "reconciliation", rec, "--type=merge", "-p", json.dumps(patch))
    wait_phase(admin, tenant, "edit-mid", "Succeeded", timeout=120)
    assert shop.shop.count() == 1
    statuses = _audit_statuses(operator.cluster.dsn, tenant, "edit-mid", "1:1")
    assert "refused" not in statuses and statuses[-1] == "ok"


def test_an_eviction_at_an_orders_arrival_finishes_it_and_pages_nobody(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
) -> None:
    """`kubectl drain` evicts the step pod (the Eviction API) just as its order reaches the
    shop, which answers 8 s later. The pod finishes the call, records it, exits 75 and is read
    as preempted (not a crash); the next attempt goes on: no OutcomeUnknown, no Reconciliation,
    one order each, and the run succeeds."""
    shop.shop.delay = 8.0
    run = agentrun("drained", shop, [[order("D1", 1)], [order("D2", 2)]])
    apply(kubectl, run)
    pod = _running_step_pod(admin, tenant, "drained")
    # Its longest call: get_inventory, an HTTP tool with no timeoutSeconds (30 s), + 30 s.
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30 + 30
    _order_taken(shop)
    name = pod["metadata"]["name"]
    admin.create(
        f"/api/v1/namespaces/{tenant}/pods/{name}/eviction",
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": tenant},
        },
    )
    done = wait_phase(admin, tenant, "drained", "Succeeded", timeout=180)
    shop.shop.delay = 0.0
    assert shop.shop.count() == 2 and set(shop.shop.by_key().values()) == {1}
    reasons = _reasons(admin, tenant, "drained")
    assert "StepPreempted" in reasons and "OutcomeUnknown" not in reasons
    assert runs.reconciliations(admin, tenant) == []
    assert condition(done, "OutcomeUnknown")["status"] == "False"  # type: ignore[index]
    assert done["status"]["step"]["crashes"] == 0


def test_a_lost_node_mid_order_holds_the_run_until_its_step_is_done_then_goes_on(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
) -> None:
    """A second node runs the step pod; its agent is stopped (the node is lost, the pod's
    process keeps running) just after the shop took the order, which it answers 8 s later.
    Meanwhile the run does not go on: no new step pod, no OutcomeUnknown, nothing to settle.
    The node is evicted of its pods; once the lost pod's deletion deadline has passed, the
    operator takes the pod as lost and starts the step's next attempt on the first node, which
    goes on from what the old process recorded: one order, and the run succeeds."""
    node = "keelgate-node-lost"
    agent = cluster.add_node(node)
    first = f"/api/v1/nodes/{NODE_NAME}"
    admin.patch(first, {"spec": {"unschedulable": True}})  # the step pod goes to the new node
    try:
        shop.shop.delay = 8.0  # within the order's 10 s time limit: the call ends well
        tolerate = [
            {
                "key": f"node.kubernetes.io/{taint}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 2,
            }
            for taint in ("unreachable", "not-ready")
        ]
        run = agentrun("lost", shop, [[order("L1", 1)]], extra={"step": {"tolerations": tolerate}})
        apply(kubectl, run)
        pod = _running_step_pod(admin, tenant, "lost")
        assert pod["spec"]["nodeName"] == node
        _order_taken(shop)
        # The node stops reporting: its agent dies alone; its pods' processes go on.
        procs.stop(agent, cluster.run_dir, sig=signal.SIGKILL, grace=0, group=False)
        admin.patch(first, {"spec": {"unschedulable": False}})
        began = time.monotonic()
        while time.monotonic() - began < 6:  # the old process is still in its call
            assert [p["metadata"]["name"] for p in _step_pods(admin, tenant, "lost")] == [
                pod["metadata"]["name"]
            ]
            assert runs.reconciliations(admin, tenant) == []
            time.sleep(1)
        done = wait_phase(admin, tenant, "lost", "Succeeded", timeout=240)
        assert shop.shop.count() == 1
        assert "OutcomeUnknown" not in _reasons(admin, tenant, "lost")
        assert done["status"]["step"]["pod"] != pod["metadata"]["name"]
        newer = [
            p for p in _step_pods(admin, tenant, "lost") if p["spec"].get("nodeName") == NODE_NAME
        ]
        assert newer, "the next attempt ran on the first node"
    finally:
        shop.shop.delay = 0.0
        admin.patch(first, {"spec": {"unschedulable": False}})
        procs.stop(agent, cluster.run_dir, sig=signal.SIGKILL, grace=0, group=False)
        admin.delete(f"/api/v1/nodes/{node}")
