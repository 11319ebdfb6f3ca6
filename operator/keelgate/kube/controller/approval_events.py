"""The Kubernetes Events the operator records about approvals, at the three moments it knows
them, and the one notification of them no object's body holds (an approval expired).

Why it exists: people want to be told where they are, not to watch a page: that an action
starts waiting for approval (or waits again, once approvals stopped counting), that a person
decided, that an approval expired. The operator learns each moment in one place, and tells it
from here: ``DecisionObjects.ask_to_approve`` (an Approval made, or asked again),
``ApprovalReconciler`` (a decision recorded in the store, an approval found expired). Each is a
Kubernetes Event on the run; an expiry is also a notification to the sinks
(``keelgate.kube.notifications.approval_expired``: the notifier derives the others from the
Approval itself); anything else that should hear of these moments is added here, once, not at
each place. It must never put a tool's argument or a secret into what it tells.
"""

from __future__ import annotations

from collections.abc import Sequence

from keelgate.core.approvals import seconds
from keelgate.core.state import Decision
from keelgate.core.types import PendingApproval, utc_iso
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.ports import JSON
from keelgate.kube.notifications import approval_expired


class ApprovalEvents:
    def __init__(self, context: ControllerContext) -> None:
        self._events = context.events
        self._notify = context.notify

    def waiting(self, run: JSON, name: str, pending: PendingApproval, *, again: bool) -> None:
        """An action starts waiting for approval (``again``: it was approved, and its
        approvals stopped counting before the call ran, so it is asked again)."""
        what = f"{pending.tool} ({pending.action})"
        needs = "needs approval" if pending.rule is None else f"needs {pending.rule.describe()}"
        if pending.round != 1 and not again:
            self._events.normal(
                run,
                "AwaitingApproval",
                f"{what} is asked afresh, round {pending.round} (no approval of the last one "
                f"counts): {needs}: approval {name}",
            )
        elif again:
            self._events.normal(
                run,
                "AwaitingApproval",
                f"{what} is asked again ({pending.tally()} count now): {needs}: approval {name}",
            )
        else:
            self._events.normal(run, "AwaitingApproval", f"{what} {needs}: approval {name}")

    def decided(
        self, run: JSON, name: str, tool: str, action: str, decision: Decision, tally: str
    ) -> None:
        """A person's decision was recorded in the store (``tally``: "1 of 2" after it)."""
        verdict = "approved" if decision.approved else "denied"
        reason = "Approved" if decision.approved else "Denied"
        counted = f" ({tally})" if decision.approved and tally else ""
        why = f" ({decision.note})" if decision.note else ""
        self._events.normal(
            run,
            reason,
            f"{tool} ({action}) {verdict} by {decision.by}{counted}{why}: approval {name}",
        )

    def expired(
        self,
        run: JSON,
        approval: JSON,
        expired: Sequence[Decision],
        *,
        expires_after: float,
        tally: str,
        first_time: bool,
    ) -> None:
        """Approvals stopped counting (older than the rule's expiresAfter) before the call ran:
        ``expired`` are those decisions; ``tally`` is what counts now. The CloudEvent of each is
        told every time (it carries an id from the decision's record, so a sink hears it once,
        and again after a restart if it was not delivered); the Event on the run only the
        ``first_time`` this look found them."""
        spec = approval.get("spec") or {}
        for decision in expired:
            at = seconds(decision.at)
            self._notify(
                approval_expired(
                    approval,
                    approved_by=[decision.by],
                    approved_at=decision.at,
                    expired_at=utc_iso(at + expires_after),
                    expires_after_seconds=expires_after,
                )
            )
        if first_time and expired:
            who = ", ".join(d.by for d in expired)
            self._events.normal(
                run,
                "ApprovalExpired",
                f"{spec.get('tool', '')} ({spec.get('action', '')}): the approval of {who} "
                f"expired ({tally} count now): approval {approval['metadata']['name']}",
            )
