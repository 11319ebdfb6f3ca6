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
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from keelgate.core.approvals import seconds
from keelgate.kube.controller.approval_entries import written_at
from keelgate.kube.naming import DECISIONS_FINALIZER, action_object_name

from keelgate_e2e import runs
from keelgate_e2e.cluster import APPROVERS, Cluster
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import JSON, ApiError, Kube
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
    assert "keelgate-approval-decisions" in said
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


def test_only_the_maker_of_a_not_executed_writes_it_again_or_corrects_it(
    admin: Kube, namespace: str, kubectl: Kubectl, keelgate_installed: None
) -> None:
    """On a Reconciliation (made as the operator makes one, undecided), bob decides "not
    executed" in his own name, saying when he looked (decidedAt). carol holds edit too, yet
    the decided-by-requester policy refuses her writing its decidedAt again, and her
    correcting it to executed, each with its message (spec.by must be carol); bob may do both
    (a look again after the call's write deadline, then a correction before it is settled),
    and carol may still add a note. Nobody's name in ``by`` changes."""
    _may_edit(admin, namespace)
    _wait_may(kubectl, "carol", "patch", "reconciliations.keelgate.dev")
    path = f"{GROUP}/namespaces/{namespace}/reconciliations"
    name = "pay-1-send-payment"
    admin.create(
        path,
        {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": "Reconciliation",
            "metadata": {"name": name},
            "spec": {"runName": "pay", "action": "1:0", "tool": "send_payment",
                     "idempotencyKey": "kg-1"},
        },
    )  # fmt: skip

    def patch(user: str, spec: JSON) -> tuple[int, str]:
        done = kubectl.as_user(user)(
            "patch", "reconciliation", name, "--type=merge", "-p", json.dumps({"spec": spec}),
            check=False,
        )  # fmt: skip
        return done.returncode, done.stderr

    first = {"executed": False, "by": "bob", "decidedAt": "2026-01-02T03:04:05Z"}
    assert patch("bob", first) == (0, "")
    policy = "spec.by must be carol (the user setting spec.executed or spec.decidedAt)"
    for change in ({"decidedAt": "2026-01-02T03:09:00Z"}, {"executed": True}):
        code, said = patch("carol", change)
        assert code != 0 and policy in said, (change, said)
        assert "decided-by-requester" in said
    code, said = patch("carol", {"executed": True, "by": "carol"})
    assert code != 0 and "cannot change once executed is set" in said, said
    assert patch("bob", {"decidedAt": "2026-01-02T03:09:00Z"}) == (0, "")
    assert patch("bob", {"executed": True, "decidedAt": "2026-01-02T03:10:00Z"}) == (0, "")
    assert patch("carol", {"note": "the payment is in the ledger"}) == (0, "")
    spec = admin.get(f"{path}/{name}")["spec"]
    assert (spec["executed"], spec["by"], spec["decidedAt"], spec["note"]) == (
        True,
        "bob",
        "2026-01-02T03:10:00Z",
        "the payment is in the ledger",
    )


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
    name = action_object_name("payout", "1:0", "place_order")

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
    # Counts and verdict agree: Settled approved by the two who met the rule.
    assert (decided["status"]["progress"], decided["status"]["approvedBy"]) == (
        "2 of 2",
        ["carol", "bob"],
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


# Issue 46: an approval means this call, by these people, once.


def _plugin(cluster: Cluster, kubectl_bin: Path, tenant: str) -> Callable[[str], KubectlKeelgate]:
    return lambda user: KubectlKeelgate(kubectl_bin, cluster.kubeconfig, user, tenant)


def _approval(admin: Kube, namespace: str, name: str) -> JSON:
    return admin.get(f"{GROUP}/namespaces/{namespace}/approvals/{name}")


def _status_of(admin: Kube, namespace: str, name: str) -> JSON:
    try:
        return dict(_approval(admin, namespace, name).get("status") or {})
    except ApiError as error:
        if error.status == 404:
            return {}
        raise


def _run_status(admin: Kube, namespace: str, run: str) -> JSON:
    return dict(admin.get(f"{GROUP}/namespaces/{namespace}/agentruns/{run}").get("status") or {})


def _waiting_for_two(
    admin: Kube, alice: Kubectl, tenant: str, shop: ShopServer, run: str, rule: JSON
) -> str:
    """alice's run whose one order waits for ``rule``; the name of its Approval, once made."""
    body = agentrun(run, shop, [[order("P9", 1)]])
    body["spec"]["tools"][1]["approval"] = rule
    apply(alice, body)
    wait_phase(admin, tenant, run, "Stopped", timeout=90)
    name = action_object_name(run, "1:0", "place_order")
    wait_for(lambda: _status_of(admin, tenant, name).get("phase") == "Pending", what=name)
    return name


def _wait_status(admin: Kube, namespace: str, name: str, field: str, value: object) -> None:
    wait_for(
        lambda: _status_of(admin, namespace, name).get(field) == value,
        timeout=90,
        what=f"{name}'s {field} {value}",
    )


def _made_again(admin: Kube, alice: Kubectl, namespace: str, run: str, name: str) -> None:
    """alice deletes her run (its Approval goes with it) and applies it again: the stored run
    goes on, and the operator makes a fresh Approval of the same name, showing what the store
    holds (1 of 2)."""
    _wait_status(admin, namespace, name, "progress", "1 of 2")
    old = _approval(admin, namespace, name)["metadata"]["uid"]
    body = admin.get(f"{GROUP}/namespaces/{namespace}/agentruns/{run}")
    alice("delete", "agentrun", run)
    wait_for(lambda: not _status_of(admin, namespace, name), timeout=60, what=f"{name} gone")
    again = {"apiVersion": body["apiVersion"], "kind": "AgentRun",
             "metadata": {"name": run}, "spec": body["spec"]}  # fmt: skip
    apply(alice, again)
    wait_for(
        lambda: (
            _status_of(admin, namespace, name).get("progress") == "1 of 2"
            and _approval(admin, namespace, name)["metadata"]["uid"] != old
        ),
        timeout=90,
        what=f"{name} made again, 1 of 2",
    )


def _service_account(admin: Kube, kubectl: Kubectl, namespace: str, name: str) -> str:
    """A ServiceAccount ``name`` holding `edit` in the namespace, as a namespace admin makes
    one; its user name, once the API server lets it patch Approvals."""
    admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
    )
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{name}-edit"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    user = f"system:serviceaccount:{namespace}:{name}"
    wait_for(
        lambda: kubectl("auth", "can-i", "patch", "approvals.keelgate.dev", "--as", user,
                        check=False).returncode == 0,
        timeout=30,
        what=f"{user} may patch approvals",
    )  # fmt: skip
    return user


