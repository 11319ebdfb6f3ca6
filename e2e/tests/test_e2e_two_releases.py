"""Two releases of the chart in one cluster, each watching its own namespaces (issue 26).

A platform gives two teams an operator each: release names (or fullnameOverride) keep every
object apart, cluster-scoped ones too, and `operator.watchNamespaces` binds each operator with
namespaced Roles only, so neither can see, let alone drive, the other's runs. This test must
leave the session's operator running and remove what it installed.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelgate_e2e import keelgate as kg
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import Kube
from keelgate_e2e.runs import agentrun, apply, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl

pytestmark = pytest.mark.e2e


@pytest.fixture
def two_releases(
    operator_process: OperatorPod, cluster: Cluster, admin: Kube
) -> Iterator[list[tuple[OperatorPod, str]]]:
    """Releases team-a and team-b, each in its own namespace, each watching one tenant
    namespace of its own (the session's operator stopped meanwhile)."""
    suffix = secrets.token_hex(3)
    operator_process.stop()
    made: list[tuple[OperatorPod, str]] = []
    try:
        for team in ("team-a", "team-b"):
            tenant = f"{team}-runs-{suffix}"
            kg.make_namespace(admin, tenant)
            kg.add_tenant(cluster, tenant)
            release = OperatorPod(
                cluster,
                release=team,
                namespace=f"{team}-system-{suffix}",
                # The CRDs are the session release's: a second release leaves them alone.
                values=(f"operator.watchNamespaces[0]={tenant}", "crds.install=false"),
                # The operator's database role is one for the store (`keelgate tenant add
                # --operator`): both releases log in with it, through their own Secrets.
                store=operator_process.store_url,
            )
            made.append((release, tenant))
            release.install()
        yield made
    finally:
        for release, tenant in made:
            release.helm("uninstall", release.release, "-n", release.namespace, check=False)
            for namespace in (tenant, release.namespace):
                if admin.exists(f"/api/v1/namespaces/{namespace}"):
                    admin.delete(f"/api/v1/namespaces/{namespace}")
        operator_process.start()


def test_two_releases_each_drive_only_their_own_namespaces_with_namespaced_roles(
    two_releases: list[tuple[OperatorPod, str]],
    cluster: Cluster,
    admin: Kube,
    kubectl_bin: Path,
    shop: ShopServer,
) -> None:
    """Both releases install side by side (no name collides); each operator is bound by a Role
    in its own tenant namespace and by nothing cluster-wide; a run in each namespace succeeds,
    started by that namespace's operator alone (its own step-pod count), and an operator's
    service account may not even list the other team's runs."""
    (a, ns_a), (b, ns_b) = two_releases
    for release, tenant in two_releases:
        roles = admin.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{tenant}/rolebindings")
        assert f"{release.release}-operator" in {r["metadata"]["name"] for r in roles["items"]}
        cluster_bindings = admin.get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")
        assert f"{release.release}-operator" not in {
            r["metadata"]["name"] for r in cluster_bindings["items"]
        }
    for tenant in (ns_a, ns_b):
        kubectl = Kubectl(kubectl_bin, cluster.kubeconfig, "admin", tenant)
        apply(kubectl, agentrun("team-run", shop, [[order(tenant, 1)]]))
    for tenant in (ns_a, ns_b):
        wait_phase(admin, tenant, "team-run", "Succeeded", timeout=120)
    assert shop.shop.count() == 2
    for release in (a, b):
        started = [
            line
            for line in release.metrics().splitlines()
            if line.startswith("keelgate_steps_started_total ")
        ]
        assert started and float(started[0].split()[1]) >= 1, started

    def allowed(namespace: str) -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{a.namespace}:team-a-operator",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{a.namespace}"],
                "resourceAttributes": {
                    "group": "keelgate.dev",
                    "resource": "agentruns",
                    "verb": "list",
                    "namespace": namespace,
                },
            },
        }
        answer = admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(answer["status"]["allowed"])

    assert not allowed(ns_b) and allowed(ns_a)
