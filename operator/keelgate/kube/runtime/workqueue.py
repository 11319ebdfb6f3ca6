"""A keyed work queue: what needs reconciling, each key at most once at a time.

kopf tells the operator that something changed (an AgentRun, a step pod, a Reconciliation); the
queue turns many such events into one reconcile of the run they concern, never two of the same
key at once (so two decisions about one run cannot interleave), and re-runs a key that changed
while it was being reconciled. Delayed adds carry back-offs and schedules. The queue lives on the
operator's event loop; ``add_threadsafe`` is for reconciles running in worker threads. It holds
keys only, never state: losing it (a restart) loses nothing, since every object is listed again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._loop = asyncio.get_running_loop()

    def add(self, key: K) -> None:
        """Reconcile ``key`` soon (once, however often it is added before that)."""
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._ready.put_nowait(key)

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
        key = await self._ready.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        """``key``'s reconcile ended; if it was added meanwhile, it goes round again."""
        self._processing.discard(key)
        if key in self._dirty:
            self._ready.put_nowait(key)

    def __len__(self) -> int:
        return self._ready.qsize()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
