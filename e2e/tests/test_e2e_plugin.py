"""`kubectl keelgate` on the real control plane, run as a user runs it.

The machine's kubectl finds `kubectl-keelgate` on PATH (this venv's bin) and the plugin talks to
the test cluster's real kube-apiserver as the kubeconfig's user: alice (the `edit` role in the
test's namespace) or bob (nothing, or `view`). What the tests check is what a person sees and
what the cluster and the shop end up holding: `spec.by` filled by the API server's word, one
line for every refusal, one order per run, and a trail that verifies. They must never settle an
outcome against the shop's record, and never print a store password.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import psycopg
import pytest
from keelgate.kube.naming import action_object_name

from keelgate_e2e import runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import STORE_PASSWORD, OperatorPod, password_of, store_url, tenant_dsn
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.plugin import KubectlKeelgate, kubeconfig_for, last_json
from keelgate_e2e.runs import agentrun, apply, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, wait_for

pytestmark = pytest.mark.e2e

CRASH_AFTER_ORDER = {"keelgate.dev/failpoints": "after_gateway_call@1"}


@pytest.fixture
def plugin(cluster: Cluster, kubectl_bin: Path, namespace: str) -> KubectlKeelgate:
    """`kubectl keelgate ... --context=alice -n <the test's namespace>`."""
    return KubectlKeelgate(kubectl_bin, cluster.kubeconfig, "alice", namespace)


def _one_line_error(result: object) -> str:
    """The error line of a refused command: exactly one line on stderr, no traceback."""
    stderr = str(getattr(result, "stderr", ""))
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and lines[0].startswith("kubectl keelgate: error: ")
    return lines[0]


def _reconciliation(admin: Kube, namespace: str, name: str) -> JSON:
    return admin.get(f"/apis/keelgate.dev/v1alpha1/namespaces/{namespace}/reconciliations/{name}")


def test_status_shows_an_unknown_outcome_as_a_tree_naming_its_reconciliation_and_next_steps(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    plugin: KubectlKeelgate,
) -> None:
    """A step pod killed right after the order: `kubectl keelgate status` exits 3 and draws
    the run as a tree (phase, stop reason, usage, conditions, the current step pod, the action
    with its Reconciliation's name and Idempotency-Key, and the reconcile commands to run);
    `--output json` carries the same as one object."""
    apply(kubectl, agentrun("unsure", shop, [[order("U1", 1)]], annotations=CRASH_AFTER_ORDER))
    wait_phase(admin, tenant, "unsure", "Stopped", timeout=90)
    rec = action_object_name("unsure", "1:0", "place_order")
    wait_for(lambda: runs.reconciliations(admin, tenant), what="the Reconciliation")
    shown = plugin("status", "unsure")
    assert shown.returncode == 3, shown.stderr
    text = shown.stdout
    key = next(iter(shop.shop.by_key()))
    for expected in (
        f"AgentRun {tenant}/unsure  Stopped  outcome_unknown (resumable)",
        "iteration 1 · tokens",
        "step 1, attempt 2: pod unsure-s1-a2, exit code 3",
        "OutcomeUnknown=True  WriteInFlight",
        "Succeeded=False  outcome_unknown",
        "iteration 1",
        f"1:0 place_order: outcome unknown (Idempotency-Key {key}) → reconciliation {rec}",
        f"kubectl keelgate reconcile unsure 1:0 --executed --context alice -n {tenant}",
        f"kubectl keelgate reconcile unsure 1:0 --not-executed --context alice -n {tenant}",
    ):
        assert expected in text, f"{expected!r} not in:\n{text}"
    assert "├──" in text and "└──" in text  # a tree, not a table
    as_json = plugin("status", "unsure", "-o", "json")
    assert as_json.returncode == 3
    document = last_json(as_json.stdout)
    assert (document["phase"], document["stopReason"]) == ("Stopped", "outcome_unknown")
    assert document["unknownActions"] == [
        {"action": "1:0", "tool": "place_order", "idempotencyKey": key, "reconciliation": rec}
    ]
    assert document["step"]["pod"] == "unsure-s1-a2" and document["step"]["exitCode"] == 3
    assert {c["type"] for c in document["conditions"]} >= {"Succeeded", "OutcomeUnknown"}
    missing = plugin("status", "no-such-run")
    assert missing.returncode == 2
    assert "no AgentRun named 'no-such-run'" in _one_line_error(missing)


def test_reconcile_fills_by_from_whoami_refuses_others_and_the_run_succeeds_with_one_order(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    plugin: KubectlKeelgate,
) -> None:
    """An unknown outcome settled with `kubectl keelgate reconcile`: bob (no grant) is refused
    in one line, and so is bob with `view` (the access review says he may not patch), both
    flags at once are refused (exit 2), nothing changing the Reconciliation; alice's
    `--executed --note` lands with `spec.by: alice` (the API server's name for her, never
    typed), the same command again is a no-op, the opposite decision is refused, and the run
    succeeds with exactly one order."""
    apply(kubectl, agentrun("settle", shop, [[order("R1", 1)]], annotations=CRASH_AFTER_ORDER))
    wait_phase(admin, tenant, "settle", "Stopped", timeout=90)
    rec = action_object_name("settle", "1:0", "place_order")
    wait_for(lambda: runs.reconciliations(admin, tenant), what="the Reconciliation")

    bob = plugin.as_user("bob")
    refused = bob("reconcile", "settle", "1:0", "--executed")
    assert refused.returncode == 1
    assert "forbidden" in _one_line_error(refused).lower()
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{tenant}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "bob-view"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "view",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}],
        },
    )
    viewer = wait_for(
        lambda: (
            (r := bob("reconcile", "settle", "1:0", "--executed")).returncode == 1
            and "may not patch" in r.stderr
            and r
        ),
        timeout=30,
        what="bob's view role to apply",
    )
    line = _one_line_error(viewer)
    assert f"bob may not patch reconciliation {rec} in namespace {tenant}" in line
    assert "nothing was changed" in line
    both = plugin("reconcile", "settle", "1:0", "--executed", "--not-executed")
    assert both.returncode == 2 and "not both" in _one_line_error(both)
    assert "executed" not in _reconciliation(admin, tenant, rec)["spec"]

    assert shop.shop.count() == 1  # the order went out before the crash: executed is the truth
    settled = plugin("reconcile", "settle", "1:0", "--executed", "--note", "order in the book")
    assert settled.returncode == 0, settled.stderr
    assert f"settle 1:0 (place_order): executed by alice (reconciliation {rec})" in settled.stdout
    spec = _reconciliation(admin, tenant, rec)["spec"]
    assert (spec["executed"], spec["by"], spec["note"]) == (True, "alice", "order in the book")
    again = plugin("reconcile", "settle", "1:0", "--executed", "-o", "json")
    assert again.returncode == 0 and last_json(again.stdout)["already"] is True
    changed = plugin("reconcile", "settle", "1:0", "--not-executed")
    assert changed.returncode == 2
    assert "a decision cannot change" in _one_line_error(changed)

    done = wait_phase(admin, tenant, "settle", "Succeeded", timeout=90)
    assert done["status"]["stopReason"] == "goal_met"
    assert shop.shop.count() == 1
    status = plugin("status", "settle")
    assert status.returncode == 0
    assert f"1:0 place_order: executed by alice → reconciliation {rec}" in status.stdout
    reconciled = [
        e
        for e in runs.audit_events(operator.cluster.dsn, tenant, "settle")
        if e.type == "loop.reconciled"
    ]
    assert [(e.actor, e.data["verdict"]) for e in reconciled] == [("alice", "executed")]


def test_approve_from_the_kubeconfig_contexts_namespace_runs_the_approved_write_once(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    plugin: KubectlKeelgate,
    tmp_path: Path,
) -> None:
    """With KUBECONFIG naming a file whose current context is alice's, set to the test's
    namespace, `kubectl keelgate approve` needs no flag: `--approve` runs one run's order once,
    `--deny` never runs the other's, each Approval holds alice's decision (by: alice), and
    `--approve --deny` is refused (exit 2)."""
    apply(
        kubectl,
        agentrun("granted", shop, [[order("P1", 1)]], approval=True),
        agentrun("denied", shop, [[order("P2", 1)]], approval=True),
    )
    for name in ("granted", "denied"):
        stopped = wait_phase(admin, tenant, name, "Stopped", timeout=90)
        assert stopped["status"]["stopReason"] == "awaiting_approval"
    wait_for(lambda: len(runs.approvals(admin, tenant)) == 2, what="two Approvals")
    config = kubeconfig_for(plugin.kubeconfig, tmp_path / "kubeconfig", "alice", tenant)
    alice = KubectlKeelgate(plugin.kubectl, config, context=None, namespace=None)
    waiting = alice("status", "granted")
    assert waiting.returncode == 3, waiting.stderr
    granted_name = action_object_name("granted", "1:0", "place_order")
    assert f"1:0 place_order: awaiting approval → approval {granted_name}" in waiting.stdout
    assert "kubectl keelgate approve granted 1:0 --approve" in waiting.stdout
    both = alice("approve", "granted", "1:0", "--approve", "--deny")
    assert both.returncode == 2 and "not both" in _one_line_error(both)
    granted = alice("approve", "granted", "1:0", "--approve", "--note", "within budget")
    assert granted.returncode == 0, granted.stderr
    denied = alice("approve", "denied", "1:0", "--deny", "-o", "json")
    assert denied.returncode == 0, denied.stderr
    assert last_json(denied.stdout) == {
        "run": "denied",
        "action": "1:0",
        "tool": "place_order",
        "verdict": "denied",
        "by": "alice",
        "approval": action_object_name("denied", "1:0", "place_order"),
        "already": False,
    }
    wait_phase(admin, tenant, "granted", "Succeeded", timeout=90)
    wait_phase(admin, tenant, "denied", "Succeeded", timeout=90)
    assert [o["body"]["sku"] for o in shop.shop.orders] == ["P1"]
    decided = {a["spec"]["runName"]: a["spec"]["decisions"] for a in runs.approvals(admin, tenant)}
    ((granted,), (denied,)) = (decided["granted"], decided["denied"])
    assert (granted["by"], granted["approved"], denied["by"], denied["approved"]) == (
        "alice",
        True,
        "alice",
        False,
    )
    assert granted["note"] == "within budget"


def test_resume_raises_the_budget_in_spec_and_the_run_continues_its_saved_plan(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    plugin: KubectlKeelgate,
) -> None:
    """A run stopped by its token budget: `status` names `resume --tokens` as what to run;
    `kubectl keelgate resume --tokens 100000` merge-patches spec.budget.tokens alone (as field
    manager kubectl-keelgate), says what changed, and the run continues and places its saved
    order once; resuming the finished run changes nothing."""
    run = agentrun("budget", shop, [[order("B1", 3)]], budget={"maxIterations": 5, "tokens": 2000})
    run["spec"]["model"]["script"][0]["usage"] = {"inputTokens": 1900, "outputTokens": 200}
    apply(kubectl, run)
    stopped = wait_phase(admin, tenant, "budget", "Stopped", timeout=90)
    assert stopped["status"]["stopReason"] == "token_budget"
    shown = plugin("status", "budget")
    assert shown.returncode == 3
    assert f"kubectl keelgate resume budget --tokens N --context alice -n {tenant}" in shown.stdout
    assert shop.shop.count() == 0

    resumed = plugin("resume", "budget", "--tokens", "100000")
    assert resumed.returncode == 0, resumed.stderr
    assert "budget: spec.budget.tokens 2000 → 100000" in resumed.stdout
    live = runs.get_run(admin, tenant, "budget")
    assert live["spec"]["budget"] == {
        "maxIterations": 5,
        "tokens": 100000,
        "maxVerifierRejections": 3,  # the CRD's default, untouched
    }
    managers = {m["manager"] for m in live["metadata"]["managedFields"]}
    assert "kubectl-keelgate" in managers
    wait_phase(admin, tenant, "budget", "Succeeded", timeout=90)
    assert shop.shop.count() == 1

    finished = plugin("resume", "budget", "--tokens", "200000")
    assert finished.returncode == 0
    assert "has finished" in finished.stderr
    assert runs.get_run(admin, tenant, "budget")["spec"]["budget"]["tokens"] == 100000


def test_logs_lists_the_step_pods_in_order_each_headed_by_how_it_ended(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    plugin: KubectlKeelgate,
) -> None:
    """A run whose first step pod is SIGKILLed after its order, settled and finished:
    `kubectl keelgate logs` prints every step pod's log (read through the API server's
    pods/log) in step/attempt order, each under a header with its pod's name and how it ended
    (137 killed first, 0 last), with no store password anywhere."""
    apply(
        kubectl,
        agentrun(
            "logged",
            shop,
            [[order("L1", 1)]],
            annotations=CRASH_AFTER_ORDER,
            # Every step pod kept (three by default): the test reads them all.
            extra={"step": {"keepFinishedPods": 20}},
        ),
    )
    runs.drive_to_success(admin, alice, tenant, ["logged"], shop, timeout=120)
    pods = admin.get(
        f"/api/v1/namespaces/{tenant}/pods", {"labelSelector": "keelgate.dev/run=logged"}
    )["items"]

    def order_of(pod: JSON) -> tuple[int, int]:
        labels = pod["metadata"]["labels"]
        return int(labels["keelgate.dev/step"]), int(labels["keelgate.dev/attempt"])

    expected = [p["metadata"]["name"] for p in sorted(pods, key=order_of)]
    assert expected[:2] == ["logged-s1-a1", "logged-s1-a2"]
    shown = plugin("logs", "logged")
    assert shown.returncode == 0, shown.stderr
    headers = [line for line in shown.stdout.splitlines() if line.startswith("==> ")]
    assert [h.split()[1] for h in headers] == expected
    assert "exit code 137" in headers[0] and "SIGKILL" in headers[0]
    assert "exit code 0" in headers[-1]
    assert '"phase"' in shown.stdout  # each step's outcome line, from its log
    assert STORE_PASSWORD not in shown.stdout + shown.stderr
    as_json = last_json(plugin("logs", "logged", "-o", "json").stdout)
    assert [p["pod"] for p in as_json["pods"]] == expected
    assert as_json["pods"][0]["exitCode"] == 137


def test_audit_verify_reads_the_trail_from_the_store_and_never_shows_its_password(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    plugin: KubectlKeelgate,
    cluster: Cluster,
) -> None:
    """`kubectl keelgate audit --verify` reads the run's hash-chained trail from the store
    (KEELGATE_STORE, whose URL holds a password never shown) and verifies it (exit 0), even
    after the AgentRun is deleted; without a store it says where the trail is (exit 2); an
    altered event makes `--verify` exit 1."""
    apply(kubectl, agentrun("audited", shop, [[order("A1", 1)]]))
    wait_phase(admin, tenant, "audited", "Succeeded", timeout=90)
    nowhere = plugin("audit", "audited")
    assert nowhere.returncode == 2 and "--store" in _one_line_error(nowhere)

    own = store_url(admin, tenant)  # the tenant's own role reads its own trail
    with_store = plugin.with_env(KEELGATE_STORE=own)
    kubectl("delete", "agentrun", "audited", "--wait=true", timeout=60)
    verified = with_store("audit", "audited", "--verify")
    assert verified.returncode == 0, verified.stderr
    assert "chain verified" in verified.stdout and "action_started" in verified.stdout
    as_json = last_json(with_store("audit", "audited", "--verify", "-o", "json").stdout)
    assert as_json["verified"] is True and as_json["events"]
    with psycopg.connect(tenant_dsn(cluster, tenant)) as conn:
        conn.execute(
            "UPDATE keelgate_audit SET actor = 'mallory' WHERE tenant = %s AND run = %s "
            "AND seq = 1",
            (tenant, "audited"),
        )
    broken = with_store("audit", "audited", "--verify")
    assert broken.returncode == 1 and "chain BROKEN" in broken.stdout
    unreachable = plugin.with_env(
        KEELGATE_STORE=f"postgresql://keelgate:{STORE_PASSWORD}@127.0.0.1:1/keelgate"
    )("audit", "audited")
    assert unreachable.returncode == 5 and "--store" in _one_line_error(unreachable)
    for result in (verified, broken, unreachable):
        for password in (STORE_PASSWORD, password_of(own)):
            assert password not in result.stdout + result.stderr
    assert json.dumps(as_json).count(password_of(own)) == 0


def test_audit_export_signs_with_a_key_from_a_secret_and_verify_needs_only_the_file(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    plugin: KubectlKeelgate,
    tmp_path: Path,
) -> None:
    """The platform keeps the signing key in a Secret of the namespace; alice (who may read
    it) runs `kubectl keelgate audit export RUN --sign-key-secret audit-key --store ...`, and
    the file verifies offline with only the public key (`kubectl keelgate audit verify`). The
    key is never printed; bob, who may not read the Secret, cannot sign."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = tmp_path / "audit.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    admin.create(
        f"/api/v1/namespaces/{tenant}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "audit-key"},
            "data": {"key.pem": base64.b64encode(pem).decode()},
        },
    )
    apply(kubectl, agentrun("signed", shop, [[order("S1", 1)]]))
    wait_phase(admin, tenant, "signed", "Succeeded", timeout=90)
    with_store = plugin.with_env(KEELGATE_STORE=store_url(admin, tenant))
    out = tmp_path / "signed.dsse.json"
    exported = with_store(
        "audit", "export", "signed", "--sign-key-secret", "audit-key", "--output-file", str(out)
    )
    assert exported.returncode == 0, exported.stderr
    assert "events exported" in exported.stdout
    verified = plugin("audit", "verify", str(out), "--key", str(public))
    assert verified.returncode == 0, verified.stderr
    assert (
        f"{tenant}/signed:" in verified.stdout and "signature and chain verified" in verified.stdout
    )
    for result in (exported, verified):
        assert pem.decode() not in result.stdout + result.stderr
    bob = plugin.as_user("bob").with_env(KEELGATE_STORE=store_url(admin, tenant))
    refused = bob("audit", "export", "signed", "--sign-key-secret", "audit-key")
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()


