"""The operator on the real control plane: `kubectl apply` an AgentRun, one pod per step.

Every test runs the operator as it ships (kopf, under its own service account's RBAC) against
the real kube-apiserver, with step pods run by the node agent and a real PostgreSQL store. What
they check is what a user sees: phases, conditions, Events, printer columns, the downstream
shop's order book, and the audit trail in the store. They must never settle an outcome against
the shop's record, and never depend on objects outside their own namespace.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psycopg
import pytest
from keelgate.kube.naming import action_object_name

from keelgate_e2e import runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import (
    STORE_PASSWORD,
    OperatorPod,
    OperatorProcess,
    grant_edit,
    password_of,
    store_url,
    tenant_dsn,
)
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.plugin import KubectlKeelgate
from keelgate_e2e.runs import agentrun, apply, look, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, condition, wait_for

pytestmark = pytest.mark.e2e


def _events(admin: Kube, namespace: str, name: str) -> list[JSON]:
    listed = admin.get(
        f"/api/v1/namespaces/{namespace}/events",
        {"fieldSelector": f"involvedObject.name={name},involvedObject.kind=AgentRun"},
    )
    return list(listed["items"])


def _reasons(admin: Kube, namespace: str, name: str) -> list[str]:
    return [e["reason"] for e in _events(admin, namespace, name)]


def test_a_run_applied_with_kubectl_succeeds_with_conditions_events_and_columns(
    operator: OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """The restock run: read, order, done. `kubectl wait --for=condition=Succeeded` returns,
    `kubectl get` shows Succeeded / goal_met / 3, each step had its pod and its Events, and the
    shop took exactly one order, under the key the audit trail names."""
    run = agentrun("restock", shop, [[look("A1")], [order("A1", 20)]])
    assert "created" in apply(kubectl, run)
    kubectl("wait", "--for=condition=Succeeded", "agentrun/restock", "--timeout=90s", timeout=120)
    table = kubectl("get", "agentruns").stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "PHASE", "REASON", "ITERATION"]
    assert table[1].split()[:4] == ["restock", "Succeeded", "goal_met", "3"]
    status = runs.get_run(admin, tenant, "restock")["status"]
    assert status["observedGeneration"] == 1 and status["answer"] == "done"
    expected = {
        "Succeeded": "True",
        "Ready": "True",
        "OutcomeUnknown": "False",
        "AwaitingApproval": "False",
        "Reconciling": "False",
        "Stalled": "False",
    }
    assert {c["type"]: c["status"] for c in status["conditions"]} == expected
    pods = admin.get(
        f"/api/v1/namespaces/{tenant}/pods", {"labelSelector": "keelgate.dev/run=restock"}
    )["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == [
        "restock-s1-a1",
        "restock-s2-a1",
        "restock-s3-a1",
    ]
    reasons = _reasons(admin, tenant, "restock")
    # The run's first step is told; the routine steps after it by the status alone (the
    # default --step-events=notable), and the last clean end with the run's stop.
    assert reasons.count("StepStarted") == 1 and reasons.count("StepEnded") == 0
    told = {e["reason"]: e["message"] for e in _events(admin, tenant, "restock")}
    assert "step 3 (pod restock-s3-a1) ended: exit code 0" in told["Succeeded"]
    assert "Succeeded" in reasons
    assert shop.shop.count() == 1
    events = runs.audit_events(operator.cluster.dsn, tenant, "restock")
    started = [e for e in events if e.type == "loop.action_started" and e.data["idempotencyKey"]]
    assert [e.data["idempotencyKey"] for e in started] == list(shop.shop.by_key())


def test_gitops_sees_no_drift_after_a_run(
    operator: OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """The operator writes status only: after a full run, applying the same manifest again is
    `unchanged`, `kubectl diff --server-side` shows nothing, and the spec, labels and
    annotations are exactly what the user applied, besides who created it, which admission
    records (generation still 1)."""
    run = agentrun("gitops", shop, [[order("G1", 1)]])
    run["metadata"]["labels"] = {"team": "stores"}
    run["metadata"]["annotations"] = {"owner": "alice"}
    apply(kubectl, run)
    wait_phase(admin, tenant, "gitops", "Succeeded", timeout=90)
    assert "unchanged" in apply(kubectl, run)
    diff = kubectl("diff", "--server-side", "-f", "-", stdin=json.dumps(run), check=False)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    live = runs.get_run(admin, tenant, "gitops")
    assert live["metadata"]["generation"] == 1
    assert live["metadata"]["labels"] == {"team": "stores"}
    annotations = dict(live["metadata"]["annotations"])
    annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
    # Who created the run, recorded by the chart's admission policy at creation (for an
    # approval rule's notCreator; the control plane serves MutatingAdmissionPolicy): the
    # requester. Apply and the server-side diff above ignore it.
    assert annotations.pop("keelgate.dev/created-by") == "admin"
    assert annotations == {"owner": "alice"}
    assert not live["metadata"].get("finalizers")
    managers = {m["manager"]: m for m in live["metadata"]["managedFields"]}
    operator_writes = [m for name, m in managers.items() if "kubectl" not in name]
    assert operator_writes and all(m.get("subresource") == "status" for m in operator_writes)


# Every crash window of contract section 3, armed through the annotation.
WINDOWS = (
    "after_plan",
    "before_action",
    "after_gateway_call",
    "after_action_checkpoint",
    "after_observe",
    "after_verify",
)


def test_every_crash_window_armed_by_annotation_runs_each_write_exactly_once(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """Each window at its 1st and 2nd occurrence in the step pod that plans two WRITEs: the pod
    dies there (`os._exit(137)`), a new attempt resumes from the checkpoint, a WRITE left in
    flight stops the run OutcomeUnknown until alice settles its Reconciliation with what the
    shop says. Every run succeeds; the shop sees each key at most once, and exactly once
    wherever the order was sent."""
    names = []
    docs = []
    for window in WINDOWS:
        for occurrence in (1, 2):
            name = f"{window.replace('_', '-')}-{occurrence}"
            names.append(name)
            sku = f"{window}-{occurrence}"
            docs.append(
                agentrun(
                    name,
                    shop,
                    [[order(sku, 1), order(sku, 2)]],
                    annotations={"keelgate.dev/failpoints": f"{window}@{occurrence}"},
                )
            )
    apply(kubectl, *docs)
    done = runs.drive_to_success(admin, alice, tenant, names, shop, timeout=300)
    assert set(done) == set(names)
    counts = shop.shop.by_key()
    assert counts and max(counts.values()) == 1, counts
    # Where the crash came after the order went out, the order stands, once.
    for name in names:
        events = runs.audit_events(operator.cluster.dsn, tenant, name)
        keys = {e.data["idempotencyKey"] for e in events if e.type == "loop.action_started"}
        assert len(keys) == 2
        settled = {
            e.data["idempotencyKey"]: e.data["verdict"]
            for e in events
            if e.type == "loop.reconciled"
        }
        for key in keys:
            expected = 0 if settled.get(key) == "abandoned" else 1
            assert counts[key] == expected, (name, key, settled)
    crashed = [
        name
        for name in names
        if any(
            "137" in e["message"]
            for e in _events(admin, tenant, name)
            if e["reason"] == "StepEnded"
        )
    ]
    # after_plan@2, after_observe@2 and after_verify@2 never come in a one-iteration pod.
    assert len(crashed) >= 9, crashed


def test_a_decision_is_made_by_the_requesting_user_only_and_never_changes(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """An unknown outcome's Reconciliation: alice cannot write someone else's name into `by`,
    bob (no grant) cannot touch it, alice cannot reach another namespace, and once settled the
    decision cannot be changed. The run then finishes with the order placed once."""
    run = agentrun(
        "decide",
        shop,
        [[order("D1", 1)]],
        annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
    )
    apply(kubectl, run)
    stopped = wait_phase(admin, tenant, "decide", "Stopped", timeout=90)
    unknown = condition(stopped, "OutcomeUnknown")
    assert unknown is not None and unknown["status"] == "True"
    rec = action_object_name("decide", "1:0", "place_order")
    assert rec in unknown["message"]
    assert stopped["status"]["stopReason"] == "outcome_unknown"
    rec_path = f"/apis/keelgate.dev/v1alpha1/namespaces/{tenant}/reconciliations/{rec}"
    wait_for(lambda: admin.exists(rec_path), what="the Reconciliation")

    def patch(who: Kubectl, body: JSON) -> tuple[int, str]:
        out = who(
            "patch", "reconciliation", rec, "--type=merge", "-p", json.dumps(body), check=False
        )
        return out.returncode, out.stderr

    code, err = patch(alice, {"spec": {"executed": True, "by": "bob"}})
    assert code != 0 and "spec.by must be alice" in err
    bob = kubectl.as_user("bob")
    code, err = patch(bob, {"spec": {"executed": True, "by": "bob"}})
    assert code != 0 and "forbidden" in err.lower()
    elsewhere = Kubectl(kubectl.binary, kubectl.kubeconfig, "alice", "default")
    out = elsewhere("get", "agentruns", check=False)
    assert out.returncode != 0 and "forbidden" in out.stderr.lower()
    assert shop.shop.count() == 1  # the order went out before the crash: executed is the truth
    code, err = patch(alice, {"spec": {"executed": True, "by": "alice", "note": "in the book"}})
    assert code == 0, err
    code, err = patch(alice, {"spec": {"executed": False}})
    assert code != 0 and "cannot change once set" in err
    done = wait_phase(admin, tenant, "decide", "Succeeded", timeout=90)
    assert condition(done, "OutcomeUnknown")["status"] == "False"  # type: ignore[index]
    settled = admin.get(rec_path)
    assert settled["status"]["phase"] == "Settled"
    assert (settled["status"]["verdict"], settled["status"]["source"]) == ("executed", "human")
    assert settled["status"]["settledBy"] == "alice"
    assert shop.shop.count() == 1
    assert "Settled" in _reasons(admin, tenant, "decide")
    reconciled = [
        e
        for e in runs.audit_events(operator.cluster.dsn, tenant, "decide")
        if e.type == "loop.reconciled"
    ]
    assert [(e.actor, e.data["verdict"]) for e in reconciled] == [("alice", "executed")]


def test_a_not_executed_written_before_the_deadline_never_counts(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
    kubectl_bin: Path,
) -> None:
    """Two runs whose order went out before their step died (unknown outcomes, the orders in
    the shop). Before the calls' write deadline `kubectl keelgate reconcile --not-executed` is
    exit 4, and alice's own patch of "not executed" (wrong: it ran) is held, then refused as
    written too early (Stalled, DecidedTooEarly): never recorded, the runs wait. carol, who
    holds edit too, may not correct alice's (one line from the plugin). On the first, alice
    looks again and corrects it to executed; the second the admin deletes and then touches its
    run (an annotation), and the operator makes it afresh, undecided, which carol settles.
    Both runs succeed, each order counted once."""
    grant_edit(admin, tenant, "carol")
    names = ("early-a", "early-b")
    docs = []
    for name in names:
        run = agentrun(
            name,
            shop,
            [[order(name, 1)]],
            annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
        )
        run["spec"]["tools"][1]["timeoutSeconds"] = 40  # the write deadline: the claim + 45 s
        docs.append(run)
    apply(kubectl, *docs)
    path = f"/apis/keelgate.dev/v1alpha1/namespaces/{tenant}/reconciliations"
    recs = {name: action_object_name(name, "1:0", "place_order") for name in names}

    def rec(name: str) -> JSON:
        return admin.get(f"{path}/{recs[name]}")

    def plugin(user: str, *args: str) -> tuple[int, str]:
        done = KubectlKeelgate(kubectl_bin, cluster.kubeconfig, user, tenant)(*args)
        return done.returncode, done.stdout + done.stderr

    def deadline(name: str) -> str:
        return str((rec(name).get("status") or {}).get("notExecutedAfter") or "")

    def held(name: str) -> JSON | None:
        body = rec(name)
        return (
            body if body["status"].get("heldGeneration") == body["metadata"]["generation"] else None
        )

    def refused(name: str) -> JSON | None:
        stalled = condition(rec(name), "Stalled")
        return stalled if stalled and stalled["reason"] == "DecidedTooEarly" else None

    for name in names:
        wait_phase(admin, tenant, name, "Stopped", timeout=90)
        wait_for(partial(deadline, name), what=f"{name}'s Reconciliation with its deadline")
        code, said = plugin("alice", "reconcile", name, "1:0", "--not-executed")
        assert code == 4 and "cannot be settled as not executed yet" in said, said
        early = {"spec": {"executed": False, "by": "alice"}}
        alice("patch", "reconciliation", recs[name], "--type=merge", "-p", json.dumps(early))
    for name in names:
        shown = wait_for(partial(held, name), what=f"{name}'s not executed held")
        assert shown["status"]["phase"] == "Pending"
        assert "SettlementHeld" in _reasons(admin, tenant, name)
    for name in names:
        stalled = wait_for(partial(refused, name), timeout=90, what="DecidedTooEarly")
        assert stalled["status"] == "True" and "not executed by alice" in stalled["message"]
        assert rec(name)["status"]["phase"] == "Pending"
        assert runs.phase(admin, tenant, name) == "Stopped"
        assert "DecidedTooEarly" in _reasons(admin, tenant, name)
        code, said = plugin("carol", "reconcile", name, "1:0", "--executed")
        assert code == 1, said
        assert "only alice, who made it, may write it again or correct it to executed" in said
    time.sleep(2)  # refused, it stays so: nothing is recorded
    for name in names:
        events = runs.audit_events(operator.cluster.dsn, tenant, name)
        assert not [e for e in events if e.type == "loop.reconciled"]

    code, said = plugin("alice", "reconcile", "early-a", "1:0", "--executed", "--note", "in")
    assert code == 0, said
    # alice cannot write early-b's again (she is away): an admin deletes it, and the operator
    # makes it afresh, undecided, for carol.
    admin.delete(f"{path}/{recs['early-b']}")
    wait_for(
        lambda: (
            admin.exists(f"{path}/{recs['early-b']}")
            and "executed" not in (rec("early-b").get("spec") or {})
        ),
        timeout=90,
        what="early-b's Reconciliation made afresh",
    )
    code, said = plugin("carol", "reconcile", "early-b", "1:0", "--executed")
    assert code == 0, said
    for name, by in (("early-a", "alice"), ("early-b", "carol")):
        wait_phase(admin, tenant, name, "Succeeded", timeout=90)
        settled = rec(name)
        assert (settled["status"]["verdict"], settled["status"]["settledBy"]) == ("executed", by)
        assert settled["spec"]["decidedAt"]
        reconciled = [
            (e.actor, e.data["verdict"])
            for e in runs.audit_events(operator.cluster.dsn, tenant, name)
            if e.type == "loop.reconciled"
        ]
        assert reconciled == [(by, "executed")]
    assert shop.shop.by_key() and set(shop.shop.by_key().values()) == {1}
    assert shop.shop.count() == 2


def test_an_invalid_agentrun_is_refused_by_the_api_server_naming_the_field(
    operator: OperatorPod, tenant: str, kubectl: Kubectl, shop: ShopServer
) -> None:
    """A bad value never reaches the operator: `kubectl apply` fails with the field's path."""
    run = agentrun("invalid", shop, [[order("X", 1)]])
    run["spec"]["tools"][1]["sideEffect"] = "DELETE"
    out = kubectl("apply", "-f", "-", stdin=json.dumps(run), check=False)
    assert out.returncode != 0
    assert "spec.tools[1].sideEffect" in out.stderr


