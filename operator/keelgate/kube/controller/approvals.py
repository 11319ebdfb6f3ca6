"""The Approval reconciler: people's decisions, from the object into the store, one by one.

Why it exists: people decide an Approval by appending to its ``spec.decisions`` (or, the
one-decision form, setting ``spec.approved`` and ``spec.by``); admission has made sure each
entry names the user who added it and only groups the API server authenticated them in. This
reconciler records each entry in the store through ``Loop.approve`` (the same rule as
``keelgate approve``: a different person each, from the rule's groups, not the creator if it
says so, for the call whose idempotency key the object names), once (each entry has its own
``ref``), and shows on the object what the store holds: "1 of 2", who counts, when the first
approval stops counting, or Settled approved or denied. The store decides, never the object: a
decision already recorded elsewhere (``keelgate approve``) is shown too, and an entry the loop
refuses is shown and tried again later. An action asked again (its approvals expired before the
call ran) makes a Settled Approval Pending again; its old decisions stay in the object and the
store. This module must never record a decision nobody made, record an entry twice, or change
one already recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keelgate.core.approvals import Tally, tally
from keelgate.core.state import RunState
from keelgate.core.types import ApprovalRule, PendingApproval, utc_iso
from keelgate.errors import InputError, RunNotFound, SettleError
from keelgate.kube.api_failures import Gone
from keelgate.kube.controller.approval_news import ApprovalNews
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.decisions import (
    REFUSED_RETRY,
    REFUSED_RETRY_MAX,
    refuse,
    warn,
    with_generation,
)
from keelgate.kube.controller.outcomes import REST, Requeue, Result
from keelgate.kube.controller.ports import JSON, Key
from keelgate.kube.status import condition
from keelgate.kube.times import now

#: The status fields this reconciler decides (the rest: conditions, settledAt, are kept).
_SHOWN = (
    "phase",
    "verdict",
    "approvals",
    "required",
    "progress",
    "approvedBy",
    "expiresAt",
    "asks",
    "settledBy",
    "decided",
    "message",
)


@dataclass(frozen=True)
class Entry:
    """One decision the object holds: an entry of ``spec.decisions``, or the one-decision form."""

    ref: str
    approved: bool
    by: str
    groups: tuple[str, ...]


def entries(body: Mapping[str, Any]) -> list[Entry]:
    """The object's decisions in order, each with the ``ref`` it is recorded under: the
    one-decision form first, then each entry of ``spec.decisions`` as "<by>#<n>" (that person's
    n-th entry), which no reordering of other people's entries can change."""
    name = str(body["metadata"]["name"])
    spec = body.get("spec") or {}
    found: list[Entry] = []
    if spec.get("approved") is not None and str(spec.get("by") or "").strip():
        found.append(Entry(f"{name}#spec", bool(spec["approved"]), str(spec["by"]), ()))
    seen: dict[str, int] = {}
    for item in spec.get("decisions") or ():
        by = str(item.get("by") or "")
        if not by.strip() or not isinstance(item.get("approved"), bool):
            continue  # the schema refuses such an entry: nothing to record
        seen[by] = seen.get(by, 0) + 1
        groups = tuple(str(g) for g in item.get("groups") or ())
        found.append(Entry(f"{name}#{by}#{seen[by]}", bool(item["approved"]), by, groups))
    return found


@dataclass(frozen=True)
class Shown:
    """What the object shows of the store's record of its action."""

    status: JSON
    settled: bool
    tally: Tally | None
    pending: PendingApproval | None


