"""Keelgate on the local cluster: install its CRDs, RBAC and admission policy, run the operator.

Why it exists: `make up`, `make demo` and the e2e tests need Keelgate installed the way a user
installs it (CRDs from `crds/`, the manifests in `deploy/`), and the operator running under its
own service account's RBAC, never as admin. Until the Helm chart installs the operator as a pod,
the operator runs as a host process with a kubeconfig holding a token of the
`keelgate-system/keelgate-operator` service account (from the TokenRequest API), so every API
call it makes is checked against the RBAC it ships with. Step pods run on the node agent, whose
PATH starts with this venv's `bin`: the host's `keelgate` stands in for the image's.

It must never give the operator admin credentials, and never touch a cluster but the one given.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import yaml

from keelgate_e2e import procs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import ApiError, Kube
from keelgate_e2e.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
DEPLOY = ROOT / "deploy"
SYSTEM = "keelgate-system"
OPERATOR_SA = "keelgate-operator"
STORE_SECRET = "keelgate-store"
#: The step ServiceAccount the session's chart lets any AgentRun author name
#: (admissionPolicy.stepServiceAccounts).
STEP_ACCOUNT = "keelgate-step"

JSON = dict[str, Any]

_PLURALS = {
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "customresourcedefinitions",
    ("v1", "Namespace"): "namespaces",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "clusterroles",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "clusterrolebindings",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): (
        "validatingadmissionpolicies"
    ),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): (
        "validatingadmissionpolicybindings"
    ),
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"): "mutatingadmissionpolicies",
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding"): (
        "mutatingadmissionpolicybindings"
    ),
}


def manifests() -> list[JSON]:
    """Everything Keelgate installs besides the operator itself, in apply order."""
    docs: list[JSON] = []
    for path in [*sorted(CRDS.glob("*.yaml")), *(DEPLOY / n for n in _DEPLOY_FILES)]:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


# admission-creator.yaml needs MutatingAdmissionPolicy (Kubernetes 1.36+), as the local
# control plane has.
_DEPLOY_FILES = ("rbac.yaml", "user-roles.yaml", "admission.yaml", "admission-creator.yaml")


def _path(doc: JSON) -> str:
    api, kind = doc["apiVersion"], doc["kind"]
    plural = _PLURALS[(api, kind)]
    base = "/api/v1" if api == "v1" else f"/apis/{api}"
    namespace = doc["metadata"].get("namespace")
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


def apply(kube: Kube, doc: JSON) -> None:
    """Create, or replace what exists (as `kubectl apply` would for these kinds)."""
    collection = _path(doc)
    name = doc["metadata"]["name"]
    try:
        kube.create(collection, doc)
    except ApiError as error:
        if error.status != 409:
            raise
        current = kube.get(f"{collection}/{name}")
        updated = {**doc, "metadata": {**doc["metadata"], **_version(current)}}
        kube.replace(f"{collection}/{name}", updated)


def _version(current: JSON) -> JSON:
    return {"resourceVersion": current["metadata"]["resourceVersion"]}


def install(kube: Kube) -> None:
    """Apply the CRDs, RBAC, user roles and admission policy; wait until the CRDs serve."""
    for doc in manifests():
        apply(kube, doc)
    for crd in ("agentruns", "reconciliations", "approvals"):
        name = f"{crd}.keelgate.dev"
        wait_for(
            lambda name=name: _established(kube, name),  # type: ignore[misc]
            timeout=60,
            what=f"CRD {name} established",
        )


def wait_admitting(kube: Kube, namespace: str, timeout: float = 60) -> None:
    """Until the API server admits an AgentRun (a dry run): right after its CRD is established,
    the chart's mutating admission policy (created-by) refuses one with 503 "Resource kind ...
    not found" for a few seconds, until the CRD's schema reaches the policy's type resolver."""
    path = f"/apis/keelgate.dev/v1alpha1/namespaces/{namespace}/agentruns"
    probe = {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "admission-probe"},
        "spec": {},
    }

    def admitted() -> bool:
        try:
            kube.request("POST", path, body=probe, params={"dryRun": "All"})
        except ApiError as error:
            return error.status != 503  # refused for what it says (an empty spec): admitted
        return True

    wait_for(admitted, timeout=timeout, interval=0.5, what="AgentRuns admitted")


