"""What every reconciler works with, in one value: the seams, the stores, the settings and the
controller's shared state.

Why it exists: the reconcilers share the cluster API, the cache, the stores (through one
``Loop``), the Event recorder, the step slots and the run memory; one object passed to each
constructor keeps them the same objects everywhere and the constructors short. The settings are
the operator's command-line options. Nothing here decides anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.state import RunState
from keelgate.core.tracing import NO_TRACING, Tracer
from keelgate.errors import RunNotFound
from keelgate.kube.controller.events import EventRecorder
from keelgate.kube.controller.memory import RunMemory
from keelgate.kube.controller.ownership import RUN_LEASE, RunHolding
from keelgate.kube.controller.ports import ApiServer, ClusterView, Enqueue, StepMeter
from keelgate.kube.controller.slots import StepSlots
from keelgate.kube.naming import action_object_name, earlier_object_name
from keelgate.kube.notifications import Notification
from keelgate.kube.resources import StepPodSettings


def notify_nobody(notification: Notification) -> None:
    """No sink is configured: a notification goes nowhere."""


@dataclass(frozen=True)
class ControllerSettings:
    pods: StepPodSettings = field(default_factory=StepPodSettings)
    allow_failpoints: bool = False
    max_step_pods: int = 20
    max_crashes: int = 5
    crash_backoff: float = 1.0  # seconds before the 3rd attempt (the 2nd: at once); doubles
    max_backoff: float = 60.0
    busy_retry: float = 5.0
    #: Tell every step's start in an Event (``--step-events=every``); by default only those a
    #: status does not tell (a run's first step, a retry, failpoints armed).
    every_step_event: bool = False
    #: Signs a payload into a DSSE envelope (``--audit-sign-key``): the operator then signs each
    #: stopped run's chain head (``kube.controller.signed_heads``). None: it signs nothing.
    sign_head: Callable[[bytes], Mapping[str, Any]] | None = None
    #: Who this operator is in the store's run ownership (``--identity``: its pod's name); empty:
    #: it takes no run, and every run is written without an epoch, as before ownership.
    holder: str = ""
    #: Seconds a taken run's lease lasts (``--run-lease``); renewed every third of it.
    run_lease: float = RUN_LEASE
    #: How many shards the runs are in (``--shards``): each run is labelled with its shard
    #: before it is driven (``kube.controller.shards``). 0: not sharded, no label written.
    shards: int = 0

    @property
    def confirms(self) -> bool:
        """Whether step pods ask a confirmer about unknown outcomes."""
        return bool(self.pods.confirmer or self.pods.confirmer_url)


@dataclass(frozen=True)
class ControllerContext:
    api: ApiServer
    cache: ClusterView
    stores: Stores
    loop: Loop
    settings: ControllerSettings
    events: EventRecorder
    slots: StepSlots
    memory: RunMemory
    meter: StepMeter
    enqueue: Enqueue
    clock: Callable[[], float]
    tracer: Tracer = NO_TRACING  # where step pods' spans go (kube.controller.traces)
    #: Send a notification no object's body holds (``kube.notifications.approval_expired``) to
    #: the sinks, once; never blocks (``kube.runtime.notifier``). Every other notification is
    #: derived by the runtime from the objects the controller writes: the controller sends
    #: nothing else.
    notify: Callable[[Notification], None] = notify_nobody
    #: The runs this operator holds in the store (``kube.controller.ownership``); by default
    #: none, and none is taken.
    holding: RunHolding = field(default_factory=RunHolding)

    def run_state(self, namespace: str, name: str) -> RunState | None:
        """The run's checkpoint, as the store has it now (None: no step has saved one)."""
        try:
            return self.loop.state(namespace, name)
        except RunNotFound:
            return None

    def object_name(
        self, kind: str, namespace: str, run: str, action: str, tool: str, *, round: int = 1
    ) -> str:
        """The name of the Reconciliation or Approval (``kind``) of one action of ``run``:
        today's (``naming.action_object_name``), or the name an earlier release gave it when
        an object of that kind and name exists for this very run, action and tool (made
        before an upgrade: it is the one people were told of, and holds their decision or the
        settlement). The cache holds every such object before any reconcile runs (the
        operator's start barrier), so an object made before the upgrade is never made again
        under today's name. An Approval of a later ``round`` has today's name only."""
        if round != 1:
            return action_object_name(run, action, tool, round=round)
        name = action_object_name(run, action, tool)
        if self.cache.get(kind, namespace, name) is not None:
            return name
        earlier = earlier_object_name(run, action, tool)
        found = self.cache.get(kind, namespace, earlier)
        spec = (found or {}).get("spec") or {}
        if (spec.get("runName"), spec.get("action"), spec.get("tool")) == (run, action, tool):
            return earlier
        return name
