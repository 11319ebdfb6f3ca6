"""Creating the step pod a run's ``status.step`` names: after its back-off, in a free step slot,
with the run's spec recorded in the store first.

Why it exists: the pod is created only after the intent is written (``status.step``), under the
name the intent holds, so a restarted operator (or a second one) creates or adopts that same pod
and never another. A 409 is adopted only when the pod found is this run's (its owner UID); one
that is not stalls the run. The pod reads its spec from the store, so the spec is recorded before
the pod can start. A create the API server refuses (a ResourceQuota, a policy engine, an
invalid field) is told in a Warning ``FailedCreate`` Event with the server's words (once per
distinct refusal), tried again with a growing back-off, and after ``STALL_AFTER`` refusals in a
row shown as ``Stalled=True`` (reason ``PodCreateRefused``), which the next successful create
clears. Where the operator takes runs in the store (``ownership``), it takes the run first and
hands the pod its epoch; a run another live holder holds gets no pod, and its status says who
holds it (``Standby`` when another cluster's operator does; else ``Reconciling``, reason
``HeldElsewhere``). This module must never create a pod whose
name the status does not hold, nor one for a run this operator does not hold when it takes runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keelgate.core import clocks
from keelgate.errors import KeelgateError
from keelgate.kube import resources
from keelgate.kube.api_failures import ApiFailure, Conflict, Gone
from keelgate.kube.controller import traces
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.outcomes import REST, Requeue, Result
from keelgate.kube.controller.ownership import HeldElsewhere
from keelgate.kube.controller.ports import JSON, Key
from keelgate.kube.controller.run_status import RunStatusWriter
from keelgate.kube.resources import creator_of
from keelgate.kube.times import parse_time
from keelgate.manifest import AgentRunSpec

#: Refusals in a row before the run shows Stalled=True (the server's reason as its message).
STALL_AFTER = 3
#: The back-off after the first refusal, doubling, and at most.
REFUSED_FIRST, REFUSED_MAX = 5.0, 300.0


def foreign_pod(pod: str) -> str:
    """Why a run stalls when the name of its next pod is taken by a pod that is not its own."""
    return f"a pod named {pod} exists and is not this run's; delete it"


class StepPodStarter:
    def __init__(self, context: ControllerContext, status: RunStatusWriter) -> None:
        self._context = context
        self._status = status

    def start(self, key: Key, run: JSON, spec: AgentRunSpec, step: Mapping[str, Any]) -> Result:
        """Create (or adopt) the pod ``step`` names, when its back-off has passed and a step
        slot is free (else the run waits for a slot: woken when a step pod ends)."""
        context = self._context
        namespace = key[1]
        not_before = parse_time(step.get("notBefore"))
        if not_before is not None:
            left = not_before.timestamp() - context.clock()
            if left > 0:
                return Requeue(left)
        held = context.holding.hold(namespace, key[2])
        if isinstance(held, HeldElsewhere):
            # Another operator drives the run (a standby cluster's, or the leader before a
            # hand-over whose lease has not lapsed): no pod here; look again when it lapses.
            self._status.write_run_status(
                run, step, suspended=spec.suspend, stepping=not held.standby, held=held
            )
            return Requeue(max(1.0, held.lease_left + 0.5))
        epoch = None if held is None else held.epoch
        if not context.slots.take(key):
            return REST  # woken when a step pod ends
        refused: ApiFailure | None = None
        try:
            self._record_spec(key, run, spec)
            meta = run["metadata"]
            trace = None
            if context.tracer.enabled and context.settings.pods.trace_env:
                ref = traces.run_trace(run, context.run_state(namespace, key[2]))
                trace = traces.pod_trace(ref, run, str(step["pod"]))
            body = resources.step_pod(
                run,
                spec,
                name=str(step["pod"]),
                step=int(step["number"]),
                attempt=int(step["attempt"]),
                generation=int(meta.get("generation") or 1),
                failpoints=str(step.get("failpoints", "")),
                settings=context.settings.pods,
                trace=trace,
                epoch=epoch,
            )
            try:
                created = context.api.create_pod(namespace, body)
            except Conflict:
                existing = context.api.read_pod(namespace, str(step["pod"]))
                if not resources.owned_by(existing, meta["uid"]):
                    return self._status.write_run_status(
                        run,
                        step,
                        suspended=spec.suspend,
                        stepping=False,
                        stalled=foreign_pod(str(step["pod"])),
                    )
                context.cache.put("Pod", existing)  # ours already: adopt it
                return REST
            except ApiFailure as failure:
                if not failure.refused:
                    raise  # the server did not answer, or asks us to wait: the usual back-off
                refused = failure
            else:
                # Counted as active before its slot is given back: the cap must see it at once.
                context.cache.put("Pod", created)
        finally:
            context.slots.release()
        if refused is not None:
            return self._refused(key, run, spec, step, refused)
        if context.memory.create_succeeded(key):
            context.events.normal(
                run, "Created", f"step {step['number']}: pod {step['pod']} created at last"
            )
        self._tell_started(key, run, step)
        return REST

    def as_the_server_has_it(self, namespace: str, pod: JSON) -> JSON | None:
        """The pod ``pod`` (a view from the cache) as the API server has it now; None, and
        forgotten as deleted (its last body left as its tombstone), if the server no longer
        has it. Asked before a run stalls on a pod of its next name that is not its own: a
        watch that reconnects lists the objects again but never reports one deleted while it
        was away, so a finished pod of a run deleted before (removed since) can sit in the
        cache for good, and a stall on it would tell a person to delete a pod that is not
        there, and last until the operator restarted."""
        context = self._context
        meta = pod["metadata"]
        name = str(meta["name"])
        try:
            found = context.api.read_pod(namespace, name)
        except Gone as gone:
            if gone.named != name:
                raise  # a 404 that names no pod (a server still starting): retried, backing off
            context.cache.forget_vanished("Pod", namespace, name, str(meta.get("uid") or ""))
            return None
        context.cache.put("Pod", found)
        return found

    def _refused(
        self, key: Key, run: JSON, spec: AgentRunSpec, step: Mapping[str, Any], refused: ApiFailure
    ) -> Result:
        """The API server refused the step pod: a Warning with its words (once per distinct
        refusal), Stalled=True once it has refused ``STALL_AFTER`` times in a row, and another
        try after a back-off (5 s doubling, at most 5 minutes): the cause may go (a quota
        raised, a policy fixed) without any change to the run."""
        context = self._context
        said = refused.detail or str(refused)
        count, new = context.memory.create_refused(key, said)
        what = f"step {step['number']} attempt {step['attempt']}: cannot create pod {step['pod']}"
        if new:
            context.events.warning(run, "FailedCreate", f"{what}: {said}")
        if count >= STALL_AFTER:
            self._status.write_run_status(
                run,
                step,
                suspended=spec.suspend,
                stepping=True,
                stalled=f"{what} ({count} tries): {said}",
                stalled_reason="PodCreateRefused",
            )
        return Requeue(clocks.backoff(REFUSED_FIRST, REFUSED_MAX, count - 1))

    def _record_spec(self, key: Key, run: JSON, spec: AgentRunSpec) -> None:
        """The pod reads the spec from the store: record it before the pod can start. Once
        recorded, a spec is never removed, and only a newer generation replaces it, so what
        this operator recorded for a run stays there: no store call to say it again."""
        context = self._context
        _, namespace, name = key
        specs = context.stores.specs
        if specs is None:
            raise KeelgateError("the store keeps no recorded specs")
        meta = run["metadata"]
        generation = int(meta.get("generation") or 1)
        document = spec.loop_spec(tenant=namespace, run=name, creator=creator_of(run)).to_json()
        recorded = (meta["uid"], generation, document)
        if not context.memory.spec_recorded(key, recorded) and specs.record_spec(
            namespace, name, document, source=meta["uid"], generation=generation
        ):
            context.memory.remember_spec(key, recorded)

    def _tell_started(self, key: Key, run: JSON, step: Mapping[str, Any]) -> None:
        """Count the step, and tell its start in a ``StepStarted`` Event when it says something
        the run's status does not: the run's first step, an attempt after a pod that did not
        end cleanly, failpoints armed. The routine next step after a clean end is told by the
        status alone (``status.step``), and that clean end with what comes after it (the run's
        stop, or a step that is told), unless ``--step-events=every``: an Event is an API
        write, a third of what a step costs the API server."""
        context = self._context
        context.meter.step_started()
        ended = context.memory.take_ended_at(key)
        if ended is not None:
            context.meter.handoff(max(0.0, context.clock() - ended))
        routine = (
            int(step.get("number") or 0) > 1
            and int(step.get("attempt") or 0) == 1
            and not step.get("failpoints")
        )
        if routine and not context.settings.every_step_event:
            return  # the clean end before it stays untold, for the next Event to tell
        armed = f" with failpoints {step['failpoints']}" if step.get("failpoints") else ""
        untold = context.memory.take_untold(key)
        if untold is not None:
            armed += f" ({untold})"
        context.events.normal(
            run,
            "StepStarted",
            f"step {step['number']} attempt {step['attempt']}: pod {step['pod']}{armed}",
        )
