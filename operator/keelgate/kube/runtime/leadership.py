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
standby). However the renewals fail: the client's renew loop notices an API server that answers
with an error, but a connection dropped without an answer ends its thread (only API errors count
as failed tries there) and a request never answered holds it for good, both with this replica
still leading while a standby takes the lease. So every request here is bounded in time, any
failure to reach the API server is a failed try, and a watch of its own tells ``lost`` once no
renewal has succeeded for the renew deadline, whatever the election's thread is doing. Nor may
it renew after ``release`` or ``lost``: a release that the renew loop undid would make the next
leader wait out a whole lease.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
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
        self._ended = threading.Event()  # stopped leading (released or lost), for good
        self._end_lock = threading.Lock()
        self._renewed = 0.0  # when the last create or renewal that succeeded was sent
        self._thread: threading.Thread | None = None
        self._lock: Any = None

    @property
    def leading(self) -> bool:
        return self._leading.is_set() and not (self._stopped.is_set() or self._ended.is_set())

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
        from kubernetes.leaderelection import electionconfig, leaderelection

        # The election's modules carry no type hints.
        election_module: Any = leaderelection
        config_module: Any = electionconfig
        settings = self.settings
        # No request may outlast the renew deadline (the client sets no timeout of its own).
        api = lease_api(self._api_client, timeout=float(settings.renew_seconds))
        lock = lease_lock(settings.name, settings.namespace, settings.identity, api, self._write)
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
        self._thread = threading.Thread(
            target=self._elect, args=(election,), name="keelgate-lease", daemon=True
        )
        self._thread.start()
        log.info(
            "standing by: waiting to lead (Lease %s/%s, as %s)",
            settings.namespace,
            settings.name,
            settings.identity,
        )

    def _write(self, write: Callable[[], Any]) -> bool:
        """A create or renewal of the lease; False, without sending it, once this replica
        stopped leading for good; False on any failure."""
        if self._stopped.is_set() or self._ended.is_set():
            return False
        sent = time.monotonic()
        try:
            done = bool(write())
        except Exception:  # no answer: a failed try
            return False
        if done:
            self._renewed = max(self._renewed, sent)
        return done

    def _elect(self, election: Any) -> None:
        try:
            election.run()
        except Exception as failure:  # the election's thread must not end with us leading
            log.error("the leader election failed (%s)", type(failure).__name__)
            if self._leading.is_set():
                self._stopped_leading()

    def _watch(self) -> None:
        """While leading: tell ``lost`` once no renewal succeeded for the renew deadline,
        whatever the election's thread is doing (a request that never ends holds it)."""
        deadline = float(self.settings.renew_seconds)
        step = min(0.25, self.settings.retry_seconds / 4)
        while not self._ended.wait(step):
            if self._stopped.is_set():
                return
            if time.monotonic() - self._renewed > deadline:
                self._stopped_leading()
                return

    def _started(self) -> None:
        # Called on a thread of its own, which may return at once: the renew loop goes on.
        if self._ended.is_set():
            return
        self._leading.set()
        threading.Thread(target=self._watch, name="keelgate-lease-watch", daemon=True).start()
        log.info("leading (Lease %s/%s)", self.settings.namespace, self.settings.name)

    def _stopped_leading(self) -> None:
        # From the election's thread or the watch, whichever notices first: told once.
        with self._end_lock:
            if self._ended.is_set():
                return
            self._ended.set()
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
        if give_up(
            lock.api_instance, self.settings.name, self.settings.namespace, self.settings.identity
        ):
            log.info("gave the lease up")


def lease_api(api_client: Any, *, timeout: float) -> Any:
    """The official client's Leases API, each of the lock's requests bounded by ``timeout``
    seconds (the client sets no timeout of its own: a request never answered would hold an
    election's thread for good)."""
    from kubernetes import client

    leases_module: Any = client.CoordinationV1Api  # the client carries no type hints

    class _TimedLeases(leases_module):  # type: ignore[misc]
        def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("_request_timeout", timeout)
            return super().read_namespaced_lease(*args, **kwargs)

        def create_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("_request_timeout", timeout)
            return super().create_namespaced_lease(*args, **kwargs)

        def replace_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("_request_timeout", timeout)
            return super().replace_namespaced_lease(*args, **kwargs)

    return _TimedLeases(api_client)


def lease_lock(
    name: str,
    namespace: str,
    identity: str,
    api: Any,
    write: Callable[[Callable[[], Any]], bool],
    *,
    seen: Callable[[str], Any] | None = None,
) -> Any:
    """The official client's Lease lock for one Lease, for its ``LeaderElection``: any failure to
    reach the API server is a failed try, as an error answer is (the client's lock lets anything
    but an ``ApiException`` end the election's thread), and every create or renewal goes through
    ``write`` (which may refuse to send it: False). With ``seen``, the Lease is read from what
    ``seen`` returns for its name (one listing of many Leases, None: there is none) instead of
    one request of its own."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.leaderelection.resourcelock import leaselock

    lock_module: Any = leaselock  # the client carries no type hints

    class _Lock(lock_module.LeaseLock):  # type: ignore[misc]
        def get(self, *args: Any, **kwargs: Any) -> Any:
            if seen is not None:
                lease = seen(self.name)
                if lease is None:  # what the client takes for a missing Lease: create it
                    return False, ApiException(404, "NotFound", body='{"code": 404}')
                self.lease_reference = lease
                return True, self.get_lock_object(lease)
            parent: Any = super()
            try:
                return parent.get(*args, **kwargs)
            except Exception as error:  # no answer: a failed try, not a missing lease
                return False, ApiException(reason=f"no answer ({type(error).__name__})")

        def create(self, *args: Any, **kwargs: Any) -> bool:
            parent: Any = super()
            return write(lambda: parent.create(*args, **kwargs))

        def update(self, *args: Any, **kwargs: Any) -> bool:
            parent: Any = super()
            return write(lambda: parent.update(*args, **kwargs))

    lock: Any = _Lock(name, namespace, identity)
    lock.api_instance = api
    return lock


def give_up(api: Any, name: str, namespace: str, identity: str) -> bool:
    """Give a Lease ``identity`` holds up: no holder and a one-second lease, so that another
    candidate takes it at its next try. Best effort (whether it was given up): a Lease that
    cannot be written simply runs out."""
    from kubernetes import client

    try:
        lease = api.read_namespaced_lease(name, namespace)
        spec = lease.spec or client.V1LeaseSpec()
        if spec.holder_identity != identity:
            return False
        spec.holder_identity = None
        spec.lease_duration_seconds = 1
        lease.spec = spec
        api.replace_namespaced_lease(name, namespace, lease)
    except Exception:  # the lease then simply runs out
        return False
    return True
