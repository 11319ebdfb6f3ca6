"""``/healthz``, ``/readyz`` and ``/metrics``: the operator's HTTP endpoints, and its gauges.

Why it exists: a kubelet's probes and Prometheus ask over HTTP. ``/healthz`` (liveness) says
whether every worker and the resync still run, or on a standby whether its leader election does;
``/readyz`` says what this replica is doing: 200 ``leading`` once every watched kind has been
listed, 503 ``listing`` before that, and 200 ``standby`` on a replica waiting for the lease (a
standby that never became ready would block every rolling update of the Deployment: its new pods
could never count as available while the old leader holds the lease). The ``keelgate_leader``
gauge says which replica leads. ``/metrics`` refreshes its gauges from the cache at each scrape.
It must never block the event loop, and never show a run's name or spec.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from keelgate.kube.resources import is_settled
from keelgate.kube.runtime.cache import JSON, Cache
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.times import parse_time

RUN_PHASES = ("Pending", "Running", "Stopped", "Succeeded", "Failed")


def _created(body: JSON) -> datetime | None:
    return parse_time((body.get("metadata") or {}).get("creationTimestamp"))


def refresh_gauges(metrics: Metrics, cache: Cache) -> None:
    """Runs by phase, what waits for a person, and the active step pods, as the cache has them."""
    phases = cache.tally(
        "AgentRun", lambda body: str((body.get("status") or {}).get("phase") or "Pending")
    )
    for phase in RUN_PHASES:
        metrics.runs.labels(phase).set(phases.get(phase, 0))
    unsettled = lambda body: not is_settled(body)  # noqa: E731
    metrics.unknown_outcomes.set(cache.count("Reconciliation", unsettled))
    metrics.approvals_pending.set(cache.count("Approval", unsettled))
    now = time.time()
    for kind in ("Reconciliation", "Approval"):
        created = [
            when.timestamp()
            for _, when in cache.keys_with(kind, _created, unsettled)
            if when is not None
        ]
        metrics.oldest_waiting.labels(kind).set(max(0.0, now - min(created)) if created else 0.0)
    late = cache.tally(
        "AgentRun", lambda body: str(len((body.get("status") or {}).get("lateResults") or []))
    )
    metrics.late_results.set(sum(int(count) * runs for count, runs in late.items()))
    metrics.step_pods_active.set(cache.active_step_pods())


def _always_ready() -> tuple[bool, str]:
    return True, "leading"


class HealthServer:
    def __init__(
        self,
        *,
        alive: Callable[[], bool],
        metrics: Metrics,
        refresh: Callable[[], None],
        ready: Callable[[], tuple[bool, str]] = _always_ready,
    ) -> None:
        self._alive = alive
        self._ready = ready
        self._metrics = metrics
        self._refresh = refresh
        self._runner: web.AppRunner | None = None

    async def start(self, bind: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_page)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # reuse_port: replicas that share a network (the local cluster runs pods on the host's)
        # can all listen; each pod of a real cluster has its own, where it changes nothing.
        await web.TCPSite(self._runner, bind, port, reuse_port=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        alive = self._alive()
        return web.Response(status=200 if alive else 503, text="ok\n" if alive else "stalled\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        ready, what = self._ready()
        return web.Response(status=200 if ready else 503, text=f"{what}\n")

    async def _metrics_page(self, _: web.Request) -> web.Response:
        self._refresh()
        return web.Response(
            body=generate_latest(self._metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )
