"""Status samples for the Argo CD health checks, captured from real runs or checked against them.

Why it exists: `deploy/argocd/keelgate.dev/<Kind>/testdata/*.yaml` must be what the operator
really writes, not what someone thinks it writes. The e2e health-sample tests drive runs into
each state on the local control plane and hand every object here: with
`KEELGATE_CAPTURE_HEALTH_SAMPLES=1` it is written into testdata (as `kubectl get -o yaml` shows
it, less the noise: uid, resourceVersion, managedFields, kubectl's last-applied annotation, and
the test's random namespace, renamed); otherwise the committed sample must have the same shape
as the live object (kind, phase, stop, conditions' types, statuses and reasons, generation
observed, the spec fields the health checks read), so an operator change that would make a
sample stale fails the e2e suite. It must never write outside `deploy/argocd/`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from keelgate_e2e.kube import JSON
from keelgate_e2e.testing import Kubectl

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "deploy" / "argocd" / "keelgate.dev"
CAPTURE = os.environ.get("KEELGATE_CAPTURE_HEALTH_SAMPLES") == "1"
SAMPLE_NAMESPACE = "keelgate-samples"


def strip(obj: JSON, namespace: str) -> JSON:
    """The object less what differs on every run and says nothing about its health."""
    meta = dict(obj["metadata"])
    for noise in ("uid", "resourceVersion", "managedFields"):
        meta.pop(noise, None)
    annotations = dict(meta.get("annotations") or {})
    annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    text = json.dumps({**obj, "metadata": meta}).replace(namespace, SAMPLE_NAMESPACE)
    stripped: JSON = json.loads(text)
    return stripped


def shape(obj: JSON) -> JSON:
    """What the health checks (Argo CD's and kstatus) read, without names, times and texts."""
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    observed = status.get("observedGeneration")
    return {
        "kind": obj.get("kind"),
        "has status": bool(status),
        "phase": status.get("phase"),
        "stopReason": status.get("stopReason"),
        "resumable": status.get("resumable"),
        "verdict": status.get("verdict"),
        "source": status.get("source"),
        "generation observed": None if observed is None else observed == meta.get("generation"),
        "conditions": sorted(
            (c.get("type"), c.get("status"), c.get("reason"))
            for c in status.get("conditions") or []
        ),
        "spec.loop": spec.get("loop"),
        "spec.suspend": spec.get("suspend"),
        "decided": "executed" in spec or "approved" in spec,
        "tick": "keelgate.dev/monitor" in (meta.get("labels") or {}),
    }


def sample_path(kind: str, sample: str) -> Path:
    return SAMPLES / kind / "testdata" / f"{sample}.yaml"


def get(kubectl: Kubectl, kind: str, name: str) -> JSON:
    """The object as `kubectl get -o yaml` shows it."""
    loaded: JSON = yaml.safe_load(kubectl("get", kind.lower(), name, "-o", "yaml").stdout)
    return loaded


def keep(kind: str, sample: str, obj: JSON, namespace: str, why: str) -> None:
    """Write the sample (capture mode) or check the committed one has the live object's shape."""
    path = sample_path(kind, sample)
    stripped = strip(obj, namespace)
    if CAPTURE:
        path.parent.mkdir(parents=True, exist_ok=True)
        header = (
            f"# Captured from a real run by e2e/tests/test_e2e_health_samples.py "
            f"(KEELGATE_CAPTURE_HEALTH_SAMPLES=1):\n# {why}\n"
        )
        path.write_text(header + yaml.safe_dump(stripped, sort_keys=True, width=100))
        return
    assert path.exists(), (
        f"{path.relative_to(ROOT)} is missing: run this test with "
        "KEELGATE_CAPTURE_HEALTH_SAMPLES=1 and commit the samples"
    )
    committed: Any = yaml.safe_load(path.read_text())
    assert shape(committed) == shape(stripped), (
        f"{path.relative_to(ROOT)} no longer has the shape the operator writes; capture the "
        f"samples again (KEELGATE_CAPTURE_HEALTH_SAMPLES=1) and check deploy/argocd/ still "
        f"holds:\ncommitted: {shape(committed)}\nlive:      {shape(stripped)}"
    )
