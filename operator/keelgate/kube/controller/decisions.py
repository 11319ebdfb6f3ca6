"""The Reconciliation reconciler, and the refusal handling it shares with the Approval
reconciler (``approvals``).

A person settles an unknown outcome by editing the Reconciliation (``spec.executed``, with
``spec.by``); this reconciler records that decision in the store through the same ``Loop``
method the CLI calls (``reconcile``), then shows it Settled in the object's status and wakes the
run. A decision already recorded in the store (made with ``keelgate reconcile``, or by a step
pod's confirmer) is mirrored instead, and wins: the first decision stands. A decision the loop
refuses (or one whose run the store does not have) shows in the object's status (``message`` and
``Stalled=True``, so kstatus tools and Argo CD see it), is told in one Warning Event per
distinct reason, and is tried again with a growing back-off; "not executed" made before the
call's write deadline (until then a held-up process may still send it) is held, shown in the
object's status, and recorded once the deadline has passed, unless the call's own result arrived
first. What is particular to the kind is in ``DecisionKind`` (``RECONCILIATION``). This module
must never record a decision nobody made, nor change one already recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from keelgate.core.loop import Loop
from keelgate.core.types import KeyState
from keelgate.errors import InputError, RunNotFound, SettleError, SettleTooEarly
from keelgate.kube.api_failures import Gone
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.outcomes import REST, Requeue, Result
from keelgate.kube.controller.ports import JSON, Key
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


def refuse(
    context: ControllerContext, kind: str, body: JSON, run_name: str, reason: str, message: str
) -> Result:
    """A decision the loop refused, or whose run the store does not have (``body``, a
    Reconciliation or an Approval, of ``kind``): shown Pending in the object's status
    (``Stalled=True`` with the reason), told once per distinct message in a Warning, and tried
    again after a wait that grows with how long it has been refused (10 s, then as long as it
    has been refused so far, at most 5 minutes)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
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
        try:
            patched = context.api.patch_status(kind, namespace, name, shown)
        except Gone:
            return REST
        context.cache.put(kind, patched)
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


@dataclass(frozen=True)
class Decided:
    """A decision as the store records it: yes (executed) or no, by whom, and its source
    (``human`` or ``confirmer``; "" when the store names none)."""

    yes: bool
    by: str
    source: str = ""


@dataclass(frozen=True)
class DecisionKind:
    """What the reconciler says and reads of its kind: the words status and Events use, the
    spec field a person sets, and how the store is read and written."""

    kind: str  # the object's kind
    field: str  # the spec field holding the person's decision
    yes: str  # the verdicts, as status shows them
    no: str
    refused: str  # the Warning's reason when the loop refuses the decision
    #: The decision the store holds for the object's spec (None: undecided there).
    recorded: Callable[[ControllerContext, str, JSON], Decided | None]
    #: Record a person's decision in the store (raises what the loop raises on a refusal).
    record: Callable[[Loop, str, JSON, bool], None]

    def verdict(self, decided: Decided) -> str:
        return self.yes if decided.yes else self.no

    def status(self, decided: Decided, old: JSON) -> JSON:
        at = now()
        conditions = [
            condition(old, "Ready", "True", "Settled", self.verdict(decided), generation=0, now=at),
            condition(old, "Stalled", "False", "Settled", generation=0, now=at),
        ]
        return {
            "phase": "Settled",
            "verdict": self.verdict(decided),
            "source": decided.source or "human",
            "settledBy": decided.by,
            "settledAt": at,
            "message": "",
            "conditions": with_generation(conditions, old),
        }

    def told(self, decided: Decided, spec: JSON, name: str) -> tuple[str, str]:
        """The Normal Event on the run: its reason and message."""
        what = f"{spec.get('tool')} ({spec.get('action', '')})"
        source = decided.source or "human"
        return "Settled", (
            f"{what} settled as {self.verdict(decided)} by {decided.by} ({source}): "
            f"reconciliation {name}"
        )


