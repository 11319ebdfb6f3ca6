"""The simulated world's spine: one schedule of choices, one virtual clock, one queue of events.

Why it exists: a simulated run is only worth something if it replays exactly. So everything that
could differ between two runs of one seed goes through here: every choice (does this process die
at this window, does the shop lose this answer, does alice say "executed") is drawn from the
``Schedule``, and every moment is the ``World``'s virtual time, which the product reads through
``keelgate.core.clocks`` and the stores' clock function. Nothing runs on another thread: an
actor that is held up (a paused process) runs the rest of the world from inside its own call
(``World.advance``), and is resumed when its pause is over.

A choice is a whole number; 0 always means "nothing unusual" (no death, the answer arrives, the
person is right), so a schedule shrinks towards calm by lowering its numbers or cutting its end.
Three clocks run on the one virtual time and drift apart, as real machines' do (``Clocks``):
the process's boot clock (write deadlines), its wall clock (stamps people read) and the store
server's wall clock (the deadline a settlement waits for); each runs at its own rate, a few
hundred parts per million apart, and the wall clocks stand a little apart too. Each step
process's machine reads its boot clock through the operating system's reader
(``World.clock_gettime``) by clock id, as Linux answers it: ``CLOCK_BOOTTIME`` runs on while
the machine is suspended (``World.suspended``), ``CLOCK_MONOTONIC`` stops, and the product's
own choice between them (``keelgate.core.clocks``) is what a process reads.

This module must never read the real clock or an unseeded random source.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from keelgate.core import clocks as product_clocks

#: Virtual wall time of every simulation's start (2026-12-01T00:00:00Z): stamps read the same in
#: every replay.
EPOCH = 1_796_083_200.0
#: Virtual boot-clock reading at the start.
BOOT = 10_000.0
#: How large a raw choice is (a chance is read in thousandths of it).
RAW = 1 << 20
#: The clock ids a simulated machine answers for (Linux's; ``None`` where the platform has no
#: such clock, and the product then reads neither through ``clock_gettime``).
BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)
MONOTONIC = getattr(time, "CLOCK_MONOTONIC", None)


class Schedule:
    """Every choice of one simulated run, in order: drawn from ``seed``, or replayed from a list
    (``replay``; past its end every choice is 0, the calm one). ``made`` records them all, so a
    seeded run can be replayed, and shrunk, as a list."""

    def __init__(self, *, seed: int | None = None, replay: Sequence[int] | None = None) -> None:
        self.seed = seed
        self._random = random.Random(seed) if replay is None else None
        self._replay = list(replay or ())
        self.made: list[int] = []

    def raw(self) -> int:
        if self._random is not None:
            value = self._random.randrange(RAW)
        else:
            index = len(self.made)
            value = self._replay[index] if index < len(self._replay) else 0
        self.made.append(value)
        return value

    def pick(self, count: int) -> int:
        """One of ``count`` options (0: the first, the calm one)."""
        value = self.raw()
        return value % count if count > 1 else 0

    def chance(self, per_mille: int) -> bool:
        """True with ``per_mille`` in a thousand; a raw 0 is always False."""
        return self.chance_and_rest(per_mille)[0]

    def chance_and_rest(self, per_mille: int) -> tuple[bool, int]:
        """``chance`` and the rest of its one draw (the raw choice by a thousand; 0 for the calm
        draw), for a choice added later to read without a draw of its own, so that every
        later choice of a run is drawn as before it came."""
        value = self.raw()
        return value % 1000 >= 1000 - per_mille, value // 1000

    def between(self, low: float, high: float) -> float:
        """A length between ``low`` and ``high`` (0: ``low``)."""
        return low + (high - low) * (self.raw() % 1000) / 999.0


@dataclass(frozen=True)
class Clocks:
    """How the run's clocks read true (virtual) time: each at its own rate (1 + parts per
    million), the wall clocks each at their own offset (seconds). 0 everywhere is the calm
    draw: every clock exact."""

    boot_ppm: float = 0.0
    wall_ppm: float = 0.0
    wall_offset: float = 0.0
    store_ppm: float = 0.0
    store_offset: float = 0.0

    @classmethod
    def drawn(cls, schedule: Schedule) -> Clocks:
        if not schedule.chance(600):
            return cls()
        return cls(
            boot_ppm=schedule.between(-300.0, 300.0),
            wall_ppm=schedule.between(-300.0, 300.0),
            wall_offset=schedule.between(-2.0, 2.0),
            store_ppm=schedule.between(-300.0, 300.0),
            store_offset=schedule.between(-2.0, 2.0),
        )

    def boot(self, now: float) -> float:
        return BOOT + now * (1 + self.boot_ppm * 1e-6)

    def wall(self, now: float) -> float:
        return EPOCH + self.wall_offset + now * (1 + self.wall_ppm * 1e-6)

    def store(self, now: float) -> float:
        return EPOCH + self.store_offset + now * (1 + self.store_ppm * 1e-6)

    def true_of_boot(self, boot: float) -> float:
        """The true moment the boot clock reads ``boot``."""
        return (boot - BOOT) / (1 + self.boot_ppm * 1e-6)

    def true_of_store(self, store: float) -> float:
        """The true moment the store server's clock reads ``store``."""
        return (store - EPOCH - self.store_offset) / (1 + self.store_ppm * 1e-6)

    def true_of_wall(self, wall: float) -> float:
        """The true moment a process's wall clock read ``wall`` (it only ever goes forward)."""
        return (wall - EPOCH - self.wall_offset) / (1 + self.wall_ppm * 1e-6)


