"""An AgentRun's ``status``: the run's checkpoint mirrored in the shape Kubernetes tools read.

The checkpoint in the store is the truth; status is its mirror plus what only the operator knows
(the step pod it intends or runs). Conditions follow both the contract and the conventions other
tools read: ``Succeeded`` (``kubectl wait --for=condition=Succeeded``), ``OutcomeUnknown`` and
``AwaitingApproval`` (a person must act), and kstatus's ``Reconciling`` (work under way: Helm's
``--wait`` and Flux read it as in progress) and ``Stalled`` (no progress without a change to the
spec: read as failed), plus ``Ready``. A run that waits for a person is neither reconciling nor
stalled: it is at rest until someone acts. ``LateResult`` is there (True) only while the run lists
a call that ended after someone else had settled its key: the settlement stands, and a person
should look at what really happened; ``Denied`` likewise only while the run keeps an action a
person denied (it never ran: a run that met its goal did so without it). ``Standby`` is there
(True) only while another cluster's operator holds the run in the store: this cluster stands by,
at rest (``Reconciling=False``, reason ``Standby``; kstatus reads it Current). This module is pure:
it never talks to a cluster or a store, and never puts a tool's argument or a secret into
status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from keelgate.core.types import (
    LateResult,
    Outcome,
    PendingApproval,
    RunPhase,
    RunStatus,
    Stop,
    StopReason,
    UnknownAction,
    Usage,
)
from keelgate.kube.settle_window import shown_after

JSON = dict[str, Any]

CONDITION_TYPES = (
    "Succeeded",
    "OutcomeUnknown",
    "AwaitingApproval",
    "Ready",
    "Reconciling",
    "Stalled",
)


@dataclass(frozen=True)
class RunView:
    """What the operator knows of a run at one moment."""

    generation: int
    outcome: Outcome | None  # None: the store holds no checkpoint of it yet
    step: Mapping[str, Any]  # status.step as it is to be written
    stepping: bool  # a step pod is intended or running
    suspended: bool = False
    stalled: str = ""  # why no further step pod will start until the spec changes
    stalled_reason: str = "StepsFailing"  # the Stalled condition's reason when stalled
    waiting: str = ""  # why the intended pod is not created yet (a slot, a back-off)
    # The Reconciling condition's reason while waiting: HeldElsewhere when another operator
    # holds the run in the store (``waiting`` then names it).
    waiting_reason: str = "Waiting"
    # Another cluster's operator holds the run in the store, in words (who, its cluster, the
    # epoch): this cluster stands by (the Standby condition), at rest, neither reconciling nor
    # stalled, so that kstatus reads it Current and no GitOps tool waits on it or fails it.
    standby: str = ""
    reconciliations: Mapping[str, str] = field(default_factory=dict)  # action -> object name
    approvals: Mapping[str, str] = field(default_factory=dict)  # action -> object name
    failpoints_seen: str = ""
    # The run's unknown outcomes as the store holds them now (no step pod to record them: the
    # run rests, is stalled or suspended), shown whatever the checkpoint's stop says; None: as
    # the checkpoint's stop lists them.
    unknown: tuple[UnknownAction, ...] | None = None
    # The actions a person denied, in words ("place_order (2:0) denied by bob: wrong sku"): a
    # run that met its goal without them says so (the Denied condition).
    denied: tuple[str, ...] = ()


def phase_of(view: RunView) -> RunPhase:
    outcome = view.outcome
    if view.stalled:
        # No further pod until the spec changes, which resumes it: a stop, not an end.
        if outcome is None or outcome.phase is RunPhase.RUNNING:
            return RunPhase.STOPPED
        return outcome.phase
    if outcome is None:
        return RunPhase.RUNNING if view.stepping else RunPhase.PENDING
    if view.stepping and outcome.phase in (RunPhase.STOPPED, RunPhase.PENDING):
        return RunPhase.RUNNING  # resuming: the stop is settled and a step is under way
    return outcome.phase


def _listing(items: Mapping[str, str], pairs: Sequence[tuple[str, str]], kind: str) -> str:
    parts = []
    for action, tool in pairs:
        name = items.get(action, "")
        where = f": see {kind} {name}" if name else ""
        parts.append(f"{tool} ({action}){where}")
    return "; ".join(parts)


def condition(
    old: Mapping[str, Any],
    type_: str,
    status: str,
    reason: str,
    message: str = "",
    *,
    generation: int,
    now: str,
) -> JSON:
    """One metav1.Condition of a status whose previous value is ``old``: its transition time
    moves only when its status does, as metav1.Condition requires."""
    previous = {c.get("type"): c for c in old.get("conditions") or []}.get(type_) or {}
    same = previous.get("status") == status and previous.get("lastTransitionTime")
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": previous["lastTransitionTime"] if same else now,
        "observedGeneration": generation,
    }


def desired_status(view: RunView, *, old: Mapping[str, Any], now: str) -> JSON:
    """The whole status the operator wants the AgentRun to show (kopf's part excluded)."""
    outcome = view.outcome
    phase = phase_of(view)
    stop = _stop_shown(view, phase)
    if view.unknown is not None:
        unknown = list(view.unknown)  # the store's word: no spec may hide an unknown outcome
    else:
        unknown = [] if outcome is None or stop is None else list(outcome.unknown_actions)
    # Shown as its Reconciliation shows it: the moment a "not executed" written in the cluster
    # counts from (the store's deadline, and the skew allowed between the clocks).
    unknown = [replace(u, not_executed_after=shown_after(u.not_executed_after)) for u in unknown]
    pending = [] if outcome is None or stop is None else list(outcome.pending_approvals)
    # The run's part has the one shape users read (RunStatus, as `--output json` prints it);
    # the rest is what only the operator knows.
    run_status = RunStatus(
        phase=phase,
        stop_reason="" if stop is None else stop.reason.value,
        message=_message(view, phase, stop),
        resumable=False if stop is None else stop.is_resumable,
        iteration=0 if outcome is None else outcome.iteration,
        usage=Usage() if outcome is None else outcome.usage,
        unknown_actions=tuple(unknown),
        pending_approvals=tuple(pending),
        answer=None if outcome is None else outcome.answer,
        late_results=() if outcome is None else outcome.late_results,
    )
    gen = view.generation

    def cond(type_: str, shown: _Shown) -> JSON:
        return condition(old, type_, *shown, generation=gen, now=now)

    conditions = [
        cond("Succeeded", _succeeded(view, phase, stop)),
        cond("OutcomeUnknown", _outcome_unknown(view, unknown)),
        cond("AwaitingApproval", _awaiting_approval(view, pending)),
        cond(
            "Ready",
            ("True", "Succeeded") if phase is RunPhase.SUCCEEDED else ("False", phase.value),
        ),
        cond("Reconciling", _reconciling(view, phase)),
        cond("Stalled", _stalled(view, phase, stop)),
    ]
    if view.denied:
        conditions.append(cond("Denied", ("True", "ActionDenied", "; ".join(view.denied))))
    if run_status.late_results:
        conditions.append(cond("LateResult", _late_result(run_status.late_results)))
    if view.standby:
        conditions.append(cond("Standby", ("True", "HeldByAnotherCluster", view.standby)))
    return {
        **run_status.to_json(),
        "observedGeneration": gen,
        "conditions": conditions,
        "step": dict(view.step),
        "failpointsSeen": view.failpoints_seen,
    }


#: A condition as shown: its status, its reason and, when there is one, its message.
_Shown = tuple[str, str] | tuple[str, str, str]


def _stop_shown(view: RunView, phase: RunPhase) -> Stop | None:
    """The run's stop, unless it runs (a resumed run's step under way hides the stop it left)."""
    outcome = view.outcome
    if outcome is None or outcome.phase is RunPhase.RUNNING:
        return None
    if view.stepping and phase is RunPhase.RUNNING:
        return None
    return outcome.stop


def _message(view: RunView, phase: RunPhase, stop: Stop | None) -> str:
    """The status's one message: why it is stalled or suspended, its stop's, or its wait's."""
    if view.stalled:
        return view.stalled
    if view.suspended and not view.stepping and phase is not RunPhase.SUCCEEDED:
        return "suspended (spec.suspend is true)"
    if stop is not None:
        return stop.message
    return view.standby or view.waiting


def _succeeded(view: RunView, phase: RunPhase, stop: Stop | None) -> _Shown:
    if stop is not None and stop.reason is StopReason.GOAL_MET:
        answer = (view.outcome.answer if view.outcome is not None else None) or ""
        return ("True", "goal_met", answer)
    if stop is not None:
        return ("False", stop.reason.value, stop.message)
    if view.stalled:
        return ("False", "Stalled", view.stalled)
    return ("Unknown", phase.value, view.waiting)


def _outcome_unknown(view: RunView, unknown: Sequence[UnknownAction]) -> _Shown:
    if not unknown:
        return ("False", "NoUnknownOutcome")
    listed = _listing(view.reconciliations, [(u.action, u.tool) for u in unknown], "reconciliation")
    return ("True", "WriteInFlight", listed)


def _awaiting_approval(view: RunView, pending: Sequence[PendingApproval]) -> _Shown:
    if not pending:
        return ("False", "NoPendingApproval")
    listed = _listing(view.approvals, [(p.action, p.tool) for p in pending], "approval")
    return ("True", "ApprovalRequired", listed)


def _reconciling(view: RunView, phase: RunPhase) -> _Shown:
    if view.standby:
        return ("False", "Standby", view.standby)  # another cluster's to drive: at rest here
    if view.suspended and not view.stepping:
        return ("False", "Suspended", "spec.suspend is true")
    if view.stepping or (view.outcome is None and not view.stalled):
        return ("True", view.waiting_reason if view.waiting else "StepRunning", view.waiting)
    return ("False", phase.value)


def _stalled(view: RunView, phase: RunPhase, stop: Stop | None) -> _Shown:
    if view.stalled:
        return ("True", view.stalled_reason, view.stalled)
    if phase is RunPhase.FAILED and stop is not None:
        return ("True", stop.reason.value, stop.message)
    return ("False", "NotStalled")


def _late_result(late_results: Sequence[LateResult]) -> _Shown:
    said = "; ".join(
        f"{late.tool} ({late.action}) ended {late.status} after "
        f"{late.settled_by or 'someone'} settled it as {late.recorded}"
        for late in late_results
    )
    return ("True", "ResultAfterSettlement", said)


def differs(desired: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether patching ``desired`` would change anything in ``current``."""
    return any(current.get(key) != value for key, value in desired.items())
