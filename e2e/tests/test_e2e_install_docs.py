"""docs/install.md's Helm commands and kind manifests, against the real helm and API server.

tests/test_install_docs.py checks the pages without a cluster; this is what needs one. The
`helm install` and `helm upgrade` lines of install.md and the runbook render with the chart as
written (its values schema accepts every --set) and give the operator what the pages say: the
image they built, the same image for step pods, the store URL from the Secret they created,
failpoints allowed, the confirmer URL; and the operator's Deployment is the one they
`kubectl exec` into. Every object under examples/kind passes `kubectl apply --dry-run=server`
(the AgentRuns against the CRDs' schemas and rules).

It installs only the production values example, as its own release watching one empty
namespace, and removes it; everything else it renders, and dry-runs in its own namespace.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from keelgate_e2e import build
from keelgate_e2e import keelgate as kg
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.testing import Kubectl, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "keelgate"
PAGES = [ROOT / "docs" / "install.md", ROOT / "docs" / "runbook-outcome-unknown.md"]


def shell_lines(path: Path) -> list[list[str]]:
    """The words of each command in a page's ```sh blocks (continuations joined)."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                found.append(words)
    return found


def helm_lines() -> list[list[str]]:
    return [w for page in PAGES for w in shell_lines(page) if w[:1] == ["helm"]]


def values_of(words: list[str]) -> list[str]:
    """The --set arguments of a helm command, in order."""
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]


@pytest.fixture(scope="module")
def helm() -> Path:
    return build.ensure(("helm",))["helm"].path


def render(helm: Path, cluster: Cluster, release: str, namespace: str, sets: list[str]) -> JSON:
    """The operator Deployment `helm template` renders with these values."""
    args = [str(helm), f"--kubeconfig={cluster.kubeconfig}", "template", release]
    args += [str(ROOT / "charts" / "keelgate"), "-n", namespace]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    deployments: list[JSON] = [d for d in docs if d["kind"] == "Deployment"]
    assert len(deployments) == 1
    return deployments[0]


def test_the_pages_helm_commands_render_and_configure_the_operator_as_they_say(
    helm: Path, cluster: Cluster
) -> None:
    """install.md's helm install, then each helm upgrade --reuse-values on top of it, renders;
    the operator runs keelgate:dev (then keelgate:dev2), step pods the same image, the store
    URL comes from keelgate-store/url, failpoints are allowed, the confirmer URL is passed; its
    Deployment is the one the pages exec into."""
    lines = helm_lines()
    installs = [w for w in lines if w[1] == "install"]
    upgrades = [w for w in lines if w[1] == "upgrade"]
    assert len(installs) == 1 and len(upgrades) == 2
    (install,) = installs
    release, namespace = install[2], install[install.index("-n") + 1]
    assert install[3] == "charts/keelgate"
    sets = values_of(install)
    deployment = render(helm, cluster, release, namespace, sets)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert container["image"] == "keelgate:dev"
    assert env["KEELGATE_STEP_IMAGE"]["value"] == "keelgate:dev"
    assert env["KEELGATE_STORE"]["valueFrom"]["secretKeyRef"] == {
        "name": "keelgate-store",
        "key": "url",
    }
    assert "--allow-failpoints" in container["args"]
    execs = [
        w[w.index("exec") + 1]
        for page in PAGES
        for w in shell_lines(page)
        if "exec" in w and w[0] == "kubectl"
    ]
    assert execs and set(execs) == {f"deploy/{deployment['metadata']['name']}"}
    for upgrade in upgrades:
        assert upgrade[2:4] == [release, "charts/keelgate"] and "--reuse-values" in upgrade
        upgraded = render(helm, cluster, release, namespace, sets + values_of(upgrade))
        (container,) = upgraded["spec"]["template"]["spec"]["containers"]
        for value in values_of(upgrade):
            key, _, wanted = value.partition("=")
            if key == "image.tag":
                assert container["image"] == f"keelgate:{wanted}"
            else:
                assert key == "operator.confirmerUrl"
                assert f"--confirmer-url={wanted}" in container["args"]


