"""Leader election: of the operator's replicas, the one holding a coordination.k8s.io Lease
drives runs; the others stand by, ready to take over when it stops renewing.

Why it exists: two replicas that both drive runs stay correct (the store fences every WRITE and
every name is deterministic) but double the step-pod cap and post every Event twice; one replica
alone stops all progress for as long as its pod is replaced. The election is the official
``kubernetes`` client's (``kubernetes.leaderelection``, a Lease lock, client-go's timings: a
lease of 15 s, renewed within 10 s, tried every 2 s); this module runs it in a thread, tells the
event loop when this replica leads, stops renewing on request, and gives the lease up on a clean
stop so that a standby leads within one retry period instead of a lease's length.

It must never let this replica go on leading after a renewal failed: the caller is told
(``lost``) and must stop driving runs at once (the operator exits; its pod comes back as a
standby). Nor may it renew after ``release``: a release that the renew loop undid would make the
next leader wait out a whole lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("keelgate.operator")


@dataclass(frozen=True)
class LeaseSettings:
    """Where the lease is and who this replica is (``identity``: its pod's name)."""

    name: str
    namespace: str
    identity: str
    lease_seconds: int = 15
    renew_seconds: int = 10
    retry_seconds: int = 2

    def __post_init__(self) -> None:
        # The client's Config calls sys.exit on bad timings: refused here with a clear line.
        if not self.retry_seconds >= 1:
            raise ValueError("--lease-retry must be at least 1 second")
        if not self.renew_seconds > 1.2 * self.retry_seconds:
            raise ValueError("--lease-renew must be more than 1.2 times --lease-retry")
        if not self.lease_seconds > self.renew_seconds:
            raise ValueError("--lease-duration must be longer than --lease-renew")


class Leadership:
    """One replica's part in the election. ``acquire`` waits until it leads; ``lost`` is called
    (from the election's thread) if it then fails to renew; ``release`` stops renewing and gives
    the lease up."""

    def __init__(
        self,
        settings: LeaseSettings,
        *,
        api_client: Any = None,
        lost: Callable[[], None],
    ) -> None:
        self.settings = settings
        self._api_client = api_client
        self._lost = lost
        self._stopped = threading.Event()
        self._leading = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock: Any = None

    @property
    def leading(self) -> bool:
        return self._leading.is_set() and not self._stopped.is_set()

    def alive(self) -> bool:
        """Whether the election still runs (a standby's liveness)."""
        return self._thread is not None and self._thread.is_alive()

    async def acquire(self) -> None:
        """Start the election (once) and wait until this replica holds the lease."""
        if self._thread is None:
            self._start()
        while not self._leading.is_set():
            if not self.alive():
                raise RuntimeError("the leader election stopped before this replica led")
            await asyncio.sleep(0.2)

    def _start(self) -> None:
        from kubernetes import client
        from kubernetes.leaderelection import electionconfig, leaderelection
        from kubernetes.leaderelection.resourcelock import leaselock

        # The election's modules carry no type hints.
        election_module: Any = leaderelection
        config_module: Any = electionconfig
        lock_module: Any = leaselock
        stopped = self._stopped

        class _StoppableLease(lock_module.LeaseLock):  # type: ignore[misc]
            # Once released, every write fails: the renew loop then ends instead of taking the
            # lease back.
            def create(self, *args: Any, **kwargs: Any) -> bool:
                parent: Any = super()
                return False if stopped.is_set() else bool(parent.create(*args, **kwargs))

            def update(self, *args: Any, **kwargs: Any) -> bool:
                parent: Any = super()
                return False if stopped.is_set() else bool(parent.update(*args, **kwargs))

        settings = self.settings
        lock: Any = _StoppableLease(settings.name, settings.namespace, settings.identity)
        if self._api_client is not None:
            lock.api_instance = client.CoordinationV1Api(self._api_client)
        self._lock = lock
        config = config_module.Config(
            lock,
            lease_duration=settings.lease_seconds,
            renew_deadline=settings.renew_seconds,
            retry_period=settings.retry_seconds,
            onstarted_leading=self._started,
            onstopped_leading=self._stopped_leading,
        )
        election = election_module.LeaderElection(config)
        self._thread = threading.Thread(target=election.run, name="keelgate-lease", daemon=True)
        self._thread.start()
        log.info(
            "standing by: waiting to lead (Lease %s/%s, as %s)",
            settings.namespace,
            settings.name,
            settings.identity,
        )

    def _started(self) -> None:
        # Called on a thread of its own, which may return at once: the renew loop goes on.
        self._leading.set()
        log.info("leading (Lease %s/%s)", self.settings.namespace, self.settings.name)

    def _stopped_leading(self) -> None:
        was_leading = self._leading.is_set()
        self._leading.clear()
        if self._stopped.is_set():
            return  # released on purpose
        if was_leading:
            log.error("lost the lease (not renewed within %ds)", self.settings.renew_seconds)
        self._lost()

    def release(self) -> None:
        """Stop renewing and, if this replica led, give the lease up (no holder, a one-second
        lease) so that a standby takes it at its next try."""
        was_leading = self.leading
        self._stopped.set()
        lock = self._lock
        if not was_leading or lock is None:
            return
        from kubernetes import client

        with contextlib.suppress(Exception):  # best effort: the lease then simply runs out
            api = lock.api_instance
            lease = api.read_namespaced_lease(self.settings.name, self.settings.namespace)
            spec = lease.spec or client.V1LeaseSpec()
            if spec.holder_identity != self.settings.identity:
                return
            spec.holder_identity = None
            spec.lease_duration_seconds = 1
            lease.spec = spec
            api.replace_namespaced_lease(self.settings.name, self.settings.namespace, lease)
            log.info("gave the lease up")
