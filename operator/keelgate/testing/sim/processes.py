"""Step processes: one step of a run through the product's own step runner, loop, gateway and
stores, in a process the world can kill at any window, hold up, drain, or lose with its node.

Why it exists: a step pod is where the promise is kept or broken. Here each one is the real
``StepRunner.step`` over its own store session (its own owner), with the run's spec read from the
store as a pod reads it, and the loop built from that spec's manifest with the simulated model
and tools (``StepRunner``'s ``opener`` and ``builder`` seams). At every failpoint the product
passes (``keelgate.core.failpoints.observed``), and right before a tool's first byte, the world
decides: go on, die there (``SimulatedCrash``, and the owner goes as a dead process's does), be
held up for a while (the rest of the world runs meanwhile, on virtual time), have the store
server end the session meanwhile (the node is lost: its process may still run), or be asked to
stop (a drain). Its exit code is the step program's (``keelgate.cli.step.exit_code``).
"""

from __future__ import annotations

from collections.abc import Callable

from keelgate.core import failpoints
from keelgate.core.exits import exit_code
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import LoopSpec
from keelgate.errors import KeelgateError, SimulatedCrash
from keelgate.manifest import spec_from_manifest
from keelgate.runners.step import StepRunner
from keelgate.testing.sim.desk import needed
from keelgate.testing.sim.downstream import (
    CHANGING,
    LateCall,
    Ledger,
    Sender,
    ShopConfirmer,
    SimTool,
)
from keelgate.testing.sim.model import Scenario, SimModel
from keelgate.testing.sim.oracle import PlanMade, Truth
from keelgate.testing.sim.stores import StoreSite
from keelgate.testing.sim.world import World

#: Exit code of a process that died (SIGKILL, os._exit(137)).
KILLED = 137
#: Seconds a step waits, before exiting, for a call still running (``--late-call-grace``).
LATE_CALL_GRACE = 30.0


class Faults:
    """How often each fault happens at a window, per thousand (drawn once per run)."""

    def __init__(self, world: World) -> None:
        schedule = world.schedule
        self.crash = (0, 15, 40, 80)[schedule.pick(4)]
        self.pause = (0, 15, 40, 80)[schedule.pick(4)]
        self.drain = (0, 10)[schedule.pick(2)]
        self.calm = False  # the end of a run: no more faults

    def at_window(self, world: World) -> str:
        """What happens at one window: "" (nothing), "crash", "pause" or "drain"."""
        if self.calm:
            return ""
        schedule = world.schedule
        if schedule.chance(self.crash):
            return "crash"
        if schedule.chance(self.pause):
            return "pause"
        if schedule.chance(self.drain):
            return "drain"
        return ""