def _events(admin: Kube, namespace: str, reason: str) -> list[str]:
    found = admin.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [str(e.get("message") or "") for e in found if e.get("reason") == reason]


def test_an_edit_of_the_tool_after_two_approvals_voids_them_and_sends_nothing(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
    kubectl_bin: Path,
) -> None:
    """bob and carol approve alice's suspended run's POST /orders (2 of 2); alice points the
    tool at another shop and resumes. Nothing is sent anywhere: the run asks again (0 of 2),
    its audit trail says the tool's URL changed and whose approvals it voided. Approved again,
    the order goes once to the shop now named, never to the first."""
    _may_edit(admin, tenant)
    _wait_may(kubectl, "carol", "patch", "approvals.keelgate.dev")
    alice, plugin = kubectl.as_user("alice"), _plugin(cluster, kubectl_bin, tenant)
    other = ShopServer().start()
    try:
        name = _waiting_for_two(admin, alice, tenant, shop, "payout", RULE)
        alice("patch", "agentrun", "payout", "--type", "merge", "-p", '{"spec":{"suspend":true}}')
        for person in ("bob", "carol"):
            done = plugin(person)("approve", "payout", "1:0", "--approve")
            assert done.returncode == 0, done.stderr
        wait_for(lambda: _status_of(admin, tenant, name).get("phase") == "Settled", what="2 of 2")
        shown = str(_status_of(admin, tenant, name)["definition"])
        edit = [
            {"op": "replace", "path": "/spec/tools/1/http/url", "value": f"{other.url}/orders"},
            {"op": "replace", "path": "/spec/suspend", "value": False},
        ]
        alice("patch", "agentrun", "payout", "--type", "json", "-p", json.dumps(edit))
        # Nothing on the first Approval can count any more: it is settled as expired and the
        # call is asked afresh on the round-2 Approval, bound to the edited tool.
        again = action_object_name("payout", "1:0", "place_order", round=2)
        wait_for(
            lambda: (
                (status := _status_of(admin, tenant, again)).get("phase") == "Pending"
                and status.get("definition") != shown
            ),
            timeout=90,
            what="the Approval asked again for the edited call",
        )
        old = _status_of(admin, tenant, name)
        assert (old["verdict"], old["askedAgainAs"]) == ("expired", again)
        assert "made on an earlier definition of the tool" in old["message"]
        assert _status_of(admin, tenant, again)["progress"] == "0 of 2"
        assert shop.shop.orders == [] and other.shop.orders == []
        (changed,) = [
            e
            for e in runs.audit_events(operator.cluster.dsn, tenant, "payout")
            if e.type == "loop.call_changed"
        ]
        assert (changed.data["changed"], changed.data["voided"]) == (["http.url"], ["bob", "carol"])
        for person in ("bob", "carol"):
            done = plugin(person)("approve", "payout", "1:0", "--approve")
            assert done.returncode == 0 and "already" not in done.stdout, done.stdout
        wait_phase(admin, tenant, "payout", "Succeeded", timeout=90)
        assert shop.shop.orders == [] and len(other.shop.orders) == 1
    finally:
        other.stop()


