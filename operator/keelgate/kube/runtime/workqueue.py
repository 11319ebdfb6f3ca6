"""A keyed work queue: what needs reconciling, each key at most once at a time, fairly between
tenants.

kopf tells the operator that something changed (an AgentRun, a step pod, a Reconciliation); the
queue turns many such events into one reconcile of the run they concern, never two of the same
key at once (so two decisions about one run cannot interleave), and re-runs a key that changed
while it was being reconciled. Delayed adds carry back-offs and schedules. The queue lives on the
operator's event loop; ``add_threadsafe`` is for reconciles running in worker threads. It holds
keys only, never state: losing it (a restart) loses nothing, since every object is listed again.

Two priorities: a key added ``low`` (by the periodic resync, thousands at a time) waits behind
every key added normally (by a watch event, a reconcile's own request), as controller-runtime's
priority queue puts its resyncs behind events; a key added normally while it waits low goes
ahead. So a step pod's end is acted on at once even while a resync of 10,000 runs is queued.

Tenants (``tenant_of``: a key's namespace): within a priority, tenants take turns, one key each,
so a tenant with a thousand keys queued puts one ahead of another tenant's next, not a thousand;
and a tenant whose keys hold workers already may not take the last free one. A reconcile waits
on its tenant's store (a lock that tenant holds, up to the store's ``lock_timeout``), so without
that a tenant could hold every worker with its own waits: with it, one tenant holds at most all
workers but one, and another tenant's key always finds a worker.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class _Turns(Generic[K]):
    """The keys of one priority: a queue per tenant, and the tenants in turn."""

    def __init__(self) -> None:
        self.keys: dict[Hashable, collections.deque[K]] = {}
        self.turns: collections.deque[Hashable] = collections.deque()

    def append(self, tenant: Hashable, key: K) -> None:
        queued = self.keys.get(tenant)
        if queued is None:
            queued = self.keys[tenant] = collections.deque()
            self.turns.append(tenant)
        queued.append(key)


class WorkQueue(Generic[K]):
    def __init__(
        self, *, tenant_of: Callable[[K], Hashable] | None = None, workers: int = 1
    ) -> None:
        # Keys in order, per priority and tenant; an entry whose key is no longer dirty (taken
        # already through the other priority) is skipped when reached.
        self._high: _Turns[K] = _Turns()
        self._low: _Turns[K] = _Turns()
        self._dirty: dict[K, bool] = {}  # key -> whether it waits low
        self._processing: set[K] = set()
        self._busy: collections.Counter[Hashable] = collections.Counter()  # tenant -> workers
        self._tenant_of = tenant_of
        self._workers = workers
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._loop = asyncio.get_running_loop()

    def _tenant(self, key: K) -> Hashable:
        return None if self._tenant_of is None else self._tenant_of(key)

    def add(self, key: K, *, low: bool = False) -> None:
        """Reconcile ``key`` soon (once, however often it is added before that); ``low``: after
        every key added without it."""
        waiting_low = self._dirty.get(key)
        if waiting_low is not None:
            if low or not waiting_low:
                return
            self._dirty[key] = False  # waits no longer behind the low ones
        else:
            self._dirty[key] = low
        if key not in self._processing:
            (self._low if low else self._high).append(self._tenant(key), key)
            self._wake()

    def add_after(self, key: K, delay: float) -> None:
        """Reconcile ``key`` after ``delay`` seconds (an earlier pending delay wins)."""
        if delay <= 0:
            self.add(key)
            return
        when = self._loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = self._loop.call_at(when, fire)

    def add_threadsafe(self, key: K, delay: float = 0.0) -> None:
        self._loop.call_soon_threadsafe(self.add_after, key, delay)

    async def get(self) -> K:
        while True:
            key = self._next()
            if key is not None:
                break
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: another getter takes the key
                raise
        del self._dirty[key]
        self._processing.add(key)
        self._busy[self._tenant(key)] += 1
        return key

    def _may_take(self, tenant: Hashable) -> bool:
        """Whether a key of ``tenant`` may take a free worker now: not the last free one, if
        the tenant's keys hold workers already (keys of one tenant share no tenant)."""
        if self._tenant_of is None or not self._busy[tenant]:
            return True
        return self._workers - len(self._processing) > 1

    def _next(self) -> K | None:
        for ready in (self._high, self._low):
            for _ in range(len(ready.turns)):
                if not ready.turns:
                    break
                tenant = ready.turns[0]
                ready.turns.rotate(-1)  # the next call starts with the next tenant
                if not self._may_take(tenant):
                    continue
                queued = ready.keys[tenant]
                while queued:
                    key = queued.popleft()
                    if key in self._dirty and key not in self._processing:
                        if not queued:
                            self._forget(ready, tenant)
                        return key
                self._forget(ready, tenant)
        return None

    @staticmethod
    def _forget(ready: _Turns[K], tenant: Hashable) -> None:
        del ready.keys[tenant]
        ready.turns.remove(tenant)

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def done(self, key: K) -> None:
        """``key``'s reconcile ended; if it was added meanwhile, it goes round again."""
        if key in self._processing:
            self._processing.discard(key)
            tenant = self._tenant(key)
            self._busy[tenant] -= 1
            if not self._busy[tenant]:
                del self._busy[tenant]
        low = self._dirty.get(key)
        if low is not None:
            (self._low if low else self._high).append(self._tenant(key), key)
        # A worker is free: a key another tenant could not take a moment ago may go now.
        self._wake()

    def busy(self, key: K) -> bool:
        """Whether ``key`` is queued or being reconciled (a delayed add is not counted)."""
        return key in self._dirty or key in self._processing

    def __len__(self) -> int:
        return sum(1 for key in self._dirty if key not in self._processing)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