class StepProcess(Sender):
    """One step process (a step pod's container, or a `keelgate step` run by hand)."""

    def __init__(
        self,
        world: World,
        site: StoreSite,
        ledger: Ledger,
        scenario: Scenario,
        faults: Faults,
        *,
        name: str,
        tenant: str,
        run: str,
        on_exit: Callable[[StepProcess, int], None],
        truth: Truth,
    ) -> None:
        self.world = world
        self.site = site
        self.ledger = ledger
        self.scenario = scenario
        self.faults = faults
        self.name = name
        self.tenant = tenant
        self.run_name = run
        self.on_exit = on_exit
        self.truth = truth
        self.alive = True
        self.lost = False  # its node was lost: nobody hears from it, it may still run
        self.asked_to_stop = False
        self.paused_until: float | None = None
        self.code: int | None = None
        self._stores: Stores | None = None
        self._spec: LoopSpec | None = None
        self._late: list[LateCall] = []

    # Sender: what its tools ask of it

    def window(self, name: str) -> None:
        self._window(name)

    def approval_in_spec(self, tool: str) -> int:
        spec = self._spec
        if spec is None or spec.manifest is None:
            return 0
        tools = spec.manifest.get("tools") or []
        return max((needed(t) for t in tools if t.get("name") == tool), default=0)

    def late(self, call: LateCall) -> None:
        self._late.append(call)

    # Running

    def start(self) -> None:
        """Run the step to its end (or its death), then exit, after waiting for a call still
        running (as ``keelgate step`` waits, up to its grace)."""
        world = self.world
        world.say(f"{self.name} starts")
        runner = StepRunner(
            store="sim://",
            confirmer=ShopConfirmer(world, self.ledger) if self.scenario.confirmer else None,
            opener=self._open,
            builder=self._build,
        )
        code: int
        try:
            with failpoints.observed(self._window):
                outcome = runner.step(self.tenant, self.run_name, asked_to_stop=self._asked)
            code = exit_code(outcome, asked=self.asked_to_stop)
            world.say(f"{self.name} ends {outcome.phase.value} {outcome.stop.reason.value}")
        except SimulatedCrash as crash:
            self._die(f"died at {crash.failpoint}")
            return
        except KeelgateError as error:
            code = error.exit_code
            world.say(f"{self.name} ends with {type(error).__name__} (exit {code})")
        if not self.alive:
            return  # it was lost meanwhile and then killed
        running = [call for call in self._late if not call.ended]
        if running:
            world.at(LATE_CALL_GRACE, f"{self.name} grace over", lambda: self._exit(code))
            for call in running:
                call.when_done(lambda output, error: self._exit_if_done(code))
            return
        self._exit(code)

    def _exit_if_done(self, code: int) -> None:
        if all(call.ended for call in self._late):
            self._exit(code)

    def _exit(self, code: int) -> None:
        if not self.alive or self.code is not None:
            return
        self.code = code
        if self._stores is not None:
            self.site.kill(self._stores)  # the process is gone: whatever it held goes too
        self.alive = False
        self.world.say(f"{self.name} exits {code}")
        self.on_exit(self, code)

    def _die(self, why: str) -> None:
        if not self.alive:
            return
        self.world.say(f"{self.name} {why}")
        if self._stores is not None:
            self.site.kill(self._stores)
        self.alive = False
        self.code = KILLED
        self.on_exit(self, KILLED)

    def kill(self) -> None:
        """SIGKILL from outside (a pod deleted past its grace, a node gone for good)."""
        self._die("killed")

    def drain(self) -> None:
        """SIGTERM: stop at the next checkpoint."""
        self.asked_to_stop = True

    def _asked(self) -> bool:
        return self.asked_to_stop

    def _open(self) -> Stores:
        self._stores = self.site.open()
        return self._stores

    def _build(self, spec: LoopSpec, stores: Stores) -> Loop:
        self._spec = spec
        config = spec_from_manifest(spec.manifest)
        tools = [
            SimTool(
                self.world,
                self.ledger,
                self,
                name=tool.name,
                side_effect=tool.side_effect,
                requires_approval=tool.requires_approval,
                timeout_seconds=tool.timeout_seconds,
                approval=tool.approval_rule(),
            )
            for tool in config.tools
        ]
        return Loop(
            stores=stores,
            model=SimModel(self.scenario, on_plan=self._planned),
            tools=tools,
            confirmer=ShopConfirmer(self.world, self.ledger) if self.scenario.confirmer else None,
            busy_wait=0.0,  # virtual time: a busy run is told at once, never slept on
            clock=self.world.boot,
        )

    def _planned(self, iteration: int) -> None:
        rules = {t: n for t in CHANGING if (n := self.approval_in_spec(t))}
        self.truth.plans.append(PlanMade(self.world.now, iteration, rules))

    def _window(self, name: str) -> None:
        """The world's say at one window of this process."""
        if not self.alive:
            raise SimulatedCrash(name, 1)  # killed while held up: it never comes back
        world = self.world
        fault = self.faults.at_window(world)
        if fault == "crash":
            raise SimulatedCrash(name, 1)
        if fault == "drain":
            world.say(f"{self.name} asked to stop at {name}")
            self.asked_to_stop = True
        elif fault == "pause":
            long = world.schedule.chance(500)
            seconds = (
                world.schedule.between(40.0, 500.0) if long else world.schedule.between(0.5, 20.0)
            )
            lost = world.schedule.chance(500)
            world.say(
                f"{self.name} held up {seconds:.1f}s at {name}{' (node lost)' if lost else ''}"
            )
            if lost:
                self.lost = True
                if self._stores is not None:
                    self.site.lose_session(self._stores)
                self.on_exit(self, -1)  # whoever drives the run hears nothing more from it
            self.paused_until = world.now + seconds
            world.advance(seconds)
            self.paused_until = None
            if not self.alive:
                raise SimulatedCrash(name, 1)
            world.say(f"{self.name} goes on after {name}")
