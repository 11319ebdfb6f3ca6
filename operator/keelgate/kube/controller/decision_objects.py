"""The Reconciliations and Approvals a run's stop asks people for, made by the AgentRun's
reconcile: one per unknown outcome, one per pending approval, and one already Settled for each
outcome a step pod's confirmer settled. A key the store no longer holds was dropped by its own
live owner after a definite refusal (a timed-out call whose late answer was a refusal): nothing
happened, so nothing is left to settle, nobody is asked and the run goes on.

Why it exists: a person settles or approves by editing an object (``kubectl patch``), so the
object must exist as soon as the run stops for it, under a name computed from the run and the
action (two operators make the same one; a 409 is someone else's create of it). Status is a
subresource, so a new object is created, then shown Pending. Settling them when a person edits
them is ``decisions``'s job, not this module's. It must never settle anything itself (only
record what a step pod's confirmer settled), and never put a tool's argument into an object.
"""

from __future__ import annotations

import contextlib

from keelgate.core.state import RunState
from keelgate.core.types import KeyState, UnknownAction
from keelgate.kube import resources
from keelgate.kube.api_failures import Conflict, Gone
from keelgate.kube.controller.approval_events import ApprovalEvents
from keelgate.kube.controller.approval_status import shown
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.ports import JSON
from keelgate.kube.settle_window import shown_from
from keelgate.kube.times import now

_SETTLED = (KeyState.COMPLETED, KeyState.ABANDONED)
#: The status message of a Reconciliation whose key its owner dropped after a refusal.
NOTHING_TO_SETTLE = (
    "nothing to settle: the call was refused after all and its key dropped (nothing happened); "
    "the run goes on"
)


