"""A run's trace on the cluster: the ids the operator hands each step pod, and the pods' spans.

Why it exists: a run of five step pods, a crash and a settlement must be one trace. The operator
names the run's trace before its first step pod (from the AgentRun's UID, so every replica and
every restart names the same one, unless the run's checkpoint already names one), gives each pod
a span of its own (``TRACEPARENT``) and the run's span (``TRACESTATE``), and, once the pod has
ended, sends that pod's span from what Kubernetes says of it: when it was made and ended, and how
(a crash shows as a failed step). The step's own spans hang under it. This module must never put
a tool's argument or a secret on a span, and sends nothing when the operator is not traced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from keelgate.core.state import RunState
from keelgate.core.tracing import RunEvent, Tracer, TraceRef
from keelgate.kube.controller.pod_ends import EndKind, PodEnd


def _digest(*parts: str, length: int) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:length]


def run_trace(run: Mapping[str, Any], state: RunState | None) -> TraceRef:
    """The run's trace: the one its checkpoint names, else the one its UID names."""
    if state is not None and state.trace is not None:
        return state.trace
    meta = run["metadata"]
    uid = str(meta["uid"])
    return TraceRef(
        _digest("keelgate-trace", uid, length=32),
        _digest("keelgate-run", uid, length=16),
        str(meta.get("creationTimestamp") or ""),
    )


def pod_trace(ref: TraceRef, run: Mapping[str, Any], pod_name: str) -> tuple[str, str]:
    """(TRACEPARENT, TRACESTATE) of one step pod: its own span, and the run's."""
    span = _digest("keelgate-step", str(run["metadata"]["uid"]), pod_name, length=16)
    return ref.traceparent_of(span), ref.tracestate


def tell_pod_span(
    tracer: Tracer,
    pod: Mapping[str, Any],
    step: Mapping[str, Any],
    ended: PodEnd,
    state: RunState | None,
) -> None:
    """Send the span of a step pod that has ended, under the ids it was handed (read back from
    its own environment): from its creation to its end, failed unless it ended cleanly, with
    the run's stop (its checkpoint's, read after the pod ended) if the step left one."""
    if not tracer.enabled:
        return
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    env = {e.get("name"): e.get("value") for e in containers[0].get("env") or []}
    ref = TraceRef.handed(str(env.get("TRACEPARENT") or ""), str(env.get("TRACESTATE") or ""))
    if ref is None:
        return  # made before tracing was on
    span_id = str(env["TRACEPARENT"]).split("-")[2]
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    terminated = (statuses[0].get("state") or {}).get("terminated") if statuses else None
    meta = pod.get("metadata") or {}
    stop = None if state is None else state.stop
    events = []
    if ended.clean and stop is not None:
        events.append(
            RunEvent(
                "keelgate.stop",
                str((terminated or {}).get("finishedAt") or ""),
                {
                    "keelgate.stop_reason": stop.reason.value,
                    "keelgate.resumable": stop.is_resumable,
                },
            )
        )
    tracer.record(
        f"step {step.get('number')} attempt {step.get('attempt')}",
        trace_id=ref.trace_id,
        span_id=span_id,
        parent_span_id=ref.span_id,
        # Kubernetes keeps times to the second: the span runs from its creation's second to the
        # moment the operator saw the end, so the step's own spans always fall inside it.
        start=str(meta.get("creationTimestamp") or ""),
        end="",
        attributes={
            "keelgate.step.number": int(step.get("number") or 0),
            "keelgate.step.attempt": int(step.get("attempt") or 0),
            "keelgate.step.ended": ended.kind.value,
            "keelgate.step.end": ended.words,
            "k8s.pod.name": str(meta.get("name") or ""),
            "k8s.namespace.name": str(meta.get("namespace") or ""),
            "k8s.node.name": str((pod.get("spec") or {}).get("nodeName") or ""),
        },
        events=events,
        # A drain's stop at a checkpoint is no failure; a crash is.
        error="" if ended.clean or ended.kind is EndKind.PREEMPTED else ended.words,
    )
