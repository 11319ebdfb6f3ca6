"""The node agent: a stand-in for the kubelet that runs pods as local host processes.

Why it exists: the local cluster has no kubelet (no container runtime, no Docker). The agent
speaks the real API as a kubelet does, with node credentials (`system:node:<name>`, so the API
server's Node authorizer and NodeRestriction admission apply): it registers a Node with capacity,
conditions, addresses and its log port, renews its Lease in `kube-node-lease` every 10 s, watches
the pods bound to it, hands each to a `PodWorker` (which mounts the pod's volumes, the
service-account token included, in each container's own mount namespace), and serves container
logs over TLS.

It must never run a pod that is not bound to its node, never pull or unpack an image (it runs the
host's programs named by `command`/`args`; the image is only echoed in the status), and never
leave a pod process running after it stops.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import platform
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from keelgate_e2e.kube import JSON, STRATEGIC_PATCH, ApiError, Kube
from keelgate_e2e.node.cpu import CpuGroups
from keelgate_e2e.node.logs import LogServer, LogSource
from keelgate_e2e.node.pod import NodeContext, PodWorker

log = logging.getLogger("keelgate_e2e.node")

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
RENEW_EVERY = 10.0
STATUS_EVERY = 60.0
MAX_PODS = "110"


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read(path: str, default: str = "") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def _memory_kib() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 0


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "Linux"


class Agent:
    """One node: registration, heartbeat, pod watch, workers and the log server."""

    def __init__(
        self,
        kube: Kube,
        name: str,
        state_dir: Path,
        *,
        port: int,
        tls_cert: Path,
        tls_key: Path,
        client_ca: Path,
        allowed_clients: frozenset[str],
        node_ip: str = "127.0.0.1",
        backoff_base: float = 10.0,
        marker_env: dict[str, str] | None = None,
    ) -> None:
        self.kube = kube
        self.name = name
        self.state_dir = state_dir
        self.node_ip = node_ip
        self.stopping = threading.Event()
        self._workers: dict[str, PodWorker] = {}
        self._by_name: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._ready_since = _now()
        self._node_uid = ""
        disk = shutil.disk_usage(state_dir if state_dir.exists() else Path("/"))
        self.capacity = {
            "cpu": str(os.cpu_count() or 1),
            "memory": f"{_memory_kib()}Ki",
            "pods": MAX_PODS,
            "ephemeral-storage": str(disk.total),
        }
        server = httpx.URL(kube.server)
        api_host, api_port = server.host, str(server.port or 443)
        self._service_env = {
            # No kube-proxy runs, so the kubernetes Service's cluster IP is unreachable: point
            # in-cluster clients at the API server itself.
            "KUBERNETES_SERVICE_HOST": api_host,
            "KUBERNETES_SERVICE_PORT": api_port,
            "KUBERNETES_SERVICE_PORT_HTTPS": api_port,
            "KUBERNETES_PORT": f"tcp://{api_host}:{api_port}",
        }
        self.ctx = NodeContext(
            kube=kube,
            node_name=name,
            state_dir=state_dir,
            node_ip=node_ip,
            allocatable=self.capacity,
            service_env=lambda _namespace: dict(self._service_env),
            backoff_base=backoff_base,
            marker_env=marker_env or {},
        )
        # KEELGATE_E2E_CPU_WEIGHTS=0 runs pods without them (to measure what they change).
        if os.environ.get("KEELGATE_E2E_CPU_WEIGHTS", "1") != "0":
            self.ctx.cpu = CpuGroups(name, self.capacity["cpu"])
        self.log_server = LogServer(
            port, tls_cert, tls_key, client_ca, allowed_clients, self._resolve_log
        )

    # -- node registration and heartbeat ----------------------------------------------------

    def _conditions(self) -> list[JSON]:
        now = _now()
        since = self._ready_since

        def cond(ctype: str, status: str, reason: str, message: str) -> JSON:
            return {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            }

        return [
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            cond(
                "DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"
            ),
            cond(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "keelgate e2e node agent is posting ready status (pods run as host processes)",
            ),
        ]

    def _node_status(self, version: str) -> JSON:
        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": self._conditions(),
            "addresses": [
                {"type": "InternalIP", "address": self.node_ip},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.log_server.port}},
            "nodeInfo": {
                "machineID": _read("/etc/machine-id"),
                "systemUUID": _read("/sys/class/dmi/id/product_uuid", _read("/etc/machine-id")),
                "bootID": _read("/proc/sys/kernel/random/boot_id"),
                "kernelVersion": platform.release(),
                "osImage": f"{_os_image()} (keelgate e2e node agent: host processes)",
                "containerRuntimeVersion": "keelgate-node://0.1.0",
                "kubeletVersion": version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": _arch(),
            },
        }

    def register(self) -> None:
        """Create this Node (or refresh it if it exists), then its Lease."""
        version = str(self.kube.get("/version").get("gitVersion", "v0.0.0"))
        node: JSON = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": _arch(),
                    "node.keelgate.dev/agent": "e2e",
                },
            },
            "spec": {},
            "status": self._node_status(version),
        }
        try:
            created = self.kube.create("/api/v1/nodes", node)
        except ApiError as exc:
            if exc.status != 409:
                raise
            created = self.kube.patch(
                f"/api/v1/nodes/{self.name}/status",
                {"status": node["status"]},
                content_type=STRATEGIC_PATCH,
            )
        self._node_uid = str(created["metadata"]["uid"])
        self._version = version
        self.renew_lease()
        log.info("registered node %s (uid %s)", self.name, self._node_uid)

    def renew_lease(self) -> None:
        """Renew (or create) the node's Lease, the heartbeat the node-lifecycle controller reads."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{self.name}"
        try:
            self.kube.patch(
                path, {"spec": {"renewTime": _micro_now(), "holderIdentity": self.name}}
            )
        except ApiError as exc:
            if exc.status != 404:
                raise
            lease: JSON = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": LEASE_NAMESPACE,
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": self.name,
                            "uid": self._node_uid,
                        }
                    ],
                },
                "spec": {
                    "holderIdentity": self.name,
                    "leaseDurationSeconds": LEASE_SECONDS,
                    "renewTime": _micro_now(),
                },
            }
            self.kube.create(
                f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases", lease
            )

    def _heartbeat(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(RENEW_EVERY):
            try:
                self.renew_lease()
                if time.monotonic() - last_status >= STATUS_EVERY:
                    self.kube.patch(
                        f"/api/v1/nodes/{self.name}/status",
                        {"status": {"conditions": self._conditions()}},
                        content_type=STRATEGIC_PATCH,
                    )
                    last_status = time.monotonic()
            except (ApiError, httpx.HTTPError) as exc:
                log.warning("heartbeat failed: %s", exc)
            self._reap()

    # -- pods -----------------------------------------------------------------------------

    def _dispatch(self, kind: str, pod: JSON) -> None:
        meta = pod["metadata"]
        uid = str(meta["uid"])
        with self._lock:
            worker = self._workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    worker.gone()
                return
            if pod.get("spec", {}).get("nodeName") != self.name:
                return
            if worker is None:
                worker = PodWorker(self.ctx, pod)
                self._workers[uid] = worker
                self._by_name[(meta["namespace"], meta["name"])] = uid
                worker.start()
        worker.update(pod)

    def _reap(self) -> None:
        """Forget workers whose pods are gone, and their logs (as the kubelet does)."""
        with self._lock:
            done = [uid for uid, w in self._workers.items() if w.finished.is_set()]
            for uid in done:
                worker = self._workers.pop(uid)
                key = (worker.namespace, worker.pod_name)
                if self._by_name.get(key) == uid:
                    del self._by_name[key]
        for uid in done:
            if self.ctx.cpu is not None:
                self.ctx.cpu.release(uid)
            if not self.stopping.is_set():
                shutil.rmtree(self.state_dir / "pods" / uid, ignore_errors=True)

    def _watch_pods(self) -> None:
        selector = {"fieldSelector": f"spec.nodeName={self.name}"}
        while not self.stopping.is_set():
            try:
                listed = self.kube.get("/api/v1/pods", selector)
                version = str(listed["metadata"]["resourceVersion"])
                present = set()
                for pod in listed.get("items", []):
                    present.add(pod["metadata"]["uid"])
                    self._dispatch("ADDED", pod)
                with self._lock:
                    missing = [w for uid, w in self._workers.items() if uid not in present]
                for worker in missing:
                    worker.gone()
                while not self.stopping.is_set():
                    expired = False
                    params: dict[str, str | int] = {**selector, "resourceVersion": version}
                    for event in self.kube.watch("/api/v1/pods", params):
                        if self.stopping.is_set():
                            return
                        obj: dict[str, Any] = event.get("object", {})
                        if event["type"] == "ERROR":
                            expired = True  # 410 Gone: relist
                            break
                        version = str(obj["metadata"]["resourceVersion"])
                        if event["type"] != "BOOKMARK":
                            self._dispatch(str(event["type"]), obj)
                    if expired:
                        break
            except (ApiError, httpx.HTTPError, KeyError) as exc:
                if self.stopping.is_set():
                    return
                log.warning("pod watch failed, relisting: %s", exc)
                time.sleep(1.0)

    def _resolve_log(
        self, namespace: str, pod: str, container: str, previous: bool
    ) -> LogSource | str:
        with self._lock:
            uid = self._by_name.get((namespace, pod))
            worker = self._workers.get(uid) if uid else None
        if worker is None:
            return f'pod "{pod}" not found on node {self.name}'
        found = worker.log_source(container, previous)
        if isinstance(found, str):
            return found
        path, writing = found
        return LogSource(path, (lambda: worker.is_writing(container)) if writing else bool)

    # -- lifetime ---------------------------------------------------------------------------

    def run(self) -> None:
        """Register, then serve until `stop` is called; on return no pod process is left."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_server.start()
        while True:
            try:
                self.register()
                break
            except (ApiError, httpx.HTTPError) as exc:
                if self.stopping.wait(1.0):
                    return
                log.warning("registration failed, retrying: %s", exc)
        threads = [
            threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True),
            threading.Thread(target=self._watch_pods, name="pod-watch", daemon=True),
        ]
        for thread in threads:
            thread.start()
        self.stopping.wait()
        self._shutdown_workers()

    def stop(self) -> None:
        """Ask `run` to return."""
        self.stopping.set()

    def _shutdown_workers(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.shutdown()
        for worker in workers:
            worker.finished.wait(timeout=10.0)
        if self.ctx.cpu is not None:
            self.ctx.cpu.close()
        self.log_server.shutdown()
        with contextlib.suppress(Exception):
            self.kube.close()