def shown(state: RunState, action: str, *, at: float) -> Shown | None:
    """The status of the Approval of ``action`` as the store holds it at ``at`` (seconds since
    the epoch); None when the store has nothing to show (not asked, nothing decided)."""
    decisions = state.approvals.get(action, ())
    pending = next((p for p in state.pending if p.action == action), None)
    denied = next((d for d in decisions if not d.approved), None)
    base: JSON = {"decided": len(decisions)}
    if denied is not None:
        return Shown(
            {**base, "phase": "Settled", "verdict": "denied", "settledBy": denied.by},
            True,
            None,
            pending,
        )
    if pending is not None:
        rule = pending.rule or ApprovalRule()
        counted = tally(decisions, rule, creator=state.spec.creator, now=at)
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
            "settledBy": "",
            "message": "waiting for a person to approve or deny it"
            if rule == ApprovalRule()
            else _waiting_for(counted, left),
        }
        return Shown(status, False, counted, pending)
    approvals = [d for d in decisions if d.approved]
    if approvals:
        people = list(dict.fromkeys(d.by for d in approvals))
        return Shown(
            {
                **base,
                "phase": "Settled",
                "verdict": "approved",
                "settledBy": ", ".join(people),
                "approvedBy": people,
                "expiresAt": "",
                "message": "",
            },
            True,
            None,
            None,
        )
    return None


def _waiting_for(counted: Tally, left: int) -> str:
    """ "1 of 2 approvals (alice): waiting for 1 more; the rule asks 2 approvals from ..." """
    who = f" ({', '.join(d.by for d in counted.counted)})" if counted.counted else ""
    said = f"{counted.count} approvals{who}: waiting for {left} more"
    rule = counted.rule.describe()
    plain = f"{counted.rule.required} approval{'s' if counted.rule.required != 1 else ''}"
    return said if rule == plain else f"{said}; the rule asks {rule}"


