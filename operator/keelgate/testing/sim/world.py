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
This module must never read the real clock or an unseeded random source.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: Virtual wall time of every simulation's start (2026-12-01T00:00:00Z): stamps read the same in
#: every replay.
EPOCH = 1_796_083_200.0
#: Virtual boot-clock reading at the start.
BOOT = 10_000.0
#: How large a raw choice is (a chance is read in thousandths of it).
RAW = 1 << 20


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
        return self.raw() % 1000 >= 1000 - per_mille

    def between(self, low: float, high: float) -> float:
        """A length between ``low`` and ``high`` (0: ``low``)."""
        return low + (high - low) * (self.raw() % 1000) / 999.0


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


class World:
    """Virtual time and the events due in it. ``now`` is seconds since the start."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.now = 0.0
        self.trace = Trace()
        self._queue: list[_Event] = []
        self._order = itertools.count()
        self.horizon = float("inf")  # events due after it are dropped

    # The clocks the product reads (keelgate.core.clocks) and the stores' clock

    def wall(self) -> float:
        return EPOCH + self.now

    def boot(self) -> float:
        return BOOT + self.now

    def alarm(self, when: float, act: Callable[[], None]) -> Callable[[], None]:
        """The product's alarms (``keelgate.core.clocks.alarm``: an exchange cut at its time
        limit) as events of this world, at ``when`` on its boot clock; the function returned
        takes one back."""
        slot: list[Callable[[], None] | None] = [act]

        def ring() -> None:
            due, slot[0] = slot[0], None
            if due is not None:
                due()

        def cancel() -> None:
            slot[0] = None

        self.at(when - self.boot(), "alarm", ring)
        return cancel

    # Events

    def at(self, delay: float, what: str, act: Callable[[], None]) -> None:
        """Do ``act`` ``delay`` seconds from now (events due at one moment run in the order
        they were asked for)."""
        due = self.now + max(0.0, delay)
        if due <= self.horizon:
            heapq.heappush(self._queue, _Event(due, next(self._order), what, act))

    def say(self, line: str) -> None:
        self.trace.add(self.now, line)

    def run_until(self, until: float) -> None:
        """Run every event due up to ``until``, then set the clock there. Re-entrant: an actor
        held up inside an event calls it (through ``advance``) and the world goes on."""
        while self._queue and self._queue[0].at <= until:
            event = heapq.heappop(self._queue)
            self.now = max(self.now, event.at)
            event.act()
        self.now = max(self.now, until)

    def advance(self, seconds: float) -> None:
        """The caller is held up for ``seconds``: the rest of the world goes on meanwhile."""
        self.run_until(self.now + seconds)

    def run(self, *, until: float, done: Callable[[], bool]) -> None:
        """Run events in order until ``done()`` or nothing is left before ``until``."""
        while self._queue and not done():
            if self._queue[0].at > until:
                break
            event = heapq.heappop(self._queue)
            self.now = max(self.now, event.at)
            event.act()

    def pending(self) -> int:
        return len(self._queue)
