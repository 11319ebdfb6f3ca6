"""kwok's fake nodes on the local control plane: the program, its stages, and the Node objects.

Why it exists: a step pod needs a node, and a scale test needs a thousand of them without a
thousand kubelets. kwok (built from its Go module by ``keelgate_e2e.build.ensure_optional``)
manages every Node annotated ``kwok.x-k8s.io/node=fake``: it keeps their leases and status, and
plays the pod stages given here: a scheduled pod becomes Running (``pod-ready``), a pod being
deleted is deleted at once (``pod-delete``). There is deliberately no stage that completes a pod:
the hollow executor ends each step pod itself, with the exit code of the step it really ran.

Node leases are renewed every 5 minutes (lease 20 minutes), not every 10 s as a kubelet does:
1,000 nodes at a kubelet's rate are 100 lease writes a second, which this 2-core control plane
would pay beside the runs; the controller-manager is told to allow for it (``CONTROLLER_ARGS``).
It must never manage a node that is not annotated, and never start a second kwok.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path
from typing import Any

import yaml
from keelgate_e2e import build, procs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import ApiError, Kube

ANNOTATION = "kwok.x-k8s.io/node"
LEASE_SECONDS = 1200
#: The node-lifecycle controller's patience with a node's lease (beyond LEASE_SECONDS).
CONTROLLER_ARGS = ("--node-monitor-grace-period=1800s", "--node-monitor-period=30s")

_POD_READY = """
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
{{ end }}
{{ with PodIPWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace }}
podIP: {{ . | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

_NODE_STATUS = """
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
allocatable:
  cpu: "64"
  memory: 256Gi
  pods: "110"
capacity:
  cpu: "64"
  memory: 256Gi
  pods: "110"
nodeInfo:
  architecture: amd64
  kubeletVersion: fake
  operatingSystem: linux
phase: Running
"""


def configuration() -> list[dict[str, Any]]:
    """kwok's configuration: its options and the stages it plays (the documents of its
    ``--config`` file)."""
    ready_selector = {
        "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
        "operator": "NotIn",
        "values": ["True"],
    }
    return [
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": {
                "manageNodesWithAnnotationSelector": f"{ANNOTATION}=fake",
                "nodeLeaseDurationSeconds": LEASE_SECONDS,
                # One address per pod: 10,000 runs hold 10,000 pods at once.
                "cidr": "10.128.0.0/12",
                "nodeIP": "10.96.0.1",
                # A configuration file gets none of kwok's defaults: its own, spelled out.
                "podPlayStageParallelism": 4,
                "nodePlayStageParallelism": 4,
                "nodeLeaseParallelism": 4,
                "podsOnNodeSyncParallelism": 1,
                "enablePodsOnNodeSyncListPager": True,
                "enablePodsOnNodeSyncStreamWatch": False,
                "enableDebuggingHandlers": False,
                "enableProfilingHandler": False,
                "enableContentionProfiling": False,
            },
        },
        _stage("node-initialize", "Node", [ready_selector], status=_NODE_STATUS),
        _stage(
            "pod-ready",
            "Pod",
            [
                {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                {"key": ".spec.nodeName", "operator": "Exists"},
                ready_selector,
            ],
            status=_POD_READY,
        ),
        _stage(
            "pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            delete=True,
        ),
    ]


def _stage(
    name: str,
    kind: str,
    expressions: list[dict[str, Any]],
    *,
    status: str = "",
    delete: bool = False,
) -> dict[str, Any]:
    following: dict[str, Any] = {"delete": True} if delete else {"statusTemplate": status}
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {"matchExpressions": expressions},
            "next": following,
        },
    }


def node(name: str) -> dict[str, Any]:
    """A fake node: a Node object kwok manages, with no taint (step pods tolerate none)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {},
    }


class Kwok:
    """kwok against ``cluster``, as one of its processes (``cluster.stop`` stops it too)."""

    def __init__(self, cluster: Cluster, work: Path) -> None:
        self.cluster = cluster
        self.work = work
        self.proc: procs.Proc | None = None

    def start(self) -> None:
        binary = build.ensure_optional("kwok").path
        self.work.mkdir(parents=True, exist_ok=True)
        config = self.work / "kwok.yaml"
        config.write_text(yaml.safe_dump_all(configuration(), sort_keys=False))
        home = self.work / "home"  # kwok reads ~/.kwok: not the user's
        home.mkdir(exist_ok=True)
        proc = procs.spawn(
            "kwok",
            [
                str(binary),
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--config={config}",
                "--server-address=",
                "--v=WARN",
            ],
            run_dir=self.cluster.run_dir,
            log=self.cluster.logs_dir / "kwok.log",
            env={"HOME": str(home), "GOMAXPROCS": os.environ.get("KWOK_GOMAXPROCS", "2")},
        )
        self.cluster.adopt(proc)
        self.proc = proc

    def add_nodes(self, admin: Kube, count: int, *, prefix: str = "kwok-node") -> list[str]:
        """Create ``count`` fake nodes (a few at a time) and wait until all are Ready."""
        names = [f"{prefix}-{n:04d}" for n in range(count)]

        def create(name: str) -> None:
            try:
                admin.create("/api/v1/nodes", node(name))
            except ApiError as error:
                if error.status != 409:
                    raise

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(create, names))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc is not None
            if not self.proc.alive():
                raise procs.StartError("kwok exited:\n" + procs.log_tail(self.proc.log))
            listed = admin.get("/api/v1/nodes", {"labelSelector": "type=kwok"})["items"]
            ready = sum(
                1
                for item in listed
                if any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (item.get("status") or {}).get("conditions") or []
                )
            )
            if ready >= count:
                return names
            time.sleep(1.0)
        raise procs.StartError(f"kwok: fewer than {count} nodes Ready after 300 s")
