"""The process's two clocks, read in one place so that a simulation can run them on virtual time.

Why it exists: Keelgate reads the time for two different reasons. The wall clock (seconds since
the epoch) only stamps things people read: audit events, status conditions, a decision's time.
The boot clock (``CLOCK_BOOTTIME``: never goes back, keeps counting while the process is stopped
or the machine suspended) bounds a WRITE's write deadline (``keelgate.core.fence``). Every
module that reads either reads it here, so the simulator (``keelgate.testing.sim``) can put a
whole run, its deaths and its pauses, on one virtual clock with ``simulated``, and a seed replays
exactly. Nothing else may replace them: a production process runs on the real clocks.

This module must never be read for a fence through the wall clock, and never hold anything but
the two functions.
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


def wall() -> float:
    """Seconds since the epoch (for stamps people read; never for a deadline)."""
    return _wall()


def boot() -> float:
    """Seconds on a clock that never goes back and counts while the process is stopped."""
    return _boot_clock()


@contextmanager
def simulated(*, wall: Callable[[], float], boot: Callable[[], float]) -> Iterator[None]:
    """Read both clocks from ``wall`` and ``boot`` for the block (a simulation's virtual time),
    then give the real ones back."""
    global _wall, _boot_clock
    saved = _wall, _boot_clock
    _wall, _boot_clock = wall, boot
    try:
        yield
    finally:
        _wall, _boot_clock = saved
