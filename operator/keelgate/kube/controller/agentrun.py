"""The AgentRun reconciler: drive a run one step pod at a time, and write the run's status.

Level-triggered: every reconcile reads what is (the AgentRun from the cache, its step pods, the
run's checkpoint in the store) and does the one thing that is missing, so a restarted operator
(or a second one running by mistake) converges on the same pods and the same status. The store
is the truth about the run; ``status`` is its mirror plus the operator's record of the step pod
it intends (``status.step``), written before the pod is created (``step_pods``). A monitor's
AgentRun goes to the monitor reconciler it is given instead (``monitor``, which it never
imports: the reconcilers are independent of each other).

What keeps a WRITE from running twice is not here but in the loop and its stores: a step pod
resumes from the checkpoint, a WRITE left in flight by a dead pod reads as an unknown outcome,
and a second live driver of a run is refused. This module must never write a user's ``spec``,
labels or annotations, never settle anything a person did not decide, never read a Secret, and
never put a tool's argument into status or an Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from keelgate.core import clocks
from keelgate.core.spec import LoopSpec
from keelgate.core.state import RunState
from keelgate.core.types import LoopKind, StopReason
from keelgate.errors import InputError
from keelgate.kube import resources
from keelgate.kube.controller import traces
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.decision_objects import DecisionObjects
from keelgate.kube.controller.outcomes import (
    REST,
    STEP,
    NextStep,
    Requeue,
    Rest,
    Result,
    Stall,
)
from keelgate.kube.controller.ownership import HeldElsewhere
from keelgate.kube.controller.pod_ends import EndKind, PodEnd, classify
from keelgate.kube.controller.ports import JSON, Key
from keelgate.kube.controller.retention import collect_finished_pods
from keelgate.kube.controller.run_status import RunStatusWriter, failpoints_seen_in
from keelgate.kube.controller.signed_heads import sign_head
from keelgate.kube.controller.step_pods import StepPodStarter, foreign_pod
from keelgate.kube.naming import FAILPOINTS_ANNOTATION, label_value, step_pod_name
from keelgate.kube.resources import creator_of, pod_active, pod_finished
from keelgate.kube.times import stamp
from keelgate.manifest import AgentRunSpec, spec_from_manifest

#: The stops at which a run waits for a person: its holder keeps it (the decision is written
#: under its epoch). At any other stop the run is finished until its spec changes, and let go.
_WAITING_FOR_A_PERSON = frozenset({StopReason.OUTCOME_UNKNOWN, StopReason.AWAITING_APPROVAL})


#: The stops no step goes on from whatever happens, but a spec change.
_FINAL = frozenset({StopReason.GOAL_MET, StopReason.FAILED})


class Monitors(Protocol):
    """Where a monitor's AgentRun goes: it schedules ticks (``monitor.MonitorReconciler``)."""

    def reconcile(self, run: JSON, spec: AgentRunSpec) -> Result: ...


