"""What the Reconciliation and Approval reconcilers do with a decision the loop refuses.

Why it exists: a person's decision the store will not take (the loop refuses it, or the store
has no such run) is shown in the object's status, told once in a Warning, and tried again
later, the same way for either kind (and an Approval's entries that cannot be recorded while
the store cannot be reached are shown not counted yet); the two reconcilers share this module
rather than import each other (a contract in pyproject.toml keeps the reconcilers independent),
and with it how either shows a status (``show_status``). It records nothing in the store, and
must never show a decision as made.
"""

from __future__ import annotations

from collections.abc import Sequence

from keelgate.core.redaction import redacted_line
from keelgate.errors import StoreUnavailable
from keelgate.kube.api_failures import Gone
from keelgate.kube.controller.approval_entries import Entry
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.outcomes import REST, Requeue, Result
from keelgate.kube.controller.ports import JSON
from keelgate.kube.status import condition
from keelgate.kube.times import now, parse_time

#: How long a refused decision waits before it is tried again: at first, and at most (the wait
#: grows with how long it has been refused).
REFUSED_RETRY = 10.0
REFUSED_RETRY_MAX = 300.0


def with_generation(conditions: list[JSON], body: JSON) -> list[JSON]:
    """The conditions, each with the object's generation (the spec they answer)."""
    generation = int((body.get("metadata") or {}).get("generation") or 1)
    return [{**c, "observedGeneration": generation} for c in conditions]


def show_status(context: ControllerContext, kind: str, body: JSON, status: JSON) -> bool:
    """Patch ``status`` onto the object ``body`` (of ``kind``) and keep the answer in the cache;
    False when the object is gone (deleted since it was read: nothing left to show)."""
    meta = body["metadata"]
    try:
        patched = context.api.patch_status(kind, meta["namespace"], meta["name"], status)
    except Gone:
        return False
    context.cache.put(kind, patched)
    return True


def refuse(
    context: ControllerContext, kind: str, body: JSON, run_name: str, reason: str, message: str
) -> Result:
    """A decision the loop refused, or whose run the store does not have (``body``, a
    Reconciliation or an Approval, of ``kind``): shown Pending in the object's status
    (``Stalled=True`` with the reason), told once per distinct message in a Warning, and tried
    again after a wait that grows with how long it has been refused (10 s, then as long as it
    has been refused so far, at most 5 minutes)."""
    old = body.get("status") or {}
    at = now()
    stalled = condition(old, "Stalled", "True", reason, message, generation=0, now=at)
    shown = {
        "phase": "Pending",
        "message": message,
        "conditions": with_generation(
            [
                condition(old, "Ready", "False", reason, message, generation=0, now=at),
                stalled,
            ],
            body,
        ),
    }
    if old.get("message") != message or old.get("conditions") != shown["conditions"]:
        if not show_status(context, kind, body, shown):
            return REST
        if old.get("message") != message:
            warn(context, body, run_name, reason, message)
    # The Stalled condition just shown keeps its time while the refusal stands.
    since = parse_time(stalled["lastTransitionTime"])
    refused_for = 0.0 if since is None else max(0.0, context.clock() - since.timestamp())
    return Requeue(min(REFUSED_RETRY_MAX, max(REFUSED_RETRY, refused_for)))


def warn(context: ControllerContext, body: JSON, run_name: str, reason: str, message: str) -> None:
    """A Warning on the run (on the object itself if the run is not in the cache)."""
    namespace = body["metadata"]["namespace"]
    run = context.cache.get("AgentRun", namespace, run_name)
    context.events.warning(run or body, reason, message)


def not_recordable(
    context: ControllerContext, body: JSON, found: Sequence[Entry], error: StoreUnavailable
) -> Result | None:
    """An Approval whose new entries cannot be recorded, this operator cannot reach the store
    (its cluster cut off): shown not counted yet, per person, where they look, since the run
    may go on in a cluster that can reach it, without them (``Stalled``, reason
    ``StoreUnavailable``). None when nothing a person added waits (every entry shown recorded,
    or the object settled)."""
    old = body.get("status") or {}
    recorded = set(old.get("approvedBy") or ())
    waiting = [e for e in found if not (e.approved and e.by in recorded)]
    if not waiting or old.get("phase") == "Settled":
        return None
    why = (
        f"not counted here yet: this cluster's operator cannot reach the store "
        f"({redacted_line(error)}); it counts only once it is recorded (tried again)"
    )
    said = "; ".join(f"{by}: {why}" for by in dict.fromkeys(e.by for e in waiting))
    run_name = str((body.get("spec") or {}).get("runName", ""))
    return refuse(context, "Approval", body, run_name, "StoreUnavailable", said)
