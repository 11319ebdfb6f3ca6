"""What the API server admits of people's edits to decision objects: a model of the chart's
admission policies (charts/keelgate/templates/admission.yaml: ``decided-by-requester``,
``approval-decisions``, validating and mutating, and ``approval-finalizer``) and the CRDs'
validation rules (crds/approvals.keelgate.dev.yaml, crds/reconciliations...).

Why it exists: in a cluster a person decides by editing an object, and what they can make the
operator believe is what admission lets through, no more and no less. Operator-mode people edit
Approvals and Reconciliations only through ``admitted`` and ``mutated``, so a move the policies
refuse never happens in a simulation (issue 46's copies and reorders are tried and refused, as
the chart's ``approval-decisions`` policy refuses them), and each entry added carries the
identity and the definition the chart's mutating policy gives it. The rules are written from the
policies' CEL, one function per object kind; when the chart changes, this model changes with it
(tests/test_sim_checkers.py pins each rule with a case).

This module must never admit what the chart refuses, nor refuse what it admits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keelgate.kube.naming import DECISIONS_FINALIZER

#: Decisions an Approval holds at most (the CRD's maxItems).
MAX_DECISIONS = 64


@dataclass(frozen=True)
class User:
    """Who the API server says is asking: their name and groups."""

    name: str
    groups: tuple[str, ...] = ()


def admitted(
    kind: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    user: User,
    *,
    status: Mapping[str, Any] | None = None,
    deleting: bool = False,
) -> str:
    """Why an update of an object's ``spec`` from ``old`` to ``new`` by ``user`` is refused
    ("" if it is admitted); ``status`` is the object's as the API server holds it, ``deleting``
    whether it is being deleted (its finalizer holds it)."""
    if kind == "Approval":
        if deleting and dict(new) != dict(old):
            # The chart's approval-finalizer policy.
            return "the approval is being deleted: no decision is added to it or changed"
        return _approval(old, new, user, status or {})
    if kind == "Reconciliation":
        return _reconciliation(old, new, user, status or {})
    return ""


#: Who may remove the Approval's finalizer besides the operator: the chart's
#: admissionPolicy.finalizerAdmins.
FINALIZER_ADMINS = ("system:masters",)


def finalizer_refusal(old: Sequence[str], new: Sequence[str], user: User) -> str:
    """Why ``user``'s change of an Approval's finalizers from ``old`` to ``new`` is refused
    ("" if admitted): the chart's approval-finalizer policy lets only the operator (which the
    simulation's people never are) and a cluster admin remove keelgate.dev/decisions."""
    if DECISIONS_FINALIZER not in old or DECISIONS_FINALIZER in new:
        return ""
    if any(group in FINALIZER_ADMINS for group in user.groups):
        return ""
    return "keelgate.dev/decisions holds the approval until the operator has recorded its decisions"


def mutated(
    kind: str, old: Mapping[str, Any], new: Mapping[str, Any], *, version: str, shown: str
) -> dict[str, Any]:
    """``new`` as the chart's mutating policy ``approval-decisions`` leaves it: an entry added
    to an Approval gets ``id`` (the resourceVersion it was added to: ``version``) and, unless it
    states one, the definition the object showed (``shown``: its status.definition); the
    one-decision form gets ``decisionId`` and ``definition`` the same way."""
    spec = dict(new)
    if kind != "Approval":
        return spec
    before: Sequence[Mapping[str, Any]] = old.get("decisions") or ()
    after = [dict(entry) for entry in spec.get("decisions") or ()]
    if len(after) > len(before):
        entry = after[len(before)]
        entry["id"] = version
        if shown and not entry.get("definition"):
            entry["definition"] = shown
        spec["decisions"] = after
    if spec.get("approved") is not None and old.get("approved") is None:
        spec["decisionId"] = version
        if shown and not spec.get("definition"):
            spec["definition"] = shown
    return spec


