"""CRD generation: the CRDs of AgentRun, Reconciliation and Approval, made from the manifest
models (``python -m keelgate.kube.crds --write crds/ | --check crds/``, or print them all).

Why it exists apart from the running operator: generating CRDs is a build step (``make crds``,
``make lint``, the chart's check), the operator never does it at run time, and neither side
needs the other's imports. The parts: ``kinds`` (the registry of kinds: names, columns, extra
rules), ``schema`` (a model's JSON schema in the CRD's OpenAPI dialect), ``structural`` (the API
server's structural rules, checked on every schema made) and ``files`` (render, write, check).
This package must never talk to a cluster, and nothing in ``keelgate.kube``'s running operator
imports it.
"""

from __future__ import annotations

from keelgate.kube.crds.files import (
    HEADER,
    REGENERATE,
    drift,
    main,
    render,
    rendered,
    write,
)
from keelgate.kube.crds.kinds import AGENTRUN, APPROVAL, KINDS, RECONCILIATION, Column, Kind
from keelgate.kube.crds.schema import CrdError, CrdJsonSchema, crd, openapi_schema
from keelgate.kube.crds.structural import draft4, structural_problems
from keelgate.kube.naming import GROUP, VERSION

__all__ = [
    "AGENTRUN",
    "APPROVAL",
    "GROUP",
    "HEADER",
    "KINDS",
    "RECONCILIATION",
    "REGENERATE",
    "VERSION",
    "Column",
    "CrdError",
    "CrdJsonSchema",
    "Kind",
    "crd",
    "draft4",
    "drift",
    "main",
    "openapi_schema",
    "render",
    "rendered",
    "structural_problems",
    "write",
]