def test_a_deny_in_an_approval_made_again_is_a_deny(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
    kubectl_bin: Path,
) -> None:
    """bob approves (1 of 2); alice deletes her run and applies it again (the stored run goes
    on; a fresh Approval of the same name is made, still 1 of 2). alice cannot move entries;
    bob's deny in the fresh Approval is recorded as a deny (never taken for his old approval):
    Settled denied, carol's approval refused, no order, the run marked Denied. The same with the
    one-decision form: bob's approved: true, then carol's approved: false after the run is made
    again."""
    _may_edit(admin, tenant)
    _wait_may(kubectl, "carol", "patch", "approvals.keelgate.dev")
    alice, plugin = kubectl.as_user("alice"), _plugin(cluster, kubectl_bin, tenant)
    listed = _waiting_for_two(admin, alice, tenant, shop, "listed", RULE)
    plain = _waiting_for_two(admin, alice, tenant, shop, "plain", {"required": 2})
    assert plugin("bob")("approve", "listed", "1:0", "--approve").returncode == 0
    merge = json.dumps({"spec": {"approved": True, "by": "bob"}})
    kubectl.as_user("bob")("patch", "approval", plain, "--type", "merge", "-p", merge)
    for run, name in (("listed", listed), ("plain", plain)):
        _made_again(admin, alice, tenant, run, name)
    alices = {"by": "alice", "groups": [], "approved": True}  # admitted, and not counted
    assert _add(kubectl, "alice", listed, alices)[0] == 0
    denied = plugin("bob")("approve", "listed", "1:0", "--deny")
    assert denied.returncode == 0 and "denied by bob" in denied.stdout, denied.stderr
    moved = json.dumps([{"op": "move", "from": "/spec/decisions/1", "path": "/spec/decisions/0"}])
    refused = alice("patch", "approval", listed, "--type", "json", "-p", moved, check=False)
    assert refused.returncode != 0 and "append-only" in refused.stderr, refused.stderr
    deny = json.dumps({"spec": {"approved": False, "by": "carol"}})
    kubectl.as_user("carol")("patch", "approval", plain, "--type", "merge", "-p", deny)
    for run, name, who in (("listed", listed, "bob"), ("plain", plain, "carol")):
        _wait_status(admin, tenant, name, "verdict", "denied")
        assert _status_of(admin, tenant, name)["settledBy"] == who
        late = plugin("carol")("approve", run, "1:0", "--approve")
        assert late.returncode == 2 and f"already decided: denied by {who}" in late.stderr
        finished = wait_phase(admin, tenant, run, "Succeeded", timeout=90)
        (marked,) = [c for c in finished["status"]["conditions"] if c["type"] == "Denied"]
        assert marked["message"] == f"place_order (1:0) denied by {who}"
    assert shop.shop.orders == []


