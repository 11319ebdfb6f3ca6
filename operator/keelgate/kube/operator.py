"""``keelgate operator``: kopf watches, a keyed work queue, the controller, metrics and health.

kopf's watch streams are the operator's eyes: every change to an AgentRun, a step pod, a
Reconciliation or an Approval lands in the cache and queues a reconcile of the run it concerns.
A few workers take keys from the queue and run the (synchronous, store-bound) controller in
threads; a periodic resync queues every run again, so nothing depends on an event arriving
(a person may settle an outcome with ``keelgate reconcile`` straight in the store). kopf is used
only to observe: its handlers return nothing, so kopf writes nothing onto any object, and its
progress and diff-base storage point at ``status.kopf`` should a handler ever store any.

This module must never keep run state in memory that a restart could lose (the cache and the
queue are rebuilt from the cluster's listing), and never take an action itself: only the
controller decides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from keelgate.core.protocols import Stores
from keelgate.kube.api import ClusterApi, Gone
from keelgate.kube.cache import (
    Cache,
    Key,
    copy_json,
    is_active_step_pod,
    key_of,
    pod_finished,
)
from keelgate.kube.controller import Controller, ControllerSettings, is_tick
from keelgate.kube.metrics import Metrics
from keelgate.kube.naming import GROUP, RUN_LABEL, VERSION

log = logging.getLogger("keelgate.operator")


@dataclass(frozen=True)
class OperatorOptions:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    port: int = 8080  # /metrics and /healthz
    bind: str = "0.0.0.0"
    workers: int = 4
    resync_seconds: float = 30.0


def _owner_run(body: Mapping[str, Any]) -> str:
    """The AgentRun that controls ``body`` (a pod's label may be a shortened name)."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "AgentRun":
            return str(ref.get("name", ""))
    return ""


class Operator:
    def __init__(self, options: OperatorOptions, *, stores: Stores, api: ClusterApi) -> None:
        self.options = options
        self.stores = stores
        self.api = api
        self.cache = Cache()
        self.metrics = Metrics()
        self.queue: Any = None  # a WorkQueue, made on the operator's event loop
        self.controller: Controller | None = None
        self._failures: dict[Key, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._seen_end: set[tuple[str, str]] = set()
        self.started = time.monotonic()
        api.on_write = lambda what: self.metrics.api_writes.labels(what).inc()

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
            self._observe("AgentRun", event, body)
            key = key_of("AgentRun", body)
            self._add(key)
            parent = _owner_run(body)
            if parent and is_tick(body):
                self._add(("AgentRun", key[1], parent))

        @kopf.on.event("", "v1", "pods", labels={RUN_LABEL: kopf.PRESENT}, registry=registry)
        async def on_pod(event: Mapping[str, Any], body: Any, **_: Any) -> None:
            self._observe("Pod", event, body)
            ns, name = key_of("Pod", body)[1:]
            run = _owner_run(body)
            if run:
                self._add(("AgentRun", ns, run))
            if (pod_finished(body) or event.get("type") == "DELETED") and (
                ns,
                name,
            ) not in self._seen_end:
                self._seen_end.add((ns, name))
                self._wake_waiting()

        @kopf.on.event(GROUP, VERSION, "reconciliations", registry=registry)
        async def on_reconciliation(event: Mapping[str, Any], body: Any, **_: Any) -> None:
            self._observe("Reconciliation", event, body)
            key = key_of("Reconciliation", body)
            self._add(key)

        @kopf.on.event(GROUP, VERSION, "approvals", registry=registry)
        async def on_approval(event: Mapping[str, Any], body: Any, **_: Any) -> None:
            self._observe("Approval", event, body)
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

    def _observe(self, kind: str, event: Mapping[str, Any], body: Any) -> None:
        # The event's own object is plain data already; the cache keeps a copy of it.
        raw = event.get("object")
        plain = copy_json(raw) if isinstance(raw, dict) else _plain(body)
        if event.get("type") == "DELETED":
            self.cache.drop(kind, plain)
        else:
            self.cache.put(kind, plain)

    def _add(self, key: Key) -> None:
        if self.queue is not None:
            self.queue.add(key)

    def _wake_waiting(self) -> None:
        """A step slot may be free: the runs waiting longest go first."""
        controller = self.controller
        if controller is None or not controller.waiting:
            return
        for key, _since in sorted(controller.waiting.items(), key=lambda item: item[1])[:8]:
            self._add(key)

    # Lifecycle

    async def _start(self) -> None:
        from keelgate.kube.workqueue import WorkQueue

        self.queue = WorkQueue[Key]()
        self.controller = Controller(
            api=self.api,
            stores=self.stores,
            cache=self.cache,
            settings=self.options.controller,
            metrics=self.metrics,
            enqueue=self.queue.add_threadsafe,
        )
        for number in range(self.options.workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"keelgate-worker-{number}"))
        self._tasks.append(asyncio.create_task(self._resync(), name="keelgate-resync"))
        await self._serve()
        log.info(
            "keelgate operator started (namespaces: %s, step pods at most %d)",
            ", ".join(self.options.namespaces) or "all",
            self.options.controller.max_step_pods,
        )

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.queue is not None:
            self.queue.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _work(self) -> None:
        assert self.queue is not None and self.controller is not None
        while True:
            key: Key = await self.queue.get()
            delay: float | None
            try:
                delay = await asyncio.to_thread(self.controller.reconcile, key)
            except Exception as error:
                count = self._failures.get(key, 0) + 1
                self._failures[key] = count
                delay = min(60.0, 0.5 * 2 ** min(count, 7))
                self.metrics.reconcile_errors.labels(key[0]).inc()
                log.warning(
                    "%s %s/%s: %s: %s (retry in %.0fs)",
                    key[0],
                    key[1],
                    key[2],
                    type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "",
                    delay,
                )
            else:
                self._failures.pop(key, None)
            finally:
                self.queue.done(key)
            if delay is not None:
                self.queue.add_after(key, delay)

    async def _resync(self) -> None:
        """Queue every run that may still change again now and then, forget the step pods
        deleted unseen, and refresh the gauges."""
        while True:
            await asyncio.sleep(self.options.resync_seconds)
            for key in due_for_resync(self.cache):
                self._add(key)
            self._gauges()
            await self._forget_vanished_step_pods()

    async def _forget_vanished_step_pods(self) -> None:
        """A step pod deleted while the pod watch was away (an API server restart, a network
        cut) is never reported: kopf lists the pods again when it reconnects, and a pod missing
        from that list is not a deletion to it. The cache would hold such a pod as running for
        good: its run would wait for it, and it would keep a step slot. So each resync asks
        the server which step pods are still running; one it does not name and no longer has
        is dropped as deleted (its run then takes its next attempt, as for any pod deleted
        mid-step)."""
        try:
            vanished = await asyncio.to_thread(
                vanished_step_pods, self.api, self.cache, clusterwide=not self.options.namespaces
            )
        except Exception as failure:  # an API server away, or refusing: the next resync asks again
            log.warning(
                "resync: cannot check the running step pods (%s: %s)",
                type(failure).__name__,
                str(failure).splitlines()[0] if str(failure) else "",
            )
            return
        for namespace, name, uid in vanished:
            body = self.cache.forget_vanished("Pod", namespace, name, uid)
            if body is None:
                continue  # the watch reported it meanwhile
            log.info(
                "step pod %s/%s was deleted unseen: its run takes its next attempt", namespace, name
            )
            run = _owner_run(body)
            if run:
                self._add(("AgentRun", namespace, run))
            if (namespace, name) not in self._seen_end:
                self._seen_end.add((namespace, name))
                self._wake_waiting()

    def _gauges(self) -> None:
        metrics, cache = self.metrics, self.cache
        phases = cache.tally(
            "AgentRun", lambda body: str((body.get("status") or {}).get("phase") or "Pending")
        )
        for phase in ("Pending", "Running", "Stopped", "Succeeded", "Failed"):
            metrics.runs.labels(phase).set(phases.get(phase, 0))
        unsettled = lambda body: not _settled(body)  # noqa: E731
        metrics.unknown_outcomes.set(cache.count("Reconciliation", unsettled))
        metrics.approvals_pending.set(cache.count("Approval", unsettled))
        metrics.step_pods_active.set(cache.active_step_pods())

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.options.bind, self.options.port).start()

    async def _healthz(self, _: web.Request) -> web.Response:
        alive = bool(self._tasks) and all(not task.done() for task in self._tasks)
        return web.Response(status=200 if alive else 503, text="ok\n" if alive else "stalled\n")

    async def _metrics(self, _: web.Request) -> web.Response:
        self._gauges()
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    # Running

    async def run(self) -> None:
        await kopf.operator(
            registry=self.registry(),
            settings=self.settings(),
            standalone=True,
            clusterwide=not self.options.namespaces,
            namespaces=self.options.namespaces,
        )


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