def _established(kube: Kube, name: str) -> bool:
    crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = crd.get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def operator_kubeconfig(cluster: Cluster, kube: Kube, path: Path, hours: int = 48) -> Path:
    """A kubeconfig for the operator's service account (a bound token from TokenRequest)."""
    wait_for(
        lambda: kube.exists(f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{OPERATOR_SA}"),
        timeout=30,
        what="the operator's service account",
    )
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": hours * 3600},
    }
    token = kube.create(
        f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{OPERATOR_SA}/token", request
    )["status"]["token"]
    users_config = yaml.safe_load(cluster.kubeconfig.read_text())
    ca_data = users_config["clusters"][0]["cluster"]["certificate-authority-data"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": cluster.server, "certificate-authority-data": ca_data},
            }
        ],
        "users": [{"name": OPERATOR_SA, "user": {"token": token}}],
        "contexts": [{"name": OPERATOR_SA, "context": {"cluster": "local", "user": OPERATOR_SA}}],
        "current-context": OPERATOR_SA,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


#: The password of the e2e cluster's PostgreSQL superuser (the administrator's URL): the server
#: asks for it, and tests prove it never shows.
STORE_PASSWORD = "Pw-store-never-shown-8812"


def make_namespace(kube: Kube, name: str, *, labels: dict[str, str] | None = None) -> None:
    """Create the namespace ``name`` and wait until it can hold pods (its default service
    account exists: the controller-manager makes it a moment after)."""
    meta: JSON = {"name": name, **({"labels": labels} if labels else {})}
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
    wait_for(
        lambda: kube.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=30,
        what=f"default service account in {name}",
    )


RBAC = "rbac.authorization.k8s.io"


def grant_edit(kube: Kube, namespace: str, user: str = "alice") -> None:
    """``user`` holds the built-in ``edit`` role in ``namespace`` (a RoleBinding
    ``<user>-edit``)."""
    kube.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-edit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


def add_tenant(cluster: Cluster, namespace: str, *, operator: bool = False) -> None:
    """`keelgate tenant add NAMESPACE --store ADMIN_URL` (``--operator`` for the operator's
    role), as the cluster's admin user: the namespace's own database role, and its
    `keelgate-store` Secret holding that role's URL. Run in this process (the command's own
    code, without a Python start per test)."""
    from keelgate.cli import main

    args = ["tenant", "add", namespace, "--store", cluster.dsn, "--kubeconfig"]
    args += [str(cluster.kubeconfig), "--context", "admin", *(["--operator"] if operator else [])]
    code = main(args)
    assert code == 0, f"keelgate tenant add {namespace} exited {code}"


def tenant_dsn(cluster: Cluster, namespace: str) -> str:
    """The administrator's URL on the namespace's own database (`keelgate tenant add` gives
    each tenant one beside the administrator's), for tests that read or change its rows with
    SQL; Keelgate's own commands with the administrator's URL find it themselves."""
    from keelgate.stores.tenancy import tenant_database

    base, home = cluster.dsn.rsplit("/", 1)
    return f"{base}/{tenant_database(home, namespace)}"


def store_url(kube: Kube, namespace: str) -> str:
    """The store URL in the namespace's `keelgate-store` Secret (its role's, with its
    password): what the namespace's step pods hold."""
    secret = kube.get(f"/api/v1/namespaces/{namespace}/secrets/{STORE_SECRET}")
    return base64.b64decode(secret["data"]["url"]).decode()


def password_of(url: str) -> str:
    """The password in a store URL."""
    return unquote(urlsplit(url).password or "")


def store_secret(kube: Kube, namespace: str, dsn: str) -> None:
    """A `keelgate-store` Secret written by hand (tests of a wrong URL in it)."""
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": STORE_SECRET, "namespace": namespace},
        "type": "Opaque",
        "stringData": {"url": dsn},
    }
    try:
        kube.create(f"/api/v1/namespaces/{namespace}/secrets", body)
    except ApiError as error:
        if error.status != 409:
            raise


