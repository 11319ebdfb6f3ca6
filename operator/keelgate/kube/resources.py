"""The bodies of the objects the operator creates: step pods, Reconciliations, Approvals, ticks.

Pure functions of their inputs, so a restarted operator builds the same pod it intended before
it died (everything a pod depends on is in the AgentRun and its ``status.step``). Step pods are
hardened to run in a namespace enforcing Pod Security ``restricted``, get the store URL and the
model key from Secrets by reference (never as literal values), and mount no service-account
token: a step needs the store and nothing else. This module must never put a secret's value or
a tool's argument into an object it builds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keelgate.core.types import PendingApproval, UnknownAction
from keelgate.kube.naming import (
    API_VERSION,
    ATTEMPT_LABEL,
    DECISIONS_FINALIZER,
    MANAGED_BY,
    MONITOR_LABEL,
    ROUND_LABEL,
    RUN_LABEL,
    SHARD_LABEL,
    STEP_LABEL,
    STEP_POD_LABEL,
    STEP_POD_NAME,
    action_object_name,
    label_value,
)
from keelgate.kube.times import parse_time
from keelgate.manifest import AgentRunSpec
from keelgate.manifest.agentrun import Resources, StepConfig
from keelgate.manifest.base import CREATED_BY_ANNOTATION
from keelgate.manifest.step_defaults import StepPodDefaults

JSON = dict[str, Any]

#: The non-root user step pods run as (the image's user).
STEP_USER = 65532
TERMINAL_POD_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class StepPodSettings:
    """How the operator runs step pods (its command-line options)."""

    image: str = "keelgate:latest"
    command: Sequence[str] = ("keelgate",)
    store_secret: str = "keelgate-store"
    store_secret_key: str = "url"
    confirmer: str = ""
    confirmer_url: str = ""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: The OpenTelemetry settings step pods get (the operator's own OTEL_* variables, none of
    #: them a credential); empty: step pods trace nothing.
    trace_env: Mapping[str, str] = field(default_factory=dict)
    #: A Secret (in each run's namespace) whose key ``headers`` step pods read
    #: OTEL_EXPORTER_OTLP_HEADERS from, if it is there (headers may carry credentials).
    trace_headers_secret: str = "keelgate-otel"
    #: The platform's settings for every step pod (``--step-pod-defaults``).
    defaults: StepPodDefaults = field(default_factory=StepPodDefaults)


#: The service name step pods' spans carry (the operator's carry its own).
STEP_SERVICE_NAME = "keelgate-step"


def owner_reference(owner: Mapping[str, Any]) -> JSON:
    """A controller ownerReference to ``owner`` (an object body): deleting it deletes ours."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion", API_VERSION),
        "kind": owner.get("kind", "AgentRun"),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def shard_labels(owner: Mapping[str, Any]) -> dict[str, str]:
    """The owner's shard label (``--shards``), for an object made for it: a run's objects are
    in its shard, and a replica taking the shard over lists them by it. Empty when it has none."""
    value = ((owner.get("metadata") or {}).get("labels") or {}).get(SHARD_LABEL)
    return {SHARD_LABEL: str(value)} if value else {}


