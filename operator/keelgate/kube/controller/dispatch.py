"""The controller's one entry for the operator's workers: a queued key to its kind's reconciler.

Why it exists: the workers know keys, not decisions. ``Controller`` builds the reconcilers over
one shared ``ControllerContext`` (and gives the AgentRun reconciler the monitor reconciler: the
reconcilers import nothing of each other) and hands each key to the reconciler of its kind,
with the Events it records kept until the reconcile ends (``EventRecorder.deferred``). It
decides nothing itself. A reconcile runs in a worker thread; two reconciles of one key never overlap
(the work queue sees to that), and the state reconciles of different keys share lives in
``StepSlots`` and ``RunMemory``, each with its lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.tracing import NO_TRACING, Tracer
from keelgate.kube.controller.agentrun import AgentRunReconciler
from keelgate.kube.controller.approval_finalizer import FinalizedApprovals
from keelgate.kube.controller.approvals import ApprovalReconciler
from keelgate.kube.controller.context import ControllerContext, ControllerSettings, notify_nobody
from keelgate.kube.controller.events import EventRecorder
from keelgate.kube.controller.memory import RunMemory
from keelgate.kube.controller.monitor import MonitorReconciler
from keelgate.kube.controller.outcomes import REST, Result
from keelgate.kube.controller.ownership import RunHolding
from keelgate.kube.controller.ports import ApiServer, ClusterView, Enqueue, Key, StepMeter
from keelgate.kube.controller.reconciliations import ReconciliationReconciler
from keelgate.kube.controller.shards import Shards, label_run
from keelgate.kube.controller.slots import StepSlots
from keelgate.kube.notifications import Notification


class Reconciler(Protocol):
    def reconcile(self, key: Key) -> Result: ...


class Controller:
    """Reconciles AgentRuns, Reconciliations and Approvals; called from worker threads."""

    def __init__(
        self,
        *,
        api: ApiServer,
        stores: Stores,
        cache: ClusterView,
        settings: ControllerSettings,
        meter: StepMeter,
        enqueue: Enqueue,
        clock: Callable[[], float] = time.time,
        tracer: Tracer = NO_TRACING,
        notify: Callable[[Notification], None] = notify_nobody,
    ) -> None:
        self.context = ControllerContext(
            api=api,
            cache=cache,
            stores=stores,
            # A settlement or approval made through the operator shows in the run's trace.
            loop=Loop(stores=stores, tracer=tracer),
            settings=settings,
            events=EventRecorder(api),
            slots=StepSlots(cache, limit=settings.max_step_pods, clock=clock),
            memory=RunMemory(),
            meter=meter,
            enqueue=enqueue,
            clock=clock,
            tracer=tracer,
            notify=notify,
            holding=RunHolding.of(stores, holder=settings.holder, lease=settings.run_lease),
        )
        self._shards = Shards(settings.shards) if settings.shards else None
        self._reconcilers: dict[str, Reconciler] = {
            "AgentRun": AgentRunReconciler(self.context, monitors=MonitorReconciler(self.context)),
            "Reconciliation": ReconciliationReconciler(self.context),
            "Approval": FinalizedApprovals(self.context, ApprovalReconciler(self.context)),
        }

    def reconcile(self, key: Key) -> Result:
        """Do what ``key``'s object needs; the result says when to look at it again."""
        reconciler = self._reconcilers.get(key[0])
        if reconciler is None:
            return REST
        if self._shards is not None and key[0] == "AgentRun":
            label_run(self.context.api, self.context.cache, self._shards, key)
        with self.context.events.deferred():
            return reconciler.reconcile(key)

    @property
    def holding(self) -> RunHolding:
        """The runs this operator holds in the store (the runtime renews them)."""
        return self.context.holding

    def waiting_for_slots(self, count: int) -> list[Key]:
        """Up to ``count`` runs waiting for a step slot, the longest waiting first."""
        return self.context.slots.longest_waiting(count)
