"""What an Approval shows of the store's record of its action: the count so far, who counts, when
the first approval stops counting, or Settled approved or denied.

Why it exists: two places show an Approval's status and must show the same: the AgentRun's
reconcile, when it makes the Approval a stop asks for (``decision_objects``), and the Approval
reconciler, after it recorded people's decisions (``approvals``). This module is that one view,
a pure function of the run's checkpoint and a moment; it never reads or writes anything, and
never decides whether a decision counts (``keelgate.core.approvals`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

from keelgate.core.approvals import Tally, on_call, tally
from keelgate.core.calls import fingerprint
from keelgate.core.state import RunState
from keelgate.core.types import ApprovalRule, PendingApproval, utc_iso
from keelgate.kube.controller.ports import JSON


@dataclass(frozen=True)
class Shown:
    """What the object shows of the store's record of its action."""

    status: JSON
    settled: bool
    tally: Tally | None
    pending: PendingApproval | None


def shown(state: RunState, action: str, *, at: float, required: int = 0) -> Shown | None:
    """The status of the Approval of ``action`` as the store holds it at ``at`` (seconds since
    the epoch); None when the store has nothing to show (not asked, nothing decided).
    ``required``: the count the object showed while it waited (the rule in force then), for a
    Settled approval, whose rule the store no longer lists. Counts, names and verdict always
    agree: a Settled approval shows the approvals that met its rule ("2 of 2")."""
    decisions = state.approvals.get(action, ())
    pending = next((p for p in state.pending if p.action == action), None)
    denied = next((d for d in decisions if not d.approved), None)
    planned = state.planned(action)
    definition = (
        fingerprint(planned.definition)
        if planned is not None
        else (pending.definition if pending is not None else "")
    )
    base: JSON = {"decided": len(decisions), "definition": definition}
    if pending is not None and denied is None:
        rule = pending.rule or ApprovalRule()
        counted = tally(decisions, rule, creator=state.spec.creator, now=at, definition=definition)
        left = rule.required - len(counted.counted)
        status = {
            **base,
            "phase": "Pending",
            "verdict": "",
            "approvals": len(counted.counted),
            "required": rule.required,
            "progress": counted.count,
            "approvedBy": [d.by for d in counted.counted],
            "expiresAt": "" if counted.expires_at is None else utc_iso(counted.expires_at),
            "asks": rule.describe(),
            "serviceAccounts": rule.service_accounts,
            "settledBy": "",
            "message": "waiting for a person to approve or deny it"
            if rule == ApprovalRule()
            else _waiting_for(counted, left),
        }
        if counted.voided:
            status["message"] += (
                f"; asked again: the tool was changed after the approval of "
                f"{', '.join(d.by for d in counted.voided)}"
            )
        return Shown(status, False, counted, pending)
    people = list(dict.fromkeys(d.by for d in decisions if d.approved and on_call(d, definition)))
    if denied is None and not people:
        return None
    planned_rule = planned.approval_rule() if planned is not None else None
    need = max(required, planned_rule.required if planned_rule is not None else 1)
    settled: JSON = {
        **base,
        "phase": "Settled",
        "approvals": len(people),
        "required": need,
        "progress": f"{len(people)} of {need}",
        "approvedBy": people,
        "expiresAt": "",
    }
    if denied is not None:
        why = f": {denied.note}" if denied.note else ""
        settled |= {
            "verdict": "denied",
            "settledBy": denied.by,
            "message": f"denied by {denied.by}{why}; it never runs",
        }
    else:
        settled |= {
            "verdict": "approved",
            "settledBy": ", ".join(people),
            "message": f"approved by {', '.join(people)} ({len(people)} of {need})",
        }
    return Shown(settled, True, None, pending)


def _waiting_for(counted: Tally, left: int) -> str:
    """ "1 of 2 approvals (alice): waiting for 1 more; the rule asks 2 approvals from ..." """
    who = f" ({', '.join(d.by for d in counted.counted)})" if counted.counted else ""
    said = f"{counted.count} approvals{who}: waiting for {left} more"
    rule = counted.rule.describe()
    plain = f"{counted.rule.required} approval{'s' if counted.rule.required != 1 else ''}"
    return said if rule == plain else f"{said}; the rule asks {rule}"
