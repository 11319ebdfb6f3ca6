"""Finished step pods a run keeps: the newest few, as Argo's pod GC does; older ones are deleted.

Why it exists: a long run leaves a pod per step, and each stays in etcd, in every watch cache
and in ``kubectl get pods`` until the run is deleted. What a finished pod told is already in the
run's status (``status.step.lastExit`` and ``lastLines``) and in the store's audit trail, so only
the last few steps' logs are worth keeping. The pod ``status.step`` names is never deleted here:
until its end is accounted it is the run's only record of that end, and a restarted operator
that found it gone might create it again. Only pods of earlier steps or attempts, whose ends the
status moved past, are deleted. This module must never delete a pod that has not finished or is
not the run's own (its owner UID).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keelgate.kube import resources
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.ports import JSON
from keelgate.kube.naming import ATTEMPT_LABEL, STEP_LABEL, label_value
from keelgate.manifest import AgentRunSpec


def key_of_run(run: JSON) -> tuple[str, str, str]:
    meta = run["metadata"]
    return ("AgentRun", str(meta["namespace"]), str(meta["name"]))


def _order(pod: JSON) -> tuple[int, int]:
    labels = pod.get("metadata", {}).get("labels") or {}
    try:
        return int(labels.get(STEP_LABEL, 0)), int(labels.get(ATTEMPT_LABEL, 0))
    except ValueError:
        return 0, 0


def keep_finished_pods(context: ControllerContext, spec: AgentRunSpec) -> int:
    """How many finished step pods the run keeps: its own ``spec.step.keepFinishedPods``, else
    the platform's default."""
    return spec.step.keep_finished_pods or context.settings.pods.defaults.keep_finished_pods


def collect_finished_pods(
    context: ControllerContext, run: JSON, spec: AgentRunSpec, step: Mapping[str, Any]
) -> int:
    """Delete the run's finished step pods beyond the newest ``keep_finished_pods`` (the pod
    ``step`` names counts among the kept and is never deleted); the number deleted."""
    meta = run["metadata"]
    namespace, run_uid = meta["namespace"], meta["uid"]
    current = str(step.get("pod", ""))

    def collectable(pod: JSON) -> bool:
        return (
            resources.owned_by(pod, run_uid)
            and resources.pod_finished(pod)
            and not pod["metadata"].get("deletionTimestamp")
        )

    keep = keep_finished_pods(context, spec)
    label = label_value(meta["name"])
    # Counted first, copying nothing: at almost every look there is nothing to collect.
    if context.cache.count_step_pods(namespace, label, collectable) <= keep:
        return 0
    mine = [pod for pod in context.cache.step_pods(namespace, label) if collectable(pod)]
    # Only pods of steps (or attempts) before the one the status names: their ends are
    # accounted.
    before = (int(step.get("number") or 0), int(step.get("attempt") or 0))
    deleted = 0
    for pod in sorted(mine, key=_order, reverse=True)[keep:]:
        name = pod["metadata"]["name"]
        if name == current or _order(pod) >= before:
            continue
        uid = pod["metadata"]["uid"]
        if not context.memory.collecting(key_of_run(run), uid):
            continue  # asked already; the watch has not yet seen it go
        context.api.delete_pod(namespace, name, uid=uid)
        deleted += 1
    return deleted
