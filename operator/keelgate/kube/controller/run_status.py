"""Writing an AgentRun's ``status``: the run's checkpoint mirrored, plus the step the operator
intends or runs, and the Events of the run's phase changes.

Why it exists: every reconcile of a run ends by writing what the run should show, and all of
them write it the same way: built by ``kube.status.desired_status`` (pure), patched only when it
differs, guarded by the resourceVersion read (a stale view loses the race instead of undoing a
newer status), and told in an Event when the phase or stop reason changes. A lost race is
``LOST_RACE``, never a number. This module must never write ``spec``, labels or annotations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from keelgate.core.approvals import denials
from keelgate.core.state import RunState
from keelgate.core.types import UnknownAction
from keelgate.kube import status
from keelgate.kube.api_failures import Conflict, Gone
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.outcomes import LOST_RACE, REST, Result
from keelgate.kube.controller.ownership import HeldElsewhere
from keelgate.kube.controller.ports import JSON, Key
from keelgate.kube.naming import FAILPOINTS_ANNOTATION
from keelgate.kube.resources import controller_name, is_tick
from keelgate.kube.times import now

_STOPPED_PHASES = frozenset({"Succeeded", "Failed", "Stopped"})
# While a pod runs the store is not read: status keeps these from its last mirror.
_KEPT_WHILE_RUNNING = ("iteration", "usage", "answer", "stopReason", "resumable")


def failpoints_seen_in(run: Mapping[str, Any]) -> str:
    """The failpoints annotation value last delivered or refused (``status.failpointsSeen``)."""
    annotation = run["metadata"].get("annotations", {}).get(FAILPOINTS_ANNOTATION, "")
    # Removing the annotation re-arms its next value, even the same one again.
    return str((run.get("status") or {}).get("failpointsSeen", "")) if annotation else ""


class RunStatusWriter:
    def __init__(self, context: ControllerContext) -> None:
        self._context = context

    def write_run_status(
        self,
        run: JSON,
        step: Mapping[str, Any],
        *,
        suspended: bool,
        stepping: bool,
        state: RunState | None = None,
        stalled: str = "",
        stalled_reason: str = "StepsFailing",
        read_store: bool = True,
        failpoints_seen: str | None = None,
        unknown: tuple[UnknownAction, ...] | None = None,
        held: HeldElsewhere | None = None,
    ) -> Result:
        """Write the status ``run`` should show with ``step`` as its ``status.step`` (only if
        it differs). ``held``: who holds the run in the store instead of this operator (no
        step pod is made while it does): another cluster's operator (``Standby``, at rest), or
        one of this cluster's (``Reconciling``, reason ``HeldElsewhere``). ``stepping``: a step
        pod is intended or running; ``stalled``: why no step may run until the spec changes (or
        until the cause ``stalled_reason`` names goes); ``read_store`` false: a pod runs, the
        checkpoint is not read (status keeps its last mirror); ``unknown``: the run's unknown
        outcomes as the store holds them (``DecisionObjects.unknown_now``), shown whatever the
        checkpoint says."""
        context = self._context
        meta = run["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if state is None and read_store:
            state = context.run_state(namespace, name)
        current = run.get("status") or {}
        running = current.get("phase") == "Running" and current.get("step") == step
        if not read_store and state is None and running:
            return REST  # a pod is running and status already says so
        waiting, waiting_reason = "", "Waiting"
        standby = held.words() if held is not None and held.standby else ""
        if held is not None:
            # Another cluster's: at rest here (no slot, no back-off is waited for); one of
            # this cluster's own operators: a hand-over under way.
            if not held.standby:
                waiting, waiting_reason = held.words(), "HeldElsewhere"
        elif context.slots.is_waiting(("AgentRun", namespace, name)):
            waiting = f"waiting for a step slot ({context.settings.max_step_pods} pods running)"
        elif step.get("notBefore") and stepping:
            waiting = f"next attempt after {step['notBefore']} (back-off after a failed pod)"
        view = status.RunView(
            generation=int(meta.get("generation") or 1),
            outcome=None if state is None else state.outcome(),
            step=step,
            stepping=stepping,
            suspended=suspended,
            stalled=stalled,
            stalled_reason=stalled_reason,
            waiting=waiting,
            waiting_reason=waiting_reason,
            standby=standby,
            reconciliations={
                u.action: context.object_name("Reconciliation", namespace, name, u.action, u.tool)
                for u in (
                    unknown if unknown is not None else state.unknown if state is not None else ()
                )
            },
            approvals={
                p.action: context.object_name(
                    "Approval", namespace, name, p.action, p.tool, round=p.round
                )
                for p in (state.pending if state is not None else ())
            },
            failpoints_seen=failpoints_seen_in(run) if failpoints_seen is None else failpoints_seen,
            unknown=unknown,
            denied=tuple(d.describe() for d in denials(state)) if state is not None else (),
        )
        if not read_store and state is None:
            return self._write_running(run, view)
        return self.patch(run, status.desired_status(view, old=current, now=now()))

    def write_stalled(
        self,
        run: JSON,
        why: str,
        *,
        state: RunState | None = None,
        unknown: tuple[UnknownAction, ...] = (),
    ) -> Result:
        """The run cannot go on until its spec changes (a spec the models refuse). What the
        store holds still shows: the run's checkpoint, and its unknown outcomes (``unknown``),
        which no spec may hide."""
        meta = run["metadata"]
        generation = int(meta.get("generation") or 1)
        step = dict((run.get("status") or {}).get("step") or {})
        view = status.RunView(
            generation=generation,
            outcome=None if state is None else state.outcome(),
            step={**step, "state": "Stalled", "generation": generation},
            stepping=False,
            stalled=why,
            stalled_reason="SpecInvalid",
            reconciliations={
                u.action: self._context.object_name(
                    "Reconciliation", meta["namespace"], meta["name"], u.action, u.tool
                )
                for u in unknown
            },
            unknown=unknown,
        )
        return self.patch(run, status.desired_status(view, old=run.get("status") or {}, now=now()))

    def _write_running(self, run: JSON, view: status.RunView) -> Result:
        """A pod runs and the store is not read: the phase and conditions of a run under way,
        the rest of the mirror as it was."""
        current = dict(run.get("status") or {})
        desired = status.desired_status(replace(view, outcome=None), old=current, now=now())
        for name in _KEPT_WHILE_RUNNING:
            if name in current:
                desired[name] = current[name]
        desired["phase"] = "Running"
        return self.patch(run, desired)

    def patch(self, run: JSON, desired: JSON) -> Result:
        """Patch ``desired`` into ``run``'s status if it changes anything; ``LOST_RACE`` when
        another writer got there first, or the run is gone though no watch said so."""
        context = self._context
        meta = run["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        current = run.get("status") or {}
        if not status.differs(desired, current):
            return REST
        try:
            patched = context.api.patch_status(
                "AgentRun", namespace, name, desired, resource_version=meta.get("resourceVersion")
            )
        except Conflict:
            return LOST_RACE
        except Gone as gone:
            if gone.named != name:
                raise  # a 404 that names no run (a server still starting): retried, backing off
            # The run is gone, though no watch said so (deleted while the watch was away): it
            # is forgotten as deleted; the caller sees a lost race and makes no step pod, and
            # the next look, at once, stops its pods.
            context.cache.forget_vanished("AgentRun", namespace, name, str(meta.get("uid", "")))
            return LOST_RACE
        context.cache.put("AgentRun", patched)
        self._tell_transition(run, current, desired)
        if is_tick(run):
            parent = controller_name(run)
            if parent:
                context.enqueue(("AgentRun", namespace, parent), 0.0)
        return REST

    def _tell_transition(self, run: JSON, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        told = old.get("lateResults") or []
        for late in new.get("lateResults") or []:
            if late not in told:  # a call that ended after someone settled its key: look again
                self._context.events.warning(
                    run,
                    "LateResult",
                    f"{late.get('tool')} ({late.get('action')}) ended {late.get('status')} after "
                    f"{late.get('settledBy') or 'someone'} had settled it as "
                    f"{late.get('recorded')}; the settlement stands: check the system it changes",
                )
        before = (old.get("phase"), old.get("stopReason"))
        after = (new.get("phase"), new.get("stopReason"))
        if before == after:
            return
        phase, reason = after
        message = str(new.get("message") or "")
        meta = run["metadata"]
        key: Key = ("AgentRun", meta["namespace"], meta["name"])
        untold = self._context.memory.take_untold(key) if phase in _STOPPED_PHASES else None
        if untold is not None:
            message = f"{message} ({untold})" if message else untold
        events = self._context.events
        if phase == "Succeeded":
            events.normal(run, "Succeeded", message or "goal met")
        elif phase == "Failed":
            events.warning(run, "Failed", f"{reason}: {message}")
        elif phase == "Stopped":
            events.normal(run, "Stopped", f"{reason}: {message}" if reason else message)