def _settlement(context: ControllerContext, namespace: str, spec: JSON) -> Decided | None:
    record = context.stores.idempotency.get(namespace, str(spec.get("idempotencyKey", "")))
    if record is None or record.state not in (KeyState.COMPLETED, KeyState.ABANDONED):
        return None
    return Decided(record.state is KeyState.COMPLETED, record.settled_by, record.source or "")


def _settle(loop: Loop, namespace: str, spec: JSON, executed: bool) -> None:
    run, action = str(spec.get("runName", "")), str(spec.get("action", ""))
    loop.reconcile(namespace, run, action, executed=executed, by=str(spec.get("by", "")))


RECONCILIATION = DecisionKind(
    kind="Reconciliation",
    field="executed",
    yes="executed",
    no="abandoned",
    refused="SettleRefused",
    recorded=_settlement,
    record=_settle,
)


class DecisionReconciler:
    def __init__(self, context: ControllerContext, kind: DecisionKind) -> None:
        self._context = context
        self._kind = kind

    def reconcile(self, key: Key) -> Result:
        """Record the decision the object holds (or mirror the one the store holds), show it
        Settled, and wake the run."""
        context, kind = self._context, self._kind
        _, namespace, name = key
        body = context.cache.get(kind.kind, namespace, name)
        if body is None or (body.get("status") or {}).get("phase") == "Settled":
            return REST
        spec = body.get("spec") or {}
        run_name = str(spec.get("runName", ""))
        wanted = spec.get(kind.field)
        decided = kind.recorded(context, namespace, spec)
        if decided is None:
            if wanted is None:
                return REST  # waiting for a person
            try:
                kind.record(context.loop, namespace, spec, bool(wanted))
            except SettleTooEarly as early:
                return self._hold(body, run_name, early)
            except (SettleError, RunNotFound, InputError) as error:
                decided = kind.recorded(context, namespace, spec)
                if decided is None:
                    reason = "RunNotFound" if isinstance(error, RunNotFound) else kind.refused
                    return refuse(context, kind.kind, body, run_name, reason, str(error))
            else:
                decided = kind.recorded(context, namespace, spec)
        if decided is None:
            return Requeue(1.0)
        if wanted is not None and bool(wanted) != decided.yes:
            warn(
                context,
                body,
                run_name,
                "DecidedElsewhere",
                f"{spec.get('action', '')} was already settled as {kind.verdict(decided)} by "
                f"{decided.by}; that decision stands",
            )
        try:
            patched = context.api.patch_status(
                kind.kind, namespace, name, kind.status(decided, body)
            )
        except Gone:
            return REST
        context.cache.put(kind.kind, patched)
        run = context.cache.get("AgentRun", namespace, run_name)
        if run is not None:
            reason, message = kind.told(decided, spec, name)
            context.events.normal(run, reason, message)
        context.enqueue(("AgentRun", namespace, run_name), 0.0)
        return REST

    def _hold(self, body: JSON, run_name: str, early: SettleTooEarly) -> Result:
        """Hold a "not executed" made before the call's write deadline: say so in the object's
        status (once, with a Normal Event on the run) and try again when it has passed."""
        context = self._context
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        message = (
            f"not executed is held until {early.not_before}: until then the call may still be "
            "sent by a process that was held up; it is recorded then, unless the call's own "
            "result arrives first"
        )
        status = body.get("status") or {}
        if status.get("message") != message:
            shown = {"phase": "Pending", "notExecutedAfter": early.not_before, "message": message}
            try:
                patched = context.api.patch_status(self._kind.kind, namespace, name, shown)
            except Gone:
                return REST
            context.cache.put(self._kind.kind, patched)
            run = context.cache.get("AgentRun", namespace, run_name)
            context.events.normal(
                run or body, "SettlementHeld", f"reconciliation {name}: {message}"
            )
        return Requeue(early.retry_after + 0.5)