def test_admission_keeps_each_decision_a_fact_of_its_maker(
    admin: Kube, namespace: str, kubectl: Kubectl, keelgate_installed: None
) -> None:
    """On an Approval (made as the operator makes one): bob's entry is stamped with its
    identity and the definition the Approval showed; a copy of it appended by alice, two
    entries at once, a moved entry and an id of the client's own are refused. ServiceAccounts
    (two made by an admin, and alice acting as one) are refused while the rule counts people
    only. alice cannot fill the list: her ninth entry is refused, and bob and carol still
    decide. Once Settled, nothing more is taken."""
    _may_edit(admin, namespace)
    _may_edit(admin, namespace, "User", "alice")
    _wait_may(kubectl, "bob", "patch", "approvals.keelgate.dev")
    _wait_may(kubectl, "alice", "patch", "approvals.keelgate.dev")
    path = f"{GROUP}/namespaces/{namespace}/approvals"
    admin.create(
        path,
        {"apiVersion": "keelgate.dev/v1alpha1", "kind": "Approval",
         "metadata": {"name": "pay-1-send-payment"},
         "spec": {"runName": "pay", "action": "1:0", "tool": "send_payment",
                  "idempotencyKey": "kg-1", "decisions": []}},
    )  # fmt: skip
    name = "pay-1-send-payment"
    admin.patch(f"{path}/{name}/status", {"status": {"phase": "Pending", "definition": "d-1"}})
    bobs = {"by": "bob", "groups": [APPROVERS], "approved": True}
    before = time.time()
    assert _add(kubectl, "bob", name, bobs) == (0, "")
    after = time.time()
    appended = admin.get(f"{path}/{name}")
    (entry,) = appended["spec"]["decisions"]
    assert entry["id"] and entry["definition"] == "d-1"
    # The API server records when the entry was written (what an entry seen late counts from).
    written = written_at(appended)
    assert written is not None and int(before) - 1 <= written <= after + 1, (written, before)
    code, said = _add(kubectl, "alice", name, entry)
    assert code != 0 and "a decision added by alice must have by: alice" in said, said
    carols = {"op": "add", "path": "/spec/decisions/-", "value": {"by": "carol", "approved": True}}
    carol = kubectl.as_user("carol")
    refused = carol("patch", "approval", name, "--type", "json", "-p", json.dumps([carols] * 2),
                    check=False)  # fmt: skip
    assert refused.returncode != 0 and "add one decision per request" in refused.stderr
    code, said = _add(kubectl, "carol", name, {"by": "carol", "approved": True, "id": "7"})
    assert code == 0  # the id is admission's: the client's is replaced
    ids = [d["id"] for d in admin.get(f"{path}/{name}")["spec"]["decisions"]]
    assert ids[1] != "7" and ids[0] != ids[1]
    for account in ("ci", "cd"):
        user = _service_account(admin, kubectl, namespace, account)
        value = json.dumps([{"op": "add", "path": "/spec/decisions/-",
                             "value": {"by": user, "approved": True}}])  # fmt: skip
        as_account = kubectl("--as", user, "patch", "approval", name, "--type", "json",
                             "-p", value, check=False)  # fmt: skip
        assert as_account.returncode != 0 and "is a ServiceAccount" in as_account.stderr
    acting = kubectl.as_user("alice")(
        "--as", f"system:serviceaccount:{namespace}:ci", "patch", "approval", name,
        "--type", "json", "-p", json.dumps([{"op": "add", "path": "/spec/decisions/-",
        "value": {"by": f"system:serviceaccount:{namespace}:ci", "approved": True}}]),
        check=False,
    )  # fmt: skip
    assert acting.returncode != 0 and "counts people only" in acting.stderr, acting.stderr
    for _ in range(8):
        assert _add(kubectl, "alice", name, {"by": "alice", "approved": True})[0] == 0
    code, said = _add(kubectl, "alice", name, {"by": "alice", "approved": True})
    assert code != 0 and "alice has 8 approvals on it" in said, said
    # The cap is on approvals: her deny still has room.
    assert _add(kubectl, "alice", name, {"by": "alice", "approved": False})[0] == 0
    assert _add(kubectl, "bob", name, {"by": "bob", "approved": False})[0] == 0
    last = written_at(admin.get(f"{path}/{name}"))
    time.sleep(1.5)  # a status write a second later is not a decision's
    settled = {"phase": "Settled", "verdict": "denied", "settledBy": "bob"}
    admin.patch(f"{path}/{name}/status", {"status": settled})
    assert written_at(admin.get(f"{path}/{name}")) == last
    code, said = _add(kubectl, "carol", name, {"by": "carol", "approved": False})
    assert code != 0 and f"approval {name} is settled (denied by bob)" in said, said
    # An Approval settled as expired (its action asked afresh) names where to decide instead.
    expired = {"verdict": "expired", "settledBy": "", "askedAgainAs": f"{name}-r2"}
    admin.patch(f"{path}/{name}/status", {"status": expired})
    code, said = _add(kubectl, "carol", name, {"by": "carol", "approved": True})
    assert code != 0 and f"is asked afresh as {name}-r2: decide there" in said, said


