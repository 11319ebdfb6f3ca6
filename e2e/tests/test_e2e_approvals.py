"""Approvals that need several people, on the real control plane, as alice, bob and carol.

alice holds the `edit` role and no group; bob and carol are authenticated in the group
payments-approvers (their certificates say so), which these tests bind to `edit` in the test's
namespace. What is checked is what the API server admits (the chart's admission policies and
the CRD's rules: a decision names its maker and only their groups, none is taken back, who
created a run is recorded and kept) and what a person sees and the shop ends up holding when
two people must approve a payment through `kubectl keelgate`. They must never grant anything
outside the test's namespace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from keelgate_e2e import runs
from keelgate_e2e.cluster import APPROVERS, Cluster
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.plugin import KubectlKeelgate
from keelgate_e2e.runs import agentrun, apply, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, wait_for

pytestmark = pytest.mark.e2e

GROUP = "/apis/keelgate.dev/v1alpha1"
CREATED_BY = "keelgate.dev/created-by"
RULE = {"required": 2, "groups": [APPROVERS], "notCreator": True}
RBAC = "rbac.authorization.k8s.io"


def _may_edit(admin: Kube, namespace: str, kind: str = "Group", name: str = APPROVERS) -> None:
    """``name`` (the group payments-approvers, or a user) gets `edit` in the namespace."""
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{name}-edit"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": RBAC, "kind": kind, "name": name}],
        },
    )


def _wait_may(kubectl: Kubectl, user: str, verb: str, resource: str) -> None:
    wait_for(
        lambda: kubectl.as_user(user)("auth", "can-i", verb, resource, check=False).returncode == 0,
        timeout=30,
        what=f"{user} may {verb} {resource}",
    )


def _add(kubectl: Kubectl, user: str, name: str, entry: JSON) -> tuple[int, str]:
    """`user` appends ``entry`` to the Approval's decisions with a JSON patch."""
    patch = json.dumps([{"op": "add", "path": "/spec/decisions/-", "value": entry}])
    done = kubectl.as_user(user)(
        "patch", "approval", name, "--type", "json", "-p", patch, check=False
    )
    return done.returncode, done.stderr


def test_a_decision_names_its_maker_and_only_their_groups_and_none_is_taken_back(
    admin: Kube, namespace: str, kubectl: Kubectl, keelgate_installed: None
) -> None:
    """On an Approval (made as the operator makes one, with an empty list): bob adding a
    decision in carol's name is refused, so is one naming a group he is not in; with his own
    name and groups it is admitted, so is carol's naming none. Taking one back (bob's merge
    patch that would leave only a deny of his), changing one, removing the list, or pointing
    the Approval at another call is refused by the CRD's rules."""
    _may_edit(admin, namespace)
    _wait_may(kubectl, "bob", "patch", "approvals.keelgate.dev")
    admin.create(
        f"{GROUP}/namespaces/{namespace}/approvals",
        {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": "Approval",
            "metadata": {"name": "pay-1-send-payment"},
            "spec": {"runName": "pay", "action": "1:0", "tool": "send_payment",
                     "idempotencyKey": "kg-1", "decisions": []},
        },
    )  # fmt: skip
    name = "pay-1-send-payment"
    code, said = _add(kubectl, "bob", name, {"by": "carol", "approved": True})
    assert code != 0 and "a decision added by bob must have by: bob" in said, said
    assert "keelgate-decided-by-requester" in said
    code, said = _add(kubectl, "bob", name, {"by": "bob", "groups": ["admins"], "approved": True})
    assert code != 0 and f"({APPROVERS}, system:authenticated)" in said, said
    bobs = {"by": "bob", "groups": [APPROVERS, "system:authenticated"], "approved": True}
    assert _add(kubectl, "bob", name, bobs) == (0, "")
    assert _add(kubectl, "carol", name, {"by": "carol", "approved": True, "note": "ok"})[0] == 0
    bob = kubectl.as_user("bob")
    mine = json.dumps({"spec": {"decisions": [{"by": "bob", "approved": False}]}})
    dropped = bob("patch", "approval", name, "--type", "merge", "-p", mine, check=False)
    assert dropped.returncode != 0 and "decisions are append-only" in dropped.stderr
    turned = json.dumps([{"op": "replace", "path": "/spec/decisions/1/approved", "value": False}])
    changed = kubectl.as_user("carol")("patch", "approval", name, "--type", "json", "-p", turned,
                                       check=False)  # fmt: skip
    assert changed.returncode != 0 and "decisions are append-only" in changed.stderr
    gone = json.dumps([{"op": "remove", "path": "/spec/decisions"}])
    removed = bob("patch", "approval", name, "--type", "json", "-p", gone, check=False)
    assert removed.returncode != 0 and "none can be removed" in removed.stderr
    moved = json.dumps({"spec": {"idempotencyKey": "kg-2"}})
    pointed = bob("patch", "approval", name, "--type", "merge", "-p", moved, check=False)
    assert pointed.returncode != 0 and "idempotencyKey cannot change" in pointed.stderr
    kept = admin.get(f"{GROUP}/namespaces/{namespace}/approvals/{name}")["spec"]["decisions"]
    assert [(d["by"], d["approved"]) for d in kept] == [("bob", True), ("carol", True)]