# A resync's look at the running step pods gives up after this long (an API server that
# accepts connections and answers nothing must not hold the resync up for good).
CHECK_TIMEOUT = 10.0


def vanished_step_pods(
    api: ClusterApi, cache: Cache, *, clusterwide: bool
) -> list[tuple[str, str, str]]:
    """The step pods the cache holds as running that the API server no longer has, as
    (namespace, name, uid): one list of the running step pods (of every namespace, or of each
    namespace the cache has one in), then a read of each pod the list did not name, since a pod
    may be missing from it only because it ended, or was created after the list was made."""
    cached = cache.select("Pod", where=is_active_step_pod)
    if not cached:
        return []
    scopes: list[str | None] = [None]
    if not clusterwide:
        scopes = [*sorted({str(pod["metadata"]["namespace"]) for pod in cached})]
    listed = {
        key_of("Pod", pod)[1:]
        for scope in scopes
        for pod in api.running_step_pods(scope, timeout=CHECK_TIMEOUT)
    }
    gone = []
    for pod in cached:
        _, namespace, name = key_of("Pod", pod)
        if (namespace, name) in listed:
            continue
        try:
            found = api.read_pod(namespace, name, timeout=CHECK_TIMEOUT)
        except Gone:
            gone.append((namespace, name, str(pod["metadata"].get("uid", ""))))
            continue
        cache.put("Pod", found)  # it ended, or is newer than the list: the cache catches up
    return gone


