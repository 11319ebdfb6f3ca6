"""CPU weights for pod processes, as the kubelet's QoS cgroups give them (cgroup v1 ``cpu``).

Why it exists: on a real node the kubelet puts each pod in a cgroup whose ``cpu.shares`` follow
its CPU requests. All pods together sit in one group weighted by the node's allocatable CPU;
BestEffort pods (no requests at all) share one group of weight 2; a Burstable pod gets its
request in shares (1000m = 1024) inside the Burstable group, whose weight is the sum of its
pods' requests; a Guaranteed pod gets its request directly. So on a busy node, pods that asked
for nothing cannot starve the pods that did, nor the programs outside the pods. Without this,
the node agent's pod processes competed as equals with everything on the machine: twenty
BestEffort step pods took the two cores from the control plane and the operator (run as a host
process here), which a kubelet would not allow.

Where the cgroup v1 ``cpu`` hierarchy is missing or not writable, pods run as before and the
agent says so once. Shares only weigh processes against each other when the CPU is contended;
limits (CFS quota) are not applied. This module must never move a process the agent did not
start, and it removes the groups it made when the agent stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keelgate_e2e.node.env import ConfigError, parse_quantity

log = logging.getLogger("keelgate_e2e.node.cpu")

JSON = dict[str, Any]
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
#: The kubelet's weight for the BestEffort group, and the least any group gets.
MIN_SHARES = 2
PREFIX = "keelgate-node-"


def millicores(quantity: str | int | float) -> int:
    """A CPU quantity ("250m", "1", "0.5", "100u", "1k") in millicores; 0 if it is not one."""
    try:
        return int(parse_quantity(str(quantity)) * 1000)
    except ConfigError:
        return 0


def shares(milli: int) -> int:
    """``cpu.shares`` for a request of ``milli`` millicores, as the kubelet computes them."""
    return max(MIN_SHARES, milli * 1024 // 1000)


def _resources(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c.get("resources") or {} for c in pod.get("spec", {}).get("containers") or []]


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class: the API server's ``status.qosClass``, else worked out the same way."""
    given = (pod.get("status") or {}).get("qosClass")
    if given:
        return str(given)
    resources = _resources(pod)
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        (r.get("limits") or {}).get(kind) is not None
        and (r.get("requests") or {}).get(kind, (r.get("limits") or {}).get(kind))
        == (r.get("limits") or {}).get(kind)
        for r in resources
        for kind in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


def requested_millicores(pod: Mapping[str, Any]) -> int:
    """The CPU the pod's containers request together (a limit alone stands for its request)."""
    total = 0
    for r in _resources(pod):
        cpu = (r.get("requests") or {}).get("cpu", (r.get("limits") or {}).get("cpu"))
        if cpu is not None:
            total += millicores(cpu)
    return total


class CpuGroups:
    """The node's pod cgroups: ``<root>/keelgate-node-<node>-<pid>/{besteffort,burstable}``."""

    def __init__(self, node: str, allocatable_cpu: str, *, root: Path = CPU_ROOT) -> None:
        self._lock = threading.Lock()
        self._burstable: dict[str, int] = {}  # pod uid -> its shares in the Burstable group
        self._pods: dict[str, Path] = {}
        self.base: Path | None = root / f"{PREFIX}{node}-{os.getpid()}"
        try:
            _sweep(root)
            self.base.mkdir(exist_ok=True)
            _write(self.base / "cpu.shares", shares(millicores(allocatable_cpu)))
            for group in ("besteffort", "burstable"):
                (self.base / group).mkdir(exist_ok=True)
                _write(self.base / group / "cpu.shares", MIN_SHARES)
        except OSError as error:
            log.info("pods run without CPU weights (no writable cgroup v1 cpu: %s)", error)
            self.close()
            self.base = None

    @property
    def enabled(self) -> bool:
        return self.base is not None

    def group_for(self, pod: Mapping[str, Any]) -> Path | None:
        """The pod's group, made and weighed, for a container about to start: the container's
        mount helper joins it (its ``cgroup.procs``) before it execs the command, so the command
        runs weighed from its first instruction (placing it after the start raced with a command
        that looks at once). None when there are no weights here, or the group could not be
        made."""
        if self.base is None:
            return None
        uid = str(pod["metadata"]["uid"])
        with self._lock:
            # Never fatal: a pod without its weight still runs (the agent must go on tracking
            # the process it just started).
            try:
                qos = qos_class(pod)
                weight = shares(requested_millicores(pod))
                parent = {"BestEffort": "besteffort", "Burstable": "burstable"}.get(qos)
                group = (self.base / parent if parent else self.base) / f"pod{uid}"
                group.mkdir(exist_ok=True)
                self._pods[uid] = group
                _write(group / "cpu.shares", MIN_SHARES if qos == "BestEffort" else weight)
                if qos == "Burstable":
                    self._burstable[uid] = weight
                    _write(self.base / "burstable" / "cpu.shares", self._burstable_shares())
            except Exception as error:
                log.warning("pod %s: no CPU weight: %s", uid, error)
                return None
            return group

    def release(self, uid: str) -> None:
        """The pod is gone: remove its group (empty by now)."""
        with self._lock:
            group = self._pods.pop(uid, None)
            if self._burstable.pop(uid, None) is not None and self.base is not None:
                with contextlib.suppress(OSError):
                    _write(self.base / "burstable" / "cpu.shares", self._burstable_shares())
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()

    def close(self) -> None:
        """Remove every group this agent made (their processes have ended)."""
        with self._lock:
            groups = list(self._pods.values())
            self._pods.clear()
            self._burstable.clear()
        base = self.base
        if base is None:
            return
        for group in [*groups, base / "besteffort", base / "burstable", base]:
            with contextlib.suppress(OSError):
                group.rmdir()

    def _burstable_shares(self) -> int:
        return max(MIN_SHARES, sum(self._burstable.values()))


def _write(path: Path, value: int) -> None:
    path.write_text(f"{value}\n")


def _sweep(root: Path) -> None:
    """Remove the empty groups of agents that died without closing theirs."""
    for base in root.glob(f"{PREFIX}*"):
        pid = base.name.rsplit("-", 1)[-1]
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            continue
        for group in sorted(base.rglob("*"), key=lambda p: -len(p.parts)):
            if group.is_dir():
                with contextlib.suppress(OSError):
                    group.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()
