"""The process's two clocks, and its waits, read in one place so that a simulation can run them
on virtual time.

Why it exists: Keelgate reads the time for two different reasons. The wall clock (seconds since
the epoch) only stamps things people read: audit events, status conditions, a decision's time.
The boot clock (``CLOCK_BOOTTIME``: never goes back, keeps counting while the process is stopped
or the machine suspended) bounds a WRITE's write deadline (``keelgate.core.fence``). Every
module that reads either reads it here, so the simulator (``keelgate.testing.sim``) can put a
whole run, its deaths and its pauses, on one virtual clock with ``simulated``, and a seed replays
exactly. A pause the process takes on purpose (a retry's backoff) is ``sleep``, so that a
simulated process waits on virtual time while the rest of the world goes on. Nothing else may
replace them: a production process runs on the real clocks.

This module must never be read for a fence through the wall clock, and never hold anything but
the three functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def _boot() -> float:
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


_wall: Callable[[], float] = time.time
_boot_clock: Callable[[], float] = _boot
_sleep: Callable[[float], None] = time.sleep


def wall() -> float:
    """Seconds since the epoch (for stamps people read; never for a deadline)."""
    return _wall()


def boot() -> float:
    """Seconds on a clock that never goes back and counts while the process is stopped."""
    return _boot_clock()


def sleep(seconds: float) -> None:
    """Wait ``seconds`` on purpose (a retry's pause): ``time.sleep``, or a simulation's wait."""
    _sleep(seconds)


@contextmanager
def simulated(
    *,
    wall: Callable[[], float],
    boot: Callable[[], float],
    sleep: Callable[[float], None] | None = None,
) -> Iterator[None]:
    """Read both clocks from ``wall`` and ``boot`` (and wait with ``sleep``, if given) for the
    block (a simulation's virtual time), then give the real ones back."""
    global _wall, _boot_clock, _sleep
    saved = _wall, _boot_clock, _sleep
    _wall, _boot_clock = wall, boot
    if sleep is not None:
        _sleep = sleep
    try:
        yield
    finally:
        _wall, _boot_clock, _sleep = saved
