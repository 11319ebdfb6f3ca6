"""The bodies of the objects the operator creates: step pods, Reconciliations, Approvals, ticks.

Pure functions of their inputs, so a restarted operator builds the same pod it intended before
it died (everything a pod depends on is in the AgentRun and its ``status.step``). Step pods are
hardened to run in a namespace enforcing Pod Security ``restricted``, get the store URL and the
model key from Secrets by reference (never as literal values), and mount no service-account
token: a step needs the store and nothing else. This module must never put a secret's value or
a tool's argument into an object it builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keelgate.core.types import PendingApproval, UnknownAction
from keelgate.kube.naming import (
    API_VERSION,
    ATTEMPT_LABEL,
    MANAGED_BY,
    MONITOR_LABEL,
    RUN_LABEL,
    STEP_LABEL,
    STEP_POD_LABEL,
    STEP_POD_NAME,
    action_object_name,
    label_value,
)
from keelgate.manifest import AgentRunSpec

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


def owned_by(child: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether ``child`` is controlled by the object with ``owner_uid``."""
    refs = child.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in refs)


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """Whether a pod has ended (succeeded or failed): it will never run again."""
    return pod.get("status", {}).get("phase") in TERMINAL_POD_PHASES


def pod_active(pod: Mapping[str, Any]) -> bool:
    return not pod_finished(pod)


def is_active_step_pod(pod: Mapping[str, Any]) -> bool:
    """A step pod that still holds one of the operator's step slots."""
    labels = pod.get("metadata", {}).get("labels") or {}
    return labels.get(STEP_POD_LABEL) == STEP_POD_NAME and pod_active(pod)


def is_settled(decision: Mapping[str, Any]) -> bool:
    """A Reconciliation or Approval the operator has shown Settled (its decision recorded)."""
    return (decision.get("status") or {}).get("phase") == "Settled"


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
) -> JSON:
    """The pod of one step attempt of ``run`` (an AgentRun body)."""
    meta = run["metadata"]
    namespace, run_name = meta["namespace"], meta["name"]
    env: list[JSON] = [
        {
            "name": "KEELGATE_STORE",
            "valueFrom": {
                "secretKeyRef": {"name": settings.store_secret, "key": settings.store_secret_key}
            },
        },
        {"name": "HOME", "value": "/tmp"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    model = spec.model
    if model.api_key_secret_ref is not None and model.api_key_env_name:
        env.append(
            {
                "name": model.api_key_env_name,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": model.api_key_secret_ref.name,
                        "key": model.api_key_secret_ref.key,
                    }
                },
            }
        )
    if failpoints:
        env.append({"name": "KEELGATE_FAILPOINTS", "value": failpoints})
    env.extend({"name": k, "value": v} for k, v in sorted(settings.extra_env.items()))
    args = ["step", "--namespace", namespace, "--run", run_name]
    if settings.confirmer:
        args += ["--confirmer", settings.confirmer]
    if settings.confirmer_url:
        args += ["--confirmer-url", settings.confirmer_url]
    step_config = spec.step
    container: JSON = {
        "name": "step",
        "image": step_config.image or settings.image,
        "command": list(settings.command),
        "args": args,
        "env": env,
        "resources": step_config.resources.model_dump(by_alias=True, exclude_defaults=True),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec: JSON = {
        "restartPolicy": "Never",
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
    if step_config.service_account_name:
        pod_spec["serviceAccountName"] = step_config.service_account_name
    if step_config.node_selector:
        pod_spec["nodeSelector"] = dict(step_config.node_selector)
    if step_config.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_defaults=True) for t in step_config.tolerations
        ]
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
            },
            "annotations": {"keelgate.dev/generation": str(generation)},
            "ownerReferences": [owner_reference(run)],
        },
        "spec": pod_spec,
    }


def reconciliation(run: Mapping[str, Any], unknown: UnknownAction) -> JSON:
    """The Reconciliation a person edits to settle one unknown outcome."""
    meta = run["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Reconciliation",
        "metadata": {
            "name": action_object_name(meta["name"], unknown.action, unknown.tool),
            "namespace": meta["namespace"],
            "labels": {**MANAGED_BY, RUN_LABEL: label_value(meta["name"])},
            "ownerReferences": [owner_reference(run)],
        },
        "spec": {
            "runName": meta["name"],
            "action": unknown.action,
            "tool": unknown.tool,
            "idempotencyKey": unknown.idempotency_key,
        },
    }


def approval(run: Mapping[str, Any], pending: PendingApproval) -> JSON:
    """The Approval a person edits to let one action run, or deny it."""
    meta = run["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Approval",
        "metadata": {
            "name": action_object_name(meta["name"], pending.action, pending.tool),
            "namespace": meta["namespace"],
            "labels": {**MANAGED_BY, RUN_LABEL: label_value(meta["name"])},
            "ownerReferences": [owner_reference(run)],
        },
        "spec": {"runName": meta["name"], "action": pending.action, "tool": pending.tool},
    }


def tick(monitor: Mapping[str, Any], name: str) -> JSON:
    """A monitor's tick: an AgentRun of its own with the monitor's spec, owned by it."""
    meta = monitor["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentRun",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {**MANAGED_BY, MONITOR_LABEL: label_value(meta["name"])},
            "ownerReferences": [owner_reference(monitor)],
        },
        "spec": dict(monitor["spec"]),
    }
