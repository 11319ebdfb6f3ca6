"""Authentication and authorization on the real API server: client-certificate users, RBAC,
the Node authorizer for the node agent, the agent's log endpoint, and Keelgate's admission
policies on what an AgentRun may reference (Secrets its author may read, ServiceAccounts its
author may act as; optionally, allowed step images and the hosts a run may call).

They must never grant anything outside the test's own namespace (the cluster is shared by the
session).
"""

from __future__ import annotations

import re
import ssl
import subprocess
from pathlib import Path

import httpx
import yaml

from keelgate_e2e import keelgate as kg
from keelgate_e2e import runs
from keelgate_e2e.cluster import NODE_NAME, Cluster
from keelgate_e2e.kube import JSON, ApiError, Kube
from keelgate_e2e.testing import Kubectl, wait_for


def test_alice_forbidden_until_rbac_grant(admin: Kube, namespace: str, kubectl: Kubectl) -> None:
    """`alice` (a plain certificate user) cannot list pods until a Role and RoleBinding grant
    it; then she can, in that namespace only, while `bob` stays forbidden."""
    alice = kubectl.as_user("alice")
    denied = alice("get", "pods", check=False)
    assert denied.returncode != 0
    assert 'User "alice" cannot list resource "pods"' in denied.stderr

    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    admin.create(
        f"{rbac}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    admin.create(
        f"{rbac}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "alice-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}
            ],
        },
    )
    wait_for(
        lambda: alice("get", "pods", check=False).returncode == 0,
        timeout=30,
        what="alice to be allowed",
    )
    assert alice("auth", "can-i", "list", "pods").stdout.strip() == "yes"
    assert alice("auth", "can-i", "delete", "pods", check=False).stdout.strip() == "no"
    assert alice("get", "pods", "-n", "default", check=False).returncode != 0
    assert kubectl.as_user("bob")("get", "pods", check=False).returncode != 0


def test_aggregated_cluster_roles(admin: Kube, namespace: str, kubectl: Kubectl) -> None:
    """The aggregated `view` ClusterRole is filled by the clusterrole-aggregation controller:
    binding `bob` to it lets him read ConfigMaps but not Secrets."""
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "bob-views"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "view",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}],
        },
    )
    bob = kubectl.as_user("bob")
    wait_for(
        lambda: bob("get", "configmaps", check=False).returncode == 0,
        timeout=30,
        what="bob to read configmaps through view",
    )
    assert bob("get", "secrets", check=False).returncode != 0


def test_node_agent_is_confined_by_the_node_authorizer(
    admin: Kube, namespace: str, cluster: Cluster
) -> None:
    """The agent authenticates as system:node:<name>: the Node authorizer refuses it a Secret
    that no pod on its node references, as it would a real kubelet."""
    admin.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "unreferenced"},
            "stringData": {"k": "v"},
        },
    )
    node = Kube.from_kubeconfig(cluster.pki_dir / "node.kubeconfig")
    try:
        try:
            node.get(f"/api/v1/namespaces/{namespace}/secrets/unreferenced")
        except ApiError as exc:
            assert exc.status == 403, exc
        else:
            raise AssertionError("the node read a secret no pod of its references")
        assert node.get(f"/api/v1/nodes/{NODE_NAME}")["metadata"]["name"] == NODE_NAME
    finally:
        node.close()


def test_log_endpoint_serves_only_the_api_server(cluster: Cluster) -> None:
    """The agent's kubelet port answers /healthz to anyone but refuses container logs to any
    client but the API server's kubelet client: no certificate, or alice's, gets 403."""
    url = f"https://127.0.0.1:{cluster.ports['node']}"
    ca = str(cluster.pki_dir / "ca.crt")
    logs = f"{url}/containerLogs/default/any/main"
    with httpx.Client(verify=ssl.create_default_context(cafile=ca), trust_env=False) as anonymous:
        assert anonymous.get(f"{url}/healthz").text == "ok"
        assert anonymous.get(logs).status_code == 403
    pki = cluster.pki_dir
    alice_ctx = ssl.create_default_context(cafile=ca)
    alice_ctx.load_cert_chain(pki / "alice.crt", pki / "alice.key")
    with httpx.Client(verify=alice_ctx, trust_env=False) as alice:
        assert alice.get(logs).status_code == 403
    kubelet_ctx = ssl.create_default_context(cafile=ca)
    kubelet_ctx.load_cert_chain(
        pki / "apiserver-kubelet-client.crt", pki / "apiserver-kubelet-client.key"
    )
    with httpx.Client(verify=kubelet_ctx, trust_env=False) as apiserver:
        assert apiserver.get(logs).status_code == 404  # allowed; there is no such pod


