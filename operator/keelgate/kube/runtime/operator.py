"""``keelgate operator``: the wiring of the running operator: kopf's watches feed the cache and
the work queue, workers run the controller, a resync and the health endpoints run beside them.

With leader election (``leadership``), a replica stands by until it holds the Lease, serving
only its health endpoints; the leader then lists every watched kind once into the cache (the
start barrier: no worker runs before, so the step-pod cap and a monitor's due tick are judged on
the whole cluster, never on a half-filled cache, and ``/readyz`` says ``listing`` meanwhile) and
starts kopf's watches. A leader that fails to renew its lease stops at once and exits 1; its pod
comes back as a standby. Sharded (``shards``), no replica leads alone: each starts its watches at
once and drives the shards whose Leases it takes (``shard_leases``), each listed into the cache
when taken and forgotten when given back or lost, and leaves other shards' objects alone
(``shards``).

kopf's watch streams are the operator's eyes: every change to an AgentRun, a step pod, a
Reconciliation or an Approval lands in the cache and queues a reconcile of the run it concerns.
A few workers (``workers``) take keys from the queue and run the (synchronous, store-bound)
controller in threads; a periodic resync (``resync``) queues every run again, so nothing depends
on an event arriving. kopf is used only to observe: its handlers return nothing, so kopf writes
nothing onto any object, and its progress and diff-base storage point at ``status.kopf`` should
a handler ever store any.

This module must never keep run state in memory that a restart could lose (the cache and the
queue are rebuilt from the cluster's listing), and never take an action itself: only the
controller decides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from keelgate.core.protocols import RunRevisions, Stores
from keelgate.core.tracing import NO_TRACING, Tracer
from keelgate.kube.api import ClusterApi
from keelgate.kube.controller.context import ControllerSettings, notify_nobody
from keelgate.kube.controller.dispatch import Controller
from keelgate.kube.controller.outcomes import REST, Result
from keelgate.kube.controller.ports import Key
from keelgate.kube.naming import GROUP, RUN_LABEL, VERSION
from keelgate.kube.resources import (
    controller_name,
    is_tick,
    pod_change_matters,
    pod_finished,
)
from keelgate.kube.runtime.cache import Cache, key_of, slim_copy
from keelgate.kube.runtime.health import HealthServer, refresh_gauges
from keelgate.kube.runtime.leadership import Leadership, LeaseSettings
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.notifier import ConfigMapState, Notifier, plan_arguments
from keelgate.kube.runtime.resync import Resync, WaitingRuns
from keelgate.kube.runtime.run_leases import let_go_idle_runs, renew_runs
from keelgate.kube.runtime.shards import Sharding, notification_shard, refuse_sharding
from keelgate.kube.runtime.watch_events import is_new_run, run_to_ask_again
from keelgate.kube.runtime.workers import Workers
from keelgate.kube.runtime.workqueue import WorkQueue
from keelgate.manifest.notifications import NotifySettings

log = logging.getLogger("keelgate.operator")

#: How many of the runs waiting for a step slot one freed slot wakes.
WAKE_ON_SLOT = 8
#: How often the notifier's delivery state is kept (only while notifications flow).
NOTIFY_STATE_EVERY = 2.0
#: The kinds the operator watches, listed once before any worker runs.
WATCHED = ("AgentRun", "Pod", "Reconciliation", "Approval")


@dataclass(frozen=True)
class OperatorOptions:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    port: int = 8080  # /metrics and /healthz
    bind: str = "0.0.0.0"
    workers: int = 4
    resync_seconds: float = 30.0
    lease: LeaseSettings | None = None  # None: no election, this process leads alone
    notify: NotifySettings | None = None  # None: no sinks, no CloudEvents
    #: Seconds between the batched renewals of the runs held in the store (``--run-lease-renew``).
    run_lease_renew: float = 10.0
    #: The shards the runs are in (``--shards``; 0: not sharded). Sharded, this replica drives
    #: the shards whose Leases it takes (``lease``: their timings, its name their prefix) instead
    #: of leading alone, and needs run ownership (``controller.holder``).
    shards: int = 0

    def __post_init__(self) -> None:
        if self.shards:
            refuse_sharding(self)


class Operator:
    def __init__(
        self,
        options: OperatorOptions,
        *,
        stores: Stores,
        api: ClusterApi,
        tracer: Tracer = NO_TRACING,
    ) -> None:
        self.options = options
        self.stores = stores
        self.api = api
        self.tracer = tracer
        self.metrics = Metrics()
        self.notifier: Notifier | None = None
        if options.notify is not None and options.notify.sinks:
            settings = options.notify
            self.notifier = Notifier(
                settings,
                metrics=self.metrics,
                state=ConfigMapState(api, settings.state) if settings.state else None,
                arguments=self._arguments,
                # Sharded: each shard's notifications are a lane of their own.
                lane_of=(lambda n: notification_shard(n, options.shards, self.cache))
                if options.shards
                else None,
            )
        self.cache = Cache(observer=None if self.notifier is None else self.notifier.observe)
        self.queue: WorkQueue[Key] | None = None  # made on the operator's event loop
        self.controller: Controller | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._health = HealthServer(
            alive=self._alive, ready=self._ready, metrics=self.metrics, refresh=self._refresh_gauges
        )
        self._seen_end: set[tuple[str, str]] = set()
        self.started = time.monotonic()
        self.leadership: Leadership | None = None
        self.sharding: Sharding | None = None  # sharded: the shards this replica drives
        self.listed = False  # every watched kind listed into the cache once (the barrier)
        self.lost_lease = False
        self.metrics.step_pod_cap.set(options.controller.max_step_pods)
        api.on_write = lambda what: self.metrics.api_writes.labels(what).inc()
        api.on_throttle = self.metrics.api_throttled.inc

    # kopf wiring

    def registry(self) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()

        @kopf.on.login(registry=registry)
        def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
            # The official client's configuration: in-cluster, else the kubeconfig.
            return kopf.login_via_client(**kwargs)

        @kopf.on.startup(registry=registry)
        async def startup(**_: Any) -> None:
            await self._start()

        @kopf.on.cleanup(registry=registry)
        async def cleanup(**_: Any) -> None:
            await self._stop()

        @kopf.on.event(GROUP, VERSION, "agentruns", registry=registry)
        async def on_run(event: Mapping[str, Any], body: Any, **_: Any) -> None:
            if not self._observe("AgentRun", event, body):
                return
            key = key_of("AgentRun", body)
            if is_new_run(event):
                self._add_low(key)
            else:
                self._add(key)
            parent = controller_name(body)
            if parent and is_tick(body):
                self._add(("AgentRun", key[1], parent))

        @kopf.on.event("", "v1", "pods", labels={RUN_LABEL: kopf.PRESENT}, registry=registry)
        async def on_pod(event: Mapping[str, Any], body: Any, **_: Any) -> None:
            if not self._observe("Pod", event, body):
                return
            namespace, name = key_of("Pod", body)[1:]
            run = controller_name(body)
            if run and pod_change_matters(str(event.get("type") or ""), body):
                self._add(("AgentRun", namespace, run))
            deleted = event.get("type") == "DELETED"
            if pod_finished(body) or deleted:
                self._pod_ended(namespace, name)
            if deleted:
                # No event follows a deletion: what was told of this pod may go (a pod of the
                # same name made later is another pod, and its end is told again).
                self._seen_end.discard((namespace, name))

        @kopf.on.event(GROUP, VERSION, "reconciliations", registry=registry)
        async def on_reconciliation(event: Mapping[str, Any], body: Any, **_: Any) -> None:
            if self._observe("Reconciliation", event, body):
                self._add(key_of("Reconciliation", body))
                run = run_to_ask_again(event)
                if run is not None:
                    self._add(run)

        @kopf.on.event(GROUP, VERSION, "approvals", registry=registry)
        async def on_approval(event: Mapping[str, Any], body: Any, **_: Any) -> None:
            if self._observe("Approval", event, body):
                self._add(key_of("Approval", body))

        return registry

    def settings(self) -> kopf.OperatorSettings:
        settings = kopf.OperatorSettings()
        # GitOps: should kopf ever store progress, it goes to status, never to annotations (the
        # CRD keeps status.kopf). A diff-base it never builds nor stores (_NoDiffBase).
        settings.persistence.progress_storage = kopf.StatusProgressStorage()
        settings.persistence.diffbase_storage = _NoDiffBase()
        settings.posting.enabled = False  # the controller posts its own Events
        # The kinds are known and installed before the operator: no watching of CRDs and
        # namespaces, and so no RBAC to read them.
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        return settings

    def _observe(self, kind: str, event: Mapping[str, Any], body: Any) -> bool:
        """Keep a watch event's object in the cache; False when it is not this replica's
        (sharded: of a shard it does not drive), and nothing is to be done about it."""
        # The event's own object is plain data already; the cache keeps a copy of it, without
        # what it would drop anyway (copied on the event loop, for every event of every pod).
        raw = event.get("object")
        sharding = self.sharding
        if sharding is not None:
            seen = raw if isinstance(raw, Mapping) else body
            if not sharding.replica.accepts(kind, seen):
                sharding.replica.moved_out(kind, seen)
                return False
        plain = slim_copy(raw) if isinstance(raw, dict) else _plain(body)
        if event.get("type") == "DELETED":
            self.cache.drop(kind, plain)
        else:
            self.cache.admit(kind, plain)
        return True

    def _add(self, key: Key) -> None:
        if self.queue is not None:
            self.queue.add(key)

    def _add_low(self, key: Key) -> None:
        """Queued behind every key an event or a reconcile queued (the resync's)."""
        if self.queue is not None:
            self.queue.add(key, low=True)

    def _pod_ended(self, namespace: str, name: str) -> None:
        """A step pod ended or went (told once per pod): its slot may be free, and the runs
        waiting longest for one go first."""
        if (namespace, name) in self._seen_end:
            return
        self._seen_end.add((namespace, name))
        if self.controller is not None:
            for key in self.controller.waiting_for_slots(WAKE_ON_SLOT):
                self._add(key)

    def _refresh_gauges(self) -> None:
        refresh_gauges(self.metrics, self.cache)

    def _alive(self) -> bool:
        if self.sharding is not None and not self.sharding.alive():
            return False
        if self._tasks:
            return all(not task.done() for task in self._tasks)
        # Not started yet: a standby is alive while its election runs, a leader while it lists.
        leadership = self.leadership
        return leadership is None or leadership.alive()

    def _ready(self) -> tuple[bool, str]:
        if self.sharding is not None:
            # Ready once started, whatever it holds: a replica that drives no shard (others hold
            # them all) must not hold a rollout up, as a standby does not.
            return True, self.sharding.readiness()
        if self.options.shards:
            return False, "listing"
        leadership = self.leadership
        if leadership is not None and not leadership.leading:
            return True, "standby"
        if not self.listed:
            return False, "listing"
        return True, "leading"

    # Lifecycle

    async def _start(self) -> None:
        notifier = self.notifier
        if notifier is not None:
            if not self.options.shards:  # sharded: each shard's, as it is taken (Sharding)
                # How far the last leader delivered, read before the listing: what the listing
                # holds after that is sent (again).
                await asyncio.to_thread(notifier.begin)
            notifier.start()
        if not self.options.shards:
            await asyncio.to_thread(self._list_everything)  # sharded: each shard as it is taken
        if notifier is not None:
            if not self.options.shards:
                notifier.live()
            self._tasks.append(
                asyncio.create_task(notifier.keep(NOTIFY_STATE_EVERY), name="keelgate-notify")
            )
        # Tenants (namespaces) take turns, and none may hold every worker with its waits.
        queue = self.queue = WorkQueue[Key](
            tenant_of=lambda key: key[1], workers=self.options.workers
        )
        self.controller = Controller(
            api=self.api,
            stores=self.stores,
            cache=self.cache,
            # Sharded: each run is labelled with its shard before it is driven.
            settings=dataclasses.replace(self.options.controller, shards=self.options.shards),
            meter=self.metrics,
            enqueue=queue.add_threadsafe,
            tracer=self.tracer,
            notify=notify_nobody if notifier is None else notifier.notify,
        )
        workers = Workers(queue, self._reconcile, self.metrics)
        for number in range(self.options.workers):
            self._tasks.append(
                asyncio.create_task(workers.work(), name=f"keelgate-worker-{number}")
            )
        resync = Resync(
            every=self.options.resync_seconds,
            cache=self.cache,
            api=self.api,
            clusterwide=not self.options.namespaces,
            add=self._add,
            add_low=self._add_low,
            pod_ended=self._pod_ended,
            refresh_gauges=self._refresh_gauges,
            waiting=(
                WaitingRuns(self.stores.checkpoints.revisions)
                if isinstance(self.stores.checkpoints, RunRevisions)
                else None
            ),
        )
        self._tasks.append(asyncio.create_task(resync.run(), name="keelgate-resync"))
        if self.controller.holding.enabled:
            self._tasks.append(
                asyncio.create_task(
                    renew_runs(
                        self.controller.holding, every=self.options.run_lease_renew, look=self._add
                    ),
                    name="keelgate-runs",
                )
            )
        if self.options.shards:
            self.sharding = Sharding(
                self.options,
                cache=self.cache,
                api=self.api,
                queue=queue,
                slots=self.controller.context.slots,
                metrics=self.metrics,
                notifier=notifier,
            )
            self.listed = True
            self.sharding.start()
        log.info(
            "keelgate operator started (namespaces: %s, step pods at most %d; %d runs listed)",
            ", ".join(self.options.namespaces) or "all",
            self.options.controller.max_step_pods,
            len(self.cache.keys("AgentRun")),
        )

    def _reconcile(self, key: Key) -> Result:
        """A worker's reconcile of ``key``: sharded, only of an object of a shard it drives."""
        controller = self.controller
        assert controller is not None
        sharding = self.sharding
        if sharding is not None and not sharding.replica.drives(key):
            return REST
        return controller.reconcile(key)

    def _list_everything(self) -> None:
        """The start barrier: every watched kind listed into the cache before any worker runs.
        A failed list is tried again (an API server starting up with this replica), never
        skipped: a reconcile on a partial view could exceed the step-pod cap or tick twice."""
        scopes: tuple[str | None, ...] = self.options.namespaces or (None,)
        for kind in WATCHED:
            for scope in scopes:
                delay = 0.5
                while True:
                    try:
                        items = self.api.list_all(kind, scope)
                        break
                    except Exception as failure:  # told, then tried again
                        log.warning(
                            "start: cannot list %s (%s: %s); trying again in %.0fs",
                            kind,
                            type(failure).__name__,
                            str(failure).splitlines()[0] if str(failure) else "",
                            delay,
                        )
                        time.sleep(delay)
                        delay = min(delay * 2, 10.0)
                for item in items:
                    self.cache.put(kind, item)
        self.listed = True

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.sharding is not None:
            await self.sharding.cancel()
        if self.controller is not None:
            await let_go_idle_runs(self.controller.holding, self.cache)
        if self.queue is not None:
            self.queue.close()
        if self.notifier is not None:
            # Undelivered notifications stay after ``through``: the next leader sends them.
            await asyncio.to_thread(self.notifier.stop)

    def _arguments(self, namespace: str, run: str, action: str) -> Any:
        """An action's recorded arguments, for a sink with includeArguments (None: not in the
        run's latest checkpoint, e.g. the run has gone on to a later plan)."""
        checkpoint = self.stores.checkpoints.load(namespace, run)
        return None if checkpoint is None else plan_arguments(checkpoint.state, action)

    # Running

    async def run(self) -> int:
        """Stand by until leading (with an election), then drive runs until stopped. Returns
        the process's exit code: 1 if the lease was lost, else 0."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def lost() -> None:
            self.lost_lease = True
            self.metrics.leader.set(0)
            loop.call_soon_threadsafe(stop.set)

        await self._health.start(self.options.bind, self.options.port)
        try:
            if self.options.lease is not None and not self.options.shards:
                self.leadership = Leadership(
                    self.options.lease, api_client=self.api.client, lost=lost
                )
                await self.leadership.acquire()
            # Sharded: leading is driving a shard (told as shards are taken).
            self.metrics.leader.set(0 if self.options.shards else 1)
            if not stop.is_set():
                await kopf.operator(
                    registry=self.registry(),
                    settings=self.settings(),
                    standalone=True,
                    clusterwide=not self.options.namespaces,
                    namespaces=self.options.namespaces,
                    stop_flag=stop,
                )
        finally:
            self.metrics.leader.set(0)
            if self.leadership is not None:
                await asyncio.to_thread(self.leadership.release)
            if self.sharding is not None:
                # Once nothing is driven: the other replicas take the shards at their next try.
                await asyncio.to_thread(self.sharding.leases.stop)
            await self._health.stop()
        return 1 if self.lost_lease else 0


class _NoDiffBase(kopf.DiffBaseStorage):
    """kopf keeps a "diff-base" (the last handled essence of an object) for its change handlers
    (``on.create``, ``on.update``, ...), and builds one from every event as a deep copy of the
    body. This operator has event handlers only, which need none, and at a few hundred runs
    those copies were a twentieth of its CPU. So none is built, and none is ever stored on an
    object (nothing for a GitOps tool to see as drift)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _plain(body: Any) -> dict[str, Any]:
    """kopf's read-only body as plain data."""
    if isinstance(body, Mapping):
        return {str(k): _plain(v) for k, v in body.items()}
    if isinstance(body, list | tuple):
        return [_plain(v) for v in body]  # type: ignore[return-value]
    return body  # type: ignore[no-any-return]
