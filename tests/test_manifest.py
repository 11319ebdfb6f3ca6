"""The manifest models: what validates, and how a mistake is reported (one line, the field's path).

``tests/data/full-*.yaml`` set every field to a valid value; each case breaks one field and checks
the exact path (in the manifest's own camelCase spelling) and the message. A meta-test checks that
every field of every model is broken by at least one case, so a new field cannot go untested.
"""

from __future__ import annotations

import copy
import json
import re
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from keelgate.core.spec import LoopSpec
from keelgate.core.types import LoopKind, SideEffect, StopReason
from keelgate.errors import InputError
from keelgate.manifest import (
    AgentRun,
    AgentRunSpec,
    Approval,
    Reconciliation,
    load_agentrun,
    parse,
    read_yaml,
    spec_from_manifest,
)
from keelgate.manifest.load import _inner_model

DATA = Path(__file__).parent / "data"
MODELS: dict[str, type[BaseModel]] = {
    "agentrun": AgentRun,
    "approval": Approval,
    "reconciliation": Reconciliation,
}
DELETE = object()


def full(kind: str) -> dict[str, Any]:
    data = yaml.safe_load((DATA / f"full-{kind}.yaml").read_text())
    assert isinstance(data, dict)
    return data


def set_at(data: dict[str, Any], path: str, value: Any) -> None:
    """Set (or, with DELETE, remove) the value at ``spec.tools[1].sideEffect``."""
    parts: list[str | int] = []
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        parts.append(int(index) if index else name)
    target: Any = data
    for part in parts[:-1]:
        target = target[part]
    if value is DELETE:
        del target[parts[-1]]
    else:
        target[parts[-1]] = value


def check(kind: str, data: dict[str, Any]) -> BaseModel:
    if kind == "agentrun":
        return load_agentrun(yaml.safe_dump(data, sort_keys=False))
    return parse(MODELS[kind], data)