def due_for_resync(cache: Cache) -> list[Key]:
    """What a periodic resync looks at again: every run and Reconciliation but those that only
    an edit can change (a finished run, a settled Reconciliation), since the edit's watch event
    brings them anyway. Finished runs pile up, and each look reads the store."""
    return [
        *cache.keys("AgentRun", lambda body: not _finished(body)),
        *cache.keys("Reconciliation", lambda body: not _settled(body)),
    ]


def _settled(body: Mapping[str, Any]) -> bool:
    return (body.get("status") or {}).get("phase") == "Settled"


def _finished(run: Mapping[str, Any]) -> bool:
    """A run whose goal is met and whose status answers its current spec: no step, no store
    change can move it (an edit of its spec can, and arrives as a watch event)."""
    meta, status = run.get("metadata", {}), run.get("status") or {}
    return (
        status.get("phase") == "Succeeded"
        and status.get("observedGeneration") == meta.get("generation")
        and not meta.get("deletionTimestamp")
    )


def _plain(body: Any) -> dict[str, Any]:
    """kopf's read-only body as plain data."""
    if isinstance(body, Mapping):
        return {str(k): _plain(v) for k, v in body.items()}
    if isinstance(body, list | tuple):
        return [_plain(v) for v in body]  # type: ignore[return-value]
    return body  # type: ignore[no-any-return]
