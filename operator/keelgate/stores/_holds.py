"""Owner holds: a store's owner outlives ``close()`` while a call it started may still run.

A timed-out WRITE can go on running in this process (a worker thread). Its key is in flight and
owned by this store; owner liveness (a flock, a PostgreSQL session lock, a live-owner set) is what
tells everyone else "do not judge it, it may still change". Closing the store releases that
liveness, so a store with such a call must not really close until the call has ended and its end
is recorded: ``close()`` is deferred until the last hold is released. A process that dies first
releases everything anyway, and the key then reads unknown, which is the truth.

This module must never release an owner early, and never block ``close()``: a deferred close
happens on the thread that releases the last hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_held = threading.Condition()
_held_total = 0  # holds alive in this process, over every store


class OwnerHolds:
    """Counts the calls that keep one store's owner alive, and defers its close past them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._deferred: Callable[[], None] | None = None

    def hold(self) -> Callable[[], None]:
        """Keep the owner alive until the returned function is called (once; later calls are
        no-ops)."""
        global _held_total
        with self._lock:
            self._count += 1
        with _held:
            _held_total += 1
        released = threading.Event()

        def release() -> None:
            global _held_total
            if released.is_set():
                return
            released.set()
            with self._lock:
                self._count -= 1
                close = self._deferred if self._count == 0 else None
                if close is not None:
                    self._deferred = None
            try:
                if close is not None:
                    close()
            finally:
                with _held:
                    _held_total -= 1
                    _held.notify_all()

        return release

    def close(self, close_now: Callable[[], None]) -> None:
        """Run ``close_now`` now, or when the last hold is released."""
        with self._lock:
            if self._count:
                self._deferred = close_now
                return
        close_now()


def calls_still_running() -> int:
    """How many calls in this process still keep a store's owner alive."""
    with _held:
        return _held_total


def wait_for_running_calls(timeout: float) -> bool:
    """Wait until no call in this process holds a store's owner; False if some still do.

    A process about to exit calls this so a timed-out call can finish and be recorded rather
    than be cut off (which would leave its key unknown).
    """
    deadline = time.monotonic() + timeout
    with _held:
        while _held_total:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _held.wait(left)
    return True


class HoldsOwner:
    """``hold`` and a ``close`` deferred past every hold, for a store whose ``_close_now``
    really closes it and so releases its owner (every store with idempotency keys)."""

    _holds: OwnerHolds

    def hold(self) -> Callable[[], None]:
        """Keep this store's owner alive, even past ``close``, until the returned function is
        called: a call it started may still run."""
        return self._holds.hold()

    def close(self) -> None:
        """Close the store and release its owner: from then on its in-flight keys read unknown.
        Deferred while a hold is taken."""
        self._holds.close(self._close_now)

    def _close_now(self) -> None:
        raise NotImplementedError
