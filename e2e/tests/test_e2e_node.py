"""The node agent as the control plane sees it: a Ready Node with capacity and a Lease
heartbeat, logs that `kubectl logs` can follow and tail, a pod's end reported even when the API
server was down at that moment, and pods weighted for CPU by their QoS class as the kubelet's
cgroups weigh them.

They must never stop or reconfigure the shared node agent.
"""

from __future__ import annotations

import datetime as dt
import os
from functools import partial
from pathlib import Path

import pytest

from keelgate_e2e.cluster import NODE_NAME, Cluster
from keelgate_e2e.kube import Kube
from keelgate_e2e.testing import Kubectl, condition, pod, pod_phase, wait_for


def _micro(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_node_registered_ready_with_capacity_and_lease(admin: Kube) -> None:
    """The Node is Ready (KubeletReady) with no pressure, reports capacity, allocatable and
    its address, carries no not-ready taint, and its Lease's renewTime advances (~10 s)."""
    node = admin.get(f"/api/v1/nodes/{NODE_NAME}")
    ready = condition(node, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "KubeletReady")
    for ctype in ("MemoryPressure", "DiskPressure", "PIDPressure"):
        pressure = condition(node, ctype)
        assert pressure is not None and pressure["status"] == "False"
    for field in ("capacity", "allocatable"):
        assert {"cpu", "memory", "pods"} <= set(node["status"][field])
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    assert node["status"]["nodeInfo"]["kubeletVersion"] == admin.get("/version")["gitVersion"]
    assert not [t for t in node["spec"].get("taints") or [] if "not-ready" in t["key"]]

    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE_NAME}"
    first = _micro(admin.get(lease_path)["spec"]["renewTime"])

    def renewed() -> dt.datetime | None:
        latest = _micro(admin.get(lease_path)["spec"]["renewTime"])
        return latest if latest > first else None

    assert wait_for(renewed, timeout=30, what="the node Lease to be renewed") > first
    lease = admin.get(lease_path)
    assert lease["metadata"]["ownerReferences"][0]["name"] == NODE_NAME


def test_kubectl_logs_follow_and_tail(admin: Kube, namespace: str, kubectl: Kubectl) -> None:
    """`kubectl logs -f` streams a running container's output until it exits; `--tail`
    and `--timestamps` are honoured."""
    script = "for i in 1 2 3 4 5; do echo line$i; sleep 0.5; done"
    admin.create(f"/api/v1/namespaces/{namespace}/pods", pod("talker", ["sh", "-c", script]))
    wait_for(lambda: pod_phase(admin, namespace, "talker", "Running"), timeout=30)
    followed = kubectl("logs", "-f", "talker", timeout=30)
    assert followed.stdout.splitlines() == [f"line{i}" for i in range(1, 6)]
    wait_for(lambda: pod_phase(admin, namespace, "talker", "Succeeded"), timeout=30)
    assert kubectl("logs", "--tail=2", "talker").stdout == "line4\nline5\n"
    stamped = kubectl("logs", "--timestamps", "--tail=1", "talker").stdout.split()
    assert stamped[1] == "line5"
    assert _micro(stamped[0][:26] + "Z") <= dt.datetime.now(dt.UTC)


def test_a_pod_that_ends_while_the_api_server_is_down_is_reported_once_it_is_back(
    admin: Kube, namespace: str, cluster: Cluster
) -> None:
    """A container that exits while the API server is down still has its end recorded once the
    server is back (the node agent sends the status again, as the kubelet's status manager
    does): the operator waits for that end, so a pod left Running for good would stall its run."""
    admin.create(f"/api/v1/namespaces/{namespace}/pods", pod("brief", ["sh", "-c", "sleep 2"]))
    wait_for(lambda: pod_phase(admin, namespace, "brief", "Running"), timeout=30)
    cluster.restart("kube-apiserver", lambda: admin.text("/readyz") == "ok", kill=True, away=5.0)
    ended = wait_for(lambda: pod_phase(admin, namespace, "brief", "Succeeded"), timeout=60)
    assert ended["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


CPU_ROOT = Path("/sys/fs/cgroup/cpu")
#: The container prints its cpu cgroup and that group's weight, then the weight of the group
#: above it (the QoS group), each on a line.
SHOW_WEIGHT = (
    'g=$(sed -n -E "s/^[0-9]+:([^:]*,)?cpu(,[^:]*)?:(.*)$/\\3/p" /proc/self/cgroup); '
    'echo "$g"; cat "/sys/fs/cgroup/cpu$g/cpu.shares"; cat "/sys/fs/cgroup/cpu${g%/*}/cpu.shares"'
)


@pytest.mark.skipif(
    not os.access(CPU_ROOT, os.W_OK) or os.environ.get("KEELGATE_E2E_CPU_WEIGHTS") == "0",
    reason="no writable cgroup v1 cpu hierarchy here, or KEELGATE_E2E_CPU_WEIGHTS=0: the node "
    "agent runs pods without weights",
)
def test_pods_get_the_cpu_weight_of_their_qos_class(admin: Kube, namespace: str) -> None:
    """A pod that requests no CPU runs in the BestEffort group, whose weight is the kubelet's 2;
    a pod requesting 250m runs with 256 shares in the Burstable group (which weighs the sum of
    its pods' requests); a Guaranteed pod with 500m gets 512 directly under the node's pods. So
    step pods that request nothing cannot take the CPU from the control plane or the operator
    on a busy node."""
    cases = {
        "besteffort": ({}, "/besteffort/pod", "2"),
        "burstable": ({"requests": {"cpu": "250m"}}, "/burstable/pod", "256"),
        "guaranteed": (
            {
                "requests": {"cpu": "500m", "memory": "64Mi"},
                "limits": {"cpu": "500m", "memory": "64Mi"},
            },
            "/pod",
            "512",
        ),
    }
    for name, (resources, _, _) in cases.items():
        manifest = pod(name, ["sh", "-c", SHOW_WEIGHT], extra={"resources": resources})
        admin.create(f"/api/v1/namespaces/{namespace}/pods", manifest)
    parents: dict[str, int] = {}
    for name, (_, where, weight) in cases.items():
        done = wait_for(partial(pod_phase, admin, namespace, name, "Succeeded"), timeout=60)
        uid = done["metadata"]["uid"]
        lines = admin.text(f"/api/v1/namespaces/{namespace}/pods/{name}/log").splitlines()
        group, shares, parent = lines
        assert group.endswith(f"{where}{uid}"), (name, group)
        assert group.startswith("/keelgate-node-"), (name, group)
        assert shares == weight, (name, shares)
        parents[name] = int(parent)
    assert parents["besteffort"] == 2
    # Other Burstable pods on the shared node (an operator the chart installed) may add theirs.
    assert parents["burstable"] >= 256
