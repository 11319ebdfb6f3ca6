"""What the API server admits of people's edits to decision objects: a model of the chart's
admission policies (charts/keelgate/templates/admission.yaml, ``decided-by-requester``) and the
CRDs' validation rules (crds/approvals.keelgate.dev.yaml, crds/reconciliations...).

Why it exists: in a cluster a person decides by editing an object, and what they can make the
operator believe is what admission lets through, no more and no less. Operator-mode people edit
Approvals and Reconciliations only through ``admitted``, so a move the policies refuse never
happens in a simulation, and a move they let through (a byte-equal copy of someone's entry, a
deny moved to the front of the list, a ServiceAccount's decision) does (issue 46). The rules are
written from the policies' CEL, one function per object kind; when the chart changes, this model
changes with it (tests/test_sim_checkers.py pins each rule with a case).

This module must never admit what the chart refuses, nor refuse what it admits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Decisions an Approval holds at most (the CRD's maxItems).
MAX_DECISIONS = 64


@dataclass(frozen=True)
class User:
    """Who the API server says is asking: their name and groups."""

    name: str
    groups: tuple[str, ...] = ()


def admitted(kind: str, old: Mapping[str, Any], new: Mapping[str, Any], user: User) -> str:
    """Why an update of an object's ``spec`` from ``old`` to ``new`` by ``user`` is refused
    ("" if it is admitted)."""
    if kind == "Approval":
        return _approval(old, new, user)
    if kind == "Reconciliation":
        return _reconciliation(old, new, user)
    return ""


def _approval(old: Mapping[str, Any], new: Mapping[str, Any], user: User) -> str:
    for field in ("runName", "action", "tool", "idempotencyKey"):
        if old.get(field) != new.get(field):
            return "runName, action, tool, idempotencyKey cannot change (the operator set them)"
    if new.get("approved") is not None:
        if not str(new.get("by") or "").strip():
            return "spec.by: must name who decided when approved is set"
        if old.get("approved") is not None:
            if new.get("approved") != old.get("approved") or new.get("by") != old.get("by"):
                return "spec.approved: cannot change once set"
        elif new.get("by") != user.name:
            return f"spec.by must be {user.name} (the user setting spec.approved)"
    elif old.get("approved") is not None:
        return "spec.approved: cannot change once set"
    before: Sequence[Mapping[str, Any]] = old.get("decisions") or ()
    after: Sequence[Mapping[str, Any]] | None = new.get("decisions")
    if after is None:
        return "spec.decisions: decisions are append-only: none can be removed" if before else ""
    if len(after) > MAX_DECISIONS:
        return f"spec.decisions: must have at most {MAX_DECISIONS} items"
    # The CRD: no fewer, and every old entry still in the list (anywhere: membership).
    if len(after) < len(before) or any(entry not in after for entry in before):
        return "spec.decisions: decisions are append-only"
    # The policy: an entry not in the old list names the user, and only their groups.
    for entry in after:
        if entry in before:
            continue
        groups = entry.get("groups") or ()
        if entry.get("by") != user.name or any(g not in user.groups for g in groups):
            return (
                f"spec.decisions: a decision added by {user.name} must have by: {user.name} "
                "and name only groups the API server authenticated them in"
            )
    return ""


def _reconciliation(old: Mapping[str, Any], new: Mapping[str, Any], user: User) -> str:
    if old.get("executed") is not None:
        if new.get("executed") != old.get("executed") or new.get("by") != old.get("by"):
            return "spec.executed: cannot change once set"
        return ""
    if new.get("executed") is not None and new.get("by") != user.name:
        return f"spec.by must be {user.name} (the user setting spec.executed)"
    return ""
