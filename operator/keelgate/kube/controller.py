"""The operator's decisions: which step pod runs next, what status shows, what an edit settles.

Level-triggered: every reconcile reads what is (the AgentRun from the cache, its step pods, the
run's checkpoint in the store) and does the one thing that is missing, so a restarted operator
(or a second one running by mistake) converges on the same pods and the same status. The store
is the truth about the run; the AgentRun's ``status`` is its mirror plus the operator's record of
the step pod it intends (``status.step``), written before the pod is created so the pod is
created (or adopted, on a 409, only if its owner UID is this run's) under exactly that name.

What keeps a WRITE from running twice is not here but in the loop and its stores: a step pod
resumes from the checkpoint, a WRITE left in flight by a dead pod reads as an unknown outcome,
and a second live driver of a run is refused. This module must never write a user's ``spec``,
labels or annotations, never settle anything a person did not decide (or a trusted confirmer in
a step pod), never read a Secret, and never put a tool's argument into status or an Event.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from keelgate.core.loop import Loop
from keelgate.core.monitor import next_due, tick_number, tick_run_name
from keelgate.core.protocols import Stores
from keelgate.core.spec import LoopSpec
from keelgate.core.state import RunState
from keelgate.core.types import KeyState, LoopKind, StopReason, UnknownAction
from keelgate.errors import (
    InputError,
    KeelgateError,
    RunBusy,
    RunNotFound,
    SettleError,
    exit_retryable,
)
from keelgate.kube import resources, status
from keelgate.kube.api import ClusterApi, Conflict, Gone, now
from keelgate.kube.cache import Cache, Key, pod_active, pod_finished
from keelgate.kube.metrics import Metrics
from keelgate.kube.naming import (
    FAILPOINTS_ANNOTATION,
    MONITOR_LABEL,
    action_object_name,
    label_value,
    step_pod_name,
)
from keelgate.manifest import AgentRunSpec, spec_from_manifest

log = logging.getLogger("keelgate.operator")

JSON = dict[str, Any]
Enqueue = Callable[[Key, float], None]

# A tick stopped here waits for a person: the monitor holds its next tick back.
_WAITING = frozenset({StopReason.OUTCOME_UNKNOWN, StopReason.AWAITING_APPROVAL})
# Exit codes of `keelgate step` (see cli/cluster.py).
# A step that recorded where the run stands exits 0 (at rest or going on), 1 (failed) or 3
# (stopped, resumable): see keelgate.cli.step. Any other code is read from the error table.
_CLEAN = frozenset({0, 1, 3})
_STOPPED_PHASES = frozenset({"Succeeded", "Failed", "Stopped"})


@dataclass(frozen=True)
class ControllerSettings:
    pods: resources.StepPodSettings = field(default_factory=resources.StepPodSettings)
    allow_failpoints: bool = False
    max_step_pods: int = 20
    max_crashes: int = 5
    crash_backoff: float = 1.0  # seconds before the 3rd attempt (the 2nd: at once); doubles
    max_backoff: float = 60.0
    busy_retry: float = 5.0


@dataclass(frozen=True)
class Ended:
    """How a step pod ended, as far as Kubernetes says."""

    kind: str  # clean | crash | busy | bad_input | store
    words: str
    seconds: float | None = None


def classify(pod: Mapping[str, Any], *, deleted: bool = False) -> Ended:
    """A finished (or vanished) step pod's end, from its container's terminated state."""
    pod_status = pod.get("status") or {}
    containers = pod_status.get("containerStatuses") or []
    terminated = (containers[0].get("state") or {}).get("terminated") if containers else None
    if terminated:
        code = terminated.get("exitCode")
        reason = terminated.get("reason") or ""
        seconds = _duration(terminated.get("startedAt"), terminated.get("finishedAt"))
        words = f"exit code {code}" + (f" ({reason})" if reason else "")
        if code in _CLEAN:
            return Ended("clean", words, seconds)
        if code == RunBusy.exit_code:
            return Ended("busy", f"{words}: another process was driving the run", seconds)
        retryable = exit_retryable(code) if isinstance(code, int) else None
        if retryable is False:  # the same pod would meet the same error: the spec must change
            detail = _last_line(terminated.get("message") or "")
            return Ended("bad_input", f"{words}: {detail}" if detail else words, seconds)
        if retryable is True:
            return Ended("store", f"{words}: the store could not be reached", seconds)
        return Ended("crash", words, seconds)
    if pod_status.get("phase") == "Failed":
        reason = pod_status.get("reason") or "Failed"
        message = pod_status.get("message") or ""
        return Ended("crash", f"{reason}: {message}" if message else reason)
    if deleted:
        return Ended("crash", "deleted before it ended")
    return Ended("crash", f"ended as {pod_status.get('phase') or 'unknown'}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # The step prints its outcome as one JSON object last; the error line comes before it.
    for line in reversed(lines):
        if not line.startswith("{"):
            return line[:300]
    return ""


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _duration(start: str | None, end: str | None) -> float | None:
    begun, done = _parse_time(start), _parse_time(end)
    if begun is None or done is None:
        return None
    return max(0.0, (done - begun).total_seconds())


def _spec_json(spec: LoopSpec) -> Mapping[str, Any]:
    # Where a run was driven from (the CLI's folder) is not what it does.
    return {k: v for k, v in spec.to_json().items() if k not in ("sourceDir", "store")}


class Controller:
    """Reconciles AgentRuns, Reconciliations and Approvals; called from worker threads."""

    def __init__(
        self,
        *,
        api: ClusterApi,
        stores: Stores,
        cache: Cache,
        settings: ControllerSettings,
        metrics: Metrics,
        enqueue: Enqueue,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.stores = stores
        self.loop = Loop(stores=stores)
        self.cache = cache
        self.settings = settings
        self.metrics = metrics
        self.enqueue = enqueue
        self.clock = clock
        self._slots = threading.Lock()
        self._creating = 0
        #: Runs whose intended pod waits for a free step slot, and since when.
        self.waiting: dict[Key, float] = {}
        #: When the operator saw each run's last step pod end (for the hand-off time).
        self.ended_at: dict[Key, float] = {}
        self.phases: dict[Key, str] = {}
        #: Each run's last clean step end not yet told in an Event (see _account).
        self.ends_untold: dict[Key, tuple[JSON, str]] = {}
        #: The spec each run's step pods were last given, as recorded in the store: (uid,
        #: generation, document). Lost on a restart, which costs one more record_spec, no more.
        self.recorded: dict[Key, tuple[str, int, Mapping[str, Any]]] = {}
        self._events = threading.local()  # each worker thread's Events, posted after its work

    # Dispatch

    def reconcile(self, key: Key) -> float | None:
        """Do what ``key``'s object needs; returns seconds until it should be looked at again
        (None: when something changes)."""
        self._events.later = []
        try:
            kind = key[0]
            if kind == "AgentRun":
                return self._run(key)
            if kind == "Reconciliation":
                return self._reconciliation(key)
            if kind == "Approval":
                return self._approval(key)
            return None
        finally:
            # Events are posted last: they tell people what happened, and must not stand
            # between one step pod's end and the creation of the next.
            later, self._events.later = self._events.later, None
            for involved, type_, reason, message in later or ():
                self.api.event(involved, type_=type_, reason=reason, message=message)

    def _event(self, involved: JSON, *, type_: str, reason: str, message: str) -> None:
        later = getattr(self._events, "later", None)
        if later is None:
            self.api.event(involved, type_=type_, reason=reason, message=message)
        else:
            later.append((involved, type_, reason, message))

    # AgentRun

    def _run(self, key: Key) -> float | None:
        _, ns, name = key
        run = self.cache.get("AgentRun", ns, name)
        if run is None or run["metadata"].get("deletionTimestamp"):
            self._deleted(ns, name, run)
            self.waiting.pop(key, None)
            self.phases.pop(key, None)
            self.ends_untold.pop(key, None)
            self.recorded.pop(key, None)
            return None
        try:
            spec = spec_from_manifest(run.get("spec"))
        except InputError as error:
            return self._write_status(run, self._stalled_view(run, str(error)))
        if spec.loop is LoopKind.MONITOR and not is_tick(run):
            return self._monitor(run, spec)
        return self._drive(key, run, spec)

    def _deleted(self, ns: str, name: str, run: JSON | None) -> None:
        """An AgentRun being deleted: stop its step pods now (the garbage collector would, a
        little later); its audit trail stays in the store."""
        uid = None if run is None else run["metadata"].get("uid")
        for pod in self.cache.step_pods(ns, label_value(name)):
            owner_ok = uid is None or resources.owned_by(pod, uid)
            if owner_ok and pod_active(pod) and not pod["metadata"].get("deletionTimestamp"):
                self.api.delete_pod(ns, pod["metadata"]["name"], uid=pod["metadata"]["uid"])

    def _drive(self, key: Key, run: JSON, spec: AgentRunSpec) -> float | None:
        _, ns, name = key
        meta = run["metadata"]
        uid, generation = meta["uid"], int(meta.get("generation") or 1)
        current = run.get("status") or {}
        step = dict(current.get("step") or {})
        seen = self._failpoints_seen(run)
        if step.get("state") == "Stalled":
            if int(step.get("generation") or 0) == generation:
                why = str(current.get("message") or step.get("lastExit") or "stalled")
                return self._mirror(run, spec, step, stepping=False, stalled=why)
            step = {**step, "state": "Ended", "crashes": 0}  # the spec changed: try again

        ended: Ended | None = None
        if step.get("state") == "Pending":
            pod_name = str(step.get("pod", ""))
            pod = self.cache.get("Pod", ns, pod_name)
            if pod is not None and not resources.owned_by(pod, uid):
                message = f"a pod named {pod_name} exists and is not this run's; delete it"
                return self._mirror(run, spec, step, stepping=False, stalled=message)
            if pod is None:
                gone = self.cache.tombstone(ns, pod_name)
                if gone is None or not resources.owned_by(gone, uid):
                    return self._create_pod(key, run, spec, step)
                ended = classify(gone, deleted=not pod_finished(gone))
                self.cache.forget_tombstone(ns, pod_name)
            elif pod_active(pod):
                self.waiting.pop(key, None)
                return self._mirror(run, spec, step, stepping=True, read_store=False)
            else:
                ended = classify(pod)
            step = self._account(key, run, step, ended)

        state = self._state(ns, name)
        if ended is not None and state is not None and self._confirms():
            self._confirmer_settlements(run, state)
        loop_spec = spec.loop_spec(tenant=ns, run=name)
        decision = self._next(run, spec, loop_spec, state, step, ended)
        if decision is None or spec.suspend:
            step = {**step, "state": "Ended"} if step else step
            return self._mirror(run, spec, step, stepping=False, state=state)
        if decision.startswith("stalled:"):
            stalled_step = {**step, "state": "Stalled", "generation": generation}
            return self._mirror(
                run, spec, stalled_step, stepping=False, state=state, stalled=decision[8:]
            )
        # A step is needed: record the intent (status.step) before creating the pod.
        retry = ended is not None and ended.kind != "clean"
        number = int(step.get("number") or 0)
        attempt = int(step.get("attempt") or 0)
        number, attempt = (number, attempt + 1) if retry and number else (number + 1, 1)
        crashes = int(step.get("crashes") or 0)
        delay = 0.0
        if ended is not None and ended.kind == "busy":
            delay = self.settings.busy_retry
        elif retry and crashes > 1:
            delay = min(self.settings.max_backoff, self.settings.crash_backoff * 2 ** (crashes - 2))
        annotation = meta.get("annotations", {}).get(FAILPOINTS_ANNOTATION, "")
        failpoints = ""
        if annotation and annotation != seen:
            if self.settings.allow_failpoints:
                failpoints = annotation
            else:
                self._event(
                    run,
                    type_="Warning",
                    reason="FailpointsIgnored",
                    message=f"{FAILPOINTS_ANNOTATION} is ignored: the operator was not started "
                    "with --allow-failpoints",
                )
            seen = annotation
        step = {
            "number": number,
            "attempt": attempt,
            "pod": step_pod_name(name, number, attempt),
            "state": "Pending",
            "generation": generation,
            "crashes": crashes,
            "notBefore": _stamp(self.clock() + delay) if delay else "",
            "failpoints": failpoints,
            "lastExit": step.get("lastExit", ""),
        }
        after = self._mirror(run, spec, step, stepping=True, state=state, failpoints_seen=seen)
        if after is not None and after < 0:
            return 0.5  # the status patch lost a race: look again
        fresh = self.cache.get("AgentRun", ns, name) or run
        return self._create_pod(key, fresh, spec, step)

    def _failpoints_seen(self, run: JSON) -> str:
        annotation = run["metadata"].get("annotations", {}).get(FAILPOINTS_ANNOTATION, "")
        # Removing the annotation re-arms its next value, even the same one again.
        return str((run.get("status") or {}).get("failpointsSeen", "")) if annotation else ""

    def _account(self, key: Key, run: JSON, step: JSON, ended: Ended) -> JSON:
        """Record a step pod's end in the step record (once: the record then says Ended)."""
        self.ended_at[key] = self.clock()
        self.metrics.steps_ended.labels(ended.kind).inc()
        if ended.seconds is not None:
            self.metrics.step_seconds.observe(ended.seconds)
        crashes = 0 if ended.kind == "clean" else int(step.get("crashes") or 0) + 1
        if ended.kind == "busy":
            crashes = int(step.get("crashes") or 0)  # another driver is alive: not a crash
        told = f"step {step.get('number')} (pod {step.get('pod')}) ended: {ended.words}"
        if ended.kind == "clean":
            # Told with what comes next (the next step's start, or the run's stop): one Event,
            # one API write, for both transitions. Kept in memory only: an Event lost to a
            # restart loses no fact (the pod and status.step.lastExit keep it).
            self.ends_untold[key] = (run, told)
        else:
            self._event(run, type_="Warning", reason="StepEnded", message=told)
            # The pod may have found no spec (a store restored, or replaced under this
            # operator): the next pod's spec is recorded again, not taken as known.
            self.recorded.pop(key, None)
        return {**step, "state": "Ended", "crashes": crashes, "lastExit": ended.words}

    def _state(self, ns: str, name: str) -> RunState | None:
        try:
            return self.loop.state(ns, name)
        except RunNotFound:
            return None

    def _next(
        self,
        run: JSON,
        spec: AgentRunSpec,
        loop_spec: LoopSpec,
        state: RunState | None,
        step: JSON,
        ended: Ended | None,
    ) -> str | None:
        """ "step" when a step pod should run next, "stalled: why" when none may until the spec
        changes, None when the run is at rest (finished, or waiting for a person)."""
        if ended is not None and ended.kind == "bad_input":
            return f"stalled:the step refused its input: {ended.words}"
        crashes = int(step.get("crashes") or 0)
        if crashes >= self.settings.max_crashes:
            return (
                f"stalled:{crashes} step pods in a row ended without recording a stop (last: "
                f"{step.get('lastExit', '')}); change the spec (e.g. toggle spec.suspend) to retry"
            )
        if state is None or state.stop is None:
            return "step"
        stop = state.stop
        if stop.reason is StopReason.GOAL_MET:
            return None
        if stop.reason is StopReason.OUTCOME_UNKNOWN:
            if self._unknown_settled(run, state):
                return "step"
        elif stop.reason is StopReason.AWAITING_APPROVAL:
            self._ensure_approvals(run, state)
            if not state.pending:
                return "step"
        if stop.reason is StopReason.FAILED:
            return None
        # Any other stop (a budget, the verifier's limit) resumes when the spec has changed
        # since the checkpoint: the loop then decides with the new spec, once.
        return "step" if _spec_json(state.spec) != _spec_json(loop_spec) else None

    def _unknown_settled(self, run: JSON, state: RunState) -> bool:
        """Make sure each unknown action has its Reconciliation; True when all are settled."""
        ns = run["metadata"]["namespace"]
        settled = True
        for unknown in state.unknown:
            record = self.stores.idempotency.get(ns, unknown.idempotency_key)
            done = record is not None and record.state in (KeyState.COMPLETED, KeyState.ABANDONED)
            settled = settled and done
            body = resources.reconciliation(run, unknown)
            name = body["metadata"]["name"]
            existing = self.cache.get("Reconciliation", ns, name)
            if existing is None:
                try:
                    created = self._create_pending("Reconciliation", ns, body)
                except Conflict:
                    continue
                self.cache.put("Reconciliation", created)
                self._event(
                    run,
                    type_="Warning",
                    reason="OutcomeUnknown",
                    message=f"{unknown.tool} ({unknown.action}) may or may not have run: "
                    f"settle reconciliation {name}",
                )
            elif done and (existing.get("status") or {}).get("phase") != "Settled":
                self.enqueue(("Reconciliation", ns, name), 0.0)  # settled elsewhere: mirror it
        return settled

    def _confirms(self) -> bool:
        pods = self.settings.pods
        return bool(pods.confirmer or pods.confirmer_url)

    def _confirmer_settlements(self, run: JSON, state: RunState) -> None:
        """A step pod's confirmer may settle an unknown outcome without the run ever stopping
        (it asks on the attempt after a crash): record each such settlement as a Reconciliation,
        already Settled with source confirmer, so people see what was decided for them."""
        if state.plan is None:
            return
        ns = run["metadata"]["namespace"]
        for action in state.plan.actions:
            record = self.stores.idempotency.get(ns, action.key)
            if record is None or record.source != "confirmer":
                continue
            unknown = UnknownAction(action.id, action.tool, action.key)
            body = resources.reconciliation(run, unknown)
            name = body["metadata"]["name"]
            if self.cache.get("Reconciliation", ns, name) is not None:
                continue
            verdict = "executed" if record.state is KeyState.COMPLETED else "abandoned"
            try:
                self.api.create_object("Reconciliation", ns, body)
                settled = self.api.patch_status(
                    "Reconciliation",
                    ns,
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
            self.cache.put("Reconciliation", settled)
            self._event(
                run,
                type_="Normal",
                reason="Settled",
                message=f"{action.tool} ({action.id}) settled as {verdict} by the confirmer "
                f"{record.settled_by}: reconciliation {name}",
            )

    def _ensure_approvals(self, run: JSON, state: RunState) -> None:
        ns = run["metadata"]["namespace"]
        for pending in state.pending:
            body = resources.approval(run, pending)
            name = body["metadata"]["name"]
            if self.cache.get("Approval", ns, name) is not None:
                continue
            try:
                created = self._create_pending("Approval", ns, body)
            except Conflict:
                continue
            self.cache.put("Approval", created)
            self._event(
                run,
                type_="Normal",
                reason="AwaitingApproval",
                message=f"{pending.tool} ({pending.action}) needs approval: approval {name}",
            )

    def _create_pending(self, kind: str, ns: str, body: JSON) -> JSON:
        """Create a Reconciliation or Approval and show it Pending (status is a subresource: a
        create cannot set it)."""
        created = self.api.create_object(kind, ns, body)
        try:
            return self.api.patch_status(kind, ns, body["metadata"]["name"], {"phase": "Pending"})
        except (Conflict, Gone):
            return created

    def _create_pod(self, key: Key, run: JSON, spec: AgentRunSpec, step: JSON) -> float | None:
        """Create (or adopt) the pod ``step`` names, when its back-off has passed and a step slot
        is free."""
        _, ns, name = key
        not_before = _parse_time(step.get("notBefore"))
        if not_before is not None:
            left = not_before.timestamp() - self.clock()
            if left > 0:
                return left
        if not self._take_slot():
            self.waiting.setdefault(key, self.clock())
            return None  # woken when a step pod ends
        try:
            self.waiting.pop(key, None)
            loop_spec = spec.loop_spec(tenant=ns, run=name)
            if self.stores.specs is None:
                raise KeelgateError("the store keeps no recorded specs")
            meta = run["metadata"]
            generation = int(meta.get("generation") or 1)
            # The pod reads the spec from the store: record it before the pod can start. Once
            # recorded, a spec is never removed, and only a newer generation replaces it, so
            # what this operator recorded for a run stays there: no store call to say it again.
            document = loop_spec.to_json()
            recorded = (meta["uid"], generation, document)
            if self.recorded.get(key) != recorded and self.stores.specs.record_spec(
                ns, name, document, source=meta["uid"], generation=generation
            ):
                self.recorded[key] = recorded
            body = resources.step_pod(
                run,
                spec,
                name=str(step["pod"]),
                step=int(step["number"]),
                attempt=int(step["attempt"]),
                generation=generation,
                failpoints=str(step.get("failpoints", "")),
                settings=self.settings.pods,
            )
            try:
                created = self.api.create_pod(ns, body)
            except Conflict:
                existing = self.api.read_pod(ns, str(step["pod"]))
                if not resources.owned_by(existing, meta["uid"]):
                    message = f"a pod named {step['pod']} exists and is not this run's; delete it"
                    return self._mirror(run, spec, step, stepping=False, stalled=message)
                self.cache.put("Pod", existing)  # ours already: adopt it
                return None
            # Counted as active before its slot is given back: the cap must see it at once.
            self.cache.put("Pod", created)
        finally:
            self._release_slot()
        self.metrics.steps_started.inc()
        ended = self.ended_at.pop(key, None)
        if ended is not None:
            self.metrics.handoff_seconds.observe(max(0.0, self.clock() - ended))
        armed = f" with failpoints {step['failpoints']}" if step.get("failpoints") else ""
        untold = self.ends_untold.pop(key, None)
        if untold is not None:
            armed += f" ({untold[1]})"
        self._event(
            run,
            type_="Normal",
            reason="StepStarted",
            message=f"step {step['number']} attempt {step['attempt']}: pod {step['pod']}{armed}",
        )
        return None

    def _take_slot(self) -> bool:
        with self._slots:
            active = self.cache.active_step_pods()
            if active + self._creating >= self.settings.max_step_pods:
                return False
            self._creating += 1
            return True

    def _release_slot(self) -> None:
        with self._slots:
            self._creating -= 1

    # Status

    def _mirror(
        self,
        run: JSON,
        spec: AgentRunSpec,
        step: JSON,
        *,
        stepping: bool,
        state: RunState | None = None,
        stalled: str = "",
        read_store: bool = True,
        failpoints_seen: str | None = None,
    ) -> float | None:
        """Write the status this run should show (only if it differs). Returns -1 when the
        patch lost a race with another writer."""
        meta = run["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if state is None and read_store:
            state = self._state(ns, name)
        current = run.get("status") or {}
        running = current.get("phase") == "Running" and current.get("step") == step
        if not read_store and state is None and running:
            return None  # a pod is running and status already says so
        outcome = None if state is None else state.outcome()
        waiting = ""
        key: Key = ("AgentRun", ns, name)
        if key in self.waiting:
            waiting = f"waiting for a step slot ({self.settings.max_step_pods} pods running)"
        elif step.get("notBefore") and stepping:
            waiting = f"next attempt after {step['notBefore']} (back-off after a failed pod)"
        view = status.RunView(
            generation=int(meta.get("generation") or 1),
            outcome=outcome,
            step=step,
            stepping=stepping,
            suspended=spec.suspend,
            stalled=stalled,
            waiting=waiting,
            reconciliations={
                u.action: action_object_name(name, u.action, u.tool)
                for u in (state.unknown if state is not None else ())
            },
            approvals={
                p.action: action_object_name(name, p.action, p.tool)
                for p in (state.pending if state is not None else ())
            },
            failpoints_seen=self._failpoints_seen(run)
            if failpoints_seen is None
            else failpoints_seen,
        )
        if not read_store and state is None:
            return self._write_running(run, view)
        return self._write_status(run, view)

    def _write_running(self, run: JSON, view: status.RunView) -> float | None:
        """While a pod runs the store is not read: status keeps its mirror, with the phase
        and conditions of a run under way."""
        current = dict(run.get("status") or {})
        desired = status.desired_status(replace(view, outcome=None), old=current, now=now())
        for name in ("iteration", "usage", "answer", "stopReason", "resumable"):
            if name in current:
                desired[name] = current[name]
        desired["phase"] = "Running"
        return self._patch(run, desired)

    def _stalled_view(self, run: JSON, why: str) -> status.RunView:
        meta = run["metadata"]
        step = dict((run.get("status") or {}).get("step") or {})
        return status.RunView(
            generation=int(meta.get("generation") or 1),
            outcome=None,
            step={**step, "state": "Stalled", "generation": int(meta.get("generation") or 1)},
            stepping=False,
            stalled=why,
        )

    def _write_status(self, run: JSON, view: status.RunView) -> float | None:
        current = run.get("status") or {}
        desired = status.desired_status(view, old=current, now=now())
        return self._patch(run, desired)

    def _patch(self, run: JSON, desired: JSON) -> float | None:
        meta = run["metadata"]
        ns, name = meta["namespace"], meta["name"]
        current = run.get("status") or {}
        self.phases[("AgentRun", ns, name)] = str(desired.get("phase", ""))
        if not status.differs(desired, current):
            return None
        try:
            patched = self.api.patch_status(
                "AgentRun", ns, name, desired, resource_version=meta.get("resourceVersion")
            )
        except Conflict:
            return -1.0
        except Gone as gone:
            if gone.named != name:
                raise  # a 404 that names no run (a server still starting): retried, backing off
            # The run is gone, though no watch said so (deleted while the watch was away): it
            # is forgotten as deleted; the caller sees a lost race and makes no step pod, and
            # the next look, at once, stops its pods.
            self.cache.forget_vanished("AgentRun", ns, name, str(meta.get("uid", "")))
            return -1.0
        self.cache.put("AgentRun", patched)
        self._transition_events(run, current, desired)
        if is_tick(run):
            parent = _controller_name(run)
            if parent:
                self.enqueue(("AgentRun", ns, parent), 0.0)
        return None

    def _transition_events(self, run: JSON, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        before = (old.get("phase"), old.get("stopReason"))
        after = (new.get("phase"), new.get("stopReason"))
        if before == after:
            return
        phase, reason = after
        message = str(new.get("message") or "")
        meta = run["metadata"]
        key: Key = ("AgentRun", meta["namespace"], meta["name"])
        untold = self.ends_untold.pop(key, None) if phase in _STOPPED_PHASES else None
        if untold is not None:
            message = f"{message} ({untold[1]})" if message else untold[1]
        if phase == "Succeeded":
            self._event(run, type_="Normal", reason="Succeeded", message=message or "goal met")
        elif phase == "Failed":
            self._event(run, type_="Warning", reason="Failed", message=f"{reason}: {message}")
        elif phase == "Stopped":
            words = f"{reason}: {message}" if reason else message
            self._event(run, type_="Normal", reason="Stopped", message=words)

    # Reconciliation and Approval

    def _reconciliation(self, key: Key) -> float | None:
        _, ns, name = key
        rec = self.cache.get("Reconciliation", ns, name)
        if rec is None or (rec.get("status") or {}).get("phase") == "Settled":
            return None
        spec = rec.get("spec") or {}
        run_name, action = str(spec.get("runName", "")), str(spec.get("action", ""))
        record = self.stores.idempotency.get(ns, str(spec.get("idempotencyKey", "")))
        if record is None or record.state not in (KeyState.COMPLETED, KeyState.ABANDONED):
            executed = spec.get("executed")
            if executed is None:
                return None  # waiting for a person
            try:
                record = self.loop.reconcile(
                    ns, run_name, action, executed=bool(executed), by=str(spec.get("by", ""))
                )
            except (SettleError, RunNotFound, InputError) as error:
                record = self.stores.idempotency.get(ns, str(spec.get("idempotencyKey", "")))
                if record is None or record.state not in (KeyState.COMPLETED, KeyState.ABANDONED):
                    self._warn_about(rec, run_name, "SettleRefused", str(error))
                    return 10.0
        verdict = "executed" if record.state is KeyState.COMPLETED else "abandoned"
        decided = spec.get("executed")
        if decided is not None and bool(decided) != (verdict == "executed"):
            self._warn_about(
                rec,
                run_name,
                "DecidedElsewhere",
                f"{action} was already settled as {verdict} by {record.settled_by}; "
                "that decision stands",
            )
        body = {
            "phase": "Settled",
            "verdict": verdict,
            "source": record.source or "human",
            "settledBy": record.settled_by,
            "settledAt": now(),
        }
        try:
            patched = self.api.patch_status("Reconciliation", ns, name, body)
        except Gone:
            return None
        self.cache.put("Reconciliation", patched)
        run = self.cache.get("AgentRun", ns, run_name)
        if run is not None:
            self._event(
                run,
                type_="Normal",
                reason="Settled",
                message=f"{spec.get('tool')} ({action}) settled as {verdict} by "
                f"{record.settled_by} ({body['source']}): reconciliation {name}",
            )
        self.enqueue(("AgentRun", ns, run_name), 0.0)
        return None

    def _approval(self, key: Key) -> float | None:
        _, ns, name = key
        approval = self.cache.get("Approval", ns, name)
        if approval is None or (approval.get("status") or {}).get("phase") == "Settled":
            return None
        spec = approval.get("spec") or {}
        run_name, action = str(spec.get("runName", "")), str(spec.get("action", ""))
        decided = spec.get("approved")
        state = self._state(ns, run_name)
        recorded = None if state is None else state.approvals.get(action)
        if recorded is None:
            if decided is None:
                return None
            try:
                self.loop.approve(
                    ns, run_name, action, approved=bool(decided), by=str(spec.get("by", ""))
                )
            except (SettleError, RunNotFound, InputError) as error:
                state = self._state(ns, run_name)
                recorded = None if state is None else state.approvals.get(action)
                if recorded is None:
                    self._warn_about(approval, run_name, "ApprovalRefused", str(error))
                    return 10.0
            else:
                state = self._state(ns, run_name)
                recorded = None if state is None else state.approvals.get(action)
        if recorded is None:
            return 1.0
        verdict = "approved" if recorded.approved else "denied"
        body = {
            "phase": "Settled",
            "verdict": verdict,
            "settledBy": recorded.by,
            "settledAt": now(),
        }
        try:
            patched = self.api.patch_status("Approval", ns, name, body)
        except Gone:
            return None
        self.cache.put("Approval", patched)
        run = self.cache.get("AgentRun", ns, run_name)
        if run is not None:
            self._event(
                run,
                type_="Normal",
                reason="Approved" if recorded.approved else "Denied",
                message=f"{spec.get('tool')} ({action}) {verdict} by {recorded.by}: "
                f"approval {name}",
            )
        self.enqueue(("AgentRun", ns, run_name), 0.0)
        return None

    def _warn_about(self, obj: JSON, run_name: str, reason: str, message: str) -> None:
        ns = obj["metadata"]["namespace"]
        run = self.cache.get("AgentRun", ns, run_name)
        self._event(run or obj, type_="Warning", reason=reason, message=message)

    # Monitors

    def _monitor(self, run: JSON, spec: AgentRunSpec) -> float | None:
        """A monitor schedules ticks (child AgentRuns ``<name>.tick-<n>``); it runs nothing."""
        meta = run["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        current = run.get("status") or {}
        ticks = sorted(
            (
                (number, body)
                for body in self.cache.select(
                    "AgentRun",
                    ns,
                    lambda b: (
                        b["metadata"].get("labels", {}).get(MONITOR_LABEL) == label_value(name)
                    ),
                )
                if resources.owned_by(body, uid)
                and (number := tick_number(name, body["metadata"]["name"])) is not None
            ),
            key=lambda pair: pair[0],
        )
        self._trim_history(spec, ns, ticks)
        latest_number = max(
            [tick_number(name, str(current.get("lastTick", ""))) or 0, *(n for n, _ in ticks)]
        )
        latest = ticks[-1][1] if ticks and ticks[-1][0] == latest_number else None
        last = _parse_time(current.get("lastScheduleTime")) or _parse_time(
            meta.get("creationTimestamp")
        )
        moment = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        due = next_due(spec.schedule, after=last or moment)
        desired: JSON = {}
        held = _holds_back(latest)
        if not spec.suspend and due <= moment:
            if held:
                desired["lastScheduleTime"] = _iso(moment)  # this schedule is skipped
            else:
                tick_name = tick_run_name(name, latest_number + 1)
                try:
                    created = self.api.create_object("AgentRun", ns, resources.tick(run, tick_name))
                    self.cache.put("AgentRun", created)
                except Conflict:
                    pass
                desired["lastTick"] = tick_name
                desired["lastScheduleTime"] = _iso(moment)
                self._event(
                    run, type_="Normal", reason="TickCreated", message=f"created tick {tick_name}"
                )
            due = next_due(spec.schedule, after=moment)
        generation = int(meta.get("generation") or 1)
        phase = "Pending" if spec.suspend else "Running"
        if spec.suspend:
            message = "suspended (spec.suspend is true)"
        elif held:
            message = f"next tick held back: {held}"
        else:
            message = f"next tick at {_iso(due)}"
        desired.update(
            {
                "phase": phase,
                "observedGeneration": generation,
                "message": message,
                "conditions": [
                    _plain_condition(current, "Ready", "True", "Scheduling", generation),
                    _plain_condition(current, "Reconciling", "False", phase, generation),
                    _plain_condition(current, "Stalled", "False", "NotStalled", generation),
                ],
            }
        )
        self._patch(run, desired)
        return None if spec.suspend else max(0.5, due.timestamp() - self.clock())

    def _trim_history(self, spec: AgentRunSpec, ns: str, ticks: list[tuple[int, JSON]]) -> None:
        """Keep the newest finished ticks as a CronJob keeps its Jobs; the store keeps every
        tick's checkpoint and audit trail."""
        succeeded = [b for _, b in ticks if (b.get("status") or {}).get("phase") == "Succeeded"]
        failed = [b for _, b in ticks if (b.get("status") or {}).get("phase") == "Failed"]
        for bodies, keep in (
            (succeeded, spec.successful_ticks_history_limit),
            (failed, spec.failed_ticks_history_limit),
        ):
            for body in bodies[: max(0, len(bodies) - keep)]:
                meta = body["metadata"]
                self.api.delete_object("AgentRun", ns, meta["name"], uid=meta["uid"])


def is_tick(run: Mapping[str, Any]) -> bool:
    """A monitor's tick: labelled with its monitor and controlled by an AgentRun."""
    meta = run.get("metadata", {})
    return MONITOR_LABEL in (meta.get("labels") or {}) and bool(_controller_name(run))


def _controller_name(run: Mapping[str, Any]) -> str:
    for ref in run.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "AgentRun":
            return str(ref.get("name", ""))
    return ""


def _holds_back(latest: JSON | None) -> str:
    """Why the latest tick keeps the next one from starting ('' if it does not)."""
    if latest is None:
        return ""
    tick_status = latest.get("status") or {}
    name = latest["metadata"]["name"]
    phase = tick_status.get("phase", "Pending")
    if phase in ("Pending", "Running"):
        return f"{name} is still {phase.lower()}"
    reason = tick_status.get("stopReason", "")
    if phase == "Stopped" and reason in {r.value for r in _WAITING}:
        return f"{name} waits for a person ({reason})"
    return ""


def _plain_condition(
    current: Mapping[str, Any], type_: str, value: str, reason: str, generation: int
) -> JSON:
    before = {c.get("type"): c for c in current.get("conditions") or []}.get(type_) or {}
    same = before.get("status") == value and before.get("lastTransitionTime")
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": "",
        "lastTransitionTime": before["lastTransitionTime"] if same else now(),
        "observedGeneration": generation,
    }


def _stamp(moment: float) -> str:
    return _iso(dt.datetime.fromtimestamp(moment, dt.UTC))


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
