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

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
}


def manifests() -> list[JSON]:
    """Everything Keelgate installs besides the operator itself, in apply order."""
    docs: list[JSON] = []
    for path in [*sorted(CRDS.glob("*.yaml")), *(DEPLOY / n for n in _DEPLOY_FILES)]:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


_DEPLOY_FILES = ("rbac.yaml", "user-roles.yaml", "admission.yaml")


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


#: A password in the tests' store URL (the server trusts loopback and ignores it), so tests can
#: prove it never shows.
STORE_PASSWORD = "Pw-store-never-shown-8812"


def secret_dsn(cluster: Cluster) -> str:
    """The cluster's store URL with STORE_PASSWORD in it."""
    return cluster.dsn.replace("://keelgate@", f"://keelgate:{STORE_PASSWORD}@", 1)


def store_secret(kube: Kube, namespace: str, dsn: str) -> None:
    """The Secret step pods in `namespace` read the store URL from."""
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