def test_a_raised_budget_continues_the_saved_plan_without_asking_the_model_again(
    operator: OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """The planning call that crosses the token budget is kept and its plan saved; the run stops
    token_budget with no order. `kubectl patch` raising spec.budget.tokens resumes it: the saved
    order is placed once and no plan is saved again for that iteration."""
    run = agentrun("budget", shop, [[order("B1", 3)]], budget={"maxIterations": 5, "tokens": 2000})
    # The request is far below 2000 tokens (the pre-check lets it through); the reply crosses.
    run["spec"]["model"]["script"][0]["usage"] = {"inputTokens": 1900, "outputTokens": 200}
    apply(kubectl, run)
    stopped = wait_phase(admin, tenant, "budget", "Stopped", timeout=90)
    assert stopped["status"]["stopReason"] == "token_budget"
    assert stopped["status"]["resumable"] is True
    assert condition(stopped, "Reconciling")["status"] == "False"  # type: ignore[index]
    assert condition(stopped, "Stalled")["status"] == "False"  # type: ignore[index]
    assert shop.shop.count() == 0
    kubectl(
        "patch", "agentrun", "budget", "--type=merge", "-p", '{"spec":{"budget":{"tokens":100000}}}'
    )
    done = wait_phase(admin, tenant, "budget", "Succeeded", timeout=90)
    assert done["status"]["observedGeneration"] == 2
    assert shop.shop.count() == 1
    events = runs.audit_events(operator.cluster.dsn, tenant, "budget")
    types = [e.type for e in events]
    resumed = types.index("loop.resumed")
    assert "loop.plan_saved" not in types[resumed : types.index("loop.action_started")]
    assert types.count("loop.plan_saved") == 2  # the order's plan, then "done"


def test_an_approval_granted_runs_the_write_once_and_a_denial_never_runs_it(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """requiresApproval stops each run AwaitingApproval with an Approval object before any
    order; alice's approval runs the order once, her denial never runs it (the model sees the
    denial and the run still reaches its goal); time waiting is not active time."""
    apply(
        kubectl,
        agentrun("granted", shop, [[order("P1", 1)]], approval=True),
        agentrun("denied", shop, [[order("P2", 1)]], approval=True),
    )
    for name in ("granted", "denied"):
        waiting = wait_phase(admin, tenant, name, "Stopped", timeout=90)
        assert waiting["status"]["stopReason"] == "awaiting_approval"
        assert condition(waiting, "AwaitingApproval")["status"] == "True"  # type: ignore[index]
    assert shop.shop.count() == 0
    wait_for(lambda: len(runs.approvals(admin, tenant)) == 2, what="two approvals")
    time.sleep(2)  # a person takes a while; none of it is active time
    for approval in runs.approvals(admin, tenant):
        verdict = approval["spec"]["runName"] == "granted"
        runs.decide(alice, approval["metadata"]["name"], approved=verdict)
    granted = wait_phase(admin, tenant, "granted", "Succeeded", timeout=90)
    denied = wait_phase(admin, tenant, "denied", "Succeeded", timeout=90)
    assert [o["body"]["sku"] for o in shop.shop.orders] == ["P1"]
    assert granted["status"]["usage"]["activeSeconds"] < 2
    assert denied["status"]["usage"]["activeSeconds"] < 2
    verdicts = {a["spec"]["runName"]: a["status"]["verdict"] for a in runs.approvals(admin, tenant)}
    assert verdicts == {"granted": "approved", "denied": "denied"}
    assert "Denied" in _reasons(admin, tenant, "denied")


def test_deleting_a_run_mid_step_stops_its_pod_and_keeps_its_audit_trail(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
) -> None:
    """A run deleted while its step pod waits on a slow WRITE: the delete never blocks (no
    finalizer), the pod is stopped, and the run's audit trail stays readable in the store."""
    shop.shop.delay = 20
    apply(kubectl, agentrun("doomed", shop, [[order("Z1", 1)]]))
    wait_for(lambda: shop.shop.count() == 1, timeout=60, what="the slow order to arrive")
    started = time.monotonic()
    kubectl("delete", "agentrun", "doomed", "--wait=true", "--timeout=60s", timeout=90)
    assert time.monotonic() - started < 30
    wait_for(
        lambda: (
            not admin.get(
                f"/api/v1/namespaces/{tenant}/pods", {"labelSelector": "keelgate.dev/run=doomed"}
            )["items"]
        ),
        timeout=60,
        what="the step pod to go",
    )
    events = runs.audit_events(cluster.dsn, tenant, "doomed")
    assert [e.type for e in events][:3] == [
        "loop.started",
        "loop.plan_saved",
        "loop.action_started",
    ]


def test_step_pods_are_admitted_where_pod_security_restricted_is_enforced(
    operator: OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """A namespace enforcing Pod Security `restricted` admits the step pods (non-root,
    read-only root filesystem, no privilege escalation, no capabilities, RuntimeDefault seccomp,
    no service-account token), and the run succeeds there."""
    admin.patch(
        f"/api/v1/namespaces/{tenant}",
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    apply(kubectl, agentrun("hardened", shop, [[order("H1", 1)]]))
    done = wait_phase(admin, tenant, "hardened", "Succeeded", timeout=90)
    assert done["status"]["iteration"] == 2
    pod = admin.get(f"/api/v1/namespaces/{tenant}/pods/hardened-s1-a1")
    assert pod["spec"]["automountServiceAccountToken"] is False
    env = pod["spec"]["containers"][0]["env"]
    assert all("value" not in e for e in env if e["name"] == "KEELGATE_STORE")


def test_secrets_never_appear_in_status_events_logs_or_the_audit_trail(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
) -> None:
    """The store passwords (the operator's role's, in its URL; the tenant's role's, in the
    step pods'; the administrator's) are nowhere a user or an auditor looks: the run's status,
    its Events, the step pods' logs and specs, the operator's log, the audit trail and the
    stored checkpoints and specs."""
    apply(kubectl, agentrun("secret", shop, [[look("S1")], [order("S1", 1)]]))
    run = wait_phase(admin, tenant, "secret", "Succeeded", timeout=90)
    seen = [json.dumps(run), json.dumps(_events(admin, tenant, "secret"))]
    for pod in admin.get(f"/api/v1/namespaces/{tenant}/pods")["items"]:
        seen.append(json.dumps(pod))
        seen.append(kubectl("logs", pod["metadata"]["name"]).stdout)
    seen.append(operator.logs())
    with psycopg.connect(tenant_dsn(cluster, tenant)) as conn:
        for table in ("keelgate_checkpoints", "keelgate_audit", "keelgate_specs"):
            seen.append(str(conn.execute(f"SELECT * FROM {table}").fetchall()))
    passwords = (
        STORE_PASSWORD,
        password_of(operator.store_url),
        password_of(store_url(admin, tenant)),
    )
    assert all(len(password) >= 16 for password in passwords)
    assert all(password not in text for text in seen for password in passwords)
    assert any("secret" in text for text in seen[-3:])  # the store was read at all


def test_the_operator_serves_metrics_and_health(
    operator: OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """/healthz answers ok; /metrics counts steps started and ended, hand-offs, and writes."""
    apply(kubectl, agentrun("metered", shop, [[order("M1", 1)]]))
    wait_phase(admin, tenant, "metered", "Succeeded", timeout=90)
    assert operator.healthy()
    text = operator.metrics()
    started = re.search(r"^keelgate_steps_started_total (\d+)", text, re.MULTILINE)
    assert started and int(started.group(1)) >= 2
    assert 'keelgate_steps_ended_total{result="clean"}' in text
    assert "keelgate_step_handoff_seconds_count" in text
    assert 'keelgate_api_writes_total{what="create Pod"}' in text
    assert 'keelgate_runs{phase="Succeeded"}' in text


@pytest.fixture
def confirming_operator(
    operator_process: OperatorPod, cluster: Cluster, shop: ShopServer
) -> Iterator[OperatorProcess]:
    """The operator configured with an HTTP confirmer asking this test's shop (the session's
    operator is stopped meanwhile, so only this one acts)."""
    operator_process.stop()
    confirming = OperatorProcess(
        cluster,
        operator_process.kubeconfig,
        name="operator-confirmer",
        env=dict(operator_process.env),
        extra_args=(f"--confirmer-url={shop.url}/confirm/{{idempotencyKey}}",),
    )
    confirming.start()
    try:
        yield confirming
    finally:
        confirming.stop()
        operator_process.start()


def test_a_confirmer_on_the_operator_settles_an_unknown_outcome_on_its_own(
    confirming_operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
) -> None:
    """The step pod dies right after the order went out; the next attempt's confirmer asks the
    shop, which says the order arrived, so the action is settled as executed with no person and
    no stop. The run succeeds with one order, and a Reconciliation shows what was decided:
    Settled, executed, source confirmer."""
    run = agentrun(
        "confirmed",
        shop,
        [[order("C1", 1)]],
        annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
    )
    apply(kubectl, run)
    wait_phase(admin, tenant, "confirmed", "Succeeded", timeout=90)
    assert shop.shop.count() == 1
    assert "Stopped" not in _reasons(admin, tenant, "confirmed")
    (rec,) = wait_for(
        lambda: [r for r in runs.reconciliations(admin, tenant) if r.get("status")],
        timeout=30,
        what="the confirmer's Reconciliation",
    )
    status = rec["status"]
    assert (status["phase"], status["verdict"], status["source"]) == (
        "Settled",
        "executed",
        "confirmer",
    )
    assert status["settledBy"] == "http-confirmer"
    reconciled = [
        e
        for e in runs.audit_events(confirming_operator.cluster.dsn, tenant, "confirmed")
        if e.type == "loop.reconciled"
    ]
    assert [(e.data["source"], e.data["verdict"]) for e in reconciled] == [
        ("confirmer", "executed")
    ]


def test_a_suspended_run_starts_no_step_pod_until_it_is_resumed(
    operator: OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """`spec.suspend: true` from the start: no step pod, the run says it is suspended (and is
    neither reconciling nor stalled); `kubectl patch` to false starts it, and it succeeds with
    its one order."""
    run = agentrun("paused", shop, [[order("S9", 1)]], extra={"suspend": True})
    apply(kubectl, run)

    def suspended() -> JSON | None:
        current = runs.get_run(admin, tenant, "paused")
        reconciling = condition(current, "Reconciling")
        if reconciling and reconciling["reason"] == "Suspended":
            return current
        return None

    shown = wait_for(suspended, timeout=60, what="the run to show it is suspended")
    assert "suspend" in shown["status"]["message"]
    assert condition(shown, "Stalled")["status"] == "False"  # type: ignore[index]
    time.sleep(3)
    pods = admin.get(f"/api/v1/namespaces/{tenant}/pods")["items"]
    assert pods == [] and shop.shop.count() == 0
    kubectl("patch", "agentrun", "paused", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    done = wait_phase(admin, tenant, "paused", "Succeeded", timeout=90)
    assert done["status"]["observedGeneration"] == 2
    assert shop.shop.count() == 1


def test_a_step_pod_the_api_server_refuses_is_told_and_the_run_goes_on_once_allowed(
    operator: OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """A ResourceQuota of zero pods: the API server refuses the step pod. The run tells it in one
    FailedCreate Warning naming the quota, and after three refusals shows Stalled=True
    (PodCreateRefused) while it keeps trying; once the quota is deleted the pod is created
    ("Created"), Stalled is cleared, and the run succeeds with its one order."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods", "namespace": tenant},
        "spec": {"hard": {"pods": "0"}},
    }
    admin.create(f"/api/v1/namespaces/{tenant}/resourcequotas", quota)
    # The quota controller must have counted usage before the API server enforces it.
    wait_for(
        lambda: (
            admin.get(f"/api/v1/namespaces/{tenant}/resourcequotas/no-pods")
            .get("status", {})
            .get("used")
        ),
        timeout=30,
        what="the quota to be counted",
    )
    apply(kubectl, agentrun("blocked", shop, [[order("Q1", 1)]]))

    def stalled() -> JSON | None:
        run = runs.get_run(admin, tenant, "blocked")
        cond = condition(run, "Stalled")
        return run if cond and cond["status"] == "True" else None

    shown = wait_for(stalled, timeout=120, interval=1, what="the refused pod to stall the run")
    assert condition(shown, "Stalled")["reason"] == "PodCreateRefused"  # type: ignore[index]
    assert "no-pods" in condition(shown, "Stalled")["message"]  # type: ignore[index]
    failed = [e for e in _events(admin, tenant, "blocked") if e["reason"] == "FailedCreate"]
    assert len(failed) == 1 and failed[0]["type"] == "Warning"
    assert "no-pods" in failed[0]["message"]
    assert shop.shop.count() == 0
    admin.delete(f"/api/v1/namespaces/{tenant}/resourcequotas/no-pods")
    done = wait_phase(admin, tenant, "blocked", "Succeeded", timeout=420)
    assert condition(done, "Stalled")["status"] == "False"  # type: ignore[index]
    assert "Created" in _reasons(admin, tenant, "blocked")
    assert shop.shop.count() == 1


@pytest.fixture
def governing_operator(
    operator_process: OperatorPod, cluster: Cluster, admin: Kube, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator with platform settings for step pods (--step-pod-defaults, as the chart's
    stepPods renders them): a PriorityClass and a RuntimeClass of the cluster, a ceiling of 12 s
    on a step pod's life, one finished pod kept per run. The session's operator is stopped
    meanwhile, so only this one acts."""
    admin.create(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "agent-steps"},
            "value": 1000,
        },
    )
    admin.create(
        "/apis/node.k8s.io/v1/runtimeclasses",
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "sandboxed"},
            "handler": "runsc",
        },
    )
    settings = tmp_path / "step-pods.yaml"
    settings.write_text(
        "priorityClassName: agent-steps\nruntimeClassName: sandboxed\n"
        "resources: {requests: {cpu: 50m, memory: 64Mi}}\n"
        "maxActiveSeconds: 12\nkeepFinishedPods: 1\n"
    )
    operator_process.stop()
    governing = OperatorProcess(
        cluster,
        operator_process.kubeconfig,
        name="operator-governing",
        env=dict(operator_process.env),
        extra_args=(f"--step-pod-defaults={settings}",),
    )
    governing.start()
    try:
        yield governing
    finally:
        governing.stop()
        operator_process.start()
        admin.delete("/apis/scheduling.k8s.io/v1/priorityclasses/agent-steps")
        admin.delete("/apis/node.k8s.io/v1/runtimeclasses/sandboxed")


def test_step_pods_carry_the_platforms_settings_and_are_stopped_at_their_deadline(
    governing_operator: OperatorProcess, tenant: str, admin: Kube, kubectl: Kubectl
) -> None:
    """Step pods get the platform's priority class (the API server admits it and sets the
    priority), runtime class, default requests and a 12 s activeDeadlineSeconds. A step whose
    WRITE takes 20 s is stopped at its deadline (Failed, DeadlineExceeded): it finishes the call
    it is in and records it, the run tells the step ran past its deadline, the next attempt
    goes on from the checkpoint, and the shop has the order once. Only the newest finished
    pod is kept."""
    slow = ShopServer().start()
    slow.shop.delay = 20  # within the tool's 30 s limit, past the pod's 12 s deadline
    try:
        run = agentrun("governed", slow, [[order("G1", 1)]])
        run["spec"]["tools"] = runs.tools(slow, timeout=30)
        apply(kubectl, run)
        first = wait_for(
            lambda: _pod(admin, tenant, "governed-s1-a1"), timeout=60, what="the first step pod"
        )
        spec = first["spec"]
        assert spec["priorityClassName"] == "agent-steps" and spec["priority"] == 1000
        assert spec["runtimeClassName"] == "sandboxed"
        assert spec["activeDeadlineSeconds"] == 12
        assert spec["containers"][0]["resources"]["requests"] == {"cpu": "50m", "memory": "64Mi"}
        done = wait_phase(admin, tenant, "governed", "Succeeded", timeout=180)
        assert slow.shop.count() == 1
        told = [e["message"] for e in _events(admin, tenant, "governed")]
        assert any("governed-s1-a1" in m and "ran past its deadline" in m for m in told), told

        def one_pod_left() -> list[str] | None:
            pods = admin.get(
                f"/api/v1/namespaces/{tenant}/pods", {"labelSelector": "keelgate.dev/run=governed"}
            )["items"]
            names = [p["metadata"]["name"] for p in pods]
            return names if len(names) == 1 else None

        left = wait_for(one_pod_left, timeout=60, what="older step pods to be collected")
        assert left == [done["status"]["step"]["pod"]]
    finally:
        slow.stop()


def _pod(admin: Kube, namespace: str, name: str) -> JSON | None:
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    return admin.get(path) if admin.exists(path) else None


def test_an_approval_decided_in_the_store_is_mirrored_onto_its_object(
    operator: OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, shop: ShopServer
) -> None:
    """carol approves with `keelgate approve ... --store` (straight in the store, no object
    patched, no watch event): within a resync the Approval shows Settled, approved by carol,
    so Argo CD stops showing it Suspended, and the run goes on to its one order."""
    apply(kubectl, agentrun("mirrored", shop, [[order("M1", 1)]], approval=True))
    wait_phase(admin, tenant, "mirrored", "Stopped", timeout=90)
    (approval,) = wait_for(
        lambda: [a for a in runs.approvals(admin, tenant) if a["spec"]["runName"] == "mirrored"],
        what="the Approval",
    )
    from keelgate.cli import main as keelgate

    url = store_url(admin, tenant)
    command = ["approve", "mirrored", "1:0", "--approve", "--by", "carol", "-n", tenant]
    assert keelgate([*command, "--store", url]) == 0
    path = (
        f"/apis/keelgate.dev/v1alpha1/namespaces/{tenant}/approvals/{approval['metadata']['name']}"
    )

    def settled() -> JSON | None:
        shown = admin.get(path)
        return shown if (shown.get("status") or {}).get("phase") == "Settled" else None

    mirrored = wait_for(settled, timeout=60, interval=0.5, what="the Approval mirrored")
    assert (mirrored["status"]["verdict"], mirrored["status"]["settledBy"]) == ("approved", "carol")
    assert "approved" not in mirrored["spec"]  # nobody patched the object
    wait_phase(admin, tenant, "mirrored", "Succeeded", timeout=90)
    assert shop.shop.count() == 1