def test_people_are_told_only_what_counts_and_a_refusal_stays_in_sight(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
    kubectl_bin: Path,
) -> None:
    """Two runs of alice's. One names a group nobody is in (a typo): bob's `--deny` is refused
    in one line, exit 2, nothing written; his raw patch is refused by the operator, and the
    action stays in `pending` and `status` with the refusal shown. The other asks 2 of
    payments-approvers, not alice, a reason to deny: alice weakens the rule in her spec and
    still cannot approve her own run (the rule in force counts); bob's approval says 1 of 2 and
    is told in its own Event with his note; carol's deny without a reason is refused, with one
    it settles the Approval denied ("1 of 2", never approved), the run is marked Denied, and the
    note is on the audit trail and in the Event."""
    _may_edit(admin, tenant)
    _wait_may(kubectl, "carol", "patch", "approvals.keelgate.dev")
    alice, plugin = kubectl.as_user("alice"), _plugin(cluster, kubectl_bin, tenant)
    typo = {"required": 1, "groups": ["payments-aprovers"]}
    strict = {**RULE, "reasonToDeny": True}
    wrong = _waiting_for_two(admin, alice, tenant, shop, "typo", typo)
    name = _waiting_for_two(admin, alice, tenant, shop, "strict", strict)

    said = plugin("bob")("approve", "typo", "1:0", "--deny")
    assert said.returncode == 2 and "bob may not decide it" in said.stderr, said.stderr
    assert "denied by" not in said.stdout
    assert _approval(admin, tenant, wrong)["spec"]["decisions"] == []
    bobs = {"by": "bob", "groups": [APPROVERS, "system:authenticated"], "approved": False}
    assert _add(kubectl, "bob", wrong, bobs)[0] == 0
    wait_for(lambda: "not counted: bob" in str(_status_of(admin, tenant, wrong).get("message")),
             what="the refusal shown")  # fmt: skip
    waiting = plugin("alice")("pending", "-o", "wide")
    assert "typo" in waiting.stdout and "bob may not decide it" in waiting.stdout, waiting.stdout
    assert "not counted: bob" in plugin("alice")("status", "typo").stdout

    weaker = [{"op": "replace", "path": "/spec/tools/1/approval", "value": {"required": 1}}]
    alice("patch", "agentrun", "strict", "--type", "json", "-p", json.dumps(weaker))
    refused = plugin("alice")("approve", "strict", "1:0", "--approve")
    assert refused.returncode == 2 and "alice created the run" in refused.stderr, refused.stderr
    first = plugin("bob")("approve", "strict", "1:0", "--approve", "--note", "sku checked")
    assert first.returncode == 0 and "approved by bob (1 of 2)" in first.stdout, first.stdout
    wait_for(lambda: _status_of(admin, tenant, name).get("progress") == "1 of 2", what="1 of 2")
    wait_for(
        lambda: (
            f"place_order (1:0) approved by bob (1 of 2) (sku checked): approval {name}"
            in _events(admin, tenant, "Approved")
        ),
        what="bob's approval told",
    )
    bare = plugin("carol")("approve", "strict", "1:0", "--deny")
    assert bare.returncode == 2 and "its rule asks a reason to deny" in bare.stderr
    reasoned = plugin("carol")("approve", "strict", "1:0", "--deny", "--note", "wrong sku")
    assert reasoned.returncode == 0, reasoned.stderr
    wait_for(lambda: _status_of(admin, tenant, name).get("phase") == "Settled", what="settled")
    status = _status_of(admin, tenant, name)
    assert (status["verdict"], status["settledBy"], status["progress"]) == (
        "denied", "carol", "1 of 2"
    )  # fmt: skip
    assert status["message"] == "denied by carol: wrong sku; it never runs"
    finished = wait_phase(admin, tenant, "strict", "Succeeded", timeout=90)
    (marked,) = [c for c in finished["status"]["conditions"] if c["type"] == "Denied"]
    assert marked["message"] == "place_order (1:0) denied by carol: wrong sku"
    assert any(
        "denied by carol" in m and "wrong sku" in m for m in _events(admin, tenant, "Denied")
    )
    trail = runs.audit_events(operator.cluster.dsn, tenant, "strict")
    assert [(e.type, e.actor, e.data.get("note")) for e in trail
            if e.type in ("loop.approved", "loop.denied")] == [
        ("loop.approved", "bob", "sku checked"), ("loop.denied", "carol", "wrong sku")
    ]  # fmt: skip
    assert shop.shop.orders == []