@dataclass(order=True)
class _Event:
    at: float
    order: int
    what: str = field(compare=False)
    act: Callable[[], None] = field(compare=False)


class Trace:
    """What happened, one line per event; two runs of one seed must give the same lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, at: float, line: str) -> None:
        self.lines.append(f"{at:10.3f} {line}")

    def digest(self) -> str:
        sha = hashlib.sha256()
        for line in self.lines:
            sha.update(line.encode())
            sha.update(b"\n")
        return sha.hexdigest()


#: Events due within one second of virtual time past which the product is taken to spin (a
#: busy loop on one moment: something requeued at once for ever, which a real process would
#: burn a core on while its run never goes on). The busiest second of 80 whole-world runs held
#: 21 events; the world stops at this many, judged so (``spun``), rather than run out of memory.
SPIN = 10_000


class World:
    """Virtual time and the events due in it. ``now`` is seconds since the start."""

    def __init__(self, schedule: Schedule, *, clocks: Clocks | None = None) -> None:
        self.schedule = schedule
        self.clocks = clocks if clocks is not None else Clocks()
        self.now = 0.0
        # Who is acting now (a step process, a person, an operator): the innermost is last. A
        # held-up actor runs the world from inside its own call, so this is a stack.
        self._actors: list[str] = []
        self.trace = Trace()
        self._queue: list[_Event] = []
        self._order = itertools.count()
        self.horizon = float("inf")  # events due after it are dropped
        # Each machine's suspends (a step process's node, by the process's name): the true
        # seconds of those over, and the true moments the one under way began and ends.
        self._slept: dict[str, float] = {}
        self._sleeping: dict[str, tuple[float, float]] = {}
        # How many events the current second of virtual time has run; once past ``SPIN``, what
        # spun, and no event runs any more.
        self._second, self._in_second = -1, 0
        self.spun = ""

    # The clocks the product reads (keelgate.core.clocks) and the stores' clock

    def wall(self) -> float:
        return self.clocks.wall(self.now)

    def boot(self) -> float:
        return self.clocks.boot(self.now)

    def clock_gettime(self, clock_id: int) -> float:
        """``time.clock_gettime`` as the acting process's machine answers it (what
        ``keelgate.core.clocks`` reads the product's chosen clock id through): its
        ``CLOCK_BOOTTIME`` is the world's boot clock, counting while the machine is suspended;
        its ``CLOCK_MONOTONIC`` runs at the same rate but stops while it is (Linux's
        ``clock_gettime(2)``). Any other id is refused: a product reading another clock is a
        change to look at, not one to answer quietly."""
        if clock_id is not None and clock_id == BOOTTIME:
            return self.boot()
        if clock_id is not None and clock_id == MONOTONIC:
            return self.clocks.boot(self.now - self.slept(self.actor))
        raise ValueError(
            f"a simulated machine answers clock_gettime for CLOCK_BOOTTIME ({BOOTTIME}) and "
            f"CLOCK_MONOTONIC ({MONOTONIC}) only, not for clock id {clock_id}"
        )

    def slept(self, machine: str) -> float:
        """True seconds ``machine`` has been suspended, the suspend under way included."""
        since, until = self._sleeping.get(machine, (self.now, self.now))
        return self._slept.get(machine, 0.0) + min(self.now, until) - since

    @contextmanager
    def suspended(self, machine: str, seconds: float) -> Iterator[None]:
        """``machine`` is suspended for ``seconds`` from now, within the block (its owner runs
        the world meanwhile, as a held-up process does, and may go on later than that: another
        actor held up inside its wait holds it too): its monotonic clock stands still until
        it wakes, its boot clock runs on."""
        asleep = self._sleeping.get(machine)
        if asleep is not None:
            # Already suspended (an actor held up inside the outer suspend's wait suspends it
            # again): the one suspend lasts the longer of the two, and the outer one books it.
            self._sleeping[machine] = (asleep[0], max(asleep[1], self.now + seconds))
            yield
            return
        self._sleeping[machine] = (self.now, self.now + seconds)
        try:
            yield
        finally:
            self._slept[machine] = self.slept(machine)
            del self._sleeping[machine]

    def store_clock(self) -> float:
        """The store server's own wall clock (its SQL ``now``)."""
        return self.clocks.store(self.now)

    def sleep(self, seconds: float) -> None:
        """A product's wait (a retry's pause, a grace period): the rest of the world goes on."""
        self.advance(max(0.0, seconds))

    def drives_the_clocks(self) -> AbstractContextManager[None]:
        """The product reads this world's clocks for the block (``keelgate.core.clocks``): the
        process's wall clock, its boot clock through the product's own choice of clock id
        (``clock_gettime``), its waits and its alarms."""
        return product_clocks.simulated(
            wall=self.wall, clock_gettime=self.clock_gettime, sleep=self.sleep, alarm=self.alarm
        )

    # Who acts

    @property
    def actor(self) -> str:
        return self._actors[-1] if self._actors else ""

    @contextmanager
    def acting(self, name: str) -> Iterator[None]:
        """``name`` acts for the block (what it sends, asks and decides is booked as its)."""
        self._actors.append(name)
        try:
            yield
        finally:
            self._actors.pop()

    def alarm(self, when: float, act: Callable[[], None]) -> Callable[[], None]:
        """The product's alarms (``keelgate.core.clocks.alarm``: an exchange cut at its time
        limit) as events of this world, at ``when`` on the boot clock the product reads on the
        setting process's machine (``keelgate.core.clocks.boot``, which reads this world only
        within ``clocks.simulated``: the alarm is set there); the function returned takes one
        back. When due, it reads that clock again, as the alarm's thread does: one that fell
        further behind the world's boot clock meanwhile (a monotonic clock, its machine
        suspended) is waited on by as much, so it rings late by the suspend."""
        slot: list[Callable[[], None] | None] = [act]
        owner = self.actor

        def behind() -> float:
            with self.acting(owner):
                return self.boot() - product_clocks.boot()

        def ring(lag: float) -> None:
            now_behind = behind()
            if slot[0] is not None and now_behind > lag:
                self.at(now_behind - lag, "alarm", lambda: ring(now_behind))
                return
            due, slot[0] = slot[0], None
            if due is not None:
                due()

        def cancel() -> None:
            slot[0] = None

        lag = behind()
        self.at(when - (self.boot() - lag), "alarm", lambda: ring(lag))
        return cancel

    # Events

    def at(self, delay: float, what: str, act: Callable[[], None]) -> None:
        """Do ``act`` ``delay`` seconds from now (events due at one moment run in the order
        they were asked for)."""
        due = self.now + max(0.0, delay)
        if due <= self.horizon and not self.spun:
            heapq.heappush(self._queue, _Event(due, next(self._order), what, act))

    def say(self, line: str) -> None:
        self.trace.add(self.now, line)

    def run_until(self, until: float) -> None:
        """Run every event due up to ``until``, then set the clock there. Re-entrant: an actor
        held up inside an event calls it (through ``advance``) and the world goes on."""
        while self._queue and self._queue[0].at <= until:
            self._next().act()
        self.now = max(self.now, until)

    def advance(self, seconds: float) -> None:
        """The caller is held up for ``seconds``: the rest of the world goes on meanwhile."""
        self.run_until(self.now + seconds)

    def run(self, *, until: float, done: Callable[[], bool]) -> None:
        """Run events in order until ``done()`` or nothing is left before ``until``."""
        while self._queue and not done():
            if self._queue[0].at > until:
                break
            self._next().act()

    def _next(self) -> _Event:
        """The next event, its moment made now; past ``SPIN`` events in one second, the world
        stops after it (no event is queued any more) and says what spun."""
        event = heapq.heappop(self._queue)
        self.now = max(self.now, event.at)
        second = int(self.now)
        if second != self._second:
            self._second, self._in_second = second, 0
        self._in_second += 1
        if self._in_second >= SPIN and not self.spun:
            self.spun = f"{SPIN} events within second {second}, the last {event.what!r}"
            self.say(f"the world stops: {self.spun}")
            self._queue.clear()
        return event

    def pending(self) -> int:
        return len(self._queue)