@dataclass
class OperatorProcess:
    """`keelgate operator` as a host process under the operator's service account."""

    cluster: Cluster
    kubeconfig: Path
    name: str = "operator"
    allow_failpoints: bool = True
    max_step_pods: int = 20
    extra_args: tuple[str, ...] = ()
    port: int = 0
    proc: procs.Proc | None = None
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.cluster.logs_dir / f"{self.name}.log"

    def argv(self) -> list[str]:
        keelgate = str(Path(sys.executable).parent / "keelgate")
        args = [
            keelgate,
            "operator",
            f"--port={self.port}",
            "--bind=127.0.0.1",
            f"--max-step-pods={self.max_step_pods}",
            "--step-image=keelgate:dev",
            "--resync=10",
            *self.extra_args,
        ]
        if self.allow_failpoints:
            args.append("--allow-failpoints")
        return args

    def start(self) -> None:
        if not self.port:
            self.port = procs.free_port()
        env = {
            "KUBECONFIG": str(self.kubeconfig),
            "KEELGATE_STORE": self.cluster.dsn,
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        self.proc = procs.spawn(
            self.name, self.argv(), run_dir=self.cluster.run_dir, log=self.log, env=env
        )
        self.starts += 1
        procs.wait_until(self.proc, self.healthy, timeout=60, what="operator /healthz")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def kill(self) -> None:
        """SIGKILL: nothing flushed, as a node failure or an OOM kill would."""
        if self.proc is not None and self.proc.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            if self.proc.popen is not None:
                self.proc.popen.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            if self.proc.popen is not None:
                try:
                    self.proc.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.popen.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        time.sleep(0.2)
        self.start()


CHART = ROOT / "charts" / "keelgate"
RELEASE = "keelgate"


@dataclass
class OperatorPod:
    """The operator as users run it: installed by `helm install --wait` from charts/keelgate into
    keelgate-system, a pod of its Deployment under the chart's RBAC (the node agent runs it with
    the projected service-account token, like a kubelet). Its /metrics listens on a free
    loopback port (pods share the host network here)."""

    cluster: Cluster
    port: int = 0
    allow_failpoints: bool = True
    max_step_pods: int = 20
    values: tuple[str, ...] = ()
    release: str = RELEASE
    namespace: str = SYSTEM
    #: One replica without leader election by default: tests that kill the operator again and
    #: again would otherwise wait out a lease (15 s) at every kill. The HA tests ask for more.
    replicas: int = 1
    leader_election: bool = False
    #: A store URL for the chart's store.url. Default: the operator's own role, made with
    #: `keelgate tenant add keelgate-system --operator` into the Secret keelgate-store there,
    #: which the chart reads (store.existingSecret), as install.md does it.
    store: str = ""

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        from keelgate_e2e import build

        binary = build.ensure(("helm",))["helm"].path
        done = subprocess.run(
            [str(binary), f"--kubeconfig={self.cluster.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args[:2])} failed:\n{done.stdout}{done.stderr}")
        return done

    def chart_values(self, *extra: str) -> list[str]:
        if not self.port:
            self.port = procs.free_port()
        store = (
            f"store.url={self.store}" if self.store else f"store.existingSecret.name={STORE_SECRET}"
        )
        values = [
            store,
            "image.repository=keelgate",
            "image.tag=dev",
            f"allowFailpoints={str(self.allow_failpoints).lower()}",
            f"operator.maxStepPods={self.max_step_pods}",
            f"replicas={self.replicas}",
            f"leaderElection.enabled={str(self.leader_election).lower()}",
            "operator.resyncSeconds=10",
            f"operator.metricsPort={self.port}",
            f"metrics.service.port={self.port}",
            *self.values,
            *extra,
        ]
        pairs = [arg for value in values for arg in ("--set", value)]
        # A list whose item holds "=": --set-json says it unambiguously.
        return [*pairs, "--set-json", 'operator.extraArgs=["--bind=127.0.0.1"]']

    def install(self, *extra: str) -> None:
        """`helm install --wait` (or upgrade, when the release exists), then wait for health.
        Without a store URL of its own, the operator's role and its Secret are made first."""
        if not self.store:
            kube = self.cluster.client()
            try:
                namespace = {"apiVersion": "v1", "kind": "Namespace"}
                apply(kube, {**namespace, "metadata": {"name": self.namespace}})
            finally:
                kube.close()
            add_tenant(self.cluster, self.namespace, operator=True)
        self.helm(
            "upgrade",
            "--install",
            self.release,
            str(CHART),
            "-n",
            self.namespace,
            "--create-namespace",
            "--wait",
            "--timeout=180s",
            # CRDs an earlier test applied with kubectl (crds/) become the release's.
            "--take-ownership",
            *self.chart_values(*extra),
        )
        self.wait_healthy()
        kube = self.cluster.client()
        try:
            wait_admitting(kube, self.namespace)
        finally:
            kube.close()

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig holding a token of the operator's service account (for a second
        operator started beside the pod, under the same RBAC)."""
        # A new token each time: a bound token dies with its service account, which a test
        # that uninstalls and installs the chart again replaces.
        path = self.cluster.run_dir / "operator.kubeconfig"
        kube = self.cluster.client()
        try:
            operator_kubeconfig(self.cluster, kube, path)
        finally:
            kube.close()
        return path

    @property
    def store_url(self) -> str:
        """The operator's store URL (its role's, with its password)."""
        if self.store:
            return self.store
        kube = self.cluster.client()
        try:
            return store_url(kube, self.namespace)
        finally:
            kube.close()

    @property
    def env(self) -> dict[str, str]:
        """What a second operator started beside the pod needs: the same store URL."""
        return {"KEELGATE_STORE": self.store_url}

    def pods(self) -> list[JSON]:
        kube = self.cluster.client()
        try:
            listed = kube.get(
                f"/api/v1/namespaces/{self.namespace}/pods",
                {"labelSelector": "app.kubernetes.io/component=operator"},
            )
        finally:
            kube.close()
        return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout: float = 120) -> None:
        wait_for(self.healthy, timeout=timeout, interval=0.5, what="the operator pod's /healthz")

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def logs(self) -> str:
        """Every operator pod's log (the current ones), as `kubectl logs` gives it."""
        kube = self.cluster.client()
        try:
            return "".join(
                kube.text(f"/api/v1/namespaces/{self.namespace}/pods/{p['metadata']['name']}/log")
                for p in self.pods()
            )
        finally:
            kube.close()

    def kill(self) -> None:
        """Delete the operator's pod with --force --grace-period=0, as a lost node or an
        impatient person would; its Deployment makes a new one."""
        kube = self.cluster.client()
        try:
            for pod in self.pods():
                name = pod["metadata"]["name"]
                kube.delete(
                    f"/api/v1/namespaces/{self.namespace}/pods/{name}",
                    {"gracePeriodSeconds": 0},
                )
        finally:
            kube.close()

    def scale(self, replicas: int) -> None:
        kube = self.cluster.client()
        try:
            kube.patch(
                f"/apis/apps/v1/namespaces/{self.namespace}/deployments/"
                f"{self.release}-operator/scale",
                {"spec": {"replicas": replicas}},
            )
        finally:
            kube.close()

    def stop(self) -> None:
        """No operator pod (the Deployment scaled to 0)."""
        self.scale(0)
        wait_for(lambda: not self.pods(), timeout=60, what="the operator pod to go")
        wait_for(lambda: not self.healthy(), timeout=30, what="the operator to stop answering")

    def start(self) -> None:
        """Operator pods again: the release installed and scaled to its replicas, answering
        /healthz."""
        if self.helm("status", self.release, "-n", self.namespace, check=False).returncode:
            self.install()
            return
        self.scale(self.replicas)
        self.wait_healthy()


def monitoring_crd(kind: str, plural: str) -> JSON:
    """A stand-in for one of the Prometheus Operator's CRDs (its group, version and names; an
    open schema): enough for the API server to take the chart's objects of that kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def monitoring_crds() -> list[JSON]:
    """Stand-ins for the Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule."""
    return [
        monitoring_crd("ServiceMonitor", "servicemonitors"),
        monitoring_crd("PodMonitor", "podmonitors"),
        monitoring_crd("PrometheusRule", "prometheusrules"),
    ]