def test_actions_whose_names_read_alike_get_approvals_of_their_own(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
) -> None:
    """Run `pay` waits for its action 1:1 and run `pay-1` for its 1:0, both place_order (once
    both named pay-1-1-place-order): each gets its own Approval, and deciding one decides only
    it. A run created by a ServiceAccount says so on its audit trail."""
    alice = kubectl.as_user("alice")
    robot = _service_account(admin, kubectl, tenant, "ci")
    first = agentrun("pay", shop, [[runs.look("A1"), order("A1", 1)]], approval=True)
    second = agentrun("pay-1", shop, [[order("B2", 2)]], approval=True)
    apply(alice, first)
    kubectl("--as", robot, "apply", "-f", "-", stdin=yaml.safe_dump(second))
    for run in ("pay", "pay-1"):
        wait_phase(admin, tenant, run, "Stopped", timeout=90)
    names = {
        run: action_object_name(run, action, "place_order")
        for run, action in (("pay", "1:1"), ("pay-1", "1:0"))
    }
    assert names["pay"] != names["pay-1"]
    wait_for(lambda: len(runs.approvals(admin, tenant)) == 2, what="two Approvals")
    for run, name in names.items():
        assert _approval(admin, tenant, name)["spec"]["runName"] == run
    runs.decide(alice, names["pay-1"], approved=True)
    wait_phase(admin, tenant, "pay-1", "Succeeded", timeout=90)
    assert [o["body"]["sku"] for o in shop.shop.orders] == ["B2"]
    assert runs.phase(admin, tenant, "pay") == "Stopped"
    (started,) = [
        e
        for e in runs.audit_events(operator.cluster.dsn, tenant, "pay-1")
        if e.type == "loop.started"
    ]
    assert (started.data["creator"], started.data["creatorIsServiceAccount"]) == (robot, True)


def test_an_approval_made_while_the_operator_is_down_counts_from_when_it_was_made(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
) -> None:
    """alice's order needs 2 of payments-approvers, each approval good for 5 minutes. The
    operator is stopped (a rollout); bob approves with a raw `kubectl patch` (no moment stated),
    and the operator is back some 10 s later: his approval counts from his write, as the API
    server recorded it, so the Approval says it stops counting 5 minutes after he made it, not
    5 minutes after the operator first saw it. Nothing is ordered on one approval."""
    _may_edit(admin, tenant)
    _wait_may(kubectl, "bob", "patch", "approvals.keelgate.dev")
    alice = kubectl.as_user("alice")
    name = _waiting_for_two(admin, alice, tenant, shop, "late", {**RULE, "expiresAfter": "5m"})
    operator.stop()
    try:
        made = time.time()
        bobs = {"by": "bob", "groups": [APPROVERS, "system:authenticated"], "approved": True}
        assert _add(kubectl, "bob", name, bobs) == (0, "")
        done = time.time()
        time.sleep(10)
    finally:
        operator.start()
    _wait_status(admin, tenant, name, "progress", "1 of 2")
    expires = seconds(str(_status_of(admin, tenant, name)["expiresAt"]))
    assert int(made) - 1 + 300 <= expires <= done + 1 + 300, (expires - made, done - made)
    assert runs.phase(admin, tenant, "late") == "Stopped" and shop.shop.orders == []