# (model, the field to break, a bad value, the path the error must name, words it must say)
CASES: list[tuple[str, str, Any, str, str]] = [
    ("agentrun", "apiVersion", "v1", "apiVersion", "must be keelgate.dev/v1alpha1"),
    ("agentrun", "kind", "Job", "kind", "must be AgentRun"),
    ("agentrun", "metadata", DELETE, "metadata", "is required"),
    ("agentrun", "metadata.name", "Restock_1", "metadata.name", "lowercase DNS name"),
    ("agentrun", "metadata.namespace", "Shop", "metadata.namespace", "lowercase DNS label"),
    ("agentrun", "metadata.labels", {"team": 5}, "metadata.labels.team", "must be a string"),
    ("agentrun", "metadata.annotations", {"a": True}, "metadata.annotations.a", "a string"),
    ("agentrun", "metadata.generateName", 5, "metadata.generateName", "must be a string"),
    ("agentrun", "metadata.uid", 5, "metadata.uid", "must be a string"),
    ("agentrun", "metadata.resourceVersion", 42, "metadata.resourceVersion", "a string"),
    ("agentrun", "metadata.generation", "3", "metadata.generation", "whole number"),
    ("agentrun", "metadata.creationTimestamp", 5, "metadata.creationTimestamp", "a string"),
    ("agentrun", "metadata.deletionTimestamp", 5, "metadata.deletionTimestamp", "a string"),
    (
        "agentrun",
        "metadata.deletionGracePeriodSeconds",
        "30",
        "metadata.deletionGracePeriodSeconds",
        "whole number",
    ),
    ("agentrun", "metadata.selfLink", 5, "metadata.selfLink", "must be a string"),
    ("agentrun", "metadata.ownerReferences", "x", "metadata.ownerReferences", "must be a list"),
    ("agentrun", "metadata.finalizers", [5], "metadata.finalizers[0]", "must be a string"),
    ("agentrun", "metadata.managedFields", ["x"], "metadata.managedFields[0]", "a mapping"),
    ("agentrun", "spec", "run it", "spec", "must be a mapping"),
    ("agentrun", "spec.loop", "batch", "spec.loop", "one of task, verification or monitor"),
    ("agentrun", "spec.goal", "", "spec.goal", "must not be empty"),
    ("agentrun", "spec.goal", " \n\t ", "spec.goal", "must not be empty or only white space"),
    ("agentrun", "spec.model", DELETE, "spec.model", "is required"),
    ("agentrun", "spec.model.provider", "gpt", "spec.model.provider", "one of scripted"),
    ("agentrun", "spec.model.name", 4, "spec.model.name", "must be a string"),
    ("agentrun", "spec.model.baseURL", "ftp://x", "spec.model.baseURL", "http:// or https://"),
    (
        "agentrun",
        "spec.model.apiKeySecretRef",
        {"name": "llm"},
        "spec.model.apiKeySecretRef.key",
        "is required",
    ),
    (
        "agentrun",
        "spec.model.apiKeySecretRef.name",
        "LLM key",
        "spec.model.apiKeySecretRef.name",
        "lowercase DNS name",
    ),
    ("agentrun", "spec.model.apiKeySecretRef.key", "", "spec.model.apiKeySecretRef.key", "empty"),
    ("agentrun", "spec.model.apiKeyEnv", "1KEY", "spec.model.apiKeyEnv", "environment variable"),
    ("agentrun", "spec.model.maxOutputTokens", 0, "spec.model.maxOutputTokens", "greater than 0"),
    ("agentrun", "spec.model.callable", "mymodel", "spec.model.callable", "package.module:func"),
    ("agentrun", "spec.model.script", "go", "spec.model.script", "must be a list"),
    ("agentrun", "spec.model.script", [], "spec.model.script", "needs a script"),
    (
        "agentrun",
        "spec.model.script[0].actions",
        {"tool": "x"},
        "spec.model.script[0].actions",
        "must be a list",
    ),
    (
        "agentrun",
        "spec.model.script[2].actions",
        [{"tool": "get_inventory"}],
        "spec.model.script[2].done",
        "either actions or done",
    ),
    (
        "agentrun",
        "spec.model.script[1].actions[0].tool",
        "cancel_order",
        "spec.model.script[1].actions[0].tool",
        "'cancel_order' is not declared in spec.tools",
    ),
    (
        "agentrun",
        "spec.model.script[0].actions[0].args",
        "A1",
        "spec.model.script[0].actions[0].args",
        "must be a mapping",
    ),
    (
        "agentrun",
        "spec.model.script[0].actions[0].args",
        {"sku": b"A1"},
        "spec.model.script[0].actions[0].args",
        "JSON values only",
    ),
    ("agentrun", "spec.model.script[2].done", "yes", "spec.model.script[2].done", "true or false"),
    ("agentrun", "spec.model.script[2].done", False, "spec.model.script[2]", "needs actions"),
    ("agentrun", "spec.model.script[2].answer", 20, "spec.model.script[2].answer", "a string"),
    (
        "agentrun",
        "spec.model.script[0].usage",
        [120, 20],
        "spec.model.script[0].usage",
        "must be a mapping",
    ),
    (
        "agentrun",
        "spec.model.script[0].usage.inputTokens",
        -1,
        "spec.model.script[0].usage.inputTokens",
        "at least 0",
    ),
    (
        "agentrun",
        "spec.model.script[0].usage.outputTokens",
        "20",
        "spec.model.script[0].usage.outputTokens",
        "whole number",
    ),
    (
        "agentrun",
        "spec.model.script[0].verdict",
        "maybe",
        "spec.model.script[0].verdict",
        "one of accept or reject (got 'maybe')",
    ),
    ("agentrun", "spec.model.script[0].reason", 5, "spec.model.script[0].reason", "a string"),
    ("agentrun", "spec.tools", {"name": "x"}, "spec.tools", "must be a list"),
    ("agentrun", "spec.tools[1].name", "place order", "spec.tools[1].name", "1-64 letters"),
    ("agentrun", "spec.tools[2].name", "get_inventory", "spec.tools[2].name", "duplicate tool"),
    ("agentrun", "spec.tools[0].description", 5, "spec.tools[0].description", "a string"),
    (
        "agentrun",
        "spec.tools[1].sideEffect",
        "WRTE",
        "spec.tools[1].sideEffect",
        "one of READ, PROPOSE or WRITE (got 'WRTE')",
    ),
    ("agentrun", "spec.tools[1].sideEffect", DELETE, "spec.tools[1].sideEffect", "is required"),
    (
        "agentrun",
        "spec.tools[1].requiresApproval",
        "yes",
        "spec.tools[1].requiresApproval",
        "true or false",
    ),
    ("agentrun", "spec.tools[2].approval", "2", "spec.tools[2].approval", "must be a mapping"),
    (
        "agentrun",
        "spec.tools[2].approval.required",
        0,
        "spec.tools[2].approval.required",
        "must be at least 1",
    ),
    (
        "agentrun",
        "spec.tools[2].approval.required",
        17,
        "spec.tools[2].approval.required",
        "must be at most 16",
    ),
    (
        "agentrun",
        "spec.tools[2].approval.groups",
        ["leads", "leads"],
        "spec.tools[2].approval.groups[1]",
        "'leads' is listed twice",
    ),
    (
        "agentrun",
        "spec.tools[2].approval.notCreator",
        "yes",
        "spec.tools[2].approval.notCreator",
        "true or false",
    ),
    (
        "agentrun",
        "spec.tools[2].approval.serviceAccounts",
        "no",
        "spec.tools[2].approval.serviceAccounts",
        "true or false",
    ),
    (
        "agentrun",
        "spec.tools[2].approval.reasonToDeny",
        1,
        "spec.tools[2].approval.reasonToDeny",
        "true or false",
    ),
    (
        "agentrun",
        "spec.tools[2].approval.expiresAfter",
        "1 hour",
        "spec.tools[2].approval.expiresAfter",
        "a duration such as '90s'",
    ),
    (
        "agentrun",
        "spec.tools[2].approval.expiresAfter",
        "9000h",
        "spec.tools[2].approval.expiresAfter",
        "at most a year",
    ),
    (
        "agentrun",
        "metadata.annotations",
        {},
        "metadata.annotations.keelgate.dev/created-by",
        "needed by spec.tools[2].approval.notCreator",
    ),
    (
        "agentrun",
        "spec.tools[1].timeoutSeconds",
        0,
        "spec.tools[1].timeoutSeconds",
        "greater than 0",
    ),
    (
        "agentrun",
        "spec.tools[1].timeoutSeconds",
        "10s",
        "spec.tools[1].timeoutSeconds",
        "must be a number",
    ),
    (
        "agentrun",
        "spec.tools[0].inputSchema",
        {"type": "array"},
        "spec.tools[0].inputSchema.type",
        'type: "object"',
    ),
    (
        "agentrun",
        "spec.tools[0].inputSchema.properties",
        ["sku"],
        "spec.tools[0].inputSchema.properties",
        "mapping of argument names",
    ),
    ("agentrun", "spec.tools[0].http", "GET /x", "spec.tools[0].http", "must be a mapping"),
    ("agentrun", "spec.tools[0].http", DELETE, "spec.tools[0]", "exactly one of http, python"),
    (
        "agentrun",
        "spec.tools[0].python",
        {"callable": "m:f"},
        "spec.tools[0]",
        "exactly one of http, python, mcp (found: http, python)",
    ),
    ("agentrun", "spec.tools[0].http.url", "inventory/items", "spec.tools[0].http.url", "URL"),
    (
        "agentrun",
        "spec.tools[0].http.method",
        "get",
        "spec.tools[0].http.method",
        "one of GET, POST, PUT, PATCH or DELETE (got 'get')",
    ),
    (
        "agentrun",
        "spec.tools[0].http.headers",
        {"X-Retries": 3},
        "spec.tools[0].http.headers.X-Retries",
        "must be a string",
    ),
    ("agentrun", "spec.tools[0].http.body", "sku=A1", "spec.tools[0].http.body", "a mapping"),
    (
        "agentrun",
        "spec.tools[1].python.callable",
        "mytools.orders.place",
        "spec.tools[1].python.callable",
        "'package.module:function'",
    ),
    (
        "agentrun",
        "spec.tools[1].python.callable",
        "",
        "spec.tools[1].python.callable",
        "'package.module:function'",
    ),
    ("agentrun", "spec.tools[2].mcp.url", "mcp.shop.svc", "spec.tools[2].mcp.url", "http://"),
    ("agentrun", "spec.tools[2].mcp.tool", ["send"], "spec.tools[2].mcp.tool", "a string"),
    (
        "agentrun",
        "spec.tools[2].mcp.headers",
        "X-Team: stores",
        "spec.tools[2].mcp.headers",
        "must be a mapping",
    ),
    (
        "agentrun",
        "spec.tools[2].mcp.keyArgument",
        5,
        "spec.tools[2].mcp.keyArgument",
        "must be a string",
    ),
    ("agentrun", "spec.budget", 10, "spec.budget", "must be a mapping"),
    ("agentrun", "spec.budget.maxIterations", 0, "spec.budget.maxIterations", "greater than 0"),
    ("agentrun", "spec.budget.maxIterations", 2.5, "spec.budget.maxIterations", "whole number"),
    ("agentrun", "spec.budget.tokens", -5, "spec.budget.tokens", "greater than 0"),
    # Past int64 the API server cannot keep the number: refused here as there.
    (
        "agentrun",
        "spec.budget.maxIterations",
        99999999999999999999999999,
        "spec.budget.maxIterations",
        "must be at most 9223372036854775807",
    ),
    (
        "agentrun",
        "spec.budget.tokens",
        2**63,
        "spec.budget.tokens",
        "must be at most 9223372036854775807",
    ),
    (
        "agentrun",
        "spec.model.maxOutputTokens",
        10**30,
        "spec.model.maxOutputTokens",
        "must be at most 9223372036854775807",
    ),
    ("agentrun", "spec.budget.dollars", 2.5, "spec.budget.dollars", "quoted decimal string"),
    ("agentrun", "spec.budget.dollars", "-1", "spec.budget.dollars", "non-negative decimal"),
    ("agentrun", "spec.budget.dollars", "2,50", "spec.budget.dollars", "non-negative decimal"),
    ("agentrun", "spec.budget.timeoutSeconds", -1, "spec.budget.timeoutSeconds", "greater than"),
    (
        "agentrun",
        "spec.budget.maxVerifierRejections",
        0,
        "spec.budget.maxVerifierRejections",
        "greater than 0",
    ),
    ("agentrun", "spec.pricing", "cheap", "spec.pricing", "must be a mapping"),
    (
        "agentrun",
        "spec.pricing.inputPerMillionTokens",
        "-0.40",
        "spec.pricing.inputPerMillionTokens",
        "non-negative decimal",
    ),
    (
        "agentrun",
        "spec.pricing.outputPerMillionTokens",
        1.6,
        "spec.pricing.outputPerMillionTokens",
        "quoted decimal string",
    ),
    ("agentrun", "spec.allowedSideEffects", [], "spec.allowedSideEffects", "at least 1 item"),
    (
        "agentrun",
        "spec.allowedSideEffects",
        ["READ", "DELETE"],
        "spec.allowedSideEffects[1]",
        "one of READ, PROPOSE or WRITE",
    ),
    (
        "agentrun",
        "spec.allowedSideEffects",
        ["READ", "READ"],
        "spec.allowedSideEffects[1]",
        "READ is listed twice",
    ),
    ("agentrun", "spec.schedule", "*/5 * * * *", "spec.schedule", "only a monitor loop"),
    ("agentrun", "spec.suspend", "no", "spec.suspend", "true or false"),
    ("agentrun", "spec.step", "big", "spec.step", "must be a mapping"),
    ("agentrun", "spec.step.image", 5, "spec.step.image", "must be a string"),
    ("agentrun", "spec.step.resources", "2 cpus", "spec.step.resources", "a mapping"),
    (
        "agentrun",
        "spec.step.resources.limits",
        {"cpu": "lots"},
        "spec.step.resources.limits.cpu",
        "Kubernetes quantity",
    ),
    (
        "agentrun",
        "spec.step.resources.requests",
        {"memory": "1 GB"},
        "spec.step.resources.requests.memory",
        "Kubernetes quantity",
    ),
    (
        "agentrun",
        "spec.step.serviceAccountName",
        "Step_SA",
        "spec.step.serviceAccountName",
        "lowercase DNS name",
    ),
    ("agentrun", "spec.step.nodeSelector", {"zone": 1}, "spec.step.nodeSelector.zone", "string"),
    ("agentrun", "spec.step.tolerations", {"key": "x"}, "spec.step.tolerations", "a list"),
    ("agentrun", "spec.step.tolerations[0].key", 5, "spec.step.tolerations[0].key", "a string"),
    (
        "agentrun",
        "spec.step.tolerations[0].operator",
        "Is",
        "spec.step.tolerations[0].operator",
        "one of , Exists or Equal",
    ),
    ("agentrun", "spec.step.tolerations[0].value", 5, "spec.step.tolerations[0].value", "string"),
    (
        "agentrun",
        "spec.step.tolerations[0].effect",
        "Evict",
        "spec.step.tolerations[0].effect",
        "NoSchedule",
    ),
    (
        "agentrun",
        "spec.step.tolerations[0].tolerationSeconds",
        -1,
        "spec.step.tolerations[0].tolerationSeconds",
        "at least 0",
    ),
    (
        "agentrun",
        "spec.step.keepFinishedPods",
        0,
        "spec.step.keepFinishedPods",
        "greater than 0",
    ),
    (
        "agentrun",
        "spec.step.keepFinishedPods",
        101,
        "spec.step.keepFinishedPods",
        "at most 100",
    ),
    ("agentrun", "status", "done", "status", "must be a mapping"),
    ("agentrun", "status.phase", "Done", "status.phase", "one of Pending, Running, Stopped"),
    ("agentrun", "status.stopReason", "bored", "status.stopReason", "goal_met"),
    ("agentrun", "status.message", 5, "status.message", "must be a string"),
    ("agentrun", "status.resumable", "maybe", "status.resumable", "true or false"),
    ("agentrun", "status.iteration", -1, "status.iteration", "at least 0"),
    ("agentrun", "status.usage", 5, "status.usage", "must be a mapping"),
    ("agentrun", "status.usage.inputTokens", -1, "status.usage.inputTokens", "at least 0"),
    ("agentrun", "status.usage.outputTokens", "x", "status.usage.outputTokens", "whole number"),
    ("agentrun", "status.usage.dollars", 0.0002, "status.usage.dollars", "quoted decimal"),
    ("agentrun", "status.usage.activeSeconds", -1, "status.usage.activeSeconds", "at least 0"),
    ("agentrun", "status.observedGeneration", -1, "status.observedGeneration", "at least 0"),
    ("agentrun", "status.conditions", {"type": "x"}, "status.conditions", "must be a list"),
    (
        "agentrun",
        "status.conditions[0].type",
        "Succeeded!",
        "status.conditions[0].type",
        "condition type",
    ),
    (
        "agentrun",
        "status.conditions[0].status",
        "Yes",
        "status.conditions[0].status",
        "one of True, False or Unknown",
    ),
    (
        "agentrun",
        "status.conditions[0].reason",
        "write in flight",
        "status.conditions[0].reason",
        "CamelCase reason",
    ),
    ("agentrun", "status.conditions[0].reason", DELETE, "status.conditions[0].reason", "required"),
    ("agentrun", "status.conditions[0].message", 5, "status.conditions[0].message", "a string"),
    (
        "agentrun",
        "status.conditions[0].lastTransitionTime",
        "yesterday",
        "status.conditions[0].lastTransitionTime",
        "RFC 3339",
    ),
    (
        "agentrun",
        "status.conditions[0].observedGeneration",
        -1,
        "status.conditions[0].observedGeneration",
        "at least 0",
    ),
    (
        "agentrun",
        "status.unknownActions[0].action",
        "third",
        "status.unknownActions[0].action",
        "action id",
    ),
    ("agentrun", "status.unknownActions[0].tool", 5, "status.unknownActions[0].tool", "a string"),
    (
        "agentrun",
        "status.unknownActions[0].idempotencyKey",
        DELETE,
        "status.unknownActions[0].idempotencyKey",
        "is required",
    ),
    (
        "agentrun",
        "status.lateResults[0].recorded",
        DELETE,
        "status.lateResults[0].recorded",
        "is required",
    ),
    (
        "agentrun",
        "status.pendingApprovals[0].action",
        "2",
        "status.pendingApprovals[0].action",
        "action id",
    ),
    (
        "agentrun",
        "status.pendingApprovals[0].tool",
        DELETE,
        "status.pendingApprovals[0].tool",
        "is required",
    ),
    ("agentrun", "status.answer", ["x"], "status.answer", "must be a string"),
    ("agentrun", "status.lastTick", 5, "status.lastTick", "must be a string"),
    ("agentrun", "status.lastScheduleTime", "noon", "status.lastScheduleTime", "RFC 3339"),
    ("agentrun", "status.step", 5, "status.step", "must be a mapping"),
    ("agentrun", "status.step.number", -1, "status.step.number", "at least 0"),
    ("agentrun", "status.step.attempt", -1, "status.step.attempt", "at least 0"),
    ("agentrun", "status.step.pod", 5, "status.step.pod", "must be a string"),
    ("agentrun", "status.step.state", "Gone", "status.step.state", "one of"),
    ("agentrun", "status.step.generation", -1, "status.step.generation", "at least 0"),
    ("agentrun", "status.step.crashes", -1, "status.step.crashes", "at least 0"),
    ("agentrun", "status.step.notBefore", "soon", "status.step.notBefore", "RFC 3339"),
    ("agentrun", "status.step.failpoints", 5, "status.step.failpoints", "must be a string"),
    ("agentrun", "status.step.lastExit", 5, "status.step.lastExit", "must be a string"),
    ("agentrun", "status.step.lastLines", 5, "status.step.lastLines", "must be a string"),
    ("agentrun", "status.failpointsSeen", 5, "status.failpointsSeen", "must be a string"),
    ("agentrun", "status.kopf", 5, "status.kopf", "must be a mapping"),
    (
        "agentrun",
        "spec.successfulTicksHistoryLimit",
        -1,
        "spec.successfulTicksHistoryLimit",
        "at least 0",
    ),
    ("agentrun", "spec.failedTicksHistoryLimit", "x", "spec.failedTicksHistoryLimit", "whole"),
    ("reconciliation", "apiVersion", None, "apiVersion", "must be keelgate.dev/v1alpha1"),
    ("reconciliation", "kind", "AgentRun", "kind", "must be Reconciliation"),
    ("reconciliation", "spec.runName", "Restock", "spec.runName", "lowercase DNS name"),
    ("reconciliation", "spec.action", "3", "spec.action", "action id such as '3:0'"),
    ("reconciliation", "spec.tool", "place order", "spec.tool", "1-64 letters"),
    ("reconciliation", "spec.idempotencyKey", "", "spec.idempotencyKey", "must not be empty"),
    ("reconciliation", "spec.executed", "yes", "spec.executed", "true or false"),
    ("reconciliation", "spec.by", "", "spec.by", "must name who decided"),
    ("reconciliation", "spec.note", 5, "spec.note", "must be a string"),
    ("reconciliation", "spec.decidedAt", "just now", "spec.decidedAt", "RFC 3339"),
    ("reconciliation", "status.phase", "Done", "status.phase", "one of Pending or Settled"),
    ("reconciliation", "status.verdict", "ran", "status.verdict", "executed or abandoned"),
    ("reconciliation", "status.source", "model", "status.source", "human or confirmer"),
    ("reconciliation", "status.settledBy", 5, "status.settledBy", "must be a string"),
    ("reconciliation", "status.settledAt", "today", "status.settledAt", "RFC 3339"),
    (
        "reconciliation",
        "status.notExecutedAfter",
        "soon",
        "status.notExecutedAfter",
        "RFC 3339",
    ),
    ("reconciliation", "status.heldGeneration", -1, "status.heldGeneration", "at least 0"),
    ("reconciliation", "status.message", ["x"], "status.message", "must be a string"),
    ("reconciliation", "metadata.name", "", "metadata.name", "lowercase DNS name"),
    ("approval", "apiVersion", "keelgate.dev/v1", "apiVersion", "keelgate.dev/v1alpha1"),
    ("approval", "kind", "Reconciliation", "kind", "must be Approval"),
    ("approval", "metadata.namespace", "a.b", "metadata.namespace", "DNS label"),
    ("approval", "spec.runName", "run_1", "spec.runName", "lowercase DNS name"),
    ("approval", "spec.action", "2-0", "spec.action", "action id"),
    ("approval", "spec.tool", "", "spec.tool", "1-64 letters"),
    ("approval", "spec.approved", "ok", "spec.approved", "true or false"),
    ("approval", "spec.by", "  ", "spec.by", "must name who decided"),
    ("approval", "spec.note", ["x"], "spec.note", "must be a string"),
    ("approval", "spec.idempotencyKey", 5, "spec.idempotencyKey", "must be a string"),
    ("approval", "spec.decisions", "bob", "spec.decisions", "must be a list"),
    ("approval", "spec.decisions[0].by", " ", "spec.decisions[0].by", "not be empty"),
    ("approval", "spec.decisions[0].groups", ["a\nb"], "spec.decisions[0].groups[0]", "group"),
    ("approval", "spec.decisions[0].approved", "ok", "spec.decisions[0].approved", "true or"),
    ("approval", "spec.decisions[0].note", 5, "spec.decisions[0].note", "must be a string"),
    ("approval", "spec.decisions[0].at", "today", "spec.decisions[0].at", "RFC 3339"),
    ("approval", "spec.decisions[0].definition", 5, "spec.decisions[0].definition", "a string"),
    ("approval", "spec.decisions[0].id", 5, "spec.decisions[0].id", "must be a string"),
    ("approval", "spec.decidedAt", "now", "spec.decidedAt", "RFC 3339"),
    ("approval", "spec.decisionId", 5, "spec.decisionId", "must be a string"),
    ("approval", "spec.definition", 5, "spec.definition", "must be a string"),
    ("approval", "status.definition", 5, "status.definition", "must be a string"),
    ("approval", "status.serviceAccounts", "no", "status.serviceAccounts", "true or false"),
    ("approval", "status.approvals", -1, "status.approvals", "must be at least 0"),
    ("approval", "status.required", "2", "status.required", "whole number"),
    ("approval", "status.progress", 5, "status.progress", "must be a string"),
    ("approval", "status.approvedBy", "bob", "status.approvedBy", "must be a list"),
    ("approval", "status.expiresAt", "soon", "status.expiresAt", "RFC 3339"),
    ("approval", "status.asks", 5, "status.asks", "must be a string"),
    ("approval", "status.decided", -2, "status.decided", "must be at least 0"),
    ("approval", "status.phase", "Approved", "status.phase", "Pending or Settled"),
    ("approval", "status.verdict", "yes", "status.verdict", "approved, denied or expired"),
    ("approval", "status.settledBy", 5, "status.settledBy", "must be a string"),
    ("approval", "status.settledAt", "now", "status.settledAt", "RFC 3339"),
    ("approval", "status.message", 5, "status.message", "must be a string"),
    ("approval", "status.round", -1, "status.round", "must be at least 0"),
    ("approval", "status.askedAgainAs", 5, "status.askedAgainAs", "must be a string"),
]
# Reconciliations and Approvals carry the same conditions as an AgentRun (refusals shown there).
CASES += [
    (kind, *case[1:])
    for kind in ("reconciliation", "approval")
    for case in CASES
    if case[0] == "agentrun" and case[1].startswith("status.conditions")
]