def owned_by(child: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether ``child`` is controlled by the object with ``owner_uid``."""
    refs = child.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in refs)


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """Whether a pod has ended (succeeded or failed): it will never run again."""
    return pod.get("status", {}).get("phase") in TERMINAL_POD_PHASES


def pod_active(pod: Mapping[str, Any]) -> bool:
    return not pod_finished(pod)


def pod_change_matters(event_type: str, pod: Mapping[str, Any]) -> bool:
    """Whether a step pod's watch event can change what its run needs: the pod seen first
    (``ADDED``: after a restart, the listing), ended, being deleted, or deleted. A pending or
    running pod that only moved on (scheduled, started) changes nothing a run acts on, and
    looking at its run for each of those was two of every step's six reconciles."""
    return (
        event_type in ("ADDED", "DELETED")
        or pod_finished(pod)
        or bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    )


#: Seconds past a pod's deletion deadline (its deletionTimestamp: the end of its grace period)
#: after which a pod that never ended is taken as lost: no kubelet is there to end it.
LOST_AFTER = 10.0


def lost_in(pod: Mapping[str, Any], *, now: float) -> float | None:
    """For a pod being deleted that has not ended: seconds until it counts as lost (<= 0: it
    is lost now; its node stopped reporting, as a lost node's pods do, deleted by the node
    lifecycle controller's eviction and never confirmed). None for any other pod.

    Its process may still run there: what keeps a WRITE from running twice when the run goes on
    elsewhere is the store (the run's lock, the keys' owners and write deadlines), not this."""
    deadline = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deadline is None or pod_finished(pod):
        return None
    return deadline.timestamp() + LOST_AFTER - now


def is_active_step_pod(pod: Mapping[str, Any]) -> bool:
    """A step pod that still holds one of the operator's step slots."""
    labels = pod.get("metadata", {}).get("labels") or {}
    return labels.get(STEP_POD_LABEL) == STEP_POD_NAME and pod_active(pod)


def is_settled(decision: Mapping[str, Any]) -> bool:
    """A Reconciliation or Approval the operator has shown Settled (its decision recorded)."""
    return (decision.get("status") or {}).get("phase") == "Settled"


def holds_decisions(approval: Mapping[str, Any]) -> bool:
    """An Approval that carries the operator's finalizer (``DECISIONS_FINALIZER``): the
    operator looks at it again until it can let it go, Settled or not."""
    return DECISIONS_FINALIZER in ((approval.get("metadata") or {}).get("finalizers") or ())


def controller_name(body: Mapping[str, Any]) -> str:
    """The name of the AgentRun that controls ``body`` ("" if none does): a step pod's run (its
    label may be a shortened name), a tick's monitor."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "AgentRun":
            return str(ref.get("name", ""))
    return ""


def is_tick(run: Mapping[str, Any]) -> bool:
    """A monitor's tick: labelled with its monitor and controlled by an AgentRun."""
    meta = run.get("metadata", {})
    return MONITOR_LABEL in (meta.get("labels") or {}) and bool(controller_name(run))


#: Seconds of a step pod's grace period beyond its longest call: the commit after the call
#: (riding out a short store outage) and the stop at the next checkpoint.
STEP_GRACE_MARGIN = 30


def step_grace_seconds(spec: AgentRunSpec) -> int:
    """A step pod's ``terminationGracePeriodSeconds``: its longest call plus a margin."""
    return math.ceil(spec.longest_call_seconds()) + STEP_GRACE_MARGIN


#: Seconds a step pod is allowed beyond its run's time budget and its longest call: starting
#: the process, opening the store, recording the stop.
STEP_START_MARGIN = 60


def step_deadline_seconds(spec: AgentRunSpec, *, ceiling: int = 0) -> int:
    """A step pod's ``activeDeadlineSeconds``: the run's time budget (``budget.timeoutSeconds``,
    active time, which a step cannot outlast), plus its longest call (a call started just
    before the budget ran out may run to its own limit), plus a margin; at most ``ceiling``
    (the platform's ``maxActiveSeconds``). 0: no deadline (no time budget and no ceiling).

    A pod past its deadline is killed by its kubelet: to the run, a step that ended without
    recording a stop, so the next attempt resumes from the checkpoint and a WRITE in flight
    reads as an unknown outcome, never as a WRITE to send again."""
    budget = spec.budget.timeout_seconds
    derived = 0
    if budget is not None:
        derived = math.ceil(float(budget) + spec.longest_call_seconds()) + STEP_START_MARGIN
    if ceiling and (not derived or ceiling < derived):
        return ceiling
    return derived


def _resources(platform: Resources, run: Resources) -> JSON:
    """The step container's resources: the platform's, each resource name the run gives
    overridden by the run's."""
    merged: JSON = {}
    for part in ("requests", "limits"):
        values = {**getattr(platform, part), **getattr(run, part)}
        if values:
            merged[part] = values
    return merged


def step_pod(
    run: Mapping[str, Any],
    spec: AgentRunSpec,
    *,
    name: str,
    step: int,
    attempt: int,
    generation: int,
    failpoints: str,
    settings: StepPodSettings,
    trace: tuple[str, str] | None = None,
    epoch: int | None = None,
) -> JSON:
    """The pod of one step attempt of ``run`` (an AgentRun body). ``trace``: the W3C
    traceparent naming the pod's own span and the tracestate naming the run's, when traced;
    ``epoch``: the epoch the operator holds the run under, which the step's writes carry."""
    meta = run["metadata"]
    namespace, run_name = meta["namespace"], meta["name"]
    container = _step_container(
        spec,
        settings,
        _step_args(namespace, run_name, settings),
        _step_env(spec, settings, failpoints=failpoints, trace=trace, epoch=epoch),
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                **MANAGED_BY,
                STEP_POD_LABEL: STEP_POD_NAME,
                RUN_LABEL: label_value(run_name),
                STEP_LABEL: str(step),
                ATTEMPT_LABEL: str(attempt),
                **shard_labels(run),
            },
            "annotations": {"keelgate.dev/generation": str(generation)},
            "ownerReferences": [owner_reference(run)],
        },
        "spec": _step_pod_spec(spec, settings.defaults, container),
    }