def _finalizers(admin: Kube, namespace: str, name: str) -> list[str]:
    return list(_approval(admin, namespace, name)["metadata"].get("finalizers") or [])


def _try_to_release(alice: Kubectl, admin: Kube, namespace: str, name: str) -> None:
    """alice, on an Approval being deleted (its finalizer holding it), tries every way she has
    to let it go before the operator records bob's deny, or to add to it: each is refused, and
    the finalizer and bob's deny stay."""
    held = _approval(admin, namespace, name)
    assert held["metadata"].get("deletionTimestamp")
    assert _finalizers(admin, namespace, name) == [DECISIONS_FINALIZER]
    attempts = {
        "a JSON patch": ("--type", "json", "-p",
                         json.dumps([{"op": "remove", "path": "/metadata/finalizers/0"}])),
        "a merge patch": ("--type", "merge", "-p", json.dumps({"metadata": {"finalizers": None}})),
        "a new decision": ("--type", "json", "-p", json.dumps([{
            "op": "add", "path": "/spec/decisions/-",
            "value": {"by": "alice", "groups": [], "approved": True}}])),
        "bob's deny turned": ("--type", "json", "-p", json.dumps([
            {"op": "replace", "path": "/spec/decisions/0/approved", "value": True}])),
    }  # fmt: skip
    for what, args in attempts.items():
        done = alice("patch", "approval", name, *args, check=False)
        assert done.returncode != 0, what
        assert "keelgate-approval-finalizer" in done.stderr or "append-only" in done.stderr, (
            what,
            done.stderr,
        )
    # PUT (kubectl replace) of the object without its finalizer, and a server-side apply that
    # says none: refused, or (apply) leaves what alice does not own.
    body = {k: v for k, v in held.items() if k != "status"}
    body["metadata"] = {**held["metadata"], "finalizers": []}
    body["metadata"].pop("managedFields", None)
    replaced = alice("replace", "-f", "-", stdin=json.dumps(body), check=False)
    assert replaced.returncode != 0 and "only the operator removes it" in replaced.stderr
    applied = {"apiVersion": held["apiVersion"], "kind": "Approval",
               "metadata": {"name": name, "finalizers": []}}  # fmt: skip
    alice("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(applied),
          check=False)  # fmt: skip
    assert _finalizers(admin, namespace, name) == [DECISIONS_FINALIZER]
    decisions = _approval(admin, namespace, name)["spec"]["decisions"]
    assert [(d["by"], d["approved"]) for d in decisions] == [("bob", False)]


