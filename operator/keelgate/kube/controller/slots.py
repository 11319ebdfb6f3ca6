"""Step slots: at most ``max_step_pods`` step pods pending or running at once, and the runs
waiting for one.

Why it exists: a cap keeps a burst of runs from filling a cluster with step pods; and a run
that found no free slot must be woken when one frees, the longest waiting first, rather than
poll. Reconciles take and give back slots from worker threads while the operator's event loop
asks who waits: this object owns that state, under one lock. It never calls the API; it counts
the active step pods the cache holds, plus the ones being created right now.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from keelgate.kube.controller.ports import ClusterView, Key


class StepSlots:
    def __init__(self, cache: ClusterView, *, limit: int, clock: Callable[[], float]) -> None:
        self._cache = cache
        self._limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._creating = 0  # pods being created: not in the cache yet, counted all the same
        self._waiting: dict[Key, float] = {}  # run key -> since when it waits

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        """A new cap (a sharded replica's share of it changes with the shards it drives)."""
        with self._lock:
            self._limit = limit

    def take(self, key: Key) -> bool:
        """A slot for ``key``'s next pod, if one is free; else ``key`` waits (from now, or
        from when it first found none) until ``release`` of another run's pod wakes it."""
        with self._lock:
            if self._cache.active_step_pods() + self._creating >= self._limit:
                self._waiting.setdefault(key, self._clock())
                return False
            self._creating += 1
            self._waiting.pop(key, None)
            return True

    def release(self) -> None:
        """The pod a ``take`` was for is created (and in the cache), or was not made."""
        with self._lock:
            self._creating -= 1

    def is_waiting(self, key: Key) -> bool:
        with self._lock:
            return key in self._waiting

    def stop_waiting(self, key: Key) -> None:
        """``key`` no longer needs a slot (its pod runs, or the run is gone)."""
        with self._lock:
            self._waiting.pop(key, None)

    def longest_waiting(self, count: int) -> list[Key]:
        """Up to ``count`` waiting runs, the longest waiting first (a slot may be free)."""
        with self._lock:
            ordered = sorted(self._waiting.items(), key=lambda item: item[1])
        return [key for key, _since in ordered[:count]]
