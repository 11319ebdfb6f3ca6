"""The custom resources Keelgate defines: AgentRun, Reconciliation and Approval.

Why it exists: one registry of kinds, each with its manifest model (the single source of truth
for its schema), its names, its ``kubectl get`` columns and what its schema enforces beyond the
model (list types, CEL rules: a decision names who made it and never changes). The generator
(``keelgate.kube.crds.schema``) reads nothing else. This module must never hand-write a field the
models do not declare, and never talk to a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from keelgate.kube.naming import GROUP
from keelgate.manifest import AgentRun, Approval, Reconciliation

CATEGORY = "keelgate"


@dataclass(frozen=True)
class Column:
    """One ``kubectl get`` column (additionalPrinterColumns)."""

    name: str
    json_path: str
    description: str
    type: str = "string"
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description,
        }
        if self.priority:
            out["priority"] = self.priority
        return out


AGE = Column("Age", ".metadata.creationTimestamp", "Time since the object was created.", "date")


@dataclass(frozen=True)
class Kind:
    """One custom resource: its model, its names and what the schema enforces beyond the model's
    JSON schema (list types, CEL rules), keyed by a path of property names (``[]``: items)."""

    model: type[BaseModel]
    kind: str
    plural: str
    short_names: tuple[str, ...]
    description: str
    columns: tuple[Column, ...]
    extras: Mapping[tuple[str, ...], Mapping[str, Any]] = field(default_factory=dict)

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def file_name(self) -> str:
        return f"{self.crd_name}.yaml"


def cel_rule(rule: str, message: str, *, field_path: str = "") -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry: the rule, its message, the field it names."""
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _settle_rules(decision: str, *, changes: bool = True) -> list[dict[str, str]]:
    """Rules of a Reconciliation (``executed``) or Approval (``approved``) spec.

    A decision names who made it, and once made neither it nor its ``by`` can change: rules
    with ``oldSelf`` are transition rules, checked on update only. The API server reads a null
    field as absent, so ``has()`` is false for ``executed: null``, and removing the field is a
    change like any other. ``changes``: whether the rule that the decision never changes is
    here (a Reconciliation's is on the object, which sees its status: ``_corrected_rule``).
    """
    unchanged = cel_rule(
        f"!has(oldSelf.{decision}) || (has(self.{decision}) && "
        f"self.{decision} == oldSelf.{decision})",
        "cannot change once set",
        field_path=f".{decision}",
    )
    return [
        cel_rule(
            f"!has(self.{decision}) || (has(self.by) && self.by.trim() != '')",
            f"must name who decided when {decision} is set",
            field_path=".by",
        ),
        *([unchanged] if changes else []),
        cel_rule(
            f"!has(oldSelf.{decision}) || (has(self.by) && has(oldSelf.by) && "
            "self.by == oldSelf.by)",
            f"cannot change once {decision} is set",
            field_path=".by",
        ),
    ]


def _corrected_rule() -> dict[str, str]:
    """A Reconciliation's ``executed`` never changes once set, but from false to true while it
    is not settled: "not executed" written before the call could no longer be sent is refused
    (it may have gone out after the person looked), and its maker, looking again, may find
    that it ran. True only makes the record truer (nothing is sent again under a key recorded
    done); the other way, or after the operator settled it, is a decision changed. A rule on
    the object, the one place that sees the status too."""
    return cel_rule(
        "!has(oldSelf.spec.executed) || (has(self.spec.executed) && "
        "(self.spec.executed == oldSelf.spec.executed || (self.spec.executed && "
        "!(has(oldSelf.status) && has(oldSelf.status.phase) && "
        "oldSelf.status.phase == 'Settled'))))",
        "spec.executed cannot change once set (but from false to true, before it is settled)",
        field_path=".spec.executed",
    )


def _identity_rule(fields: Sequence[str]) -> dict[str, str]:
    # The operator created the object for one action of one run: pointing it at another action
    # (or key) would let a decision about one WRITE settle a different one.
    same = " && ".join(f"self.{name} == oldSelf.{name}" for name in fields)
    return cel_rule(same, f"{', '.join(fields)} cannot change (the operator set them)")