@pytest.mark.parametrize(
    ("kind", "path", "value", "field", "words"),
    CASES,
    ids=[f"{c[0]}:{c[1]}={c[2]!r}" for c in CASES],
)
def test_a_bad_value_names_its_field_in_one_line(
    kind: str, path: str, value: Any, field: str, words: str
) -> None:
    """Breaking one field gives an InputError naming exactly that field, in one short line."""
    data = full(kind)
    set_at(data, path, value)
    with pytest.raises(InputError) as caught:
        check(kind, data)
    error = caught.value
    assert error.field == field
    assert words in error.reason
    assert str(error).startswith(f"{field}: ")
    assert "\n" not in str(error)
    assert len(str(error)) < 200


def _field_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, info in model.model_fields.items():
        path = f"{prefix}.{info.alias or name}" if prefix else (info.alias or name)
        yield path
        inner = _inner_model(info.annotation)
        if inner is not None:
            yield from _field_paths(inner, path)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_field_has_a_bad_value_case(kind: str) -> None:
    """Each field of each model (nested ones too) is broken by at least one case above."""
    covered = {re.sub(r"\[\d+\]", "", c[3]) for c in CASES if c[0] == kind}
    covered |= {re.sub(r"\[\d+\]", "", c[1]) for c in CASES if c[0] == kind}
    # metadata is one shared model: its fields are covered once, through the AgentRun cases.
    shared = {re.sub(r"\[\d+\]", "", c[3]) for c in CASES if c[0] == "agentrun"}

    def tested(path: str) -> bool:
        pool = covered | shared if path.startswith("metadata.") else covered
        return any(c == path or c.startswith(path + ".") for c in pool)

    missing = [path for path in _field_paths(MODELS[kind]) if not tested(path)]
    assert missing == []


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_field_is_described_for_the_crd(kind: str) -> None:
    """The CRD schema is generated from the models: every property carries a description."""
    schema = MODELS[kind].model_json_schema(by_alias=True)
    nodes = {kind: schema, **schema.get("$defs", {})}
    checked = 0
    undescribed: list[str] = []
    for where, node in nodes.items():
        for name, prop in node.get("properties", {}).items():
            checked += 1
            if not prop.get("description"):
                undescribed.append(f"{where}.{name}")
    assert checked >= 15
    assert undescribed == []


