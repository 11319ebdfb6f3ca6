"""The process's two clocks, its waits and its one alarm, read in one place so that a
simulation can run them on virtual time.

Why it exists: Keelgate reads the time for two different reasons. The wall clock (seconds since
the epoch) only stamps things people read: audit events, status conditions, a decision's time.
The boot clock (``CLOCK_BOOTTIME``: never goes back, keeps counting while the process is stopped
or the machine suspended) bounds a WRITE's write deadline (``keelgate.core.fence``) and every
network exchange's time limit (``keelgate.core.cutoff``), whose end an ``alarm`` on the boot
clock enforces: it closes the exchange's connection whatever the other side is sending. Every
module that reads either clock, or sets an alarm, does it here, so the simulator
(``keelgate.testing.sim``) can put a whole run, its deaths, its pauses and its cut exchanges, on
one virtual clock with ``simulated``, and a seed replays exactly. A simulation hands over the
operating system's clock reader (``clock_gettime``) rather than a boot clock of its own, so the
choice of clock id (``_BOOTTIME``) is the product's own there too: a simulated machine that
sleeps stops its ``CLOCK_MONOTONIC`` and not its ``CLOCK_BOOTTIME``, as Linux does. A pause the
process takes on purpose (a retry's backoff) is ``sleep``, so that a simulated process waits on
virtual time while the rest of the world goes on. Nothing else may replace them: a production
process runs on the real clocks, the real sleep and the real alarm.

This module must never be read for a fence through the wall clock, never run an alarm's action
before its moment on the boot clock, and never let one action's failure stop the others.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("keelgate.clocks")

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)
#: The longest the alarm's thread sleeps before reading the boot clock again: its sleep is
#: measured on the monotonic clock, which does not count a suspended machine, so a long sleep
#: alone could ring late by the length of a suspend.
_NAP = 1.0

#: What ``alarm`` returns: call it to take the alarm back (after its action ran, it does nothing).
Cancel = Callable[[], None]
Alarm = Callable[[float, Callable[[], None]], Cancel]


def _os_clock(clock_id: int) -> float:
    # Looked up when called: ``time.clock_gettime`` is Unix's, and ``_boot`` calls it only
    # where the platform has ``CLOCK_BOOTTIME``.
    return time.clock_gettime(clock_id)


#: The operating system's clock reader ``_boot`` asks (a simulation's, within ``simulated``).
_clock_gettime: Callable[[int], float] = _os_clock


def _boot() -> float:
    if _BOOTTIME is not None:
        return _clock_gettime(_BOOTTIME)
    return time.monotonic()


class _Alarms:
    """The real alarm: one daemon thread, started at the first alarm, that runs each action at
    its moment on the boot clock (read through ``boot``, so a test that simulates the clocks
    without an alarm of its own still rings on its clock). Actions must be short: they close
    connections or wake a loop, and they run one after another on this thread."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, list[Callable[[], None] | None]]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # A forked child has no alarm thread: its own first alarm starts one.
        self._lock = threading.Condition()
        self._due = []
        self._thread = None

    def set(self, when: float, act: Callable[[], None]) -> Cancel:
        slot: list[Callable[[], None] | None] = [act]
        with self._lock:
            heapq.heappush(self._due, (when, next(self._order), slot))
            # Started again if it ever ended (a failure of its own): every exchange's end
            # rests on it, so one failure must not silence every later alarm.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._ring, name="keelgate-alarm", daemon=True
                )
                self._thread.start()
            self._lock.notify()

        def cancel() -> None:
            slot[0] = None  # dropped from the heap when its moment comes

        return cancel

    def _ring(self) -> None:
        while True:
            with self._lock:
                while True:
                    while self._due and self._due[0][2][0] is None:
                        heapq.heappop(self._due)
                    if not self._due:
                        self._lock.wait()
                        continue
                    wait = self._due[0][0] - boot()
                    if wait <= 0:
                        break
                    self._lock.wait(min(wait, _NAP))
                _, _, slot = heapq.heappop(self._due)
                act, slot[0] = slot[0], None
            if act is not None:
                try:
                    act()
                except BaseException:  # one action's failure must not silence the others
                    log.exception("an alarm's action failed")


_real_alarms = _Alarms()
_wall: Callable[[], float] = time.time
_boot_clock: Callable[[], float] = _boot
_sleep: Callable[[float], None] = time.sleep
_alarm: Alarm = _real_alarms.set


def wall() -> float:
    """Seconds since the epoch (for stamps people read; never for a deadline)."""
    return _wall()


def boot() -> float:
    """Seconds on a clock that never goes back and counts while the process is stopped."""
    return _boot_clock()


def sleep(seconds: float) -> None:
    """Wait ``seconds`` on purpose (a retry's pause): ``time.sleep``, or a simulation's wait."""
    _sleep(seconds)


def backoff(first: float, cap: float, doublings: int) -> float:
    """A retry's pause: ``first`` doubled ``doublings`` times, at most ``cap``. The exponent
    stops long before a float's power overflows (past 2 ** 1,024: a retry loop's error, after
    a sink or a refused pod had failed a thousand times, would end it for good)."""
    return min(cap, first * 2.0 ** min(max(doublings, 0), 64))


def alarm(when: float, act: Callable[[], None]) -> Cancel:
    """Run ``act`` (short, on another thread or the simulation's own loop) once ``boot()``
    reaches ``when``; the returned function takes it back if it has not run yet."""
    return _alarm(when, act)


@contextmanager
def simulated(
    *,
    wall: Callable[[], float],
    boot: Callable[[], float] | None = None,
    clock_gettime: Callable[[int], float] | None = None,
    sleep: Callable[[float], None] | None = None,
    alarm: Alarm | None = None,
) -> Iterator[None]:
    """Read both clocks from virtual time for the block: the wall clock from ``wall``, the boot
    clock either from ``boot`` (a finished boot clock, for a test that moves it by hand) or,
    given ``clock_gettime`` instead (a simulated machine's reader, keyed by clock id as
    ``time.clock_gettime`` is), through the product's own ``_boot``, which asks it for the
    clock id the product chose. Wait with ``sleep`` and ring alarms with ``alarm`` if given (a
    simulation's own events; without an alarm, the real alarm thread rings them on the boot
    clock given), then give the real ones back."""
    if (boot is None) == (clock_gettime is None):
        raise TypeError("simulated() takes either boot or clock_gettime, not both or neither")
    global _wall, _boot_clock, _clock_gettime, _sleep, _alarm
    saved = _wall, _boot_clock, _clock_gettime, _sleep, _alarm
    _wall = wall
    if boot is not None:
        _boot_clock = boot
    if clock_gettime is not None:
        _boot_clock, _clock_gettime = _boot, clock_gettime
    if sleep is not None:
        _sleep = sleep
    if alarm is not None:
        _alarm = alarm
    try:
        yield
    finally:
        _wall, _boot_clock, _clock_gettime, _sleep, _alarm = saved
