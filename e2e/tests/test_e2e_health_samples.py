"""Real status samples for the Argo CD health checks under deploy/argocd/, from real runs.

The health checks are only as good as the objects they are tested on. These tests drive runs on
the local control plane into every state a GitOps tool must tell apart (under way, done, waiting
for a person, stopped by a budget, failed, stalled, suspended, not yet seen by the operator,
edited but not yet acted on, a monitor and its tick) and hand each AgentRun, Reconciliation and
Approval to `keelgate_e2e.samples`: with KEELGATE_CAPTURE_HEALTH_SAMPLES=1 they become
`deploy/argocd/keelgate.dev/<Kind>/testdata/<sample>.yaml`; otherwise each committed sample must
still have the shape the operator writes. tests/test_argocd_health.py runs the Lua over them.
They must never depend on objects outside their own namespace, and leave the session's operator
running.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import yaml
from keelgate.core.types import PendingApproval, UnknownAction
from keelgate.kube import resources

from keelgate_e2e import keelgate as kg
from keelgate_e2e import runs
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.runs import agentrun, apply, look, order, wait_phase
from keelgate_e2e.samples import SAMPLES, get, keep
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, condition, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def slow_shop() -> Iterator[ShopServer]:
    """A second shop that sits on each order for 30 s, so a step is seen under way."""
    server = ShopServer().start()
    server.shop.delay = 30
    yield server
    server.stop()


def _is(obj: JSON, ctype: str, value: str = "True") -> bool:
    cond = condition(obj, ctype)
    return cond is not None and cond.get("status") == value


def _one(items: list[JSON], run: str) -> JSON | None:
    found = [item for item in items if item["spec"]["runName"] == run]
    return found[0] if found and found[0].get("status") else None


def _monitor(shop: ShopServer) -> JSON:
    """A monitor ticking every minute whose READ needs approval, so its tick waits."""
    run = agentrun("watch", shop, [[look("W1")]], budget={"maxIterations": 3})
    run["spec"].update({"loop": "monitor", "schedule": "* * * * *"})
    run["spec"]["tools"] = [dict(run["spec"]["tools"][0], requiresApproval=True)]
    return run


def _may_edit(admin: Kube, kubectl: Kubectl, namespace: str, user: str) -> None:
    """``user`` gets the built-in `edit` role in the namespace (and may patch Approvals)."""
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )  # fmt: skip
    wait_for(
        lambda: kubectl.as_user(user)("auth", "can-i", "patch", "approvals.keelgate.dev",
                                      check=False).returncode == 0,
        timeout=30,
        what=f"{user} may patch approvals",
    )  # fmt: skip


def _added(
    person: Kubectl, kubectl: Kubectl, name: str, by: str, shows: Callable[[JSON], bool]
) -> JSON:
    """``by`` (as ``person``) adds an approval to the Approval ``name``; the object once its
    status ``shows`` what the operator made of it."""
    entry = [{"op": "add", "path": "/spec/decisions/-", "value": {"by": by, "approved": True}}]
    person("patch", "approval", name, "--type=json", "-p", json.dumps(entry))

    def shown() -> JSON | None:
        obj = get(kubectl, "Approval", name)
        return obj if shows(obj.get("status") or {}) else None

    found: JSON = wait_for(shown, timeout=60, what=f"{name} after {by}'s approval")
    return found


def _dry_run_create(kubectl: Kubectl, body: JSON) -> JSON:
    """What the API server holds between the operator's create and its status patch (the real
    window is too short to catch): the same create, made with --dry-run=server."""
    out = kubectl("create", "--dry-run=server", "-o", "yaml", "-f", "-", stdin=json.dumps(body))
    created: JSON = yaml.safe_load(out.stdout)
    return created


def test_samples_of_runs_under_way_done_waiting_failed_and_suspended(
    operator_process: OperatorPod,
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    slow_shop: ShopServer,
) -> None:
    """Each state is reached for real and its object kept (or checked): a step under way, a run
    that succeeded, an unknown outcome and its Pending Reconciliation, an approval asked for,
    a token budget stop, a verifier's rejection limit (Failed), spec.suspend from the start, a
    monitor and its tick waiting for approval; then, with the operator stopped, a run it has not
    seen (no status), an edit it has not acted on (generation ahead), and decisions it has not
    recorded; restarted, it settles them (Settled, approved, denied, the denied run's end).
    Two people approve a rule of two (Settled, 2 of 2); a decision the rule does not count
    (alice, in no group it names) stays in sight (NotCounted)."""
    ns = tenant
    budget = agentrun("budget", shop, [[order("B1", 1)]], budget={"tokens": 2000})
    budget["spec"]["model"]["script"][0]["usage"] = {"inputTokens": 1900, "outputTokens": 200}
    rejected = agentrun(
        "rejected", shop, [[look("R1")]], budget={"maxIterations": 5, "maxVerifierRejections": 1}
    )
    rejected["spec"]["model"]["script"][0]["verdict"] = "reject"
    pair = agentrun("pair", shop, [[order("Q1", 1)]])
    pair["spec"]["tools"][1]["approval"] = {"required": 2}
    typo = agentrun("typo", shop, [[order("Y1", 1)]])
    typo["spec"]["tools"][1]["approval"] = {"required": 1, "groups": ["payments-aprovers"]}
    apply(
        kubectl,
        agentrun("restock", shop, [[look("A1")], [order("A1", 2)]]),
        agentrun("slow", slow_shop, [[order("S1", 1)]]),
        agentrun(
            "unsure",
            shop,
            [[order("U1", 1)]],
            annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
        ),
        agentrun("granted", shop, [[order("P1", 1)]], approval=True),
        agentrun("denied", shop, [[order("P2", 1)]], approval=True),
        pair,
        typo,
        budget,
        rejected,
        agentrun("held", shop, [[order("H1", 1)]], extra={"suspend": True}),
        _monitor(shop),
    )

    wait_for(lambda: slow_shop.shop.count() == 1, timeout=90, what="the slow order to arrive")
    running = runs.get_run(admin, ns, "slow")
    assert running["status"]["phase"] == "Running" and _is(running, "Reconciling")
    keep("AgentRun", "running", get(kubectl, "AgentRun", "slow"), ns, "a step pod under way")

    done = wait_phase(admin, ns, "restock", "Succeeded", timeout=90)
    assert _is(done, "Succeeded")
    keep("AgentRun", "succeeded", get(kubectl, "AgentRun", "restock"), ns, "the goal was met")

    unsure = wait_phase(admin, ns, "unsure", "Stopped", timeout=90)
    assert _is(unsure, "OutcomeUnknown")
    rec = wait_for(
        lambda: _one(runs.reconciliations(admin, ns), "unsure"), what="unsure's Reconciliation"
    )
    assert rec["status"]["phase"] == "Pending"
    keep(
        "AgentRun",
        "outcome-unknown",
        get(kubectl, "AgentRun", "unsure"),
        ns,
        "a step pod killed right after the order went out (failpoint after_gateway_call@1)",
    )
    rec_name = rec["metadata"]["name"]
    keep(
        "Reconciliation",
        "pending",
        get(kubectl, "Reconciliation", rec_name),
        ns,
        "the unknown outcome, waiting for a person",
    )

    for name in ("granted", "denied"):
        waiting = wait_phase(admin, ns, name, "Stopped", timeout=90)
        assert _is(waiting, "AwaitingApproval")
    keep(
        "AgentRun",
        "awaiting-approval",
        get(kubectl, "AgentRun", "granted"),
        ns,
        "a WRITE with requiresApproval, before the call",
    )
    granted_apr = wait_for(
        lambda: _one(runs.approvals(admin, ns), "granted"), what="the Pending Approval"
    )
    denied_apr = wait_for(
        lambda: _one(runs.approvals(admin, ns), "denied"), what="the Pending Approval"
    )
    granted_name = granted_apr["metadata"]["name"]
    denied_name = denied_apr["metadata"]["name"]
    keep(
        "Approval",
        "pending",
        get(kubectl, "Approval", granted_name),
        ns,
        "an action waiting for a person's yes or no",
    )

    wait_phase(admin, ns, "pair", "Stopped", timeout=90)
    pair_name = wait_for(lambda: _one(runs.approvals(admin, ns), "pair"), what="pair's Approval")[
        "metadata"
    ]["name"]
    keep(
        "Approval",
        "partly-approved",
        _added(alice, kubectl, pair_name, "alice", lambda s: s.get("progress") == "1 of 2"),
        ns,
        "a WRITE needing two people's approval (approval.required: 2), approved by alice so far",
    )
    _may_edit(admin, kubectl, ns, "bob")
    bob = kubectl.as_user("bob")
    keep(
        "Approval",
        "approved-by-two",
        _added(bob, kubectl, pair_name, "bob", lambda s: s.get("progress") == "2 of 2"),
        ns,
        "a WRITE needing two people's approval, approved by alice and then bob",
    )

    wait_phase(admin, ns, "typo", "Stopped", timeout=90)
    typo_name = wait_for(lambda: _one(runs.approvals(admin, ns), "typo"), what="typo's Approval")[
        "metadata"
    ]["name"]

    def not_counted(status: JSON) -> bool:
        ready = condition({"status": status}, "Ready") or {}
        return ready.get("reason") == "NotCounted"

    keep(
        "Approval",
        "not-counted",
        _added(alice, kubectl, typo_name, "alice", not_counted),
        ns,
        "alice's approval, not counted: the rule names a group she is not in (a typo)",
    )

    stopped = wait_phase(admin, ns, "budget", "Stopped", timeout=90)
    assert stopped["status"]["stopReason"] == "token_budget" and stopped["status"]["resumable"]
    keep(
        "AgentRun",
        "budget-stopped",
        get(kubectl, "AgentRun", "budget"),
        ns,
        "the token budget crossed by the model's reply (resumable: raise spec.budget.tokens)",
    )

    failed = wait_phase(admin, ns, "rejected", "Failed", timeout=90)
    assert failed["status"]["stopReason"] == "verifier_rejections" and _is(failed, "Stalled")
    keep(
        "AgentRun",
        "failed",
        get(kubectl, "AgentRun", "rejected"),
        ns,
        "the verifier rejected the first iteration (maxVerifierRejections: 1)",
    )

    held = wait_phase(admin, ns, "held", "Pending", timeout=60)
    assert _is(held, "Reconciling", "False")
    keep("AgentRun", "suspended", get(kubectl, "AgentRun", "held"), ns, "spec.suspend: true")

    # The operator stopped: what a GitOps tool sees before it acts.
    operator_process.stop()
    try:
        apply(kubectl, agentrun("unseen", shop, [[order("N1", 1)]]))
        keep(
            "AgentRun",
            "no-status",
            get(kubectl, "AgentRun", "unseen"),
            ns,
            "applied while the operator was not running",
        )
        raise_budget = '{"spec":{"budget":{"tokens":100000}}}'
        kubectl("patch", "agentrun", "budget", "--type=merge", "-p", raise_budget)
        edited = get(kubectl, "AgentRun", "budget")
        assert edited["metadata"]["generation"] == 2
        assert edited["status"]["observedGeneration"] == 1
        keep(
            "AgentRun",
            "generation-ahead",
            edited,
            ns,
            "the budget raised while the operator was not running",
        )
        key = str(rec["spec"]["idempotencyKey"])
        executed = shop.shop.by_key()[key] > 0  # what the shop says, as a person checks
        body = json.dumps({"spec": {"executed": executed, "by": "alice", "note": "checked"}})
        alice("patch", "reconciliation", rec_name, "--type=merge", "-p", body)
        keep(
            "Reconciliation",
            "decided",
            get(kubectl, "Reconciliation", rec_name),
            ns,
            "alice decided (kubectl patch) while the operator was not running",
        )
        runs.decide(alice, granted_name, approved=True)
        keep(
            "Approval",
            "decided",
            get(kubectl, "Approval", granted_name),
            ns,
            "alice approved (kubectl patch) while the operator was not running",
        )
        deny = [{"op": "add", "path": "/spec/decisions/-",
                 "value": {"by": "alice", "approved": False, "note": "not this sku"}}]  # fmt: skip
        alice("patch", "approval", denied_name, "--type=json", "-p", json.dumps(deny))
        keep(
            "Approval",
            "decided-in-list",
            get(kubectl, "Approval", denied_name),
            ns,
            "alice denied (a decision added to spec.decisions) while the operator was not running",
        )
        unsure_run = runs.get_run(admin, ns, "unsure")
        later_rec = resources.reconciliation(unsure_run, UnknownAction("2:0", "place_order", key))
        keep(
            "Reconciliation",
            "no-status",
            _dry_run_create(kubectl, later_rec),
            ns,
            "the operator's create of a Reconciliation, before its status patch (--dry-run=server)",
        )
        granted_run = runs.get_run(admin, ns, "granted")
        later_apr = resources.approval(granted_run, PendingApproval("2:0", "place_order"), "")
        keep(
            "Approval",
            "no-status",
            _dry_run_create(kubectl, later_apr),
            ns,
            "the operator's create of an Approval, before its status patch (--dry-run=server)",
        )
    finally:
        operator_process.start()

    def settled(kind: str, name: str) -> JSON | None:
        obj = get(kubectl, kind, name)
        return obj if (obj.get("status") or {}).get("phase") == "Settled" else None

    keep(
        "Reconciliation",
        "settled",
        wait_for(lambda: settled("Reconciliation", rec_name), timeout=60, what="settled"),
        ns,
        "settled as executed by alice, recorded by the operator",
    )
    keep(
        "Approval",
        "approved",
        wait_for(lambda: settled("Approval", granted_name), timeout=60, what="approved"),
        ns,
        "approved by alice, recorded by the operator",
    )
    keep(
        "Approval",
        "denied",
        wait_for(lambda: settled("Approval", denied_name), timeout=60, what="denied"),
        ns,
        "denied by alice, recorded by the operator",
    )
    wait_phase(admin, ns, "denied", "Succeeded", timeout=90)
    keep(
        "AgentRun",
        "succeeded-denied",
        get(kubectl, "AgentRun", "denied"),
        ns,
        "the goal met, its one WRITE denied by alice (it never ran)",
    )
    wait_phase(admin, ns, "unsure", "Succeeded", timeout=90)
    assert shop.shop.by_key()[key] == 1

    tick = wait_phase(admin, ns, "watch.tick-1", "Stopped", timeout=120)
    assert _is(tick, "AwaitingApproval")
    keep(
        "AgentRun",
        "tick-awaiting-approval",
        get(kubectl, "AgentRun", "watch.tick-1"),
        ns,
        "a monitor's tick whose READ waits for approval",
    )
    keep(
        "AgentRun",
        "monitor",
        get(kubectl, "AgentRun", "watch"),
        ns,
        "a monitor scheduling a tick every minute",
    )


def test_sample_of_a_run_stalled_by_a_crash_loop(
    operator: OperatorPod, namespace: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """Step pods that cannot reach the store (the tenant's Secret names a closed port) die one
    after another without recording a stop; after --max-crashes (5) the run is Stalled, phase
    Stopped, and its sample is kept (or checked)."""
    kg.store_secret(admin, namespace, "postgresql://keelgate@127.0.0.1:1/keelgate")
    apply(kubectl, agentrun("crashing", shop, [[order("C1", 1)]]))

    def stalled_run() -> JSON | None:
        run = runs.get_run(admin, namespace, "crashing")
        return run if _is(run, "Stalled") else None

    stalled = wait_for(
        stalled_run,
        timeout=150,
        interval=1,
        what="the crash loop to stall the run",
    )
    assert stalled["status"]["phase"] == "Stopped"
    assert stalled["status"]["step"]["crashes"] == 5
    keep(
        "AgentRun",
        "stalled",
        get(kubectl, "AgentRun", "crashing"),
        namespace,
        "5 step pods in a row could not reach the store (a wrong URL in the keelgate-store Secret)",
    )
    assert shop.shop.count() == 0


def test_samples_of_decisions_the_operator_cannot_act_on(
    operator: OperatorPod, namespace: str, admin: Kube, kubectl: Kubectl
) -> None:
    """A Reconciliation and an Approval written by hand for a run the store does not have (a
    typo in spec.runName): the operator shows each Pending with Stalled=True (RunNotFound) and a
    message naming the run, and their samples are kept (or checked)."""
    for kind, decided in (("Reconciliation", {"executed": True}), ("Approval", {"approved": True})):
        spec = {"runName": "ghost", "action": "1:0", "tool": "place_order", "by": "admin"}
        if kind == "Reconciliation":
            spec["idempotencyKey"] = "kg-" + "0" * 40
        obj = {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": kind,
            "metadata": {"name": "ghost-1-place-order", "namespace": namespace},
            "spec": {**spec, **decided},
        }
        apply(kubectl, obj)

        def refused(kind: str = kind) -> JSON | None:
            shown = get(kubectl, kind, "ghost-1-place-order")
            return shown if _is(shown, "Stalled") else None

        shown = wait_for(refused, timeout=60, interval=1, what=f"the {kind} to be shown refused")
        assert shown["status"]["phase"] == "Pending"
        assert "ghost" in shown["status"]["message"]
        assert condition(shown, "Stalled")["reason"] == "RunNotFound"  # type: ignore[index]
        assert _is(shown, "Ready", "False")
        keep(
            kind,
            "refused",
            shown,
            namespace,
            "written by hand for a run the store does not have (spec.runName: ghost)",
        )


def test_the_argocd_cm_snippet_merges_into_argocd_cm_as_the_docs_say(
    admin: Kube, kubectl: Kubectl
) -> None:
    """`kubectl -n argocd patch configmap argocd-cm --type merge --patch-file
    deploy/argocd/argocd-cm.yaml` (docs/gitops.md) adds the three health keys, each exactly its
    health.lua, and keeps the keys Argo CD's own configuration had."""
    admin.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "argocd"}},
    )
    try:
        admin.create(
            "/api/v1/namespaces/argocd/configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "argocd-cm"},
                "data": {"url": "https://argocd.example.com"},
            },
        )
        snippet = SAMPLES.parent / "argocd-cm.yaml"
        kubectl(
            "-n",
            "argocd",
            "patch",
            "configmap",
            "argocd-cm",
            "--type",
            "merge",
            "--patch-file",
            str(snippet),
        )
        data = admin.get("/api/v1/namespaces/argocd/configmaps/argocd-cm")["data"]
        expected = {
            f"resource.customizations.health.keelgate.dev_{kind}": (
                SAMPLES / kind / "health.lua"
            ).read_text()
            for kind in ("AgentRun", "Reconciliation", "Approval")
        }
        assert data == {"url": "https://argocd.example.com", **expected}
    finally:
        admin.delete("/api/v1/namespaces/argocd")