def test_the_contract_example_validates() -> None:
    """The user contract's AgentRun example, copied verbatim (tests/data/contract-agentrun.yaml),
    is a valid manifest."""
    run = load_agentrun(DATA / "contract-agentrun.yaml")
    assert (run.metadata.name, run.tenant) == ("restock", "shop")
    assert [t.side_effect for t in run.spec.tools] == [
        SideEffect.READ,
        SideEffect.WRITE,
        SideEffect.PROPOSE,
    ]
    assert [t.kind for t in run.spec.tools] == ["http", "http", "python"]
    assert run.spec.budget.dollars == "2.50"
    assert run.spec.model.api_key_secret_ref is not None
    assert run.status is not None and run.status.conditions[1].type == "OutcomeUnknown"


def test_the_contract_reconciliation_validates() -> None:
    """The user contract's Reconciliation example (tests/data/contract-reconciliation.yaml) is
    valid, and still undecided."""
    text = (DATA / "contract-reconciliation.yaml").read_text()
    rec = parse(Reconciliation, read_yaml(text, source="contract"))
    assert (rec.spec.run_name, rec.spec.action, rec.spec.executed) == ("restock", "3:0", None)
    assert rec.status is not None and rec.status.phase == "Pending"


def test_a_misspelled_field_is_refused_with_a_suggestion() -> None:
    """A typo is an error (never silently ignored), and the message suggests the real name."""
    data = full("agentrun")
    data["spec"]["tools"][1]["sideEfect"] = data["spec"]["tools"][1].pop("sideEffect")
    with pytest.raises(InputError) as caught:
        check("agentrun", data)
    assert caught.value.field == "spec.tools[1].sideEfect"
    assert caught.value.reason.startswith("unknown field (did you mean sideEffect?)")


