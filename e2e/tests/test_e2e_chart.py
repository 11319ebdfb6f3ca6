"""The Helm chart `charts/keelgate` with a real `helm` (built from helm.sh/helm/v4 in the control
plane's own `go build`) against the real API server: lint, what it renders, what the server accepts,
and what it refuses before anything is installed.

It must never install into the session's cluster except in its own throwaway namespaces, and
never depend on objects outside them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from keelgate_e2e import build
from keelgate_e2e import keelgate as kg
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import JSON
from keelgate_e2e.testing import Kubectl

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "keelgate"
DEPLOY = ROOT / "deploy"


@pytest.fixture(scope="module")
def helm() -> Path:
    """The pinned helm (or a new enough one on PATH)."""
    return build.ensure(("helm",))["helm"].path


def run_helm(helm: Path, cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def rendered(helm: Path, cluster: Cluster, *values: str) -> list[JSON]:
    out = run_helm(helm, cluster, "template", "kg", str(CHART), "-n", "keelgate-system", *values)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def test_the_chart_lints_clean(helm: Path, cluster: Cluster) -> None:
    """`helm lint --strict` finds nothing to say, with the values a user must give."""
    out = run_helm(
        helm, cluster, "lint", "--strict", str(CHART), "--set", "store.url=postgresql://db/kg"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


def test_what_the_chart_renders_is_accepted_by_the_api_server(
    helm: Path, cluster: Cluster, kubectl_bin: Path
) -> None:
    """`helm template --include-crds` output passes `kubectl apply --dry-run=server`: every
    object, the admission policies' CEL included (the optional allowlists too), is valid for
    the real API server."""
    out = run_helm(
        helm,
        cluster,
        "template",
        "kg",
        str(CHART),
        "-n",
        "default",
        "--include-crds",
        "--set",
        "store.url=postgresql://db/kg",
        "--set",
        "allowFailpoints=true",
        "--set-json",
        'admissionPolicy.allowed={"stepImages": ["ghcr.io/k/"], "hosts": ["api.x"]}',
        "--set-json",
        'admissionPolicy.stepServiceAccounts=["keelgate-step"]',
    )
    assert out.returncode == 0, out.stderr
    kubectl = Kubectl(kubectl_bin, cluster.kubeconfig, "admin", "default")
    applied = kubectl("apply", "--dry-run=server", "-f", "-", stdin=out.stdout)
    assert "deployment.apps/kg-operator created (server dry run)" in applied.stdout
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/kg-allowed-sources" in (
        applied.stdout
    )


def test_the_chart_ships_what_deploy_ships_and_the_operator_as_it_should_run(
    helm: Path, cluster: Cluster
) -> None:
    """The chart's CRDs are crds/ byte for byte; its RBAC rules, user roles and admission
    policy are deploy/'s; the operator runs as two replicas that elect a leader with a Lease of
    the release (a Role for that Lease alone, rolled one new pod at a time, a disruption budget
    keeping one), non-root, with a read-only root filesystem, probes, and the store URL from a
    Secret by reference; it takes runs in the store (runOwnership) unless told not to. Without
    leader election it is one replica, replaced (never rolled)."""
    for crd in (ROOT / "crds").glob("*.yaml"):
        assert (CHART / "files" / "crds" / crd.name).read_text() == crd.read_text()
    docs = rendered(helm, cluster, "--set", "store.existingSecret.name=pg")
    # Templated (so that helm upgrade upgrades them), kept on uninstall, and the same CRDs.
    for crd in (ROOT / "crds").glob("*.yaml"):
        generated = yaml.safe_load(crd.read_text())
        (ours,) = [
            d
            for d in docs
            if d["kind"] == "CustomResourceDefinition"
            and d["metadata"]["name"] == generated["metadata"]["name"]
        ]
        assert ours["spec"] == generated["spec"]
        assert ours["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    by_kind: dict[tuple[str, str], JSON] = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    plain = {
        (d["kind"], d["metadata"]["name"]): d
        for path in ("rbac.yaml", "user-roles.yaml", "admission.yaml")
        for d in yaml.safe_load_all((DEPLOY / path).read_text())
        if d
    }
    assert (
        by_kind[("ClusterRole", "kg-operator")]["rules"]
        == (plain[("ClusterRole", "keelgate-operator")]["rules"])
    )
    # Cluster-scoped names carry the release's (kg-...); deploy/ is the release "keelgate".
    for name in ("view", "edit"):
        ours, theirs = (
            by_kind[("ClusterRole", f"kg-{name}")],
            plain[("ClusterRole", f"keelgate-{name}")],
        )
        assert ours["rules"] == theirs["rules"]
        assert theirs["metadata"]["labels"].items() <= ours["metadata"]["labels"].items()
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        for name in (
            "decided-by-requester",
            "approval-decisions",
            "approval-finalizer",
            "secret-references",
            "step-service-account",
        ):
            # The policy and the operator's service account are named after the release.
            text = json.dumps(by_kind[(kind, f"kg-{name}")]["spec"])
            spec = json.loads(text.replace("kg-", "keelgate-"))
            assert spec == plain[(kind, f"keelgate-{name}")]["spec"]
    assert ("ValidatingAdmissionPolicy", "kg-allowed-sources") not in by_kind  # optional
    deployment = by_kind[("Deployment", "kg-operator")]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args and "--lease-name=kg-operator" in args
    # Runs are taken in the store under a 30 s lease, renewed every 10 s (runOwnership).
    assert "--run-lease=30" in args and "--run-lease-renew=10" in args
    # Its holder name carries the cluster (runOwnership.cluster): a standby cluster's tells it.
    assert "--cluster=default" in args
    lease_rules = by_kind[("Role", "kg-operator-lease")]["rules"]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]} in (
        lease_rules
    )
    assert by_kind[("RoleBinding", "kg-operator-lease")]["roleRef"]["name"] == "kg-operator-lease"
    assert by_kind[("PodDisruptionBudget", "kg-operator")]["spec"]["minAvailable"] == 1
    single = rendered(
        helm,
        cluster,
        "--set",
        "store.existingSecret.name=pg",
        "--set",
        "replicas=1",
        "--set",
        "leaderElection.enabled=false",
    )
    (alone,) = [d for d in single if d["kind"] == "Deployment"]
    assert alone["spec"]["replicas"] == 1 and alone["spec"]["strategy"] == {"type": "Recreate"}
    assert not [d for d in single if d["kind"] in ("Role", "PodDisruptionBudget")]
    assert "--leader-elect" not in alone["spec"]["template"]["spec"]["containers"][0]["args"]
    unowned = rendered(
        helm,
        cluster,
        "--set",
        "store.existingSecret.name=pg",
        "--set",
        "runOwnership.enabled=false",
    )
    (off,) = [d for d in unowned if d["kind"] == "Deployment"]
    assert "--run-lease=0" in off["spec"]["template"]["spec"]["containers"][0]["args"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    store = next(e for e in container["env"] if e["name"] == "KEELGATE_STORE")
    assert store["valueFrom"]["secretKeyRef"] == {"name": "pg", "key": "url"}
    assert "--allow-failpoints" not in container["args"]  # off unless asked for
    assert ("Secret", "kg-store") not in by_kind  # an existing Secret: none made
    # No hash of the store URL (a password in it) on the pod, where anyone reading pods sees it.
    with_url = rendered(helm, cluster, "--set", "store.url=postgresql://kg:pw-123@db/kg")
    (operator,) = [d for d in with_url if d["kind"] == "Deployment"]
    annotations = operator["spec"]["template"]["metadata"]["annotations"]
    assert list(annotations) == ["checksum/step-pods"]  # of the stepPods values only


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("operator.maxStepPods=many", "/operator/maxStepPods"),
        ("allowFailpoints=maybe", "/allowFailpoints"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("store.url=mysql://db", "/store/url"),
        ("operator.typo=1", "/operator"),
        ("admissionPolicy.allowed.stepImages=x", "/admissionPolicy/allowed/stepImages"),
        ("admissionPolicy.allowed.modelHosts={api.x}", "/admissionPolicy/allowed"),  # now hosts
        ("admissionPolicy.stepServiceAccounts={Not_An_Account}", "/admissionPolicy/stepServ"),
        ("replicas=0", "/replicas"),
        ("leaderElection.leaseDuration=soon", "/leaderElection/leaseDuration"),
        ("runOwnership.leaseSeconds=soon", "/runOwnership/leaseSeconds"),
        ("runOwnership.cluster=East_1", "/runOwnership/cluster"),
        ("sharding.shards=101", "/sharding/shards"),
        ("sharding.enabled=maybe", "/sharding/enabled"),
    ],
)
def test_a_wrong_value_fails_helm_install_naming_the_value(
    helm: Path, cluster: Cluster, value: str, path: str
) -> None:
    """values.schema.json stops a wrong type, an unknown choice or a misspelled key at
    `helm install`, naming the value's path, before anything reaches the cluster."""
    out = run_helm(
        helm,
        cluster,
        "install",
        "bad",
        str(CHART),
        "-n",
        "default",
        "--dry-run=server",
        "--set",
        "store.url=postgresql://db/kg",
        "--set",
        value,
    )
    assert out.returncode != 0
    assert path in out.stderr, out.stderr