def _approval(
    old: Mapping[str, Any], new: Mapping[str, Any], user: User, status: Mapping[str, Any]
) -> str:
    for field in ("runName", "action", "tool", "idempotencyKey"):
        if old.get(field) != new.get(field):
            return "runName, action, tool, idempotencyKey cannot change (the operator set them)"
    deciding_now = False
    if new.get("approved") is not None:
        if not str(new.get("by") or "").strip():
            return "spec.by: must name who decided when approved is set"
        if old.get("approved") is not None:
            if new.get("approved") != old.get("approved") or new.get("by") != old.get("by"):
                return "spec.approved: cannot change once set"
            if (new.get("definition") or "") != (old.get("definition") or ""):
                return "spec.definition: cannot change once approved is set"
        elif new.get("by") != user.name:
            return f"spec.by must be {user.name} (the user setting spec.approved)"
        else:
            deciding_now = True
    elif old.get("approved") is not None:
        return "spec.approved: cannot change once set"
    if new.get("decisionId") and new.get("decisionId") != old.get("decisionId"):
        return "spec.decisionId is the identity admission gives the decision: leave it out"
    before: Sequence[Mapping[str, Any]] = old.get("decisions") or ()
    after: Sequence[Mapping[str, Any]] = new.get("decisions") or ()
    if len(after) > MAX_DECISIONS:
        return f"spec.decisions: must have at most {MAX_DECISIONS} items"
    # The policy: one entry per request, at the end; every old entry unchanged in its place.
    if len(after) > len(before) + 1:
        return "spec.decisions: add one decision per request"
    if len(after) < len(before) or any(after[i] != entry for i, entry in enumerate(before)):
        return "spec.decisions: decisions are append-only: add yours at the end"
    added = list(after[len(before) :])
    for entry in added:
        groups = entry.get("groups") or ()
        if entry.get("by") != user.name or any(g not in user.groups for g in groups):
            return (
                f"spec.decisions: a decision added by {user.name} must have by: {user.name} "
                "and name only groups the API server authenticated them in"
            )
        if entry.get("id"):
            return "spec.decisions: id is the identity admission gives a decision: leave it out"
    if not (added or deciding_now):
        return ""
    if status.get("phase") == "Settled":
        if status.get("askedAgainAs"):
            return f"the approval expired and is asked afresh as {status['askedAgainAs']}"
        return "the approval is settled: a decision added now would count for nothing"
    if user.name.startswith("system:serviceaccount:") and not status.get("serviceAccounts"):
        return f"{user.name} is a ServiceAccount, and the rule counts people only"
    counted = status.get("approvedBy") or ()
    for entry in added:
        if entry.get("approved") and user.name in counted:
            return f"{user.name} approved it already, and the approval counts"
        if not entry.get("approved") and any(
            o.get("by") == user.name and not o.get("approved") for o in before
        ):
            return f"{user.name} denied it already"
    if sum(1 for d in after if d.get("by") == user.name and d.get("approved")) > 8:
        return f"spec.decisions: {user.name} has 8 approvals on it"
    return ""


def _reconciliation(
    old: Mapping[str, Any], new: Mapping[str, Any], user: User, status: Mapping[str, Any]
) -> str:
    """The CRD's rules (a decision never changes, but from false to true before it is settled;
    ``by`` never) and the chart's decided-by-requester policy (setting, correcting or writing
    again a decision, ``decidedAt`` included, only as oneself)."""
    if old.get("executed") is not None:
        before, after = old.get("executed"), new.get("executed")
        corrected = before is False and after is True and status.get("phase") != "Settled"
        if (after != before and not corrected) or new.get("by") != old.get("by"):
            return "spec.executed: cannot change once set"
        again = after != before or new.get("decidedAt", "") != old.get("decidedAt", "")
        if again and new.get("by") != user.name:
            return f"spec.by must be {user.name} (the user setting spec.executed or decidedAt)"
        return ""
    if new.get("executed") is not None and new.get("by") != user.name:
        return f"spec.by must be {user.name} (the user setting spec.executed)"
    return ""