# What an AgentRun may reference (the chart's admission policies)


def _run(
    name: str,
    *,
    secret: str = "",
    image: str = "",
    base_url: str = "",
    account: str | None = None,
    tools: list[JSON] | None = None,
) -> str:
    """An AgentRun (suspended: the operator starts nothing) naming a key Secret, a step image,
    a model endpoint, a step ServiceAccount or tools, as YAML for `kubectl apply -f -`."""
    model: JSON = {"provider": "openai", "name": "gpt-4o-mini"}
    if secret:
        model["apiKeySecretRef"] = {"name": secret, "key": "apiKey"}
    if base_url:
        model["baseURL"] = base_url
    spec: JSON = {"goal": "e2e admission", "model": model, "suspend": True, "tools": tools or []}
    if image:
        spec["step"] = {"image": image}
    if account is not None:
        spec["step"] = {**spec.get("step", {}), "serviceAccountName": account}
    run = {"apiVersion": "keelgate.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name}}
    return yaml.safe_dump({**run, "spec": spec})


def _grant(admin: Kube, namespace: str, user: str, role: str, rules: list[JSON] | None) -> None:
    """Bind `user` to the ClusterRole `role`, or (with `rules`) to a Role of those rules."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kind = "ClusterRole"
    if rules is not None:
        kind = "Role"
        body = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role"}
        admin.create(f"{rbac}/roles", {**body, "metadata": {"name": role}, "rules": rules})
    admin.create(
        f"{rbac}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


RUNS_ONLY = [
    {
        "apiGroups": ["keelgate.dev"],
        "resources": ["agentruns"],
        "verbs": ["get", "list", "create", "update", "patch"],
    }
]


def test_an_agentrun_may_name_only_a_secret_its_author_may_get(
    admin: Kube, namespace: str, kubectl: Kubectl, keelgate_installed: None
) -> None:
    """bob may create AgentRuns but not read Secrets: an AgentRun whose apiKeySecretRef names
    the namespace's Secret is refused, naming the field, the user and the Secret; one naming no
    Secret is admitted. alice (edit: she may read Secrets) creates it; bob may then change its
    budget (the reference unchanged) but not point it at another Secret, nor change what the
    run does with the key (its model's endpoint). The operator's own ticks of a monitor, which
    copy an admitted spec, are not asked."""
    for name in ("llm", "other-llm"):
        admin.create(
            f"/api/v1/namespaces/{namespace}/secrets",
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
             "stringData": {"apiKey": "sk-never-shown"}},
        )  # fmt: skip
    _grant(admin, namespace, "alice", "edit", None)
    _grant(admin, namespace, "bob", "runs-only", RUNS_ONLY)
    alice, bob = kubectl.as_user("alice"), kubectl.as_user("bob")
    wait_for(
        lambda: (
            bob("auth", "can-i", "create", "agentruns.keelgate.dev", check=False).returncode == 0
        ),
        timeout=30,
        what="bob's grant",
    )
    refused = bob("apply", "-f", "-", stdin=_run("bobs", secret="llm"), check=False)
    assert refused.returncode != 0
    assert (
        f"spec.model.apiKeySecretRef.name: bob may not get secret llm in namespace {namespace}"
        in refused.stderr
    ), refused.stderr
    assert "keelgate-secret-references" in refused.stderr
    assert bob("apply", "-f", "-", stdin=_run("keyless")).returncode == 0
    assert alice("apply", "-f", "-", stdin=_run("alices", secret="llm")).returncode == 0
    patch = '{"spec": {"budget": {"maxIterations": 3}}}'
    assert bob("patch", "agentrun", "alices", "--type", "merge", "-p", patch).returncode == 0
    moved = '{"spec": {"model": {"apiKeySecretRef": {"name": "other-llm", "key": "apiKey"}}}}'
    swapped = bob("patch", "agentrun", "alices", "--type", "merge", "-p", moved, check=False)
    assert swapped.returncode != 0 and "may not get secret other-llm" in swapped.stderr
    elsewhere = '{"spec": {"model": {"baseURL": "https://models.bob.example/v1"}}}'
    sent = bob("patch", "agentrun", "alices", "--type", "merge", "-p", elsewhere, check=False)
    assert sent.returncode != 0
    assert (
        f"spec.model.apiKeySecretRef.name: bob may not get secret llm in namespace {namespace} "
        "(the run uses it: changing what the run does needs that)"
    ) in sent.stderr, sent.stderr
    operator = "system:serviceaccount:keelgate-system:keelgate-operator"
    tick = kubectl("apply", "--as", operator, "-f", "-", stdin=_run("tick", secret="other-llm"))
    assert tick.returncode == 0
    assert "sk-never-shown" not in refused.stderr + swapped.stderr + sent.stderr


def _accounts(admin: Kube, namespace: str, *names: str) -> None:
    for name in names:
        admin.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )


def test_an_agentrun_may_name_only_a_step_service_account_its_author_may_act_as(
    admin: Kube, namespace: str, kubectl: Kubectl, keelgate_installed: None
) -> None:
    """bob may create AgentRuns but not pods: a run whose step would run as the namespace's
    ServiceAccount `deployer` is refused, naming the field, the user and the account; the
    namespace's default (empty or "default") and the chart's allowed `keelgate-step` are
    admitted. alice (edit, which may impersonate the namespace's ServiceAccounts) names
    `deployer`; bob may then raise the budget or suspend her run, but not change what it does
    (its goal, its tools, its image) nor move it to another account. Granted `impersonate` on
    `deployer` alone, bob may name it and still not `reader`. The operator's own creates (a
    monitor's ticks) are not asked."""
    _accounts(admin, namespace, "deployer", "reader", kg.STEP_ACCOUNT)
    _grant(admin, namespace, "alice", "edit", None)
    _grant(admin, namespace, "bob", "runs-only", RUNS_ONLY)
    alice, bob = kubectl.as_user("alice"), kubectl.as_user("bob")
    wait_for(
        lambda: (
            bob("auth", "can-i", "create", "agentruns.keelgate.dev", check=False).returncode == 0
        ),
        timeout=30,
        what="bob's grant",
    )
    field = "spec.step.serviceAccountName"
    refused = bob("apply", "-f", "-", stdin=_run("bobs", account="deployer"), check=False)
    assert refused.returncode != 0
    assert (
        f"{field}: bob may not impersonate serviceaccount deployer in namespace {namespace}"
        in refused.stderr
    ), refused.stderr
    assert "keelgate-step-service-account" in refused.stderr
    for name, account in (("empty", ""), ("default", "default"), ("platform", kg.STEP_ACCOUNT)):
        done = bob("apply", "-f", "-", stdin=_run(name, account=account), check=False)
        assert done.returncode == 0, (account, done.stderr)
    assert alice("apply", "-f", "-", stdin=_run("alices", account="deployer")).returncode == 0

    def bob_patches(patch: str) -> subprocess.CompletedProcess[str]:
        return bob("patch", "agentrun", "alices", "--type", "merge", "-p", patch, check=False)

    for free in ('{"spec": {"budget": {"maxIterations": 3}}}', '{"spec": {"suspend": false}}'):
        done = bob_patches(free)
        assert done.returncode == 0, (free, done.stderr)
    kept = f"{field}: bob may not impersonate serviceaccount deployer in namespace {namespace} "
    kept += "(the run's pods run as it: changing what the run does needs that)"
    for work in (
        '{"spec": {"goal": "mine now"}}',
        '{"spec": {"step": {"image": "registry.bob.example/agent:1"}}}',
        '{"spec": {"tools": [{"name": "run", "sideEffect": "WRITE", '
        '"python": {"callable": "bobs.tools:anything"}}]}}',
    ):
        done = bob_patches(work)
        assert done.returncode != 0 and kept in done.stderr, (work, done.stderr)
    moved = bob_patches('{"spec": {"step": {"serviceAccountName": "reader"}}}')
    assert moved.returncode != 0
    assert "bob may not impersonate serviceaccount reader" in moved.stderr, moved.stderr
    _grant(
        admin,
        namespace,
        "bob",
        "be-deployer",
        [
            {
                "apiGroups": [""],
                "resources": ["serviceaccounts"],
                "resourceNames": ["deployer"],
                "verbs": ["impersonate"],
            }
        ],
    )
    wait_for(
        lambda: (
            bob("auth", "can-i", "impersonate", "serviceaccount/deployer", check=False).returncode
            == 0
        ),
        timeout=30,
        what="bob's impersonate grant",
    )
    assert bob("apply", "-f", "-", stdin=_run("bobs", account="deployer")).returncode == 0
    other = bob("apply", "-f", "-", stdin=_run("bobs-reader", account="reader"), check=False)
    assert other.returncode != 0 and "may not impersonate serviceaccount reader" in other.stderr
    operator = f"system:serviceaccount:{kg.SYSTEM}:{kg.OPERATOR_SA}"
    tick = kubectl("apply", "--as", operator, "-f", "-", stdin=_run("tick", account="reader"))
    assert tick.returncode == 0


def test_a_monitors_ticks_run_as_its_account_and_cannot_be_taken_over_through_it(
    operator: kg.OperatorPod, tenant: str, admin: Kube, kubectl: Kubectl, alice: Kubectl
) -> None:
    """alice (edit) makes a monitor whose steps run as `deployer`: the operator creates its
    tick, the tick's step pod runs as `deployer`, and the tick finishes (the operator's create
    is not refused). bob, who may edit AgentRuns but not act as `deployer`, can neither make a
    monitor of his own that runs as it, nor change what alice's monitor or its tick does
    (their tools), each refused naming the field; he may still suspend the monitor."""
    _accounts(admin, tenant, "deployer")
    _grant(admin, tenant, "bob", "runs-only", RUNS_ONLY)
    bob = kubectl.as_user("bob")
    monitor: JSON = {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "watch"},
        "spec": {
            "loop": "monitor",
            "schedule": "* * * * *",
            "goal": "say all is well",
            "model": {"provider": "scripted", "script": [{"done": True, "answer": "well"}]},
            "step": {"serviceAccountName": "deployer"},
        },
    }
    alice("apply", "-f", "-", stdin=yaml.safe_dump(monitor))
    tick = runs.wait_phase(admin, tenant, "watch.tick-1", "Succeeded", timeout=150)
    assert tick["spec"]["step"]["serviceAccountName"] == "deployer"
    selector = {"labelSelector": "keelgate.dev/run=watch.tick-1"}
    pods = admin.get(f"/api/v1/namespaces/{tenant}/pods", selector)["items"]
    assert pods and {p["spec"]["serviceAccountName"] for p in pods} == {"deployer"}
    wait_for(
        lambda: (
            bob("auth", "can-i", "create", "agentruns.keelgate.dev", check=False).returncode == 0
        ),
        timeout=30,
        what="bob's grant",
    )
    field = "spec.step.serviceAccountName: bob may not impersonate serviceaccount deployer"
    own = {**monitor, "metadata": {"name": "bobs-watch"}}
    made = bob("apply", "-f", "-", stdin=yaml.safe_dump(own), check=False)
    assert made.returncode != 0 and field in made.stderr, made.stderr
    tools = '{"spec": {"tools": [{"name": "run", "sideEffect": "READ", '
    tools += '"python": {"callable": "bobs.tools:anything"}}]}}'
    for name in ("watch", "watch.tick-1"):
        done = bob("patch", "agentrun", name, "--type", "merge", "-p", tools, check=False)
        assert done.returncode != 0 and field in done.stderr, (name, done.stderr)
    suspend = '{"spec": {"suspend": true}}'
    assert bob("patch", "agentrun", "watch", "--type", "merge", "-p", suspend).returncode == 0


def _tools(http: str = "https://api.openai.com/items/{sku}", mcp: str = "") -> list[JSON]:
    """A READ tool over HTTP at `http` (and one of an MCP server at `mcp`), after a Python one
    (which calls no URL of the spec's)."""
    tools: list[JSON] = [
        {"name": "think", "sideEffect": "READ", "python": {"callable": "tools.mod:think"}},
        {"name": "look", "sideEffect": "READ", "http": {"url": http}},
    ]
    if mcp:
        tools.append({"name": "search", "sideEffect": "READ", "mcp": {"url": mcp}})
    return tools


def test_the_charts_allowlists_admit_only_the_step_images_and_hosts_they_name(
    admin: Kube, namespace: str, kubectl: Kubectl, keelgate_installed: None, cluster: Cluster
) -> None:
    """The optional policy the chart renders from admissionPolicy.allowed (bound here to this
    test's namespace only, so other tests are not held to it): as alice, a step image under
    an allowed prefix or a tag of an allowed repository is admitted, any other refused naming
    spec.step.image; every URL the run would call must be on an allowed host: a baseURL, an
    HTTP tool's URL template and an MCP tool's URL on one are admitted, any other refused
    naming the field (spec.model.baseURL, spec.tools[i].http.url, spec.tools[i].mcp.url),
    a host that is a placeholder or hides behind user info included; a run naming none is
    admitted, and so is an edit of a run that stays within them. bob, without a grant, is
    refused by RBAC before any of it."""
    from keelgate_e2e import build

    helm = build.ensure(("helm",))["helm"].path
    chart = Path(__file__).resolve().parents[2] / "charts" / "keelgate"
    allowed = '{"stepImages": ["ghcr.io/keelgate/", "registry.example/agent"], '
    allowed += '"hosts": ["api.openai.com", "mcp.example"]}'
    out = subprocess.run(
        [str(helm), "template", "kg", str(chart), "-n", "keelgate-system",
         "--show-only", "templates/admission.yaml", "--set", "store.url=postgresql://db/kg",
         "--set-json", f"admissionPolicy.allowed={allowed}"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    mine = [d for d in docs if d["metadata"]["name"] == "kg-allowed-sources"]  # release kg
    assert [d["kind"] for d in mine] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    policy, binding = (dict(d) for d in mine)
    suffix = namespace[-6:]
    policy["metadata"] = {"name": f"keelgate-allowed-sources-{suffix}"}
    binding["metadata"] = {"name": f"keelgate-allowed-sources-{suffix}"}
    binding["spec"] = {
        **binding["spec"],
        "policyName": policy["metadata"]["name"],
        "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        },
    }
    admissions = "/apis/admissionregistration.k8s.io/v1"
    admin.create(f"{admissions}/validatingadmissionpolicies", policy)
    admin.create(f"{admissions}/validatingadmissionpolicybindings", binding)
    try:
        _grant(admin, namespace, "alice", "edit", None)
        alice = kubectl.as_user("alice")

        def admitted(
            name: str, *, tools: list[JSON] | None = None, **given: str
        ) -> subprocess.CompletedProcess[str]:
            return alice("apply", "-f", "-", stdin=_run(name, tools=tools, **given), check=False)

        def held() -> bool:
            # A dry run is admitted or refused like a create, and leaves nothing behind (an
            # object created before the policy took effect would be "unchanged" ever after).
            probe = _run("probe", image="registry.example/agent-evil:1")
            tried = alice("create", "--dry-run=server", "-f", "-", stdin=probe, check=False)
            return "is not an allowed step image" in tried.stderr

        wait_for(held, timeout=30, what="the allowlist policy to take effect")
        for name, image in (
            ("prefixed", "ghcr.io/keelgate/keelgate:0.1.0"),
            ("tagged", "registry.example/agent:2"),
            ("digested", "registry.example/agent@sha256:" + "a" * 64),
            ("exact", "registry.example/agent"),
        ):
            done = admitted(name, image=image)
            assert done.returncode == 0, (image, done.stderr)
        for image in ("evil.example/agent:1", "registry.example/agent-evil:1", "ghcr.io/other"):
            done = admitted("refused", image=image)
            assert done.returncode != 0
            assert f"spec.step.image: {image} is not an allowed step image" in done.stderr
        assert admitted("host-ok", base_url="https://api.openai.com/v1").returncode == 0
        bad_host = admitted("host-bad", base_url="https://models.evil.example/v1")
        assert bad_host.returncode != 0
        assert "spec.model.baseURL: https://models.evil.example/v1 is not on an allowed host" in (
            bad_host.stderr
        )
        assert admitted("plain").returncode == 0
        tooled = admitted("tools-ok", tools=_tools(mcp="https://mcp.example/mcp"))
        assert tooled.returncode == 0, tooled.stderr
        for url in (
            "https://shop.evil.example/items/{sku}",
            "https://{host}/items",  # the model would choose the host
            "https://api.openai.com.{zone}/items",
            "https://api.openai.com:443@shop.evil.example/items",  # user info, then the host
            "https://API.OPENAI.COM/items",  # not as listed: refused, never guessed at
        ):
            done = admitted("tools-bad", tools=_tools(http=url))
            assert done.returncode != 0, url
            assert f"spec.tools[1].http.url: {url} is not on an allowed host (allowed: " in (
                done.stderr
            ), done.stderr
        done = admitted("mcp-bad", tools=_tools(mcp="https://mcp.evil.example/mcp"))
        assert done.returncode != 0
        assert "spec.tools[2].mcp.url: https://mcp.evil.example/mcp is not on an allowed host" in (
            done.stderr
        ), done.stderr
        moved = '{"spec": {"tools": [{"name": "look", "sideEffect": "READ", '
        moved += '"http": {"url": "https://shop.evil.example/x"}}]}}'
        edit = alice("patch", "agentrun", "tools-ok", "--type", "merge", "-p", moved, check=False)
        assert edit.returncode != 0 and "spec.tools[0].http.url: https://shop.evil" in edit.stderr
        budget = '{"spec": {"budget": {"maxIterations": 2}}}'
        raised = alice("patch", "agentrun", "tools-ok", "--type", "merge", "-p", budget)
        assert raised.returncode == 0
        bob = kubectl.as_user("bob")
        forbidden = bob("apply", "-f", "-", stdin=_run("bobs", image="evil.example/x"), check=False)
        assert forbidden.returncode != 0 and 'User "bob" cannot' in forbidden.stderr
    finally:
        name = policy["metadata"]["name"]
        admin.delete(f"{admissions}/validatingadmissionpolicybindings/{name}")
        admin.delete(f"{admissions}/validatingadmissionpolicies/{name}")


def _quickstart() -> str:
    """The shell blocks of docs/operator.md's two-person quickstart, in order, as one script."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text()
    section = page.split("### Two people, one namespace: a quickstart", 1)[1].split("\n### ")[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 3, "the quickstart's three steps"
    return "".join(blocks)


def test_the_two_person_quickstart_of_operator_md_runs_as_written(
    cluster: Cluster,
    admin: Kube,
    operator: kg.OperatorPod,
    kubectl_bin: Path,
    tmp_path: Path,
) -> None:
    """docs/operator.md's quickstart, pasted into bash as written (set -e), with the store's
    administrator URL as $ADMIN_URL, a copy of the cluster's kubeconfig (contexts admin, alice,
    bob, carol) and the payment's URL pointed at a loopback shop: the namespace and its tenant,
    alice's, bob's and carol's rights and contexts, the run alice applies; bob's `pending`
    lists it; bob's and carol's approvals send the payment once. Then the rights are
    what the page says: bob and carol may decide Approvals but not create runs, alice may
    create runs."""
    from keelgate_e2e.plugin import VENV_BIN
    from keelgate_e2e.shop import ShopServer

    config = tmp_path / "kubeconfig"
    config.write_text(cluster.kubeconfig.read_text())
    config.chmod(0o600)
    shop = ShopServer().start()
    script = _quickstart().replace("https://pay.example/payouts", f"{shop.url}/orders")
    env = {
        "PATH": f"{VENV_BIN}:{kubectl_bin.parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(config),
        "ADMIN_URL": cluster.dsn,
    }
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            capture_output=True,
            text=True,
            env=env,
            timeout=420,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        (waiting,) = [
            line for line in done.stdout.splitlines() if line.split()[:2] == ["approval", "payout"]
        ]
        assert "kubectl keelgate approve payout 1:0" in waiting
        (paid,) = shop.shop.orders
        assert paid["body"] == {"supplier": "7", "cents": 12000}
        (approval,) = runs.approvals(admin, "payments")
        assert [
            (d["by"], "payments-approvers" in d["groups"]) for d in approval["spec"]["decisions"]
        ] == [
            ("bob", True),
            ("carol", True),
        ]

        def may(user: str, verb: str, resource: str) -> bool:
            asked = Kubectl(kubectl_bin, config, user, "payments")
            return asked("auth", "can-i", verb, resource, check=False).stdout.strip() == "yes"

        assert may("bob", "patch", "approvals.keelgate.dev")
        assert may("carol", "list", "agentruns.keelgate.dev")
        assert not may("bob", "create", "agentruns.keelgate.dev")
        assert not may("carol", "patch", "agentruns.keelgate.dev")
        assert may("alice", "create", "agentruns.keelgate.dev")
    finally:
        shop.stop()
        if admin.exists("/api/v1/namespaces/payments"):
            admin.delete("/api/v1/namespaces/payments")