def _suspended(name: str, *, created_by: str = "", tools: list[JSON] | None = None) -> str:
    meta: JSON = {"name": name}
    if created_by:
        meta["annotations"] = {CREATED_BY: created_by}
    spec: JSON = {
        "goal": "e2e creator",
        "model": {"provider": "scripted", "script": [{"done": True}]},
        "suspend": True,
        "tools": tools or [],
    }
    return yaml.safe_dump({"apiVersion": "keelgate.dev/v1alpha1", "kind": "AgentRun",
                           "metadata": meta, "spec": spec})  # fmt: skip


PAY = [{"name": "pay", "sideEffect": "WRITE", "approval": RULE, "python": {"callable": "m:f"}}]


def test_who_created_a_run_is_recorded_by_admission_and_cannot_be_changed(
    admin: Kube, namespace: str, kubectl: Kubectl, keelgate_installed: None
) -> None:
    """alice creates runs: the annotation keelgate.dev/created-by says alice whatever her
    manifest said (bob, or nothing), and an annotate --overwrite leaves it alice. A run made by
    the operator (which records no creator) cannot be given one later, nor a notCreator rule."""
    _may_edit(admin, namespace, "User", "alice")
    _wait_may(kubectl, "alice", "create", "agentruns.keelgate.dev")
    alice = kubectl.as_user("alice")
    runs_of = f"{GROUP}/namespaces/{namespace}/agentruns"

    def creator(name: str) -> str:
        return str(
            admin.get(f"{runs_of}/{name}")["metadata"].get("annotations", {}).get(CREATED_BY, "")
        )

    alice("apply", "-f", "-", stdin=_suspended("forged", created_by="bob", tools=PAY))
    alice("apply", "-f", "-", stdin=_suspended("plain"))
    assert (creator("forged"), creator("plain")) == ("alice", "alice")
    alice("annotate", "agentrun", "plain", f"{CREATED_BY}=bob", "--overwrite", check=False)
    assert creator("plain") == "alice"
    # The mutating policy never stands between a broken run and the schema's own words.
    broken = yaml.safe_load(_suspended("broken"))
    broken["spec"]["budget"] = {"dollars": 2.5}
    refused = alice("apply", "-f", "-", stdin=yaml.safe_dump(broken), check=False)
    assert refused.returncode != 0 and "spec.budget.dollars: Invalid value" in refused.stderr, (
        refused.stderr
    )

    operator = "system:serviceaccount:keelgate-system:keelgate-operator"
    kubectl("apply", "--as", operator, "-f", "-", stdin=_suspended("tick"))
    assert creator("tick") == ""
    added = alice("annotate", "agentrun", "tick", f"{CREATED_BY}=alice", check=False)
    assert added.returncode != 0
    assert "keelgate.dev/created-by] cannot change: it records who created the run (nobody" in (
        added.stderr
    ), added.stderr
    rule = alice("apply", "-f", "-", stdin=_suspended("tick", tools=PAY), check=False)
    assert rule.returncode != 0
    assert "approval.notCreator needs the run's creator on record" in rule.stderr, rule.stderr


