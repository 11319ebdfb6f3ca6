"""The Reconciliation reconciler: a person's settlement of an unknown outcome, from the object
into the store.

A person settles an unknown outcome by editing the Reconciliation (``spec.executed``, with
``spec.by``); this reconciler records that decision in the store through the same ``Loop``
method the CLI calls (``reconcile``), then shows it Settled in the object's status and wakes the
run. A decision already recorded in the store (made with ``keelgate reconcile``, or by a step
pod's confirmer) is mirrored instead, and wins: the first decision stands. A decision the loop
refuses (or one whose run the store does not have) shows in the object's status (``message`` and
``Stalled=True``, so kstatus tools and Argo CD see it), is told in one Warning Event per
distinct reason, and is tried again with a growing back-off (``refusals``, shared with the
Approval reconciler); "not executed" written before the call's write deadline (until then a
held-up process may still send it, so the person's look says nothing of what came after) is
held, shown in the object's status, and refused once the deadline has passed (``too_early``),
unless the call's own result arrived first: it counts only written again after the deadline, or
corrected to executed, by its maker. A decision on a run another
operator holds in the store (another cluster's, or this cluster's before a hand-over) is refused
(``HeldElsewhere``, naming the holder) and tried again: decisions count in the cluster holding
the run, through the store's compare-and-set on the key, once. This module must never record a
decision nobody made, nor change one already recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

from keelgate.core.types import KeyRecord, KeyState
from keelgate.errors import InputError, RunNotFound, SettleError, SettleTooEarly
from keelgate.kube.controller.approval_entries import written_at
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.outcomes import REST, Requeue, Result
from keelgate.kube.controller.ownership import HeldElsewhere
from keelgate.kube.controller.ports import JSON, Key
from keelgate.kube.controller.refusals import refuse, show_status, warn, with_generation
from keelgate.kube.settle_window import CLOCK_SKEW, TOO_EARLY, counts_from, shown_from
from keelgate.kube.status import condition
from keelgate.kube.times import now, parse_time, stamp


@dataclass(frozen=True)
class Decided:
    """A settlement as the store records it: executed or not, by whom, and its source
    (``human`` or ``confirmer``; "" when the store names none)."""

    yes: bool
    by: str
    source: str = ""

    @property
    def verdict(self) -> str:
        """The verdict, as status shows it."""
        return "executed" if self.yes else "abandoned"


def settled_status(decided: Decided, body: JSON) -> JSON:
    """The status of a Reconciliation ``body`` settled as ``decided``."""
    at = now()
    conditions = [
        condition(body, "Ready", "True", "Settled", decided.verdict, generation=0, now=at),
        condition(body, "Stalled", "False", "Settled", generation=0, now=at),
    ]
    return {
        "phase": "Settled",
        "verdict": decided.verdict,
        "source": decided.source or "human",
        "settledBy": decided.by,
        "settledAt": at,
        "message": "",
        "conditions": with_generation(conditions, body),
    }


def _record(context: ControllerContext, namespace: str, spec: JSON) -> KeyRecord | None:
    """What the store holds of the Reconciliation's key (None: nothing)."""
    return context.stores.idempotency.get(namespace, str(spec.get("idempotencyKey", "")))


def _recorded(context: ControllerContext, namespace: str, spec: JSON) -> Decided | None:
    """The settlement the store holds for the Reconciliation's key (None: undecided there)."""
    return _settled(_record(context, namespace, spec))


def _settled(record: KeyRecord | None) -> Decided | None:
    """The settlement ``record`` holds (None: undecided)."""
    if record is None or record.state not in (KeyState.COMPLETED, KeyState.ABANDONED):
        return None
    return Decided(record.state is KeyState.COMPLETED, record.settled_by, record.source or "")