def test_the_python_spelling_of_a_field_is_refused_as_the_api_server_would() -> None:
    """``side_effect`` is not the manifest's spelling: refused, pointing at ``sideEffect``."""
    data = full("agentrun")
    data["spec"]["budget"]["max_iterations"] = data["spec"]["budget"].pop("maxIterations")
    with pytest.raises(InputError) as caught:
        check("agentrun", data)
    assert caught.value.field == "spec.budget.max_iterations"
    assert "did you mean maxIterations?" in caught.value.reason


def test_several_problems_report_the_first_and_count_the_rest() -> None:
    """With three broken fields the user sees one line: the first, and "(and 2 more)"."""
    data = full("agentrun")
    set_at(data, "spec.budget.tokens", 0)
    set_at(data, "spec.budget.maxIterations", 0)
    set_at(data, "spec.suspend", "no")
    with pytest.raises(InputError) as caught:
        check("agentrun", data)
    assert str(caught.value) == "spec.budget.maxIterations: must be greater than 0 (and 2 more)"


def test_a_yaml_syntax_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    """Broken YAML is reported as the file and the line to look at, not a parser traceback."""
    path = tmp_path / "run.yaml"
    lines = (DATA / "contract-agentrun.yaml").read_text().splitlines()
    number = next(i for i, line in enumerate(lines) if line.startswith("  goal:")) + 1
    lines[number - 1] = "  goal: restock: now"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as caught:
        load_agentrun(path)
    assert caught.value.field == str(path)
    assert caught.value.reason == f"line {number}, column 16: mapping values are not allowed here"
    assert str(caught.value) == f"{path}: {caught.value.reason}"