def test_pending_everywhere_as_alice_shows_the_namespaces_she_may_list(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    plugin: KubectlKeelgate,
    tmp_path: Path,
) -> None:
    """alice holds `edit` in the test's namespace only, so the API server refuses her any
    cluster-wide list ("cannot list ... at the cluster scope"), and namespaces too. `kubectl
    keelgate pending -A` then shows what waits in the namespace of her context, says so in one
    line on stderr, and exits 0 (it failed); `list -A` the same; admin's `pending -A` lists
    cluster-wide, without a word."""
    apply(kubectl, agentrun("asks", shop, [[order("A1", 1)]], approval=True))
    wait_for(lambda: runs.approvals(admin, tenant), timeout=90, what="the Approval")
    config = kubeconfig_for(plugin.kubeconfig, tmp_path / "kubeconfig", "alice", tenant)
    alice = KubectlKeelgate(plugin.kubectl, config, context=None, namespace=None)
    told = (
        "kubectl keelgate: warning: you may not list {} in every namespace; showing the "
        f"namespaces you may list: {tenant}"
    )
    pending = alice("pending", "-A")
    assert pending.returncode == 0, pending.stderr
    assert [row.split()[:3] for row in pending.stdout.splitlines()[1:]] == [
        [tenant, "approval", "asks"]
    ]
    assert pending.stderr.strip().splitlines() == [told.format("reconciliations and approvals")]
    listed = alice("list", "-A")
    assert listed.returncode == 0, listed.stderr
    assert [row.split()[:2] for row in listed.stdout.splitlines()[1:]] == [[tenant, "asks"]]
    assert listed.stderr.strip().splitlines() == [told.format("agentruns")]
    everywhere = plugin.as_user("admin")("pending", "-A")
    assert everywhere.returncode == 0 and everywhere.stderr == "", everywhere.stderr
    assert any(
        row.split()[:3] == [tenant, "approval", "asks"] for row in everywhere.stdout.splitlines()
    )
