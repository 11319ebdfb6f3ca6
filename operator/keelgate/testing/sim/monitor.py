"""Monitor mode: a monitor (``loop: monitor``) whose ticks a cron job starts by hand, one
``keelgate run`` of the monitor's name a minute, as a person's crontab would.

Why it exists: a monitor keeps the promise across runs, not within one. Each tick is a run of its
own (``<name>.tick-<n>``: its checkpoint, keys and audit chain), and the product's
``LocalRunner.tick`` decides at each invocation whether to drive the latest tick again (it never
reached a stop, or waits for a person: an unknown outcome, an approval) or to start the next one.
A tick started past one whose WRITE nobody knows the outcome of would plan that WRITE again,
under new keys: nothing in one tick's records could show it. So here the product's own
``LocalRunner.tick`` runs in each tick process (its store and loop the world's, as a step
process's are), the world's model plans each tick's calls with refs of that tick
(``books.tick_ref``), and the oracle judges each tick as a run of its own and the ticks together
(``checkers.again``). It decides nothing for the monitor: it only starts the cron job's
invocations, each a process that can die, be held up or lose its node at every window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keelgate.core.loop import Loop
from keelgate.core.monitor import latest_tick, tick_run_name
from keelgate.core.protocols import Stores
from keelgate.core.spec import LoopSpec
from keelgate.core.types import Outcome, StopReason
from keelgate.errors import KeelgateError
from keelgate.runners.build import Parts
from keelgate.runners.local import LocalRunner
from keelgate.testing.sim.processes import Setting, StepProcess

#: Seconds between the cron job's invocations (``* * * * *``).
PERIOD = 60.0
#: Stops at which a tick waits for a person: the product drives that tick again, never the next.
WAITING = frozenset({StopReason.OUTCOME_UNKNOWN, StopReason.AWAITING_APPROVAL})


def tick_is_over(stop: StopReason | None) -> bool:
    """Whether a tick stopped for good, as far as the monitor is concerned (the next invocation
    starts the next tick): a stop, and not one that waits for a person."""
    return stop is not None and stop not in WAITING


class TickLoop(Loop):
    """The product's loop, telling the world which tick it is asked to drive (the model a tick
    asks is the world's, and plans that tick's calls)."""

    told: Callable[[str], None] | None = None

    def run_or_resume(self, spec: LoopSpec, **options: Any) -> Outcome:
        if self.told is not None:
            self.told(spec.run)
        return super().run_or_resume(spec, **options)


class _Runner(LocalRunner):
    """``LocalRunner`` over one tick process's store session and loop (as ``StepRunner``'s
    ``opener`` and ``builder`` seams give a step process its own): the tick logic is the
    product's."""

    def __init__(self, process: TickProcess) -> None:
        super().__init__(busy_wait=0.0)
        self._process = process

    def _open(self, spec: LoopSpec) -> Stores:
        return self._process.open_session()

    def _loop(self, spec: LoopSpec, stores: Stores, parts: Parts) -> Loop:
        return self._process.build_loop(spec, stores)


class TickProcess(StepProcess):
    """One invocation of the cron job: ``keelgate run <monitor>``, one tick driven to a stop."""

    loop_kind = TickLoop

    def __init__(self, setting: Setting, spec: LoopSpec, **rest: Any) -> None:
        super().__init__(setting, **rest)
        self.spec = spec

    def _drive(self) -> Outcome:
        return _Runner(self).tick(self.spec, asked_to_stop=self._asked)

    def open_session(self) -> Stores:
        return self._open()

    def build_loop(self, spec: LoopSpec, stores: Stores) -> Loop:
        loop = self._build(spec, stores)
        assert isinstance(loop, TickLoop)
        loop.told = self._told
        return loop

    def _told(self, run: str) -> None:
        self.setting.planner.ticks[self.name] = run
        self.books.processes[self.name].run = run
        self.world.say(f"{self.name} drives {run}")


class MonitorDriver:
    """The cron job: a tick process a minute while none it started runs, until the monitor's
    last tick (of ``ticks``) stopped for good."""

    def __init__(self, setting: Setting, *, ticks: int) -> None:
        self.setting = setting
        self.world = setting.world
        self.ticks = ticks
        self.running: TickProcess | None = None
        self.processes: list[TickProcess] = []
        self.finished = False

    def spec(self) -> LoopSpec:
        # Recorded as the operator records it: with the creator it names (a rule's notCreator).
        return self.setting.desk.loop_spec(self.setting.tenant, self.setting.run)

    def start(self) -> None:
        self.world.at(0.0, "cron", self.cron)

    def resume(self) -> None:
        """A person who just decided runs the monitor by hand a moment later (a tick waiting
        for them goes on then, not at the cron job's next minute, when a rule's approvals may
        have grown too old)."""
        self.world.at(self.world.schedule.between(1.0, 20.0), "a person runs it", self.check)

    def over(self) -> bool:
        """Whether the monitor's last tick stopped for good, and no invocation still runs."""
        return self.finished and not any(p.alive and not p.lost for p in self.processes)

    def cron(self) -> None:
        if self.finished:
            return
        self.check()
        if not self.finished:
            self.world.at(PERIOD, "cron", self.cron)

    def check(self) -> None:
        if self.running is not None or self.finished:
            return
        try:
            latest, stop = self.latest()
        except KeelgateError as error:
            self.world.say(f"the cron job cannot look: {type(error).__name__}")
            return
        if latest >= self.ticks and tick_is_over(stop):
            self.finished = True
            self.world.say("the monitor's last tick is over")
            return
        number = len(self.processes) + 1
        process = TickProcess(self.setting, self.spec(), name=f"tick{number}", on_exit=self._exited)
        self.processes.append(process)
        self.running = process
        process.start()

    def latest(self) -> tuple[int, StopReason | None]:
        """The latest tick's number and how it stopped (None: never stopped)."""
        stores = self.setting.site.open()
        try:
            names = [ref.run for ref in stores.checkpoints.runs(self.setting.tenant)]
            latest = latest_tick(self.setting.run, names)
            if not latest:
                return 0, None
            loop = Loop(stores=stores, busy_wait=0.0)
            stop = loop.state(self.setting.tenant, tick_run_name(self.setting.run, latest)).stop
            return latest, None if stop is None else stop.reason
        finally:
            stores.close()

    def tick_names(self, stores: Stores) -> list[str]:
        """Every tick of the monitor on record, oldest first."""
        names = {ref.run for ref in stores.checkpoints.runs(self.setting.tenant)}
        latest = latest_tick(self.setting.run, names)
        return [
            tick_run_name(self.setting.run, n)
            for n in range(1, latest + 1)
            if tick_run_name(self.setting.run, n) in names
        ]

    def _exited(self, process: StepProcess, code: int) -> None:
        if self.running is process:
            self.running = None  # the next invocation is the cron job's, at its minute