AGENTRUN = Kind(
    model=AgentRun,
    kind="AgentRun",
    plural="agentruns",
    short_names=("ar",),
    description="An agent loop that Keelgate runs durably and safely: a WRITE never runs twice "
    "and never runs unapproved. The namespace is the tenant.",
    columns=(
        Column("Phase", ".status.phase", "Pending, Running, Stopped, Succeeded or Failed."),
        Column("Reason", ".status.stopReason", "Why the run stopped."),
        Column("Iteration", ".status.iteration", "Planning iterations so far.", "integer"),
        Column("Loop", ".spec.loop", "task, verification or monitor.", priority=1),
        Column("Message", ".status.message", "The stop, in words.", priority=1),
        AGE,
    ),
    extras={
        ("spec",): {
            "x-kubernetes-validations": [
                cel_rule(
                    "self.loop != 'verification' || !has(self.allowedSideEffects) || "
                    "self.allowedSideEffects.all(e, e == 'READ')",
                    "a verification loop may only READ",
                    field_path=".allowedSideEffects",
                )
            ]
        },
        # Tool names are unique (the models refuse a duplicate); as a map list the API server
        # refuses one too, and server-side apply merges tools by name.
        ("spec", "tools"): {
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
        ("spec", "tools", "[]"): {
            "x-kubernetes-validations": [
                cel_rule(
                    "[has(self.http), has(self.python), has(self.mcp)].filter(k, k).size() == 1",
                    "a tool needs exactly one of http, python, mcp",
                )
            ]
        },
        ("spec", "allowedSideEffects"): {"x-kubernetes-list-type": "set"},
    },
)

RECONCILIATION = Kind(
    model=Reconciliation,
    kind="Reconciliation",
    plural="reconciliations",
    short_names=("rec",),
    description="A WRITE whose outcome is unknown: a person sets spec.executed (true: it ran; "
    "false: abandon it) and spec.by. Created by the operator, owned by its AgentRun.",
    columns=(
        Column("Run", ".spec.runName", "The AgentRun (or tick) the action belongs to."),
        Column("Action", ".spec.action", "The action's id within the run."),
        Column("Tool", ".spec.tool", "The tool the action called."),
        Column("Phase", ".status.phase", "Pending or Settled."),
        Column("Verdict", ".status.verdict", "executed or abandoned, once settled."),
        Column("By", ".spec.by", "Who decided.", priority=1),
        AGE,
    ),
    extras={
        ("spec",): {
            "x-kubernetes-validations": [
                *_settle_rules("executed", changes=False),
                _identity_rule(("runName", "action", "tool", "idempotencyKey")),
            ]
        },
        (): {"x-kubernetes-validations": [_corrected_rule()]},
    },
)

APPROVAL = Kind(
    model=Approval,
    kind="Approval",
    plural="approvals",
    short_names=("apr",),
    description="An action that waits for people's yes: each person appends a decision to "
    "spec.decisions (or, for one, sets spec.approved and spec.by); any deny denies. Created "
    "by the operator, owned by its AgentRun.",
    columns=(
        Column("Run", ".spec.runName", "The AgentRun (or tick) waiting for approval."),
        Column("Action", ".spec.action", "The action's id within the run."),
        Column("Tool", ".spec.tool", "The tool the action would call."),
        Column("Phase", ".status.phase", "Pending or Settled."),
        Column("Approvals", ".status.progress", "Approvals that count, of those needed."),
        Column("Verdict", ".status.verdict", "approved or denied, once settled."),
        Column(
            "Expires", ".status.expiresAt", "When the first approval stops counting.", priority=1
        ),
        Column("By", ".status.settledBy", "Who decided.", priority=1),
        AGE,
    ),
    extras={
        ("spec",): {
            "x-kubernetes-validations": [
                *_settle_rules("approved"),
                _identity_rule(("runName", "action", "tool", "idempotencyKey")),
                cel_rule(
                    "!has(oldSelf.decisions) || has(self.decisions)",
                    "decisions are append-only: none can be removed",
                    field_path=".decisions",
                ),
                # The definition a one-decision approval was made on is part of the decision:
                # changed afterwards, it could carry an approval of the earlier call to the
                # edited one.
                cel_rule(
                    "!has(oldSelf.approved) || (has(self.definition) == has(oldSelf.definition) "
                    "&& (!has(self.definition) || self.definition == oldSelf.definition))",
                    "cannot change once approved is set",
                    field_path=".definition",
                ),
            ]
        },
        # People append their decisions; none is ever changed, moved or taken back: each entry
        # already there stays where it is, unchanged (a rule that only asked for each old entry
        # to be somewhere in the list would let a copy or a move through). The admission policy
        # checks that a new entry's by and groups are the requesting user's, and stamps it.
        ("spec", "decisions"): {
            "x-kubernetes-validations": [
                cel_rule(
                    "self.size() >= oldSelf.size() && oldSelf.all(i, d, self[i] == d)",
                    "decisions are append-only: add yours (a JSON patch 'add' to "
                    "/spec/decisions/-); none can be changed, moved or removed",
                ),
            ]
        },
    },
)

KINDS: tuple[Kind, ...] = (AGENTRUN, RECONCILIATION, APPROVAL)
