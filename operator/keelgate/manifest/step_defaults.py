"""The platform's settings for every step pod: what a cluster's operators decide, not a run's
author (the chart's ``stepPods`` values, read by ``keelgate operator --step-pod-defaults``).

Why it exists: a shared cluster governs its workloads (resources, priority, pull secrets, where
they run, which container runtime sandboxes them) and keeps etcd small; a run's own
``spec.step`` may add to these where that cannot escape them. How they combine, field by field:

- ``resources``: the platform's requests and limits, each resource name overridden by the run's
  (a LimitRange or ResourceQuota is the platform's ceiling, as for any workload);
- ``nodeSelector``: the platform's labels always hold; a run may add labels, never change one;
- ``tolerations``: the platform's and the run's;
- ``priorityClassName``, ``runtimeClassName``, ``imagePullSecrets``: the platform's alone (a run
  choosing its own priority could preempt other tenants, or its own runtime leave a sandbox);
- ``keepFinishedPods``: the platform's default, which a run may change (``spec.step``);
- ``maxActiveSeconds``: the ceiling on a step pod's ``activeDeadlineSeconds``, which is otherwise
  derived from the run's time budget and its longest call.

This module only describes and validates; it must never talk to Kubernetes.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PositiveInt

from keelgate.core.values import NonNegativeInt
from keelgate.manifest.agentrun import Resources, Toleration
from keelgate.manifest.base import DnsSubdomain, KeelgateModel, OptionalDnsSubdomain
from keelgate.manifest.load import load_settings

#: Finished step pods kept per run when nobody says otherwise: the last few steps' logs.
KEEP_FINISHED_PODS = 3


class StepPodDefaults(KeelgateModel):
    """How every step pod is run, whatever its run says (see the module's docstring)."""

    resources: Resources = Field(
        default_factory=Resources, description="Default requests and limits of the step container."
    )
    priority_class_name: OptionalDnsSubdomain = Field(
        default="", description="The step pods' PriorityClass."
    )
    runtime_class_name: OptionalDnsSubdomain = Field(
        default="", description="The step pods' RuntimeClass (gVisor, Kata ...)."
    )
    image_pull_secrets: list[DnsSubdomain] = Field(
        default_factory=list, description="Secrets (in each run's namespace) to pull images with."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels every step pod needs."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations every step pod has."
    )
    keep_finished_pods: PositiveInt = Field(
        default=KEEP_FINISHED_PODS,
        le=100,
        description="Finished step pods kept per run (the newest); older ones are deleted.",
    )
    max_active_seconds: NonNegativeInt = Field(
        default=0,
        description="The most a step pod may run (activeDeadlineSeconds); 0: no ceiling.",
    )


def load_step_pod_defaults(path: str | Path) -> StepPodDefaults:
    """Read the platform's step-pod settings from a YAML or JSON file; an empty file is the
    defaults. Any problem is one InputError naming the file and the field."""
    return load_settings(StepPodDefaults, path)
