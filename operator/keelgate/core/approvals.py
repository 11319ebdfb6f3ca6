"""Approvals: which planned actions wait for a person, and what a person decided.

Why it exists: a tool with ``requiresApproval`` stops the run before its call
(``awaiting_approval``), and the call runs only once a named person said yes; a no is final and
the model is told. The rule travels with the saved action (``Action.requires_approval``), so an
edited manifest can add a question, never remove one. This module must never let such a call
run unapproved, never ask a person about a call that may already have run (its outcome is
settled first), and never let a decision change once recorded.
"""

from __future__ import annotations

from collections.abc import Mapping

from keelgate.core.audit import AuditDraft, utc_now
from keelgate.core.gateway import in_flight_elsewhere, once_not_in_flight
from keelgate.core.persistence import persist
from keelgate.core.protocols import IdempotencyStore, Stores, Tool
from keelgate.core.state import HISTORY_WINDOW, Approval, RunState
from keelgate.core.types import (
    Action,
    ActionResult,
    PendingApproval,
    ResultStatus,
    SideEffect,
    Stop,
    StopReason,
    stricter,
)
from keelgate.errors import SettleError


class ApprovalGate:
    """Asked before each action of a session: may it go to the gateway?"""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        keys: IdempotencyStore,
        *,
        allowed: frozenset[SideEffect],
        busy_wait: float,
    ) -> None:
        self.tools = tools
        self.keys = keys
        self.allowed = allowed
        self.busy_wait = busy_wait

    def check(self, state: RunState, action: Action) -> ActionResult | PendingApproval | None:
        """What stands between ``action`` and the gateway: nothing (None), a decision that it
        does not run (its result: denied), or a person to ask first (the run stops)."""
        # A person's recorded decision stands, whatever the manifest says now.
        approval = state.approvals.get(action.id)
        if approval is not None:
            if approval.approved:
                return None
            return ActionResult(action.id, ResultStatus.DENIED, error=f"denied by {approval.by}")
        tool = self.tools.get(action.tool)
        if tool is None:
            return None  # the gateway reports the unknown tool; nothing runs
        if not (action.requires_approval or tool.requires_approval):
            return None
        side_effect = stricter(tool.side_effect, action.side_effect)
        if side_effect not in self.allowed:
            return None  # the gateway refuses it; no person needs to be asked
        if side_effect is not SideEffect.READ and self._begun(state, tool, action):
            # Its call was made before (the manifest asked no approval then): what it came to
            # is settled first, by the gateway. An approver asked now would be asked about a
            # call that may already have run, and asked again once it is settled.
            return None
        return PendingApproval(action.id, tool.name)

    def _begun(self, state: RunState, tool: Tool, action: Action) -> bool:
        """Whether the action's key is on record, settled or unknown: its call was made.

        A key still in flight in a live process may yet be dropped (a late definite refusal),
        and the call then counts as never made: it is waited for, as the gateway waits, and
        past that the run is busy. A key that is not in flight can no longer disappear, so
        the gateway meets the same record and never calls the tool.
        """
        record = once_not_in_flight(
            lambda: self.keys.get(state.tenant, action.key),
            wait=self.busy_wait,
            busy=lambda record: in_flight_elsewhere(
                state.tenant, state.run, tool, action, here=record.here
            ),
        )
        return record is not None


def recent(approvals: Mapping[str, Approval], iteration: int) -> Mapping[str, Approval]:
    """The recorded decisions a run still keeps when it plans ``iteration``: those of actions
    planned in the last ``HISTORY_WINDOW`` iterations, so a run that asks a person at every
    WRITE does not carry every decision ever made in each checkpoint.

    Dropping an older one can never let a call run unapproved or twice: an action's id names
    the iteration that planned it (``"7:0"``), no later plan reuses it, and the gate is only
    ever asked about the current plan's actions; a dropped decision cannot be made again either
    (``decide`` only takes an action the run awaits now). The decision stays on the audit chain.
    The window leaves a late caller (a retried update, an operator catching up on an Approval
    object) many iterations in which to find the decision it recorded.
    """
    oldest = iteration - HISTORY_WINDOW
    if all(_planned_in(action) >= oldest for action in approvals):
        return approvals  # the usual case: nothing to drop, nothing copied
    return {a: d for a, d in approvals.items() if _planned_in(a) >= oldest}


def _planned_in(action: str) -> int:
    """The iteration an action id names; an id of another shape is kept (never dropped)."""
    head = action.split(":", 1)[0]
    return int(head) if head.isascii() and head.isdigit() else 1 << 62


def decide(stores: Stores, state: RunState, action: str, *, approved: bool, by: str) -> RunState:
    """Record a person's decision on an action the run awaits (``by`` already checked): the
    checkpoint and its ``loop.approved`` or ``loop.denied`` event, together."""
    if action in state.approvals:
        decided = state.approvals[action]
        verdict = "approved" if decided.approved else "denied"
        raise SettleError(state.run, action, f"already {verdict} by {decided.by}")
    if state.stop is None or state.stop.reason is not StopReason.AWAITING_APPROVAL:
        raise SettleError(state.run, action, "the run is not awaiting an approval")
    pending = {p.action: p for p in state.pending}
    if action not in pending:
        waiting = ", ".join(pending) or "none"
        raise SettleError(state.run, action, f"not awaiting approval (awaiting: {waiting})")
    verdict = "approved" if approved else "denied"
    draft = AuditDraft(
        f"loop.{verdict}",  # a denial is not an approval, even with verdict=denied
        {"action": action, "tool": pending[action].tool, "verdict": verdict},
        actor=by,
        key=f"decided:{action}",
    )
    state = state.but(
        seq=state.seq + 1,
        approvals={**state.approvals, action: Approval(approved, by, utc_now())},
        pending=tuple(p for p in state.pending if p.action != action),
        stop=Stop(
            StopReason.AWAITING_APPROVAL,
            f"{pending[action].tool} ({action}) {verdict} by {by}; resume to continue",
            True,
        ),
    )
    # No active time passes while a person decides: this save adds none.
    return persist(stores, state, (*state.outbox, draft), joint=stores.joint)