def _secret_env(name: str, secret: str, key: str, *, optional: bool = False) -> JSON:
    """An environment variable read from a Secret's key (by reference: the pod body never
    holds the value)."""
    ref: JSON = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def _step_env(
    spec: AgentRunSpec,
    settings: StepPodSettings,
    *,
    failpoints: str,
    trace: tuple[str, str] | None,
    epoch: int | None = None,
) -> list[JSON]:
    """The step container's environment: the store URL and the model key from Secrets, the
    failpoints armed, the trace context when traced, the operator's extra variables, and the
    run's epoch when the operator holds it (last: no extra variable may stand in for it)."""
    env: list[JSON] = [
        _secret_env("KEELGATE_STORE", settings.store_secret, settings.store_secret_key),
        {"name": "HOME", "value": "/tmp"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    model = spec.model
    if model.api_key_secret_ref is not None and model.api_key_env_name:
        env.append(
            _secret_env(
                model.api_key_env_name,
                model.api_key_secret_ref.name,
                model.api_key_secret_ref.key,
            )
        )
    if failpoints:
        env.append({"name": "KEELGATE_FAILPOINTS", "value": failpoints})
    if settings.trace_env and trace is not None:
        env.extend({"name": k, "value": v} for k, v in sorted(settings.trace_env.items()))
        env.append({"name": "OTEL_SERVICE_NAME", "value": STEP_SERVICE_NAME})
        env.append({"name": "TRACEPARENT", "value": trace[0]})
        env.append({"name": "TRACESTATE", "value": trace[1]})
        env.append(
            _secret_env(
                "OTEL_EXPORTER_OTLP_HEADERS",
                settings.trace_headers_secret,
                "headers",
                optional=True,
            )
        )
    env.extend({"name": k, "value": v} for k, v in sorted(settings.extra_env.items()))
    if epoch is not None:
        env = [e for e in env if e["name"] != "KEELGATE_EPOCH"]
        env.append({"name": "KEELGATE_EPOCH", "value": str(epoch)})
    return env


def _step_args(namespace: str, run_name: str, settings: StepPodSettings) -> list[str]:
    """The arguments of ``keelgate step``: the run, and the confirmer the operator was given."""
    args = ["step", "--namespace", namespace, "--run", run_name]
    if settings.confirmer:
        args += ["--confirmer", settings.confirmer]
    if settings.confirmer_url:
        args += ["--confirmer-url", settings.confirmer_url]
    return args


def _step_container(
    spec: AgentRunSpec, settings: StepPodSettings, args: list[str], env: list[JSON]
) -> JSON:
    """The one container of a step pod: the run's image (else the operator's), resources
    merged, and hardened for Pod Security ``restricted`` (no privilege, a read-only root with
    a writable /tmp)."""
    return {
        "name": "step",
        "image": spec.step.image or settings.image,
        "command": list(settings.command),
        "args": args,
        "env": env,
        "resources": _resources(settings.defaults.resources, spec.step.resources),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def _step_pod_spec(spec: AgentRunSpec, defaults: StepPodDefaults, container: JSON) -> JSON:
    """A step pod's ``spec``: run once, no service-account token, as the image's non-root
    user, with the grace period and deadline the run's calls and budget need, then the
    scheduling the platform and the run ask for."""
    pod_spec: JSON = {
        "restartPolicy": "Never",
        # SIGTERM (a drain, an eviction) lets the step finish the call it is in, record it and
        # stop at its next checkpoint: the grace period covers the longest call and then some.
        "terminationGracePeriodSeconds": step_grace_seconds(spec),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": STEP_USER,
            "runAsGroup": STEP_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    deadline = step_deadline_seconds(spec, ceiling=defaults.max_active_seconds)
    if deadline:
        pod_spec["activeDeadlineSeconds"] = deadline
    pod_spec.update(_scheduling(spec.step, defaults))
    return pod_spec


def _scheduling(step_config: StepConfig, defaults: StepPodDefaults) -> JSON:
    """Where and how a step pod is scheduled, each field only when set: the run's service
    account, node labels and tolerations beside the platform's, and the platform's priority
    class, runtime class and image pull Secrets."""
    placed: JSON = {}
    if step_config.service_account_name:
        placed["serviceAccountName"] = step_config.service_account_name
    # The run may add node labels, never change the platform's.
    node_selector = {**step_config.node_selector, **defaults.node_selector}
    if node_selector:
        placed["nodeSelector"] = node_selector
    tolerations = [
        t.model_dump(by_alias=True, exclude_defaults=True)
        for t in (*defaults.tolerations, *step_config.tolerations)
    ]
    if tolerations:
        placed["tolerations"] = tolerations
    if defaults.priority_class_name:
        placed["priorityClassName"] = defaults.priority_class_name
    if defaults.runtime_class_name:
        placed["runtimeClassName"] = defaults.runtime_class_name
    if defaults.image_pull_secrets:
        placed["imagePullSecrets"] = [{"name": n} for n in defaults.image_pull_secrets]
    return placed


def reconciliation(run: Mapping[str, Any], unknown: UnknownAction, *, name: str = "") -> JSON:
    """The Reconciliation a person edits to settle one unknown outcome (``name``: the one
    found in use, else the computed one)."""
    meta = run["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Reconciliation",
        "metadata": {
            "name": name or action_object_name(meta["name"], unknown.action, unknown.tool),
            "namespace": meta["namespace"],
            "labels": {**MANAGED_BY, RUN_LABEL: label_value(meta["name"]), **shard_labels(run)},
            "ownerReferences": [owner_reference(run)],
        },
        "spec": {
            "runName": meta["name"],
            "action": unknown.action,
            "tool": unknown.tool,
            "idempotencyKey": unknown.idempotency_key,
        },
    }


def approval(run: Mapping[str, Any], pending: PendingApproval, key: str, *, name: str = "") -> JSON:
    """The Approval people edit to let one action run, or deny it: for the call whose
    idempotency key is ``key``, with an empty list of decisions for them to append to
    (``name``: the one found in use, else the computed one)."""
    meta = run["metadata"]
    labels = {**MANAGED_BY, RUN_LABEL: label_value(meta["name"]), **shard_labels(run)}
    if pending.round != 1:
        labels[ROUND_LABEL] = str(pending.round)  # asked afresh: `kubectl get -l` finds it
    return {
        "apiVersion": API_VERSION,
        "kind": "Approval",
        "metadata": {
            "name": name
            or action_object_name(meta["name"], pending.action, pending.tool, round=pending.round),
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [owner_reference(run)],
            # Held until the operator has recorded its decisions (approval_finalizer).
            "finalizers": [DECISIONS_FINALIZER],
        },
        "spec": {
            "runName": meta["name"],
            "action": pending.action,
            "tool": pending.tool,
            "idempotencyKey": key,
            "decisions": [],
        },
    }


def creator_of(run: Mapping[str, Any]) -> str:
    """Who created an AgentRun, as its annotation keelgate.dev/created-by says ("": unknown)."""
    annotations = (run.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(CREATED_BY_ANNOTATION, "")).strip()


def tick(monitor: Mapping[str, Any], name: str) -> JSON:
    """A monitor's tick: an AgentRun of its own with the monitor's spec, owned by it."""
    meta = monitor["metadata"]
    body: JSON = {
        "apiVersion": API_VERSION,
        "kind": "AgentRun",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            # In its monitor's shard: the replica driving the monitor sees its ticks.
            "labels": {
                **MANAGED_BY,
                MONITOR_LABEL: label_value(meta["name"]),
                **shard_labels(monitor),
            },
            "ownerReferences": [owner_reference(monitor)],
        },
        "spec": dict(monitor["spec"]),
    }
    creator = creator_of(monitor)
    if creator:  # a tick is the monitor's creator's run (an approval rule's notCreator)
        body["metadata"]["annotations"] = {CREATED_BY_ANNOTATION: creator}
    return body