class ApprovalReconciler:
    def __init__(self, context: ControllerContext) -> None:
        self._context = context
        self._news = ApprovalNews(context)

    def reconcile(self, key: Key) -> Result:
        """Record the object's new decisions, show what the store holds, wake the run."""
        context = self._context
        _, namespace, name = key
        body = context.cache.get("Approval", namespace, name)
        if body is None:
            return REST
        spec, old = body.get("spec") or {}, body.get("status") or {}
        run_name, action = str(spec.get("runName", "")), str(spec.get("action", ""))
        state = context.run_state(namespace, run_name)
        waiting = state is not None and any(p.action == action for p in state.pending)
        if old.get("phase") == "Settled" and not waiting:
            return REST  # decided, and not asked again
        found = entries(body)
        if state is None:
            if not found:
                return REST  # waiting for a person (its run has no checkpoint yet)
            return refuse(
                context,
                "Approval",
                body,
                run_name,
                "RunNotFound",
                str(RunNotFound(namespace, run_name)),
            )
        refused: list[str] = []
        told_before = len(state.approvals.get(action, ()))
        recorded = {d.ref for d in state.approvals.get(action, ()) if d.ref}
        for entry in found:
            if entry.ref in recorded:
                continue
            try:
                context.loop.approve(
                    namespace,
                    run_name,
                    action,
                    approved=entry.approved,
                    by=entry.by,
                    groups=entry.groups,
                    key=str(spec.get("idempotencyKey") or ""),
                    ref=entry.ref,
                )
            except (SettleError, RunNotFound, InputError) as error:
                refused.append(f"{entry.by}: {error}")
            state = context.run_state(namespace, run_name) or state
            recorded = {d.ref for d in state.approvals.get(action, ()) if d.ref}
        at = context.clock()
        view = shown(state, action, at=at)
        if view is None:
            if refused:
                return refuse(
                    context, "Approval", body, run_name, "ApprovalRefused", "; ".join(refused)
                )
            return REST
        self._tell(body, run_name, spec, old, state, view)
        status = dict(view.status)
        refusing = bool(refused) and not view.settled
        if refusing:
            # Shown, not Stalled: the approval still waits for people whose decisions count.
            status["message"] = f"{status.get('message', '')}; not counted: {'; '.join(refused)}"
        told_before_now = old.get("message") == status.get("message")
        result = self._show(body, run_name, old, status, refusing=refusing)
        if result is not None:
            return result
        if view.settled or len(state.approvals.get(action, ())) != told_before:
            # The run goes on (settled), or its status shows the new count.
            context.enqueue(("AgentRun", namespace, run_name), 0.0)
        if refusing:
            # A refusal may pass (the run was between stops): tried again, soon the first time.
            return Requeue(REFUSED_RETRY_MAX if told_before_now else REFUSED_RETRY)
        if view.tally is not None and view.tally.expires_at is not None:
            # Look again when the first approval stops counting: the object then says so.
            return Requeue(max(1.0, view.tally.expires_at - at + 0.5))
        return REST

    def _tell(
        self,
        body: JSON,
        run_name: str,
        spec: Mapping[str, Any],
        old: Mapping[str, Any],
        state: RunState,
        view: Shown,
    ) -> None:
        """The moments this look found: each decision recorded since the object last showed
        the store (wherever it was made), approvals that stopped counting, an action asked
        again."""
        context = self._context
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        action, tool = str(spec.get("action", "")), str(spec.get("tool", ""))
        decisions = state.approvals.get(action, ())
        told = int(old.get("decided") or 0)
        recorded_since = range(min(told, len(decisions)), len(decisions))
        waiting = view.tally is not None and view.pending is not None
        expired = view.tally.expired if view.tally is not None and waiting else ()
        if not recorded_since and not expired and not (waiting and old.get("phase") == "Settled"):
            return  # most looks find nothing to tell: the run's body is not copied for them
        run = context.cache.get("AgentRun", namespace, run_name) or body
        rule = view.pending.rule if view.pending is not None else None
        for index in recorded_since:
            so_far = tally(
                decisions[: index + 1],
                rule or ApprovalRule(),
                creator=state.spec.creator,
                now=context.clock(),
            )
            count = so_far.count if so_far.rule.required > 1 else ""
            self._news.decided(run, name, tool, action, decisions[index], count)
        if view.tally is None or view.pending is None:
            return
        before = set(old.get("approvedBy") or ())
        expires_after = view.tally.rule.expires_after
        if expires_after is not None and view.tally.expired:
            self._news.expired(
                run,
                body,
                view.tally.expired,
                expires_after=expires_after,
                tally=view.tally.count,
                first_time=bool(before & {d.by for d in view.tally.expired}),
            )
        if old.get("phase") == "Settled":
            self._news.waiting(run, name, view.pending, again=True)

    def _show(
        self, body: JSON, run_name: str, old: Mapping[str, Any], status: JSON, *, refusing: bool
    ) -> Result | None:
        """Patch the object's status to ``status`` if it shows something else (a decision that
        does not count is told once, in a Warning); a Result when the reconcile ends here (the
        object is gone)."""
        context = self._context
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        stamp = now()
        settled = status.get("phase") == "Settled"
        verdict = str(status.get("verdict") or "")
        if settled:
            ready = ("True", "Settled", verdict)
        else:
            ready = ("False", "Waiting", str(status.get("progress") or ""))
        reason = "Settled" if settled else "Waiting"
        conditions = [
            condition(old, "Ready", *ready, generation=0, now=stamp),
            condition(old, "Stalled", "False", reason, "", generation=0, now=stamp),
        ]
        status["conditions"] = with_generation(conditions, body)
        if settled:
            status["settledAt"] = old.get("settledAt") if old.get("phase") == "Settled" else stamp
        else:
            status["settledAt"] = ""
        if all(old.get(k) == status.get(k) for k in (*_SHOWN, "conditions", "settledAt")):
            return None
        if refusing and old.get("message") != status.get("message"):
            warn(context, body, run_name, "ApprovalRefused", str(status.get("message") or ""))
        try:
            patched = context.api.patch_status("Approval", namespace, name, status)
        except Gone:
            return REST
        context.cache.put("Approval", patched)
        return None