def test_the_admission_values_reach_the_policies_that_read_them(
    helm: Path, cluster: Cluster, kubectl_bin: Path
) -> None:
    """admissionPolicy.stepServiceAccounts becomes the list of step ServiceAccounts anyone may
    name (empty by default, the policy still there: the namespace's default alone is free);
    admissionPolicy.allowed.hosts becomes the allowed hosts' list, checked for the model's
    baseURL and for every HTTP and MCP tool's URL; without allowlists that policy is not
    rendered at all. A release watching some namespaces binds its policies on AgentRuns to
    those namespaces only (they let its own operator through, no other release's), and the
    API server takes such bindings; the policy on decisions' `by` stays cluster-wide."""

    def variables(docs: list[JSON], policy: str) -> dict[str, str]:
        (found,) = [
            d
            for d in docs
            if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == policy
        ]
        return {v["name"]: v["expression"] for v in found["spec"]["variables"]}

    base = ("--set", "store.existingSecret.name=pg")
    plain = rendered(helm, cluster, *base)
    assert variables(plain, "kg-step-service-account")["allowed"] == "[]"
    assert not [d for d in plain if d["metadata"]["name"] == "kg-allowed-sources"]
    given = rendered(
        helm,
        cluster,
        *base,
        "--set-json",
        'admissionPolicy.stepServiceAccounts=["keelgate-step", "ci.runner"]',
        "--set-json",
        'admissionPolicy.allowed={"hosts": ["api.openai.com", "mcp.example"]}',
    )
    accounts = variables(given, "kg-step-service-account")
    assert json.loads(accounts["allowed"]) == ["keelgate-step", "ci.runner"]
    sources = variables(given, "kg-allowed-sources")
    assert json.loads(sources["hosts"]) == ["api.openai.com", "mcp.example"]
    assert json.loads(sources["images"]) == []
    assert "t.http.url" in sources["badHttp"] and "t.mcp.url" in sources["badMcp"]
    bindings = {
        d["metadata"]["name"]: d["spec"]
        for d in given
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
    }
    assert not [s for s in bindings.values() if "matchResources" in s]  # every namespace
    scoped = rendered(
        helm,
        cluster,
        *base,
        "--set",
        "operator.watchNamespaces={default,kube-public}",
        "--set",
        "admissionPolicy.allowed.hosts={api.x}",
        "--show-only",
        "templates/admission.yaml",
    )
    selector = {
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": ["default", "kube-public"],
                }
            ]
        }
    }
    by_name = {
        d["metadata"]["name"]: d["spec"]
        for d in scoped
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
    }
    for name in ("secret-references", "step-service-account", "allowed-sources"):
        assert by_name[f"kg-{name}"]["matchResources"] == selector, name
    assert "matchResources" not in by_name["kg-decided-by-requester"]
    kubectl = Kubectl(kubectl_bin, cluster.kubeconfig, "admin", "default")
    applied = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(scoped))
    assert "kg-step-service-account created (server dry run)" in applied.stdout