def test_a_key_given_twice_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    """YAML would let a second ``sideEffect: READ`` quietly win over ``WRITE``; Keelgate refuses
    the file and names the line of the repeated key."""
    text = (DATA / "contract-agentrun.yaml").read_text()
    text = text.replace(
        "      sideEffect: WRITE\n", "      sideEffect: WRITE\n      sideEffect: READ\n"
    )
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    line = text.splitlines().index("      sideEffect: WRITE") + 2
    with pytest.raises(InputError) as caught:
        load_agentrun(path)
    assert caught.value.reason == f"line {line}, column 7: the key 'sideEffect' appears twice"


def _refused(path: Path) -> InputError:
    """The InputError loading ``path`` gives, checked to be a one-line, exit-2 error naming it."""
    with pytest.raises(InputError) as caught:
        load_agentrun(path)
    error = caught.value
    assert error.exit_code == 2
    assert error.field == str(path)
    assert "\n" not in str(error)
    return error


@pytest.mark.timeout(30)
def test_a_deeply_nested_manifest_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Five thousand levels of ``[`` would run PyYAML out of stack (an internal error); Keelgate
    refuses the file instead, naming it and the place where nesting went past the limit."""
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    error = _refused(path)
    # The document is level 1, so the 257th level is the 256th bracket, at column 3 + 256.
    assert error.reason == "line 1, column 259: nested too deeply"


def test_nesting_a_manifest_can_use_still_loads() -> None:
    """The limit is far above real manifests: arguments nested a few levels still load."""
    text = (DATA / "contract-agentrun.yaml").read_text()
    run = load_agentrun(text.replace("{sku: A1}", "{sku: A1, tags: [[[[[x]]]]]}"))
    script = run.spec.model.script
    assert script is not None
    assert script[0].actions[0].args == {"sku": "A1", "tags": [[[[["x"]]]]]}


@pytest.mark.timeout(30)
def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    """Eight anchors, each ten aliases of the one before, stand for 10**8 items in a few lines.
    Keelgate refuses the file, naming it and the anchor that crosses the limit, from the parsed
    node graph: nothing of the expansion is built, so the refusal is quick and small."""
    anchors = ["a: &a [" + ", ".join(["lol"] * 10) + "]"]
    for before, name in zip("abcdefg", "bcdefgh", strict=True):
        anchors.append(f"{name}: &{name} [" + ", ".join([f"*{before}"] * 10) + "]")
    text = (DATA / "contract-agentrun.yaml").read_text()
    text = text.replace("{sku: A1}", "{" + ", ".join(anchors) + "}")
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    # The parser alone first: were the check gone, this fails at once instead of expanding.
    with pytest.raises(InputError, match="too many aliases"):
        read_yaml(text, source="bomb")
    tracemalloc.start()
    started = time.monotonic()
    try:
        error = _refused(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 10
    assert peak < 20_000_000  # bytes; the expansion would take gigabytes
    # &f is the first anchor over the limit: 1 + 10 + ... + 10**6 nodes.
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "&f" in row)
    column = text.splitlines()[line - 1].index("&f") + 1
    assert error.reason == (
        f"line {line}, column {column}: too many aliases (more than 400000 nodes once expanded)"
    )


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    """``&a [*a]`` is a list that contains itself: infinitely many items once expanded, and no
    JSON a checkpoint could hold. The file is refused, naming the anchor."""
    path = tmp_path / "loop.yaml"
    text = (DATA / "contract-agentrun.yaml").read_text()
    path.write_text(text.replace("{sku: A1}", "{sku: &a [A1, *a]}"))
    error = _refused(path)
    assert error.reason.endswith(": an alias refers to the anchor that contains it")


def _second_usage(usage: str) -> str:
    """The contract manifest with its first script entry's usage anchored as ``&usage`` and the
    second entry's usage written as ``usage``."""
    text = (DATA / "contract-agentrun.yaml").read_text()
    return text.replace(
        "usage: {inputTokens: 120, outputTokens: 20}",
        "usage: &usage {inputTokens: 120, outputTokens: 20}",
    ).replace(
        "{tool: place_order, args: {sku: A1, qty: 20}}]",
        f"{{tool: place_order, args: {{sku: A1, qty: 20}}}}]\n        usage: {usage}",
    )


def test_an_ordinary_anchor_and_alias_still_load() -> None:
    """Reusing a block with an anchor and aliases (as YAML, kubectl and Helm allow) loads as if
    the block were written out at each alias."""
    run = load_agentrun(_second_usage("*usage"))
    script = run.spec.model.script
    assert script is not None
    assert script[1].usage == script[0].usage
    assert script[1].usage is not None
    assert script[1].usage.input_tokens == 120


def test_a_merge_key_loads_and_the_mapping_may_override_what_it_merges() -> None:
    """``<<: *base`` (a YAML merge key, which kubectl reads) merges the anchored mapping in, and
    a key written beside it overrides the merged one; a key written twice is still refused."""
    text = _second_usage("{<<: *usage, outputTokens: 7}")
    script = load_agentrun(text).spec.model.script
    assert script is not None and script[1].usage is not None
    assert (script[1].usage.input_tokens, script[1].usage.output_tokens) == (120, 7)
    twice = text.replace(
        "{<<: *usage, outputTokens: 7}", "{<<: *usage, outputTokens: 7, outputTokens: 8}"
    )
    with pytest.raises(InputError, match="the key 'outputTokens' appears twice"):
        load_agentrun(twice)


def test_a_missing_file_and_an_empty_file_are_one_line_errors(tmp_path: Path) -> None:
    """No manifest at the path, or an empty one, is an InputError naming the file."""
    with pytest.raises(InputError, match="no such file"):
        load_agentrun(tmp_path / "absent.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(InputError) as caught:
        load_agentrun(empty)
    assert str(caught.value) == f"{empty}: the manifest is empty"


def test_an_unquoted_date_in_arguments_stays_a_string() -> None:
    """As with kubectl, ``since: 2026-01-31`` is the string "2026-01-31", so it can be saved in a
    checkpoint and sent to a tool unchanged."""
    text = (
        (DATA / "contract-agentrun.yaml")
        .read_text()
        .replace("{sku: A1}", "{sku: A1, since: 2026-01-31}")
    )
    run = load_agentrun(text)
    script = run.spec.model.script
    assert script is not None
    assert script[0].actions[0].args == {"sku": "A1", "since": "2026-01-31"}


def test_a_verification_loop_that_allows_a_write_is_refused() -> None:
    """Verification loops only read: allowing WRITE is a manifest error, not a prompt hint."""
    data = full("agentrun")
    data["spec"]["loop"] = "verification"
    with pytest.raises(InputError) as caught:
        check("agentrun", data)
    assert str(caught.value) == (
        "spec.allowedSideEffects[1]: a verification loop may only READ, not PROPOSE"
    )
    data["spec"]["allowedSideEffects"] = ["READ"]
    run = check("agentrun", data)
    assert isinstance(run, AgentRun)
    assert run.to_loop_spec().side_effects == frozenset({SideEffect.READ})


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"provider": "python", "script": None}, "spec.model.callable", "needs 'package.module"),
        ({"callable": "m:f"}, "spec.model.callable", "only provider python takes a callable"),
        ({"provider": "openai", "script": None, "name": ""}, "spec.model.name", "model's name"),
        ({"provider": "anthropic", "script": None, "name": ""}, "spec.model.name", "name"),
        ({"script": None}, "spec.model.script", "provider scripted needs a script"),
    ],
)
def test_each_provider_needs_its_own_fields(
    changes: dict[str, Any], field: str, words: str
) -> None:
    """scripted needs a script, python a callable, openai and anthropic a model name."""
    data = full("agentrun")
    for key, value in changes.items():
        if value is None:
            data["spec"]["model"].pop(key, None)
        else:
            data["spec"]["model"][key] = value
    with pytest.raises(InputError) as caught:
        check("agentrun", data)
    assert caught.value.field == field
    assert words in caught.value.reason


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        (None, "a cron schedule is required"),
        ("", "a cron schedule is required"),
        ("every 5 minutes", "has 3 field(s)"),
        ("61 * * * *", "not a valid cron expression"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_a_monitor_needs_a_valid_schedule(schedule: str | None, words: str) -> None:
    """A monitor without a usable cron schedule is refused at spec.schedule."""
    data = full("agentrun")
    data["spec"]["loop"] = "monitor"
    if schedule is None:
        del data["spec"]["schedule"]
    else:
        data["spec"]["schedule"] = schedule
    with pytest.raises(InputError) as caught:
        check("agentrun", data)
    assert caught.value.field == "spec.schedule"
    assert words in caught.value.reason


def test_a_missing_namespace_takes_the_tenant_default() -> None:
    """Without metadata.namespace the run belongs to the tenant the caller names."""
    text = (DATA / "contract-agentrun.yaml").read_text().replace(", namespace: shop", "")
    assert load_agentrun(text).tenant == "default"
    run = load_agentrun(text, tenant_default="team-a")
    assert run.tenant == "team-a"
    assert run.to_loop_spec().tenant == "team-a"


def test_the_manifest_round_trips_through_loop_spec_json() -> None:
    """AgentRun -> LoopSpec -> JSON text -> LoopSpec -> the same spec: a runner in another
    process (a step pod) rebuilds exactly what the user wrote."""
    run = load_agentrun(DATA / "full-agentrun.yaml")
    spec = run.to_loop_spec()
    assert (spec.tenant, spec.run, spec.kind) == ("shop", "restock", LoopKind.TASK)
    assert spec.goal == run.spec.goal
    assert spec.budget.dollars is not None and str(spec.budget.dollars) == "2.50"
    assert spec.budget.max_iterations == 10
    assert spec.allowed_side_effects == frozenset(SideEffect)
    again = LoopSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec
    assert spec_from_manifest(again.manifest) == run.spec
    assert again.manifest is not None and again.manifest["tools"][1]["sideEffect"] == "WRITE"


def test_a_spec_that_went_bad_on_the_wire_names_its_field() -> None:
    """A LoopSpec's manifest is validated again when rebuilt, with ``spec.`` paths."""
    run = load_agentrun(DATA / "contract-agentrun.yaml")
    manifest = copy.deepcopy(run.spec.manifest())
    manifest["tools"][0]["sideEffect"] = "MAYBE"
    with pytest.raises(InputError) as caught:
        spec_from_manifest(manifest)
    assert caught.value.field == "spec.tools[0].sideEffect"
    with pytest.raises(InputError) as caught:
        spec_from_manifest(None)
    assert caught.value.field == "spec"


def test_status_accepts_every_stop_reason_of_the_core() -> None:
    """status.stopReason allows exactly the contract's stop reasons (and "" before a stop)."""
    data = full("agentrun")
    for reason in StopReason:
        data["status"]["stopReason"] = reason.value
        run = check("agentrun", data)
        assert isinstance(run, AgentRun) and run.status is not None
        assert run.status.stop_reason == reason.value
    schema = AgentRun.model_json_schema(by_alias=True)
    allowed = schema["$defs"]["AgentRunStatus"]["properties"]["stopReason"]["enum"]
    assert sorted(allowed) == sorted(["", *(r.value for r in StopReason)])


def test_a_settled_decision_must_name_who_decided() -> None:
    """``executed: true`` without ``by`` is refused: every decision is attributed."""
    data = full("reconciliation")
    data["spec"]["by"] = ""
    with pytest.raises(InputError) as caught:
        check("reconciliation", data)
    assert str(caught.value) == "spec.by: must name who decided when executed is set"
    data["spec"]["executed"] = None
    rec = check("reconciliation", data)
    assert isinstance(rec, Reconciliation) and rec.spec.executed is None


def test_the_model_dump_is_the_manifest_spelling() -> None:
    """Dumped specs use camelCase (and ``baseURL``), so they can be applied back to a cluster."""
    run = load_agentrun(DATA / "full-agentrun.yaml")
    dumped = run.model_dump(mode="json", exclude_none=True)
    assert dumped["apiVersion"] == "keelgate.dev/v1alpha1"
    assert dumped["spec"]["model"]["baseURL"] == "http://127.0.0.1:11434/v1"
    assert "maxOutputTokens" in dumped["spec"]["model"]
    assert load_agentrun(yaml.safe_dump(dumped)) == run
    assert isinstance(AgentRunSpec.model_validate(dumped["spec"]), AgentRunSpec)


def test_an_object_read_back_from_a_cluster_parses() -> None:
    """What the API server returns (server-set metadata, kopf's progress under status) parses:
    only the user-written parts refuse unknown fields."""
    data = full("agentrun")
    data["status"]["kopf"] = {"progress": {"create": {"retries": 1}}}
    run = check("agentrun", data)
    assert isinstance(run, AgentRun) and run.metadata.generation == 3
    data["spec"]["kopf"] = {}
    with pytest.raises(InputError) as caught:
        check("agentrun", data)
    assert str(caught.value) == "spec.kopf: unknown field"