@pytest.mark.parametrize("deleted", ["approval", "agentrun"])
def test_a_deny_on_an_approval_deleted_while_the_operator_is_down_stands(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
    kubectl_bin: Path,
    deleted: str,
) -> None:
    """alice's order needs one approval from payments-approvers. The operator is stopped (a
    rollout); bob denies; alice deletes the Approval (or deletes her AgentRun, whose Approval
    the garbage collector deletes, and applies it again). The Approval is only marked deleted:
    its finalizer holds it, and alice can neither remove that (patch, merge patch, PUT,
    server-side apply) nor add to or change its decisions. The operator comes back: it records
    bob's deny, then lets the Approval go; no fresh Approval is asked (carol's approval is
    refused: nothing waits), the run ends marked Denied, and nothing is sent."""
    _may_edit(admin, tenant)
    _wait_may(kubectl, "carol", "patch", "approvals.keelgate.dev")
    _wait_may(kubectl, "alice", "delete", "approvals.keelgate.dev")
    alice, plugin = kubectl.as_user("alice"), _plugin(cluster, kubectl_bin, tenant)
    run = f"gone-{deleted}"
    name = _waiting_for_two(admin, alice, tenant, shop, run, {"required": 1, "groups": [APPROVERS]})
    assert _finalizers(admin, tenant, name) == [DECISIONS_FINALIZER]
    operator.stop()
    try:
        bobs = {"by": "bob", "groups": [APPROVERS, "system:authenticated"], "approved": False}
        assert _add(kubectl, "bob", name, bobs) == (0, "")
        if deleted == "approval":
            alice("delete", "approval", name, "--wait=false")
        else:
            body = admin.get(f"{GROUP}/namespaces/{tenant}/agentruns/{run}")
            alice("delete", "agentrun", run)
            wait_for(
                lambda: _approval(admin, tenant, name)["metadata"].get("deletionTimestamp"),
                timeout=60,
                what=f"{name} deleted by the garbage collector",
            )
            again = {"apiVersion": body["apiVersion"], "kind": "AgentRun",
                     "metadata": {"name": run}, "spec": body["spec"]}  # fmt: skip
            apply(alice, again)
        _try_to_release(alice, admin, tenant, name)
    finally:
        operator.start()
    wait_for(lambda: not _status_of(admin, tenant, name), timeout=90, what=f"{name} let go")
    finished = wait_phase(admin, tenant, run, "Succeeded", timeout=90)
    (marked,) = [c for c in finished["status"]["conditions"] if c["type"] == "Denied"]
    assert marked["message"] == "place_order (1:0) denied by bob"
    assert not _status_of(admin, tenant, name)  # no fresh Approval was asked
    late = plugin("carol")("approve", run, "1:0", "--approve")
    assert late.returncode == 2 and "none is waiting" in late.stderr, late.stderr
    trail = runs.audit_events(operator.cluster.dsn, tenant, run)
    assert [(e.type, e.actor) for e in trail if e.type in ("loop.approved", "loop.denied")] == [
        ("loop.denied", "bob")
    ]
    assert shop.shop.orders == []


def test_an_approval_that_expires_is_asked_afresh_and_nothing_of_the_old_round_counts(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
    kubectl_bin: Path,
) -> None:
    """alice's order needs 2 of payments-approvers, each approval good for 15 s. carol approves;
    once her approval expired, the Approval is settled as expired and names the round-2
    Approval, which the run's status names. Insider moves, refused by admission: carol adding to
    the expired round (it names the new one), alice appending a copy of carol's old entry to
    the new round (it names carol). `kubectl keelgate approve` as bob and carol follows the
    round; one order is placed; the chain has loop.asked_again, and round 2's two approvals."""
    _may_edit(admin, tenant)
    _wait_may(kubectl, "carol", "patch", "approvals.keelgate.dev")
    alice, plugin = kubectl.as_user("alice"), _plugin(cluster, kubectl_bin, tenant)
    name = _waiting_for_two(admin, alice, tenant, shop, "renew", {**RULE, "expiresAfter": "15s"})
    second = action_object_name("renew", "1:0", "place_order", round=2)
    assert plugin("carol")("approve", "renew", "1:0", "--approve").returncode == 0
    _wait_status(admin, tenant, name, "verdict", "expired")
    old = _approval(admin, tenant, name)
    assert old["status"]["askedAgainAs"] == second
    (carols,) = old["spec"]["decisions"]
    wait_for(lambda: _status_of(admin, tenant, second).get("phase") == "Pending", what=second)

    # The run's status is written by the run's handler, apart from the Approval's: it follows.
    def rounds() -> list[object]:
        pending = _run_status(admin, tenant, "renew").get("pendingApprovals") or ()
        return [p.get("round") for p in pending]

    wait_for(lambda: rounds() == [2], what="the run's status naming round 2")
    code, said = _add(kubectl, "carol", name, {"by": "carol", "approved": True})
    assert code != 0 and f"is asked afresh as {second}" in said, said
    code, said = _add(kubectl, "alice", second, carols)
    assert code != 0 and "a decision added by alice must have by: alice" in said, said
    assert shop.shop.orders == []
    for person in ("bob", "carol"):
        done = plugin(person)("approve", "renew", "1:0", "--approve", "-o", "json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1])["approval"] == second
    wait_phase(admin, tenant, "renew", "Succeeded", timeout=90)
    assert [o["body"]["sku"] for o in shop.shop.orders] == ["P9"]
    events = runs.audit_events(operator.cluster.dsn, tenant, "renew")
    assert [e.data["round"] for e in events if e.type == "loop.asked_again"] == [2]
    assert [e.actor for e in events if e.type == "loop.approved"] == ["carol", "bob", "carol"]