def test_sharding_renders_the_shards_their_leases_and_the_label_policy(
    helm: Path, cluster: Cluster
) -> None:
    """sharding.enabled with three replicas: the operator gets --shards and the Lease options
    (the leaderElection timings, no --leader-elect), rolls one new pod at a time, may list,
    take, renew and delete the Leases of its own namespace and patch AgentRuns (their shard
    label), and an admission policy keeps the label the operator's; without runOwnership the
    chart refuses naming sharding.enabled; with notification sinks it renders them (each
    replica tells its shards' events). Unsharded, none of it."""
    store = ("--set", "store.existingSecret.name=pg")
    docs = rendered(helm, cluster, *store, "--set", "replicas=3", "--set", "sharding.enabled=true")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    deployment = by_kind[("Deployment", "kg-operator")]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--shards=16" in args and "--lease-name=kg-operator" in args
    assert "--lease-duration=15" in args and "--leader-elect" not in args
    assert by_kind[("Role", "kg-operator-lease")]["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["list", "create", "get", "update", "delete"],
        }
    ]
    assert {"apiGroups": ["keelgate.dev"], "resources": ["agentruns"], "verbs": ["patch"]} in (
        by_kind[("ClusterRole", "kg-operator")]["rules"]
    )
    assert ("ValidatingAdmissionPolicy", "kg-shard-label") in by_kind
    assert ("ValidatingAdmissionPolicyBinding", "kg-shard-label") in by_kind
    plain = {(d["kind"], d["metadata"]["name"]): d for d in rendered(helm, cluster, *store)}
    assert ("ValidatingAdmissionPolicy", "kg-shard-label") not in plain
    assert {"apiGroups": ["keelgate.dev"], "resources": ["agentruns"], "verbs": ["patch"]} not in (
        plain[("ClusterRole", "kg-operator")]["rules"]
    )
    out = run_helm(
        helm,
        cluster,
        "template",
        "kg",
        str(CHART),
        *store,
        "--set",
        "sharding.enabled=true",
        "--set",
        "runOwnership.enabled=false",
    )
    assert out.returncode != 0 and "sharding.enabled" in out.stderr
    assert "needs runOwnership.enabled" in out.stderr
    sinks = "notifications.sinks[0].name=chat,notifications.sinks[0].url=http://x"
    told = rendered(helm, cluster, *store, "--set", "sharding.enabled=true", "--set", sinks)
    sharded = next(d for d in told if d["kind"] == "Deployment")
    told_args = sharded["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--shards=16" in told_args
    assert any(a.startswith("--notify-config=") for a in told_args), told_args


def test_a_chart_without_a_store_says_which_value_to_set(helm: Path, cluster: Cluster) -> None:
    """No store given: the chart refuses in one line naming store.existingSecret.name and
    store.url."""
    out = run_helm(helm, cluster, "template", "kg", str(CHART))
    assert out.returncode != 0
    assert "store.existingSecret.name" in out.stderr and "store.url" in out.stderr


def test_the_audit_signing_key_and_the_step_pod_settings_reach_the_operator(
    helm: Path, cluster: Cluster
) -> None:
    """`audit.signingKeySecret` mounts that Secret's key.pem (and only it) read-only and
    passes it as --audit-sign-key; without it, no such volume nor flag. `stepPods` reach the
    operator as the file --step-pod-defaults reads, from a ConfigMap whose content the pod's
    checksum follows (a change rolls the operator)."""
    signed = rendered(
        helm,
        cluster,
        "--set",
        "store.existingSecret.name=pg",
        "--set",
        "audit.signingKeySecret=kg-audit",
        "--set",
        "stepPods.keepFinishedPods=5",
    )
    (deployment,) = [d for d in signed if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--audit-sign-key=/etc/keelgate-audit/key.pem" in container["args"]
    assert "--step-pod-defaults=/etc/keelgate/step-pods.yaml" in container["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["audit-key"]["secret"] == {
        "secretName": "kg-audit",
        "items": [{"key": "key.pem", "path": "key.pem"}],
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["audit-key"]["readOnly"] is True
    (config,) = [d for d in signed if d["kind"] == "ConfigMap"]
    assert "keepFinishedPods: 5" in config["data"]["step-pods.yaml"]
    plain = rendered(helm, cluster, "--set", "store.existingSecret.name=pg")
    (unsigned,) = [d for d in plain if d["kind"] == "Deployment"]
    args = unsigned["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--audit-sign-key")]
    checksum = "checksum/step-pods"
    assert (
        unsigned["spec"]["template"]["metadata"]["annotations"][checksum]
        != deployment["spec"]["template"]["metadata"]["annotations"][checksum]
    )


def test_two_releases_have_their_own_names_even_cluster_scoped_ones(
    helm: Path, cluster: Cluster
) -> None:
    """Every name the chart makes carries the release's name (or fullnameOverride), the
    cluster-scoped ones too (ClusterRoles, their binding, the admission policies and bindings),
    so two releases in one cluster do not collide; `global` (a parent chart's) is accepted."""

    def names(*values: str) -> set[tuple[str, str]]:
        # The CRDs have the API's names; a second release sets crds.install=false.
        return {
            (d["kind"], d["metadata"]["name"])
            for d in rendered(helm, cluster, "--set", "store.existingSecret.name=pg", *values)
            if d["kind"] != "CustomResourceDefinition"
        }

    first = names()
    second = names("--set", "fullnameOverride=team-b", "--set", "global.imageRegistry=r.example")
    assert all(name.startswith("kg-") for _, name in first), first
    assert all(name.startswith("team-b-") for _, name in second), second
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    assert {k for k, _ in first} >= cluster_scoped
    assert not {n for k, n in first if k in cluster_scoped} & {
        n for k, n in second if k in cluster_scoped
    }


def test_security_contexts_priority_spread_and_quoted_arguments_are_values(
    helm: Path, cluster: Cluster
) -> None:
    """By default no user id is fixed (the image's own non-root user; OpenShift may assign
    one), and both security contexts can be changed; a priority class and topology spread
    reach the pod; every argument is quoted, extraArgs too (a value with a space or a colon
    stays one argument)."""
    base = ("--set", "store.existingSecret.name=pg")
    (plain,) = [d for d in rendered(helm, cluster, *base) if d["kind"] == "Deployment"]
    pod = plain["spec"]["template"]["spec"]
    assert "runAsUser" not in pod["securityContext"] and pod["securityContext"]["runAsNonRoot"]
    assert "priorityClassName" not in pod and "topologySpreadConstraints" not in pod
    docs = rendered(
        helm,
        cluster,
        *base,
        "--set",
        "podSecurityContext.runAsUser=1000710000",
        "--set",
        "securityContext.readOnlyRootFilesystem=false",
        "--set",
        "priorityClassName=platform-critical",
        "--set-json",
        'topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone", '
        '"whenUnsatisfiable": "ScheduleAnyway"}]',
        "--set-json",
        'operator.extraArgs=["--bind=0.0.0.0", "--note=a b: c"]',
    )
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 1000710000
    container_context = pod["containers"][0]["securityContext"]
    assert container_context["readOnlyRootFilesystem"] is False
    assert container_context["runAsNonRoot"] is True
    assert pod["priorityClassName"] == "platform-critical"
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    args = pod["containers"][0]["args"]
    assert args[-2:] == ["--bind=0.0.0.0", "--note=a b: c"]
    assert all(isinstance(a, str) for a in args)


def test_monitoring_objects_and_the_network_policy_render_when_asked_for(
    helm: Path, cluster: Cluster
) -> None:
    """ServiceMonitor, PodMonitor and PrometheusRule (Prometheus Operator) and a NetworkPolicy
    are off by default; asked for, they select this release's operator only, and the rule
    holds the four alerts that matter, each scoped to the release's namespace."""
    base = ("--set", "store.existingSecret.name=pg")
    kinds = {d["kind"] for d in rendered(helm, cluster, *base)}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "NetworkPolicy"}
    docs = rendered(
        helm,
        cluster,
        *base,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "prometheusRule.decisionWaitingSeconds=900",
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        'networkPolicy.metricsFrom=[{"namespaceSelector": {"matchLabels": '
        '{"name": "monitoring"}}}]',
    )
    by_kind = {d["kind"]: d for d in docs}
    selector = by_kind["Deployment"]["spec"]["selector"]["matchLabels"]
    assert by_kind["ServiceMonitor"]["spec"]["selector"]["matchLabels"].items() <= (
        by_kind["Service"]["metadata"]["labels"].items()
    )
    assert by_kind["PodMonitor"]["spec"]["selector"]["matchLabels"] == selector
    assert by_kind["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"] == selector
    ingress = by_kind["NetworkPolicy"]["spec"]["ingress"]
    assert ingress[0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert ingress[0]["from"][0]["namespaceSelector"]["matchLabels"] == {"name": "monitoring"}
    rules = by_kind["PrometheusRule"]["spec"]["groups"][0]["rules"]
    alerts = {r["alert"]: r for r in rules}
    assert set(alerts) == {
        "KeelgateDecisionWaiting",
        "KeelgateReconcileErrors",
        "KeelgateStepPodCapSaturated",
        "KeelgateNoLeader",
    }
    assert alerts["KeelgateDecisionWaiting"]["expr"].endswith("> 900")
    for rule in rules:
        assert 'namespace="keelgate-system"' in rule["expr"], rule["expr"]


def test_monitoring_and_network_policy_objects_are_accepted_by_the_api_server(
    helm: Path, cluster: Cluster, kubectl_bin: Path
) -> None:
    """With the Prometheus Operator's CRDs in the cluster (stand-ins of their group and kinds),
    the ServiceMonitor, PodMonitor, PrometheusRule and NetworkPolicy the chart renders are
    created by `kubectl apply` (server-side, then deleted), the PrometheusRule with its four
    alerts as rendered."""
    kubectl = Kubectl(kubectl_bin, cluster.kubeconfig, "admin", "default")
    crds = kg.monitoring_crds()
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(crds))
    for crd in crds:
        kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}")
    out = run_helm(
        helm,
        cluster,
        "template",
        "mon",
        str(CHART),
        "-n",
        "default",
        "--set",
        "store.url=postgresql://db/kg",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "networkPolicy.enabled=true",
    )
    assert out.returncode == 0, out.stderr
    wanted = [
        d
        for d in yaml.safe_load_all(out.stdout)
        if d and d["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "NetworkPolicy")
    ]
    assert len(wanted) == 4
    try:
        applied = kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(wanted))
        assert "prometheusrule.monitoring.coreos.com/mon-operator created" in applied.stdout
        assert "networkpolicy.networking.k8s.io/mon-operator created" in applied.stdout
        stored = json.loads(kubectl("get", "prometheusrule", "mon-operator", "-o", "json").stdout)
        assert len(stored["spec"]["groups"][0]["rules"]) == 4
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", stdin=yaml.safe_dump_all(wanted))
        kubectl("delete", "-f", "-", "--ignore-not-found", stdin=yaml.safe_dump_all(crds))


