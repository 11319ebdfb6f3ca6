"""Authentication and authorization on the real API server: client-certificate users, RBAC,
the Node authorizer for the node agent, and the agent's log endpoint.

They must never grant anything outside the test's own namespace (the cluster is shared by the
session).
"""

from __future__ import annotations

import ssl

import httpx

from keelgate_e2e.cluster import NODE_NAME, Cluster
from keelgate_e2e.kube import ApiError, Kube
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