def test_two_people_from_the_group_approve_a_payment_with_the_plugin_and_it_is_made_once(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
    kubectl_bin: Path,
) -> None:
    """alice's run needs two approvals from payments-approvers, not hers. `kubectl keelgate
    approve` as alice is refused in one line (she created it); carol's approval lands (her
    groups with it) and the Approval shows 1 of 2 while the run waits and the shop has nothing;
    `pending` as bob shows 1 of 2; bob's approval lets the run place one order; the trail has
    both approvals, and the Approval both decisions with their groups."""
    _may_edit(admin, tenant)
    _wait_may(kubectl, "carol", "patch", "approvals.keelgate.dev")
    run = agentrun("payout", shop, [[order("P9", 1)]])
    run["spec"]["tools"][1]["approval"] = RULE
    apply(kubectl.as_user("alice"), run)
    stopped = wait_phase(admin, tenant, "payout", "Stopped", timeout=90)
    assert stopped["metadata"]["annotations"][CREATED_BY] == "alice"
    assert stopped["status"]["stopReason"] == "awaiting_approval"
    wait_for(lambda: runs.approvals(admin, tenant), what="the Approval")
    name = "payout-1-place-order"

    def plugin(user: str) -> KubectlKeelgate:
        return KubectlKeelgate(kubectl_bin, cluster.kubeconfig, user, tenant)

    refused = plugin("alice")("approve", "payout", "1:0", "--approve")
    assert refused.returncode == 2, refused.stderr
    assert "alice created the run" in refused.stderr
    assert plugin("carol")("approve", "payout", "1:0", "--approve").returncode == 0

    def progress() -> str:
        found = admin.get(f"{GROUP}/namespaces/{tenant}/approvals/{name}")
        return str((found.get("status") or {}).get("progress") or "")

    wait_for(lambda: progress() == "1 of 2", timeout=60, what="1 of 2 on the Approval")
    pending = plugin("bob")("pending", "-o", "json")
    assert pending.returncode == 0
    (item,) = json.loads(pending.stdout)["items"]
    assert item["status"]["progress"] == "1 of 2" and item["status"]["approvedBy"] == ["carol"]
    assert "1 of 2" in plugin("bob")("pending").stdout
    assert shop.shop.orders == []
    assert runs.phase(admin, tenant, "payout") == "Stopped"
    done = plugin("bob")("approve", "payout", "1:0", "--approve", "-o", "json")
    assert done.returncode == 0, done.stderr
    wait_phase(admin, tenant, "payout", "Succeeded", timeout=90)
    assert [o["body"]["sku"] for o in shop.shop.orders] == ["P9"]
    decided = admin.get(f"{GROUP}/namespaces/{tenant}/approvals/{name}")
    assert [(d["by"], d["groups"]) for d in decided["spec"]["decisions"]] == [
        ("carol", [APPROVERS, "system:authenticated"]),
        ("bob", [APPROVERS, "system:authenticated"]),
    ]
    assert (decided["status"]["verdict"], decided["status"]["settledBy"]) == (
        "approved",
        "carol, bob",
    )
    approved = [
        e
        for e in runs.audit_events(operator.cluster.dsn, tenant, "payout")
        if e.type == "loop.approved"
    ]
    assert [(e.actor, e.data["approvals"], e.data["groups"]) for e in approved] == [
        ("carol", 1, [APPROVERS]),
        ("bob", 2, [APPROVERS]),
    ]