def test_the_kind_manifests_pass_a_server_dry_run(
    cluster: Cluster, kubectl_bin: Path, namespace: str, keelgate_installed: None
) -> None:
    """Every object under examples/kind, moved into this test's namespace, is accepted by
    `kubectl apply --dry-run=server`: the Deployment, StatefulSet, Services, ConfigMap and both
    AgentRuns (validated by the CRD's schema and rules)."""
    docs = [
        doc
        for path in sorted((ROOT / "examples" / "kind").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    kubectl = Kubectl(kubectl_bin, cluster.kubeconfig, "admin", namespace)
    applied = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(docs))
    for doc in docs:
        kind = doc["kind"].lower()
        assert re.search(rf"^{kind}[.\w/]*/{doc['metadata']['name']} created", applied.stdout, re.M)
    assert applied.stdout.count("(server dry run)") == len(docs), applied.stdout


def _production_values() -> str:
    found = re.search(
        r"```yaml\n(# values-production\.yaml\n.*?)```",
        (ROOT / "docs" / "install.md").read_text(),
        flags=re.S,
    )
    assert found, "docs/install.md lost its values-production.yaml example"
    return found.group(1)


def test_the_production_values_install_and_elect_a_leader(
    operator_process: kg.OperatorPod,
    cluster: Cluster,
    admin: Kube,
    kubectl_bin: Path,
    tmp_path: Path,
    namespace: str,
) -> None:
    """install.md's values-production.yaml, as written (plus what this machine needs: the local
    image, a free metrics port, and the operator watching one empty namespace so it drives no
    other test's runs): `helm install --wait` succeeds, both replicas run and one holds the
    Lease, the PodMonitor, PrometheusRule and NetworkPolicy exist, the audit key is mounted,
    and `helm uninstall` removes it all."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    values = tmp_path / "values-production.yaml"
    values.write_text(_production_values())
    kubectl = Kubectl(kubectl_bin, cluster.kubeconfig, "admin", "default")
    crds = kg.monitoring_crds()
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(crds))
    for crd in crds:
        kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}")
    system = f"prod-{namespace[-6:]}"
    admin.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": system}},
    )
    key = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    admin.create(
        f"/api/v1/namespaces/{system}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "keelgate-audit-key"},
            "stringData": {"key.pem": key.decode()},
        },
    )
    operator = kg.OperatorPod(
        cluster,
        release="prod",
        namespace=system,
        replicas=2,
        leader_election=True,
        allow_failpoints=False,
        values=(f"operator.watchNamespaces[0]={namespace}",),
        store=operator_process.store_url,
    )
    helm = build.ensure(("helm",))["helm"].path
    try:
        done = subprocess.run(
            [
                str(helm),
                f"--kubeconfig={cluster.kubeconfig}",
                "install",
                "prod",
                str(CHART),
                "-n",
                system,
                "-f",
                str(values),
                "--wait",
                "--timeout=180s",
                # The file names a Secret of keelgate-system; here the URL comes in store.url.
                # The CRDs are the session release's (a second release in a cluster leaves
                # them to the first).
                *operator.chart_values("store.existingSecret.name=", "crds.install=false"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        deployment = admin.get(f"/apis/apps/v1/namespaces/{system}/deployments/prod-operator")
        assert deployment["status"].get("readyReplicas") == 2
        lease = wait_for(
            lambda: admin.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{system}/leases/prod-operator"
            )["spec"].get("holderIdentity"),
            timeout=60,
            what="a leader",
        )
        assert lease.startswith("prod-operator-")
        for path in (
            f"/apis/monitoring.coreos.com/v1/namespaces/{system}/podmonitors/prod-operator",
            f"/apis/monitoring.coreos.com/v1/namespaces/{system}/prometheusrules/prod-operator",
            f"/apis/networking.k8s.io/v1/namespaces/{system}/networkpolicies/prod-operator",
        ):
            assert admin.exists(path), path
        pod = deployment["spec"]["template"]["spec"]
        assert "--audit-sign-key=/etc/keelgate-audit/key.pem" in pod["containers"][0]["args"]
    finally:
        subprocess.run(
            [
                str(helm),
                f"--kubeconfig={cluster.kubeconfig}",
                "uninstall",
                "prod",
                "-n",
                system,
                "--wait",
                "--timeout=120s",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        admin.delete(f"/api/v1/namespaces/{system}")
    assert not admin.exists(f"/apis/apps/v1/namespaces/{system}/deployments/prod-operator")