class DecisionObjects:
    def __init__(self, context: ControllerContext) -> None:
        self._context = context
        self._events = ApprovalEvents(context)

    def unknown_now(self, namespace: str, state: RunState | None) -> tuple[UnknownAction, ...]:
        """Every call of the run whose outcome the store holds unknown now, whatever the spec
        says: the calls the checkpoint's stop lists and the store has not seen settled, and the
        calls of its plan with no result whose keys read unknown, which only the store knows of
        when a step died mid-call and none has run since to record its stop (the spec now
        fails to load, or the run stalls, or it is suspended).

        One per key: a plan that repeats a call gives each repeat the same key, and only the
        first of them was called (the loop stops at it). A later one, not yet started, is
        settled with it and never asked for apart: a Reconciliation of its own would ask a
        person for a decision on a call never made, and show theirs as recorded for it."""
        if state is None:
            return ()
        keys = self._context.stores.idempotency
        listed = {u.action: u for u in state.unknown}
        asked = {u.idempotency_key for u in state.unknown}
        found: list[UnknownAction] = []
        for unknown in state.unknown:
            record = keys.get(namespace, unknown.idempotency_key)
            # No record: dropped after a definite refusal, nothing to settle (``ask_to_settle``).
            if record is not None and record.state not in _SETTLED:
                found.append(unknown)
        for action in state.plan.actions if state.plan is not None else ():
            if action.id in listed or action.key in asked:
                continue
            if state.result_of(action.id) is not None:
                continue
            asked.add(action.key)
            record = keys.get(namespace, action.key)
            if record is not None and record.state is KeyState.OUTCOME_UNKNOWN:
                found.append(
                    UnknownAction(action.id, action.tool, action.key, record.not_executed_after)
                )
        return tuple(found)

    def ask_to_settle(self, run: JSON, unknowns: tuple[UnknownAction, ...]) -> bool:
        """Make sure each unknown action has its Reconciliation; True when all are settled
        (in the store: a person may have settled one there, mirrored into its object next), or
        no longer on record: its owner dropped the key after a definite refusal (a timed-out
        call answered late with a refusal), so nothing happened and nobody has anything to
        settle; a Reconciliation made for it meanwhile says so."""
        context = self._context
        namespace = run["metadata"]["namespace"]
        settled = True
        for unknown in unknowns:
            record = context.stores.idempotency.get(namespace, unknown.idempotency_key)
            name = context.object_name(
                "Reconciliation", namespace, run["metadata"]["name"], unknown.action, unknown.tool
            )
            body = resources.reconciliation(run, unknown, name=name)
            existing = self._cached_reconciliation(run, name)
            if record is None:
                if existing is not None:
                    self._nothing_to_settle(run, existing, unknown)
                continue
            done = record.state in _SETTLED
            settled = settled and done
            if existing is None:
                shown: JSON = {"phase": "Pending"}
                if record.sendable and record.deadline is not None:
                    # The moment a "not executed" written on it counts from (the call may be
                    # sent until its deadline; the clocks may be this far apart).
                    shown["notExecutedAfter"] = shown_from(record.deadline)
                if self._create_pending("Reconciliation", namespace, body, shown):
                    context.events.warning(
                        run,
                        "OutcomeUnknown",
                        f"{unknown.tool} ({unknown.action}) may or may not have run: "
                        f"settle reconciliation {name}",
                    )
            elif done and (existing.get("status") or {}).get("phase") != "Settled":
                # Settled elsewhere: the Reconciliation's reconcile mirrors it.
                context.enqueue(("Reconciliation", namespace, name), 0.0)
        return settled

    def _nothing_to_settle(self, run: JSON, existing: JSON, unknown: UnknownAction) -> None:
        """A Reconciliation whose key its owner dropped after a definite refusal: its status
        says there is nothing to settle (once, with a Normal Event on the run). It stays
        Pending: nobody decided anything, and a decision patched into it is refused as having
        nothing to settle."""
        status = existing.get("status") or {}
        if status.get("phase") == "Settled" or status.get("message"):
            return  # said already (or a decision patched in was refused, saying why)
        context = self._context
        meta = existing["metadata"]
        try:
            patched = context.api.patch_status(
                "Reconciliation", meta["namespace"], meta["name"], {"message": NOTHING_TO_SETTLE}
            )
        except (Conflict, Gone):
            return  # looked at again with the run
        context.cache.put("Reconciliation", patched)
        context.events.normal(
            run,
            "NothingToSettle",
            f"{unknown.tool} ({unknown.action}) was refused after all (nothing happened): "
            f"reconciliation {meta['name']} has nothing to settle",
        )

    def ask_to_approve(self, run: JSON, state: RunState) -> None:
        """Make sure each pending approval has its Approval (this is where an action starts
        waiting for people); and look again at each Approval whose action the store holds
        decided or still waiting: that shows a decision made elsewhere (``keelgate approve``,
        another operator), the count so far, and makes an Approval whose action is asked again
        (its approvals stopped counting before the call ran) Pending again."""
        context = self._context
        namespace = run["metadata"]["namespace"]
        label = run["metadata"]["name"]
        waiting = {p.action for p in state.pending}
        if state.approvals or waiting:
            # Only the names are wanted: no Approval's body is copied to find them.
            for key in context.cache.keys(
                "Approval",
                lambda b: (
                    (b.get("metadata") or {}).get("namespace") == namespace
                    and (b.get("spec") or {}).get("runName") == label
                    and (
                        (b.get("spec") or {}).get("action") in waiting
                        or (
                            (b.get("status") or {}).get("phase") != "Settled"
                            and (b.get("spec") or {}).get("action") in state.approvals
                        )
                    )
                ),
            ):
                context.enqueue(key, 0.0)
        keys = {a.id: a.key for a in state.plan.actions} if state.plan is not None else {}
        for pending in state.pending:
            name = context.object_name(
                "Approval", namespace, label, pending.action, pending.tool, round=pending.round
            )
            if context.cache.get("Approval", namespace, name) is not None:
                continue  # an earlier run's, held by its finalizer, stays until it is let go
            body = resources.approval(run, pending, keys.get(pending.action, ""), name=name)
            view = shown(state, pending.action, at=context.clock())
            status = dict(view.status) if view is not None else {"phase": "Pending"}
            if self._create_pending("Approval", namespace, body, status):
                self._events.waiting(run, name, pending, again=False)

    def show_confirmer_settlements(self, run: JSON, state: RunState) -> None:
        """A step pod's confirmer may settle an unknown outcome without the run ever stopping
        (it asks on the attempt after a crash): record each such settlement as a
        Reconciliation, already Settled with source confirmer, so people see what was decided
        for them (one per key, as ``unknown_now`` asks: a repeat of the call under the same key,
        never made, is not shown as settled by anyone)."""
        if state.plan is None:
            return
        context = self._context
        namespace = run["metadata"]["namespace"]
        shown: set[str] = set()
        for action in state.plan.actions:
            if action.key in shown:
                continue
            shown.add(action.key)
            record = context.stores.idempotency.get(namespace, action.key)
            if record is None or record.source != "confirmer":
                continue
            name = context.object_name(
                "Reconciliation", namespace, run["metadata"]["name"], action.id, action.tool
            )
            if self._cached_reconciliation(run, name) is not None:
                continue
            body = resources.reconciliation(
                run, UnknownAction(action.id, action.tool, action.key), name=name
            )
            verdict = "executed" if record.state is KeyState.COMPLETED else "abandoned"
            try:
                context.api.create_object("Reconciliation", namespace, body)
                settled = context.api.patch_status(
                    "Reconciliation",
                    namespace,
                    name,
                    {
                        "phase": "Settled",
                        "verdict": verdict,
                        "source": "confirmer",
                        "settledBy": record.settled_by,
                        "settledAt": now(),
                    },
                )
            except (Conflict, Gone):
                continue
            context.cache.put("Reconciliation", settled)
            context.events.normal(
                run,
                "Settled",
                f"{action.tool} ({action.id}) settled as {verdict} by the confirmer "
                f"{record.settled_by}: reconciliation {name}",
            )

    def _cached_reconciliation(self, run: JSON, name: str) -> JSON | None:
        """The Reconciliation ``name`` of ``run``'s namespace as the cache shows it; None when it is
        controlled by another AgentRun (one of the run's name deleted before): the garbage
        collector takes that one, and if the operator's watch was away then (a watch that
        reconnects never reports what was deleted meanwhile) the cache would keep it, and the
        name, for good. This run's own object is then made; a 409 says the other is still
        there, and the run's next look tries again."""
        meta = run["metadata"]
        found = self._context.cache.get("Reconciliation", meta["namespace"], name)
        if found is None:
            return None
        owners = found.get("metadata", {}).get("ownerReferences") or []
        of_another_run = any(
            ref.get("controller")
            and ref.get("kind") == "AgentRun"
            and ref.get("uid") != meta["uid"]
            for ref in owners
        )
        return None if of_another_run else found

    def _create_pending(self, kind: str, namespace: str, body: JSON, status: JSON) -> bool:
        """Create a Reconciliation or Approval and show it Pending with ``status`` (status is a
        subresource: a create cannot set it); False when another made it first (a 409)."""
        api, cache = self._context.api, self._context.cache
        try:
            created = api.create_object(kind, namespace, body)
        except Conflict:
            return False
        with contextlib.suppress(Conflict, Gone):  # shown Pending at the next look instead
            created = api.patch_status(kind, namespace, body["metadata"]["name"], status)
        cache.put(kind, created)
        return True
