"""pytest fixtures for the e2e suite: one real local cluster per session, a namespace per test.

Why it exists: e2e tests must run against the real kube-apiserver, etcd, controller-manager and
scheduler (built by `keelgate_e2e.build`, which builds whatever is missing), with the node agent
as the only stand-in. The session fixture starts them in a private run directory (never `.dev/`,
so a developer's `make up` is left alone) and stops them, checking that no process is left.
Each test gets a fresh namespace whose `default` service account exists, deleted afterwards.

It must never point tests at a cluster other than the one it started.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelgate_e2e import keelgate as kg
from keelgate_e2e import procs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.jaeger import Jaeger
from keelgate_e2e.kube import Kube
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, find_kubectl


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker this suite uses (the project runs with --strict-markers)."""
    config.addinivalue_line("markers", "e2e: needs the local Kubernetes cluster (e2e/)")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running local cluster: etcd, API server, controller-manager, scheduler, node agent."""
    run_dir = tmp_path_factory.mktemp("cluster")
    started = Cluster(run_dir, postgres=True, pg_password=kg.STORE_PASSWORD)
    started.start()
    yield started
    started.stop()
    left = procs.marked_pids(run_dir)
    assert not left, f"processes left after stopping the cluster: {left}"


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> Iterator[Kube]:
    """An API client as `admin` (system:masters)."""
    kube = cluster.client("admin")
    yield kube
    kube.close()


@pytest.fixture(scope="session")
def kubectl_bin() -> Path:
    """The machine's kubectl."""
    return find_kubectl()


@pytest.fixture
def namespace(admin: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, usable for pods (its default service account exists)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{secrets.token_hex(3)}"
    kg.make_namespace(admin, name, labels={"keelgate.dev/e2e": "true"})
    yield name
    admin.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def kubectl(cluster: Cluster, kubectl_bin: Path, namespace: str) -> Kubectl:
    """kubectl as admin in the test's namespace."""
    return Kubectl(kubectl_bin, cluster.kubeconfig, "admin", namespace)


# Keelgate on the cluster


@pytest.fixture(scope="session")
def jaeger(cluster: Cluster) -> Iterator[Jaeger]:
    """A real trace collector (Jaeger, in memory) beside the cluster: every run's spans go
    there, from the operator and from each step pod."""
    collector = Jaeger(cluster.run_dir / "jaeger").start()
    yield collector
    collector.stop()


@pytest.fixture(scope="session")
def operator_process(cluster: Cluster, jaeger: Jaeger) -> Iterator[kg.OperatorPod]:
    """Keelgate installed as a user installs it: `helm install --wait` of charts/keelgate into
    keelgate-system (the CRDs, the operator's RBAC, the user roles, the admission policy, the
    operator's Deployment), so the operator runs as a pod under the chart's RBAC, with failpoints
    allowed, tracing to the session's collector, and `keelgate-step` as a step ServiceAccount
    any AgentRun author may name (admissionPolicy.stepServiceAccounts, as a platform would set
    it); its store URL carries a password the tests look for everywhere."""
    pod = kg.OperatorPod(
        cluster,
        values=(
            f"tracing.otlpEndpoint={jaeger.otlp_endpoint}",
            f"admissionPolicy.stepServiceAccounts={{{kg.STEP_ACCOUNT}}}",
        ),
    )
    pod.install()
    yield pod


@pytest.fixture(scope="session")
def keelgate_installed(operator_process: kg.OperatorPod) -> None:
    """The chart is installed (its CRDs, roles and admission policy with it)."""


@pytest.fixture
def operator(operator_process: kg.OperatorPod) -> kg.OperatorPod:
    """The session's operator pod, brought back first if an earlier test stopped it."""
    if not operator_process.healthy():
        operator_process.start()
    return operator_process


@pytest.fixture
def tenant(admin: Kube, namespace: str, cluster: Cluster, keelgate_installed: None) -> str:
    """The test's namespace as a Keelgate tenant: its own database role and the store Secret
    step pods read (`keelgate tenant add`), and `alice` holding the built-in `edit` role there
    (bob holds nothing)."""
    kg.add_tenant(cluster, namespace)
    kg.grant_edit(admin, namespace)
    return namespace


@pytest.fixture
def shop() -> Iterator[ShopServer]:
    """A loopback shop counting orders by Idempotency-Key (step pods share the host network)."""
    server = ShopServer().start()
    yield server
    server.stop()


@pytest.fixture
def alice(kubectl: Kubectl) -> Kubectl:
    """kubectl as alice in the test's namespace."""
    return kubectl.as_user("alice")