def test_the_crds_can_be_left_out_or_not_kept(helm: Path, cluster: Cluster) -> None:
    """crds.install=false (a second release in a cluster) renders no CRD; crds.keep=false
    drops the keep policy, so `helm uninstall` deletes them (and every run object)."""
    base = ("--set", "store.existingSecret.name=pg")
    left_out = rendered(helm, cluster, *base, "--set", "crds.install=false")
    assert not [d for d in left_out if d["kind"] == "CustomResourceDefinition"]
    unkept = rendered(helm, cluster, *base, "--set", "crds.keep=false")
    crds = [d for d in unkept if d["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 3 and all("annotations" not in d["metadata"] for d in crds)


def test_notification_sinks_reach_the_operator_with_their_headers_secret_and_a_role(
    helm: Path, cluster: Cluster
) -> None:
    """`notifications.sinks` reach the operator as the file --notify-config reads (its source
    and state ConfigMap named after the release, each sink's defaults filled in, the headers
    folder of a sink with a headersSecret), that Secret mounted read-only there and only
    there, a checksum that rolls the operator when the sinks change, and a Role to create the
    state ConfigMap and get and patch it by name only. Without sinks: none of it. Two sinks of
    one name, or an event type not in the catalogue, fail at `helm template` naming the value."""
    base = ("--set", "store.existingSecret.name=pg")
    sinks = (
        '[{"name":"chat","url":"https://bridge.example/k","headersSecret":"chat-token",'
        '"types":["dev.keelgate.approval.requested"]},'
        '{"name":"flows","url":"http://broker.example/","mode":"binary","retryForSeconds":0}]'
    )
    docs = rendered(helm, cluster, *base, "--set-json", f"notifications.sinks={sinks}")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--notify-config=/etc/keelgate-notify/config/notify.yaml" in container["args"]
    (config,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kg-notify"
    ]
    notify = yaml.safe_load(config["data"]["notify.yaml"])
    assert notify["source"] == "keelgate-system/kg"
    assert notify["state"] == "keelgate-system/kg-notify-state"
    chat, flows = notify["sinks"]
    assert chat["headersDir"] == "/etc/keelgate-notify/headers/chat"
    assert (chat["mode"], chat["timeoutSeconds"], chat["retryForSeconds"]) == ("structured", 5, 600)
    assert (flows["mode"], flows["retryForSeconds"], flows["types"]) == ("binary", 0, [])
    assert "headersDir" not in flows
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["notify-headers-0"]["secret"] == {"secretName": "chat-token"}
    assert "notify-headers-1" not in volumes
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/keelgate-notify/headers/chat"]["readOnly"] is True
    assert "checksum/notifications" in deployment["spec"]["template"]["metadata"]["annotations"]
    (role,) = [
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "kg-operator-notify"
    ]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["kg-notify-state"],
            "verbs": ["get", "patch"],
        },
    ]
    plain = rendered(helm, cluster, *base)
    assert not [d for d in plain if "notify" in d["metadata"]["name"]]
    (unsent,) = [d for d in plain if d["kind"] == "Deployment"]
    assert not [
        a for a in unsent["spec"]["template"]["spec"]["containers"][0]["args"] if "notify" in a
    ]
    twice = '[{"name":"chat","url":"http://a/"},{"name":"chat","url":"http://b/"}]'
    out = run_helm(
        helm,
        cluster,
        "template",
        "kg",
        str(CHART),
        *base,
        "--set-json",
        f"notifications.sinks={twice}",
    )
    assert (
        out.returncode != 0
        and "notifications.sinks: each sink needs a name of its own" in out.stderr
    )
    typo = '[{"name":"chat","url":"http://a/","types":["dev.keelgate.run.stoped"]}]'
    out = run_helm(
        helm,
        cluster,
        "template",
        "kg",
        str(CHART),
        *base,
        "--set-json",
        f"notifications.sinks={typo}",
    )
    assert out.returncode != 0 and "/notifications/sinks/0/types/0" in out.stderr, out.stderr
