"""The process's clocks (``keelgate.core.clocks``): the boot clock every write deadline and
exchange cut is read on counts a suspended machine, and a simulation runs the product's own
choice of clock.

Why it exists: ``CLOCK_BOOTTIME`` and ``CLOCK_MONOTONIC`` are neighbours that read alike until
the machine sleeps; then only the first counts the sleep, and a write deadline read on the
second lets a WRITE leave after its store deadline passed and a person truthfully settled it
as not executed. A simulator that replaced the whole boot clock would never run that choice, so
the seam hands over the operating system's reader and the product picks the clock id.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from keelgate.core import clocks, fence

pytestmark = pytest.mark.skipif(
    not hasattr(time, "CLOCK_BOOTTIME"), reason="CLOCK_BOOTTIME is Linux's"
)

#: Readings of a machine that slept 600 s: its monotonic clock is that far behind.
BOOTTIME_READING = 10_600.0
MONOTONIC_READING = 10_000.0


def _slept(asked: list[int]) -> Callable[[int], float]:
    def clock_gettime(clock_id: int) -> float:
        asked.append(clock_id)
        if clock_id == time.CLOCK_BOOTTIME:
            return BOOTTIME_READING
        if clock_id == time.CLOCK_MONOTONIC:
            return MONOTONIC_READING
        raise ValueError(clock_id)

    return clock_gettime


def test_a_simulated_reader_is_asked_for_the_clock_the_product_chose() -> None:
    """Given a machine's clock reader (``clock_gettime``), the boot clock and the write
    deadline's ``fence.now`` ask it for ``CLOCK_BOOTTIME``, the product's own choice, and read
    what a machine that slept answers there (the sleep counted), not its monotonic clock; the
    wall clock is the one given, and the real reader is back after the block."""
    asked: list[int] = []
    with clocks.simulated(wall=lambda: 1.0, clock_gettime=_slept(asked)):
        assert clocks.boot() == BOOTTIME_READING
        assert fence.now() == BOOTTIME_READING
        assert clocks.wall() == 1.0
    assert asked == [time.CLOCK_BOOTTIME, time.CLOCK_BOOTTIME]
    real = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert real <= clocks.boot() <= time.clock_gettime(time.CLOCK_BOOTTIME)
    assert asked == [time.CLOCK_BOOTTIME, time.CLOCK_BOOTTIME]  # the simulation's reader let go


def test_a_deadline_taken_before_a_sleep_has_passed_when_the_machine_wakes() -> None:
    """A write deadline taken 30 s before a machine sleeps 600 s has passed when it wakes: the
    call is refused before anything leaves (``DeadlinePassed``), as the store's deadline a
    margin later has passed too and a person may have settled the call."""
    readings = {time.CLOCK_BOOTTIME: 10_000.0, time.CLOCK_MONOTONIC: 10_000.0}
    with clocks.simulated(wall=time.time, clock_gettime=lambda clock_id: readings[clock_id]):
        deadline = fence.WriteDeadline.starting_now("kg-1", 30.0)
        readings[time.CLOCK_BOOTTIME] += 600.0  # suspended: the monotonic clock stood still
        with pytest.raises(fence.DeadlinePassed):
            deadline.check()


def test_simulated_takes_a_boot_clock_or_a_reader_never_both() -> None:
    """A finished boot clock (a test that moves it by hand) and a machine's reader are two
    ways to simulate the one clock: given both, or neither, it refuses in one clear line."""
    both = clocks.simulated(wall=time.time, boot=time.monotonic, clock_gettime=_slept([]))
    with pytest.raises(TypeError, match="either boot or clock_gettime"), both:
        pass
    with (
        pytest.raises(TypeError, match="either boot or clock_gettime"),
        clocks.simulated(wall=time.time),
    ):
        pass
    with clocks.simulated(wall=time.time, boot=lambda: 5.0):
        assert clocks.boot() == 5.0
