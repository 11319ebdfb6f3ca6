"""Operating Keelgate with Helm while runs are in flight: `helm upgrade` to a new operator build,
`helm rollback`, and `helm uninstall` (which keeps the CRDs and every run's data, as Helm's
convention for CRDs says), then installing again; and the operator pod's RBAC is exactly what it
needs.

It must never settle an outcome against the shop's record, and it leaves the session's release
installed as it found it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from keelgate_e2e import runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.runs import agentrun, apply, look, order
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, wait_for

pytestmark = pytest.mark.e2e


def _three_step(shop: ShopServer, prefix: str, count: int) -> list[JSON]:
    return [
        agentrun(
            f"{prefix}-{n}",
            shop,
            [[look(f"{prefix}{n}")], [order(f"{prefix}{n}a", 1)], [order(f"{prefix}{n}b", 1)]],
        )
        for n in range(count)
    ]


def _once(shop: ShopServer) -> None:
    counts = shop.shop.by_key()
    assert counts and max(counts.values()) == 1, counts


def _operator_image(operator: OperatorPod) -> str:
    (pod,) = operator.pods()
    return str(pod["spec"]["containers"][0]["image"])


def test_helm_upgrade_and_rollback_mid_run_repeat_no_write_and_strand_no_run(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """Runs under way while `helm upgrade` replaces the operator with a new build (another
    image tag: the Deployment's Recreate stops the old pod first) and `helm rollback` brings the
    old one back: every run finishes and every order is placed once."""
    shop.shop.delay = 0.3
    docs = _three_step(shop, "up", 5)
    names = [d["metadata"]["name"] for d in docs]
    apply(kubectl, *docs)
    time.sleep(1.5)
    operator.install("image.tag=dev-2")
    assert _operator_image(operator) == "keelgate:dev-2"
    time.sleep(1.5)
    operator.helm("rollback", operator.release, "-n", operator.namespace, "--wait")
    wait_for(lambda: _operator_image(operator) == "keelgate:dev", timeout=120)
    operator.wait_healthy()
    runs.drive_to_success(admin, alice, tenant, names, shop, timeout=300)
    _once(shop)
    history = operator.helm("history", operator.release, "-n", operator.namespace, "-o", "json")
    revisions = [entry["description"] for entry in json.loads(history.stdout)]
    assert any("Rollback" in description for description in revisions)


def test_helm_uninstall_keeps_the_crds_and_the_runs_and_install_again_finishes_them(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
) -> None:
    """`helm uninstall` mid-run removes the operator but keeps the CRDs, the AgentRuns and the
    store's data; installing the chart again picks the runs up where they were, each order
    once."""
    shop.shop.delay = 0.3
    docs = _three_step(shop, "un", 3)
    names = [d["metadata"]["name"] for d in docs]
    apply(kubectl, *docs)
    time.sleep(1.5)
    operator.helm("uninstall", operator.release, "-n", operator.namespace, "--wait")
    wait_for(lambda: not operator.pods(), timeout=60, what="the operator pod to go")
    crds = kubectl("get", "crds", "-o", "name").stdout
    assert "agentruns.keelgate.dev" in crds and "reconciliations.keelgate.dev" in crds
    still = kubectl("get", "agentruns", "-o", "name").stdout.split()
    assert sorted(still) == sorted(f"agentrun.keelgate.dev/{n}" for n in names)
    operator.install()
    runs.drive_to_success(admin, alice, tenant, names, shop, timeout=300)
    _once(shop)
    for name in names:
        assert runs.audit_events(cluster.dsn, tenant, name)  # the trail survived


# Every (verb, resource) the operator's code does, in keelgate/kube/api.py and through kopf's
# watches (list and watch of what it observes): what its ClusterRole must grant, no more.
NEEDED = {
    ("get", "agentruns.keelgate.dev"),
    ("list", "agentruns.keelgate.dev"),
    ("watch", "agentruns.keelgate.dev"),
    ("create", "agentruns.keelgate.dev"),
    ("delete", "agentruns.keelgate.dev"),
    ("get", "reconciliations.keelgate.dev"),
    ("list", "reconciliations.keelgate.dev"),
    ("watch", "reconciliations.keelgate.dev"),
    ("create", "reconciliations.keelgate.dev"),
    ("get", "approvals.keelgate.dev"),
    ("list", "approvals.keelgate.dev"),
    ("watch", "approvals.keelgate.dev"),
    ("create", "approvals.keelgate.dev"),
    ("patch", "approvals.keelgate.dev"),  # its finalizer keelgate.dev/decisions
    ("patch", "agentruns.keelgate.dev/status"),
    ("patch", "reconciliations.keelgate.dev/status"),
    ("patch", "approvals.keelgate.dev/status"),
    ("get", "pods"),
    ("list", "pods"),
    ("watch", "pods"),
    ("create", "pods"),
    ("delete", "pods"),
    ("create", "events"),
}


def test_the_operator_may_do_what_it_needs_and_nothing_more(
    operator: OperatorPod, kubectl_bin: Path, cluster: Cluster, tenant: str
) -> None:
    """`kubectl auth can-i --list` as the operator's service account, in a tenant namespace:
    exactly what its code does (beyond what every authenticated user may), and no Secret."""
    subject = "system:serviceaccount:keelgate-system:keelgate-operator"

    def can(as_: str) -> set[tuple[str, str]]:
        out = subprocess.run(
            [
                str(kubectl_bin),
                f"--kubeconfig={cluster.kubeconfig}",
                "--context=admin",
                "auth",
                "can-i",
                "--list",
                f"--as={as_}",
                "-n",
                tenant,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        granted: set[tuple[str, str]] = set()
        # The table: Resources, Non-Resource URLs, Resource Names, [verbs ...].
        for line in out.stdout.splitlines()[1:]:
            if not line.strip() or line.startswith(" "):
                continue  # a non-resource URL row
            resource = line.split()[0]
            verbs = line[line.rindex("[") + 1 : line.rindex("]")].split()
            granted.update((verb, resource) for verb in verbs)
        return granted

    everyone = can("system:serviceaccount:default:nobody-at-all")
    extra = can(subject) - everyone
    assert extra == NEEDED
    assert not any(resource.startswith("secrets") for _, resource in can(subject))