class AgentRunReconciler:
    def __init__(self, context: ControllerContext, *, monitors: Monitors) -> None:
        self._context = context
        self._status = RunStatusWriter(context)
        self._pods = StepPodStarter(context, self._status)
        self._asks = DecisionObjects(context)
        self._monitors = monitors

    def reconcile(self, key: Key) -> Result:
        """Do what the AgentRun ``key`` needs now: stop the pods of a deleted run, stall on a
        spec the models refuse, schedule a monitor's ticks, or drive a run."""
        context = self._context
        _, namespace, name = key
        run = context.cache.get("AgentRun", namespace, name)
        if run is None or run["metadata"].get("deletionTimestamp"):
            self._stop_pods(namespace, name, run)
            context.holding.let_go(namespace, name)
            context.slots.stop_waiting(key)
            context.memory.forget(key)
            return REST
        try:
            spec = spec_from_manifest(run.get("spec"))
        except InputError as error:
            # No step may run until the spec changes, but what the store holds still shows:
            # an unknown outcome stays asked for and shown, whatever the spec now says.
            state = context.run_state(namespace, name)
            unknown = self._asks.unknown_now(namespace, state)
            elsewhere = context.holding.elsewhere(namespace, name)
            if elsewhere is None or not elsewhere.standby:
                # (Another cluster's run is asked for there: a spec broken here asks nothing.)
                self._asks.ask_to_settle(run, unknown)
            return self._status.write_stalled(run, str(error), state=state, unknown=unknown)
        if spec.loop is LoopKind.MONITOR and not resources.is_tick(run):
            return self._monitors.reconcile(run, spec)
        return self._drive(key, run, spec)

    def _stop_pods(self, namespace: str, name: str, run: JSON | None) -> None:
        """An AgentRun being deleted: stop its step pods now (the garbage collector would, a
        little later); its audit trail stays in the store."""
        uid = None if run is None else run["metadata"].get("uid")
        for pod in self._context.cache.step_pods(namespace, label_value(name)):
            owner_ok = uid is None or resources.owned_by(pod, uid)
            if owner_ok and pod_active(pod) and not pod["metadata"].get("deletionTimestamp"):
                self._context.api.delete_pod(
                    namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"]
                )

    def _drive(self, key: Key, run: JSON, spec: AgentRunSpec) -> Result:
        context = self._context
        _, namespace, name = key
        meta = run["metadata"]
        uid, generation = meta["uid"], int(meta.get("generation") or 1)
        current = run.get("status") or {}
        step = dict(current.get("step") or {})
        collect_finished_pods(context, run, spec, step)
        write = self._status.write_run_status
        if step.get("state") == "Stalled":
            if int(step.get("generation") or 0) == generation:
                why = str(current.get("message") or step.get("lastExit") or "stalled")
                return self._write_at_rest(run, step, spec, stalled=why)
            step = {**step, "state": "Ended", "crashes": 0}  # the spec changed: try again

        ended: PodEnd | None = None
        ended_pod: JSON | None = None
        if step.get("state") == "Pending":
            pod_name = str(step.get("pod", ""))
            pod = context.cache.get("Pod", namespace, pod_name)
            if pod is not None and not resources.owned_by(pod, uid):
                # Not this run's, in the cache: the server is asked before the run stalls on it
                # (the cache may hold a pod deleted while its watch was away).
                pod = self._pods.as_the_server_has_it(namespace, pod)
            if pod is not None and not resources.owned_by(pod, uid):
                return self._write_at_rest(run, step, spec, stalled=foreign_pod(pod_name))
            if pod is None:
                gone = context.cache.tombstone(namespace, pod_name)
                if gone is None or not resources.owned_by(gone, uid):
                    if not self._finished_elsewhere(namespace, name):
                        return self._pods.start(key, run, spec, step)
                    step = {**step, "state": "Ended"}  # nothing to make: at rest below
                else:
                    ended = classify(gone, deleted=not pod_finished(gone))
                    context.cache.forget_tombstone(namespace, pod_name)
                    ended_pod = gone
            elif pod_active(pod):
                context.slots.stop_waiting(key)
                lost = resources.lost_in(pod, now=context.clock())
                if lost is None or lost > 0:
                    written = write(
                        run, step, suspended=spec.suspend, stepping=True, read_store=False
                    )
                    # A pod being deleted ends with a watch event, unless its node is gone: look
                    # again when it would count as lost.
                    return written if lost is None else Requeue(lost)
                ended = PodEnd(
                    EndKind.CRASH,
                    "lost: deleted (its node stopped reporting?) and never seen to end; its "
                    "process may still run there, and the store keeps it from acting twice",
                )
                ended_pod = pod
            else:
                ended = classify(pod)
                ended_pod = pod
            if ended is not None:
                step = self._account(key, run, step, ended)

        state = context.run_state(namespace, name)
        if ended is not None and ended_pod is not None:
            traces.tell_pod_span(context.tracer, ended_pod, step, ended, state)
        if ended is not None and state is not None and context.settings.confirms:
            self._asks.show_confirmer_settlements(run, state)
        held_elsewhere = self._shown_held_elsewhere(run, step, spec, state)
        if held_elsewhere is not None:
            return held_elsewhere
        loop_spec = spec.loop_spec(tenant=namespace, run=name, creator=creator_of(run))
        needed = self._next(run, loop_spec, state, step, ended)
        if isinstance(needed, Rest) or spec.suspend:
            if state is not None and state.stop is not None:
                sign_head(context, key)  # at rest: its chain head, signed (if asked for)
                if state.stop.reason not in _WAITING_FOR_A_PERSON:
                    # Finished (until its spec changes): nobody need wait for its lease.
                    context.holding.let_go(namespace, name)
            step = {**step, "state": "Ended"} if step else step
            return self._write_at_rest(run, step, spec, state=state)
        if isinstance(needed, Stall):
            stalled = {**step, "state": "Stalled", "generation": generation}
            return self._write_at_rest(run, stalled, spec, state=state, stalled=needed.reason)
        # A step is needed: record the intent (status.step) before creating the pod.
        intended, seen = self._intend(run, step, ended)
        written = write(
            run, intended, suspended=spec.suspend, stepping=True, state=state, failpoints_seen=seen
        )
        if isinstance(written, Requeue):
            return Requeue(0.5)  # the status patch lost a race: look again
        fresh = context.cache.get("AgentRun", namespace, name) or run
        return self._pods.start(key, fresh, spec, intended)

    def _shown_held_elsewhere(
        self, run: JSON, step: Mapping[str, Any], spec: AgentRunSpec, state: RunState | None
    ) -> Result | None:
        """A run not finished that another operator drives (it took it over, or holds it in
        another cluster): its status says who, and nothing is asked or made here while it
        does; ``None`` when the run is this operator's to drive (or nobody's, or finished).
        A run waiting for a person shows that wait, as its holder shows it (were both in one
        cluster, two different statuses would be written back and forth); its Approval says
        who holds the run if a decision comes here."""
        if state is not None and state.stop is not None and state.stop.reason in _FINAL:
            return None
        meta = run["metadata"]
        elsewhere = self._context.holding.elsewhere(meta["namespace"], meta["name"])
        if elsewhere is None:
            return None
        again = Requeue(max(1.0, elsewhere.lease_left + 0.5))
        stop = None if state is None else state.stop
        if stop is not None and stop.reason in _WAITING_FOR_A_PERSON:
            at_rest = {**step, "state": "Ended"} if step else step
            # Another cluster's run shows its wait and that it stands by here.
            self._write_at_rest(
                run, at_rest, spec, state=state, held=elsewhere if elsewhere.standby else None
            )
            return again
        self._status.write_run_status(
            run,
            step,
            suspended=spec.suspend,
            stepping=not elsewhere.standby,
            state=state,
            held=elsewhere,
        )
        return again

    def _finished_elsewhere(self, namespace: str, name: str) -> bool:
        """Whether the run, intended here but not held by this operator, was finished by
        another holder meanwhile (a standby cluster's run driven to its end there): its
        intended pod is then not made, nor the run taken again."""
        context = self._context
        if not context.holding.enabled or context.holding.epoch(namespace, name) is not None:
            return False
        state = context.run_state(namespace, name)
        return state is not None and state.stop is not None and state.stop.reason in _FINAL

    def _write_at_rest(
        self,
        run: JSON,
        step: Mapping[str, Any],
        spec: AgentRunSpec,
        *,
        state: RunState | None = None,
        stalled: str = "",
        held: HeldElsewhere | None = None,
    ) -> Result:
        """The status of a run no step pod drives now (at rest, suspended or stalled): its
        unknown outcomes as the store holds them, each with its Reconciliation, shown beside
        whatever holds the run, so that no spec edit, stall or suspension hides one. ``held``:
        another cluster's operator holds the run (it is asked for there, not here)."""
        meta = run["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if state is None:
            state = self._context.run_state(namespace, name)
        unknown = self._asks.unknown_now(namespace, state)
        if (stalled or spec.suspend) and held is None:
            # No step will record these until the spec changes: ask for them here.
            self._asks.ask_to_settle(run, unknown)
        return self._status.write_run_status(
            run,
            step,
            suspended=spec.suspend,
            stepping=False,
            state=state,
            stalled=stalled,
            unknown=unknown,
            held=held,
        )

    def _account(self, key: Key, run: JSON, step: Mapping[str, Any], ended: PodEnd) -> JSON:
        """Record a step pod's end in the step record (once: the record then says Ended)."""
        context = self._context
        context.meter.step_ended(ended.kind, ended.seconds)
        crashes = 0 if ended.clean else int(step.get("crashes") or 0) + 1
        if ended.kind in (EndKind.BUSY, EndKind.PREEMPTED, EndKind.FENCED):
            # Another driver is alive, or took the run over, or the pod was asked to stop and
            # did: not a crash.
            crashes = int(step.get("crashes") or 0)
        if ended.kind is EndKind.FENCED:
            # Whatever this operator held of the run is gone: the next step pod is made only
            # if it takes the run again (else the status names who holds it).
            context.holding.lost(key[1], key[2])
        told = f"step {step.get('number')} (pod {step.get('pod')}) ended: {ended.words}"
        if ended.kind is EndKind.PREEMPTED:
            context.events.normal(run, "StepPreempted", told)
            context.memory.step_ended(key, at=context.clock(), untold=None)
        elif ended.kind is EndKind.FENCED:
            context.events.normal(run, "StepFenced", told)
            context.memory.step_ended(key, at=context.clock(), untold=None)
        elif ended.clean:
            # Told with what comes next (the next step's start, or the run's stop): one Event,
            # one API write, for both transitions.
            context.memory.step_ended(key, at=context.clock(), untold=told)
        else:
            context.events.warning(run, "StepEnded", told)
            context.memory.step_ended(key, at=context.clock(), untold=None)
        return {
            **step,
            "state": "Ended",
            "crashes": crashes,
            "lastExit": ended.words,
            "lastLines": ended.last_lines,
        }

    def _next(
        self,
        run: JSON,
        loop_spec: LoopSpec,
        state: RunState | None,
        step: Mapping[str, Any],
        ended: PodEnd | None,
    ) -> NextStep:
        """What the run needs next: a step pod, a stall until the spec changes, or rest
        (finished, or waiting for a person)."""
        if ended is not None and ended.kind is EndKind.BAD_INPUT:
            return Stall(f"the step refused its input: {ended.words}")
        crashes = int(step.get("crashes") or 0)
        if crashes >= self._context.settings.max_crashes:
            return Stall(
                f"{crashes} step pods in a row ended without recording a stop (last: "
                f"{step.get('lastExit', '')}); change the spec (e.g. toggle spec.suspend) to retry"
            )
        if state is None or state.stop is None:
            return STEP
        stop = state.stop
        if stop.reason is StopReason.GOAL_MET:
            return REST
        if stop.reason is StopReason.OUTCOME_UNKNOWN:
            if self._asks.ask_to_settle(run, state.unknown):
                return STEP
        elif stop.reason is StopReason.AWAITING_APPROVAL:
            self._asks.ask_to_approve(run, state)
            if not state.pending:
                return STEP
        if stop.reason is StopReason.FAILED or not state.continues_under(loop_spec.budget):
            # Final under this spec (the verifier's limit not raised past its rejections): a
            # step would neither use nor record an edit, and the next pod would find the same.
            return REST
        # Any other stop (a budget, the verifier's limit) resumes when the spec has changed
        # since the checkpoint: the loop then decides with the new spec, once.
        return STEP if _what_it_does(state.spec) != _what_it_does(loop_spec) else REST

    def _intend(self, run: JSON, step: Mapping[str, Any], ended: PodEnd | None) -> tuple[JSON, str]:
        """The record of the next step pod (``status.step``), and the failpoints value now
        seen: the next step (or the same step's next attempt, after a pod that did not
        record where the run stands), its back-off, and the failpoints it is to carry."""
        context = self._context
        settings = context.settings
        meta = run["metadata"]
        retry = ended is not None and not ended.clean
        number = int(step.get("number") or 0)
        attempt = int(step.get("attempt") or 0)
        number, attempt = (number, attempt + 1) if retry and number else (number + 1, 1)
        crashes = int(step.get("crashes") or 0)
        delay = 0.0
        if ended is not None and ended.kind is EndKind.BUSY:
            delay = settings.busy_retry
        elif ended is not None and ended.kind in (EndKind.PREEMPTED, EndKind.FENCED):
            # It stopped at a checkpoint, or the run was taken over (the next pod is made only
            # by whoever holds the run): the next attempt is not held back.
            delay = 0.0
        elif retry and crashes > 1:
            delay = clocks.backoff(settings.crash_backoff, settings.max_backoff, crashes - 2)
        seen = failpoints_seen_in(run)
        annotation = meta.get("annotations", {}).get(FAILPOINTS_ANNOTATION, "")
        failpoints = ""
        if annotation and annotation != seen:
            if settings.allow_failpoints:
                failpoints = annotation
            else:
                context.events.warning(
                    run,
                    "FailpointsIgnored",
                    f"{FAILPOINTS_ANNOTATION} is ignored: the operator was not started "
                    "with --allow-failpoints",
                )
            seen = annotation
        intended = {
            "number": number,
            "attempt": attempt,
            "pod": step_pod_name(meta["name"], number, attempt),
            "state": "Pending",
            "generation": int(meta.get("generation") or 1),
            "crashes": crashes,
            "notBefore": stamp(context.clock() + delay) if delay else "",
            "failpoints": failpoints,
            "lastExit": step.get("lastExit", ""),
            "lastLines": step.get("lastLines", ""),
        }
        return intended, seen


def _what_it_does(spec: LoopSpec) -> Mapping[str, Any]:
    # Where a run was driven from (the CLI's folder) is not what it does.
    return {k: v for k, v in spec.to_json().items() if k not in ("sourceDir", "store")}