class ReconciliationReconciler:
    def __init__(self, context: ControllerContext) -> None:
        self._context = context

    def reconcile(self, key: Key) -> Result:
        """Record the decision the object holds (or mirror the one the store holds), show it
        Settled, and wake the run."""
        context = self._context
        _, namespace, name = key
        body = context.cache.get("Reconciliation", namespace, name)
        if body is None or (body.get("status") or {}).get("phase") == "Settled":
            return REST
        spec = body.get("spec") or {}
        run_name = str(spec.get("runName", ""))
        wanted = spec.get("executed")  # the person's decision (false: not executed)
        record = _record(context, namespace, spec)
        decided = _settled(record)
        if decided is None:
            if wanted is None:
                return REST  # waiting for a person
            held = context.holding.hold(namespace, run_name)
            if isinstance(held, HeldElsewhere):
                # Recorded by whoever holds the run (another cluster's operator, or this
                # cluster's before a hand-over): refused here, shown, and tried again.
                return refuse(
                    context, "Reconciliation", body, run_name, "HeldElsewhere", held.refusal()
                )
            why = "" if wanted is not False else too_early(record, body)
            if why:
                return refuse(context, "Reconciliation", body, run_name, TOO_EARLY, why)
            try:
                context.loop.reconcile(
                    namespace,
                    run_name,
                    str(spec.get("action", "")),
                    executed=bool(wanted),
                    by=str(spec.get("by", "")),
                )
            except SettleTooEarly as early:
                return self._hold(body, run_name, early)
            except (SettleError, RunNotFound, InputError) as error:
                decided = _recorded(context, namespace, spec)
                if decided is None:
                    reason = "RunNotFound" if isinstance(error, RunNotFound) else "SettleRefused"
                    return refuse(context, "Reconciliation", body, run_name, reason, str(error))
            else:
                decided = _recorded(context, namespace, spec)
        if decided is None:
            return Requeue(1.0)
        if wanted is not None and bool(wanted) != decided.yes:
            warn(
                context,
                body,
                run_name,
                "DecidedElsewhere",
                f"{spec.get('action', '')} was already settled as {decided.verdict} by "
                f"{decided.by}; that decision stands",
            )
        if not show_status(context, "Reconciliation", body, settled_status(decided, body)):
            return REST
        run = context.cache.get("AgentRun", namespace, run_name)
        if run is not None:
            what = f"{spec.get('tool')} ({spec.get('action', '')})"
            context.events.normal(
                run,
                "Settled",
                f"{what} settled as {decided.verdict} by {decided.by} "
                f"({decided.source or 'human'}): reconciliation {name}",
            )
        context.enqueue(("AgentRun", namespace, run_name), 0.0)
        return REST

    def _hold(self, body: JSON, run_name: str, early: SettleTooEarly) -> Result:
        """A "not executed" met before the call's write deadline: say so in the object's
        status (once, with a Normal Event on the run), with the generation it was met in
        (``heldGeneration``: that write never counts), and look again when the deadline has
        passed (a result of the call's own may have come; else ``too_early`` refuses it)."""
        context = self._context
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        deadline = parse_time(early.not_before)
        after = early.not_before if deadline is None else shown_from(deadline.timestamp())
        message = (
            f"not executed was written before {after}: until then the call may "
            "still be sent by a process that was held up, so it cannot count; once that moment "
            "has passed, look again at what the call acts on and write your decision again "
            "(spec.decidedAt set to when you looked, or executed: true if it ran), unless the "
            "call's own result arrives first"
        )
        status = body.get("status") or {}
        generation = int(body["metadata"].get("generation") or 0)
        if status.get("message") != message or status.get("heldGeneration") != generation:
            shown = {
                "phase": "Pending",
                "notExecutedAfter": after,
                "heldGeneration": generation,
                "message": message,
            }
            if not show_status(context, "Reconciliation", body, shown):
                return REST
            run = context.cache.get("AgentRun", namespace, run_name)
            context.events.normal(
                run or body, "SettlementHeld", f"reconciliation {name}: {message}"
            )
        return Requeue(early.retry_after + CLOCK_SKEW + 0.5)


def too_early(record: KeyRecord | None, body: JSON) -> str:
    """Why the object's "not executed" cannot count ("" when it can), its key's record in the
    store being ``record`` (read as the reconcile began): it was written before
    the call's write deadline had passed, so a process held up between its claim and its send
    may have sent the call after the person looked (a decision true when made, false when
    recorded). What the operator knows of when it was written: the generation it met before
    the deadline and held (``heldGeneration``); the moment the person states (``decidedAt``);
    and the API server's record of the object's last write other than status
    (``managedFields``, whole seconds, on its clock), each against ``settle_window.counts_from``
    (the deadline, and the skew allowed between the two clocks). Not knowing is a reason to
    refuse: a write no record dates is taken as early. Its maker writes it again once they have
    looked again (a new ``decidedAt``), or corrects it to executed."""
    spec = body.get("spec") or {}
    if record is None or record.deadline is None or record.sendable:
        # Nothing on record to send, or claimed before deadlines were recorded; or its deadline
        # not passed yet, and the store refuses "not executed" itself (the decision is held).
        return ""
    deadline = shown_from(record.deadline)
    by = str(spec.get("by") or "someone")
    again = (
        "; look again at what the call acts on and write your decision again (spec.decidedAt "
        "set to when you looked, or executed: true if it ran)"
    )
    status = body.get("status") or {}
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    if generation and status.get("heldGeneration") == generation:
        return (
            f"not executed by {by} was written before {deadline}, while the call could still "
            f"be sent, so it may have gone out after {by} looked{again}"
        )
    stated = str(spec.get("decidedAt") or "")
    if stated:
        moment = parse_time(stated)
        if moment is None or moment.timestamp() < counts_from(record.deadline):
            return (
                f"not executed by {by} says it was decided at {stated}, before {deadline}, "
                f"while the call could still be sent{again}"
            )
    written = written_at(body)
    if written is None:
        return (
            f"not executed by {by}: nothing says it was written after {deadline}, before "
            f"which the call could still be sent{again}"
        )
    if written < counts_from(record.deadline):
        return (
            f"not executed by {by} was written at {stamp(written)}, before {deadline}, while "
            f"the call could still be sent{again}"
        )
    return ""
