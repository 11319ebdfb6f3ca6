"""The finalizer on each Approval: a deletion waits until the decisions on it are recorded.

Why it exists: people decide by appending to an Approval, and the operator records each entry
in the store when it looks. An Approval deleted while no operator watches (a rollout, the
operator down) would take a deny added just before with it: the operator, back, finds no
Approval, makes a fresh one of the same name, and an approval on that one runs the WRITE. So
the operator makes each Approval with ``keelgate.dev/decisions`` among its finalizers: a
deletion (``kubectl delete approval``, a run deleted and its Approval garbage-collected, a
namespace deleted) only marks it, and the operator, when it looks, records every entry as it
would on a live object, then removes its finalizer, and the object goes. Admission keeps people
from removing the finalizer or adding decisions to an Approval being deleted.

When the finalizer goes: on a deleted Approval, once no deny on it that the store does not hold
could still count (each entry was recorded, or refused while the run asked for that action, or
the action can no longer be decided: denied, its call made, the run finished or gone, the run's
action another call). An approval the store does not hold is never a reason to wait: losing one
only asks people again. A live Approval keeps the finalizer while a decision on it may still
count, and loses it once none can (its run finished, its action denied or its call made), so
``helm uninstall`` and a namespace's deletion do not wait on a finished run's Approvals; one
made by an earlier release gets it. This module must never remove the finalizer while a deny
that may still count is unrecorded, nor record anything itself (the Approval reconciler does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from keelgate.core.approvals import asked_now
from keelgate.core.state import RunState
from keelgate.core.types import StopReason
from keelgate.kube.api_failures import Conflict, Gone
from keelgate.kube.controller.approval_entries import entries, recorded_refs
from keelgate.kube.controller.approvals import Looked
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.outcomes import LOST_RACE, REST, Requeue, Result
from keelgate.kube.controller.ports import JSON, Key
from keelgate.kube.controller.refusals import REFUSED_RETRY_MAX
from keelgate.kube.naming import DECISIONS_FINALIZER

log = logging.getLogger("keelgate.operator")

#: The stops a run never leaves: nothing it planned is asked again.
_FINISHED = (StopReason.GOAL_MET, StopReason.FAILED)


class Looks(Protocol):
    def look(self, key: Key) -> Looked: ...


def may_still_count(state: RunState | None, action: str, key: str) -> bool:
    """Whether a decision on ``action`` (the call whose idempotency key is ``key``) that the
    store does not hold could still be recorded, now or when the run asks for it again: the run
    is on record and not finished, nobody denied the action, its call was not made, and the
    run's action of that id is still that call."""
    if state is None:
        return False
    if state.stop is not None and state.stop.reason in _FINISHED:
        return False
    if any(not d.approved for d in state.approvals.get(action, ())):
        return False
    if state.result_of(action) is not None:
        return False
    planned = state.planned(action)
    return planned is not None and (not key or planned.key == key)


def waiting_deny(body: Mapping[str, Any], state: RunState | None) -> str:
    """Who made a deny on ``body`` that the store does not hold and that may still count
    later: the run does not ask about the action now (when it does, the reconcile has just
    tried each entry), but may. "" when there is none, and a deleted Approval may go."""
    spec = body.get("spec") or {}
    action, key = str(spec.get("action", "")), str(spec.get("idempotencyKey") or "")
    if (
        state is None
        or not may_still_count(state, action, key)
        or asked_now(state, action) is not None
    ):
        return ""
    recorded = recorded_refs(body, state.approvals.get(action, ()))
    unrecorded = [e.by for e in entries(body) if not e.approved and e.ref not in recorded]
    return unrecorded[0] if unrecorded else ""


class FinalizedApprovals:
    """The Approval reconciler's look, then its finalizer kept, added or removed."""

    def __init__(self, context: ControllerContext, looks: Looks) -> None:
        self._context = context
        self._looks = looks

    def reconcile(self, key: Key) -> Result:
        # Judged by the state the look tried each entry against, not a second read: one read
        # fewer on every look, and a run that stops to ask again after the look refused a deny
        # (between stops then) does not release the deny unrecorded.
        _, namespace, name = key
        before = self._context.cache.get("Approval", namespace, name)
        looked = self._looks.look(key)
        result, state = looked.result, looked.state
        body = self._context.cache.get("Approval", namespace, name)
        if body is None:
            return result
        meta = body["metadata"]
        finalizers = [str(f) for f in meta.get("finalizers") or ()]
        held = DECISIONS_FINALIZER in finalizers
        spec = body.get("spec") or {}
        run_name = str(spec.get("runName", ""))
        if meta.get("deletionTimestamp"):
            if not held:
                return result
            if before is None or before.get("spec") != body.get("spec"):
                # Entries the look may not have tried (added as it looked): looked at again
                # before it may go.
                return LOST_RACE
            who = waiting_deny(body, state)
            if who:
                # The run is between stops: the deny is recorded when it asks again (or
                # released once the action can no longer be decided).
                log.info(
                    "approval %s/%s is held: %s's deny is recorded when run %s asks again",
                    namespace,
                    name,
                    who,
                    run_name,
                )
                return _sooner(result, Requeue(REFUSED_RETRY_MAX))
            released = [f for f in finalizers if f != DECISIONS_FINALIZER]
            return self._set(body, released, run_name) or result
        if state is None:
            return result  # no checkpoint yet (or no longer): nothing to judge by
        action = str(spec.get("action", ""))
        wanted = may_still_count(state, action, str(spec.get("idempotencyKey") or ""))
        if wanted == held:
            return result
        changed = (
            [*finalizers, DECISIONS_FINALIZER]
            if wanted
            else [f for f in finalizers if f != DECISIONS_FINALIZER]
        )
        return self._set(body, changed, run_name) or result

    def _set(self, body: JSON, finalizers: list[str], run_name: str) -> Result | None:
        """Write ``finalizers`` onto ``body``'s object, guarded by its resourceVersion; a
        Result when the reconcile must look again (the object changed meanwhile)."""
        context = self._context
        meta = body["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        try:
            answer = context.api.set_finalizers(
                "Approval",
                namespace,
                name,
                finalizers,
                resource_version=str(meta.get("resourceVersion") or ""),
            )
        except Conflict:
            return LOST_RACE
        except Gone:
            return None
        context.cache.put("Approval", answer)
        if meta.get("deletionTimestamp") and not finalizers:
            # Its last finalizer gone, the object is gone: the run's next look makes a fresh
            # Approval if the action still waits (the deny, if any, is recorded).
            context.cache.forget_vanished("Approval", namespace, name, str(meta.get("uid") or ""))
            context.enqueue(("AgentRun", namespace, run_name), 0.0)
        return None


def _sooner(first: Result, second: Requeue) -> Result:
    """The earlier of two looks asked for (a rest asks for none)."""
    if first == REST or not isinstance(first, Requeue):
        return second
    return first if first.after <= second.after else second
