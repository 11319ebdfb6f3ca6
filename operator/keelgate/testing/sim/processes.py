"""Step processes: one step of a run through the product's own step runner, loop, gateway, tools,
model adapters and stores, in a process the world can kill at any window, hold up, drain, or lose
with its node.

Why it exists: a step pod is where the promise is kept or broken. Here each one is the real
``StepRunner.step`` over its own store session (its own owner), with the run's spec read from the
store as a pod reads it, and its parts built by the product's own builder from that spec's
manifest (``keelgate.runners.build.build_parts``): the HTTP and MCP tools and the OpenAI and
Anthropic adapters, whose requests the simulated network carries
(``keelgate.adapters.network``). Two parts are the world's: ``pay``, whose Python function the
world runs in line (``downstream.SimTool``: Keelgate's Python tool would run it on a worker
thread), and, in runs whose model is not reached over HTTP, the world's model in process. At
every failpoint the product passes (``keelgate.core.failpoints.observed``), and right before a
request's first byte, the world decides: go on, die there (``SimulatedCrash``, and the owner goes
as a dead process's does), be held up for a while (the rest of the world runs meanwhile, on
virtual time; now and then for about a call's time limit, give or take its margin, where the
write deadline and a settlement's wait meet), have the store server end the session meanwhile (the
node is lost: its process may still run), or be asked to stop (a drain). With ``suspends`` a
share of the holds is its machine suspended (``World.suspended``): the process runs nothing, as
when held up, and its machine's ``CLOCK_MONOTONIC`` stands still while ``CLOCK_BOOTTIME`` runs
on. Its exit code is the step program's (``keelgate.cli.step.exit_code``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from types import FrameType

from keelgate.adapters.models.python import PythonModel
from keelgate.core import failpoints, fence
from keelgate.core.exits import RECORDED, exit_code
from keelgate.core.loop import Loop
from keelgate.core.persistence import Checkpointer
from keelgate.core.protocols import Confirmer, Stores, Tool
from keelgate.core.spec import LoopSpec
from keelgate.core.types import Outcome
from keelgate.errors import KeelgateError, SimulatedCrash
from keelgate.runners.build import build_parts
from keelgate.runners.step import StepRunner
from keelgate.testing.sim.books import Books, ProcessLife
from keelgate.testing.sim.desk import Desk
from keelgate.testing.sim.downstream import (
    CALL_SECONDS,
    LateCall,
    ProductConfirmer,
    Shop,
    ShopConfirmer,
    SimTool,
)
from keelgate.testing.sim.model import Planner, SimModel
from keelgate.testing.sim.network import Network
from keelgate.testing.sim.stores import BookedSaves, StoreSite
from keelgate.testing.sim.world import World

#: Exit code of a process that died (SIGKILL, os._exit(137)).
KILLED = 137
#: Seconds a step waits, before exiting, for a call still running (``--late-call-grace``).
LATE_CALL_GRACE = 30.0
#: With ``suspends``, a hold is its machine suspended where the rest of its node-lost draw by
#: this share is 1 (a third of the holds, of every length; the rest 0, the calm draw, never).
SUSPEND_SHARE = 3
#: The windows a step passes right after a write of its own landed in the store (a plan, an
#: action's checkpoint, the iteration's, a verdict's): where it drove the run.
WROTE = frozenset({"after_plan", "after_action_checkpoint", "after_observe", "after_verify"})


class Faults:
    """How often each fault happens at a window, per thousand (drawn once per run)."""

    def __init__(self, world: World, *, slow_store: bool = False, suspends: bool = False) -> None:
        schedule = world.schedule
        self.crash = (0, 15, 40, 80)[schedule.pick(4)]
        self.pause = (0, 15, 40, 80)[schedule.pick(4)]
        self.drain = (0, 10)[schedule.pick(2)]
        #: Store answers lost, per thousand statements of a server store's session.
        self.lost_answers = (0, 0, 5, 20)[schedule.pick(4)]
        #: A step's store answers that come back late (the statement landed, its answer slow),
        #: per thousand statements. Drawn only with ``slow_store`` on, so that the worlds
        #: without it (and their kept seeds) make the same choices as before.
        self.slow_answers = (0, 10, 40, 100)[schedule.pick(4)] if slow_store else 0
        #: Whether a share of the holds is the machine suspended (``SUSPEND_SHARE``), read from
        #: the draw that decides whether the node is lost: no draw of its own.
        self.suspends = suspends
        self.calm = False  # the end of a run: no more faults
        self._world = world

    def lose_answer(self) -> bool:
        return not self.calm and self._world.schedule.chance(self.lost_answers)

    def answer_delay(self) -> float:
        """How late a step's store answer comes back: 0 (at once), a moment, about the margin
        a write deadline leaves, or most of a call's time limit (a stalled connection, a
        failover): where a deadline taken before a claim and a tool's cut-off counted from
        when the claim's answer came drift apart, the request still leaving in time."""
        if self.calm or not self.slow_answers:
            return 0.0
        schedule = self._world.schedule
        if not schedule.chance(self.slow_answers):
            return 0.0
        kind = schedule.pick(3)
        if kind == 1:
            return schedule.between(fence.MARGIN - 1.0, fence.MARGIN + 3.0)
        if kind == 2:
            return schedule.between(fence.MARGIN + 3.0, CALL_SECONDS - 1.0)
        return schedule.between(0.2, 3.0)

    def at_window(self, world: World, name: str = "") -> str:
        """What happens at one window: "" (nothing), "crash", "pause" or "drain". The window
        right before a request leaves is the write deadline's, and is paused at twice as
        often."""
        if self.calm:
            return ""
        schedule = world.schedule
        if schedule.chance(self.crash):
            return "crash"
        if schedule.chance(self.pause * (2 if name == "before_send" else 1)):
            return "pause"
        if schedule.chance(self.drain):
            return "drain"
        return ""


def pause_seconds(world: World) -> float:
    """How long a pause lasts: a moment, a long stall, or about a call's time limit, give or
    take its margin (where a deadline checked before a send, the store's deadline a margin
    later, and a settlement's wait meet)."""
    schedule = world.schedule
    kind = schedule.pick(3)
    if kind == 1:
        return schedule.between(40.0, 500.0)
    if kind == 2:
        return schedule.between(
            CALL_SECONDS - fence.MARGIN - 1.0, CALL_SECONDS + fence.MARGIN + 2.0
        )
    return schedule.between(0.5, 20.0)


@dataclass(frozen=True)
class Setting:
    """The setting of one simulated run, as its step processes are made with it, whoever starts
    them (the local driver, the cluster's kubelet): the world, the store server, the network,
    the model, the desk, the faults drawn for the run, and the run's name."""

    world: World
    site: StoreSite
    network: Network
    planner: Planner
    desk: Desk
    faults: Faults
    tenant: str
    run: str
    #: Whether the run's steps have the product's HTTP confirmer (``ProductConfirmer``) ask the
    #: shop's status endpoint, whatever the scenario drew (which else decides whether they
    #: have the world's own ``ShopConfirmer``).
    http_confirmer: bool = False
    #: Whether ``pay`` is the product's own Python tool as the spec builds it, its function
    #: the world's (``sim.pay``), rather than the world's wrapper (``SimTool``).
    python_tool: bool = False


class StepProcess:
    """One step process (a step pod's container, or a `keelgate step` run by hand)."""

    def __init__(
        self,
        setting: Setting,
        *,
        name: str,
        on_exit: Callable[[StepProcess, int], None],
        epoch: int | None = None,
        cluster: str = "",
        reachable: Callable[[], bool] = lambda: True,
    ) -> None:
        """``epoch``: the one its pod was given (``KEELGATE_EPOCH``), carried on every write;
        ``cluster``: whose kubelet runs it (with two clusters); ``reachable``: whether the
        store server can be reached from its node now (a cluster cut off from it)."""
        self.setting = setting
        self.epoch = epoch
        self.cluster = cluster
        self.reachable = reachable
        self.world = setting.world
        self.books: Books = setting.planner.books
        self.name = name
        self.on_exit = on_exit
        self.alive = True
        self.lost = False  # its node was lost: nobody hears from it, it may still run
        self.asked_to_stop = False
        self.code: int | None = None
        self._stores: Stores | None = None
        self._late: list[LateCall] = []
        self._incident_ends = -1.0  # its node's network incident (a slow store answer) ends
        self._heard = False  # a statement of its own landed since the last write it booked
        self._landed = 0  # the place (``Books.next_order``) where its latest statement landed
        self._driving = False  # its step is under way (its main flow: no late call's end)
        setting.network.senders[name] = self
        self.books.processes[name] = ProcessLife(
            self.world.now, self.books.next_order(), cluster=cluster, epoch=epoch
        )

    #: The loop it builds (a monitor's tick process builds one that tells the world its tick).
    loop_kind: type[Loop] = Loop

    # What its tools ask of it

    @property
    def congested(self) -> bool:
        return self.world.now < self._incident_ends

    def window(self, name: str) -> None:
        self._window(name)

    def late(self, call: LateCall) -> None:
        self._late.append(call)

    # Running

    def start(self) -> None:
        """Run the step to its end (or its death), then exit, after waiting for a call still
        running (as ``keelgate step`` waits, up to its grace)."""
        world = self.world
        with world.acting(self.name):
            world.say(f"{self.name} starts")
            code: int
            try:
                with failpoints.observed(self._window):
                    self._driving = True
                    try:
                        outcome = self._drive()
                    finally:
                        self._driving = False
                code = exit_code(outcome, asked=self.asked_to_stop)
                world.say(f"{self.name} ends {outcome.phase.value} {outcome.stop.reason.value}")
            except SimulatedCrash as crash:
                self._die(f"died at {crash.failpoint}")
                return
            except BaseExceptionGroup as group:  # an async tool's task group carried it
                carried = _crash_in(group)
                if carried is None:
                    raise
                self._die(f"died at {carried.failpoint}")
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

    def _drive(self) -> Outcome:
        """What the process runs: one step of the run, as ``keelgate step`` does."""
        runner = StepRunner(
            store="sim://", opener=self._open, builder=self._build, epoch=self.epoch
        )
        return runner.step(self.setting.tenant, self.setting.run, asked_to_stop=self._asked)

    def _exit_if_done(self, code: int) -> None:
        if all(call.ended for call in self._late):
            self._exit(code)

    def _exit(self, code: int) -> None:
        if not self.alive or self.code is not None:
            return
        self.code = code
        if self._stores is not None:
            self.setting.site.kill(self._stores)  # the process is gone: whatever it held goes too
        self.alive = False
        self._ended(code)
        self.world.say(f"{self.name} exits {code}")
        self.on_exit(self, code)

    def _die(self, why: str) -> None:
        if not self.alive:
            return
        self.world.say(f"{self.name} {why}")
        if self._stores is not None:
            self.setting.site.kill(self._stores)
        self.alive = False
        self.code = KILLED
        self._ended(KILLED)
        self.on_exit(self, KILLED)

    def _ended(self, code: int) -> None:
        life = self.books.processes[self.name]
        life.ended, life.code, life.recorded = self.world.now, code, code in RECORDED

    def kill(self) -> None:
        """SIGKILL from outside (a pod deleted past its grace, a node gone for good)."""
        self._die("killed")

    def drain(self) -> None:
        """SIGTERM: stop at the next checkpoint."""
        self.asked_to_stop = True

    def _asked(self) -> bool:
        return self.asked_to_stop

    def _open(self) -> Stores:
        self._stores = self.setting.site.open(
            answer_late=self._answer_late, reachable=self.reachable
        )
        if isinstance(self._stores.checkpoints, BookedSaves):
            self._stores.checkpoints.booking = self._saving
        return self._stores

    def _clock(self) -> float:
        """The boot clock its loop reads (the session's active time is counted on it): the
        first reading, the session's start, is booked."""
        now = self.world.boot()
        life = self.books.processes[self.name]
        if life.clock_from is None:
            life.clock_from = now
        return now

    def _saving(self) -> Callable[[], None]:
        """A checkpoint save of its own asked for: booked once it returns, if its session
        asked for it with the time since its start (``Checkpointer.save``): not a late call's
        result written into whichever checkpoint is the latest (``remember_late``, which counts
        no time of its own), nor a save after its step ended."""
        world = self.world
        mine = self._driving and world.actor == self.name and _a_sessions_save()
        asked = world.boot()

        def returned() -> None:
            if mine:
                life = self.books.processes[self.name]
                life.saves.append((asked, world.boot(), self.books.next_order()))

        return returned

    def _answer_late(self) -> None:
        """A statement of this process landed and its answer is slow: the process waits for
        it (the rest of the world goes on), and may be killed meanwhile. Only what the process
        itself is doing waits here: a late call's worker ending from the world's own events
        (``downstream.LateCall``) hears its answers at once."""
        self._heard = True
        # Its place is where it landed in the store, not where the process heard so: a write
        # heard late landed before whatever the world did meanwhile (another cluster's take).
        self._landed = self.books.next_order()
        if self.world.actor != self.name:
            return
        seconds = self.setting.faults.answer_delay()
        if not seconds:
            return
        self.world.say(f"{self.name} hears the store's answer {seconds:.1f}s late")
        self._incident_ends = self.world.now + seconds + CALL_SECONDS
        self.world.advance(seconds)
        if not self.alive:
            raise SimulatedCrash("store_answer", 1)

    def _build(self, spec: LoopSpec, stores: Stores) -> Loop:
        """The loop a step pod builds from the spec it read (``build_parts``), over the
        simulated network; an in-process model is the world's, and so is ``pay`` (``SimTool``),
        but where the product's Python tool runs the world's function (``sim.pay``)."""
        self.books.processes[self.name].generation = self.setting.desk.generation_of(spec.manifest)
        parts = build_parts(spec)
        tools: list[Tool] = [
            SimTool(
                self.world,
                self.setting.network,
                self,
                name=tool.name,
                side_effect=tool.side_effect,
                requires_approval=tool.requires_approval,
                timeout_seconds=getattr(tool, "timeout_seconds", None),
                approval=getattr(tool, "approval", None),
                quote=self.setting.desk.scenario.quote,
            )
            if tool.name == "pay" and not self.setting.python_tool
            else tool
            for tool in parts.tools
        ]
        in_process = parts.model.name == "scripted"
        confirmer: Confirmer | None = None
        shop = self.setting.network.servers["shop.sim"]
        if self.setting.http_confirmer and isinstance(shop, Shop):
            confirmer = ProductConfirmer(self.world, shop)
        elif self.setting.desk.scenario.confirmer:
            confirmer = ShopConfirmer(self.world, self.books)
        return self.loop_kind(
            stores=stores,
            model=(
                PythonModel(SimModel(self.setting.planner), name=SimModel.name)
                if in_process
                else parts.model
            ),
            tools=tools,
            confirmer=confirmer,
            pricing=parts.pricing,
            price_model=parts.price_model,
            max_output_tokens=parts.max_output_tokens,
            busy_wait=0.0,  # virtual time: a busy run is told at once, never slept on
            clock=self._clock,
        )

    def _window(self, name: str) -> None:
        """The world's say at one window of this process."""
        if not self.alive:
            raise SimulatedCrash(name, 1)  # killed while held up: it never comes back
        if name == "after_plan":
            self.books.plan_saved(self.name)
        if self.cluster and name in WROTE and self._heard:
            # Right after a write of its own landed (a window that follows another with no
            # statement between, as the act phase's last checkpoint's does, is the same one).
            self._heard = False
            self.books.processes[self.name].wrote.append(self._landed)
        world = self.world
        fault = self.setting.faults.at_window(world, name)
        if fault == "crash":
            raise SimulatedCrash(name, 1)
        if fault == "drain":
            world.say(f"{self.name} asked to stop at {name}")
            self.asked_to_stop = True
        elif fault == "pause":
            self._hold(name)

    def _hold(self, name: str) -> None:
        """Held up at window ``name`` (the rest of the world runs meanwhile), its node lost
        now and then; with ``suspends``, now and then its machine suspended: it runs nothing
        either way, and suspended, its machine's monotonic clock stands still too."""
        world = self.world
        seconds = pause_seconds(world)
        lost, rest = world.schedule.chance_and_rest(500)
        asleep = self.setting.faults.suspends and rest % SUSPEND_SHARE == 1
        how = f"'s machine suspended {seconds:.1f}s" if asleep else f" held up {seconds:.1f}s"
        world.say(f"{self.name}{how} at {name}{' (node lost)' if lost else ''}")
        if lost:
            self.lost = True
            if self._stores is not None:
                self.setting.site.lose_session(self._stores)
            self.on_exit(self, -1)  # whoever drives the run hears nothing more from it
        with world.suspended(self.name, seconds) if asleep else nullcontext():
            world.advance(seconds)
        if not self.alive:
            raise SimulatedCrash(name, 1)
        world.say(f"{self.name} goes on after {name}")


def _a_sessions_save() -> bool:
    """Whether the checkpoint save under way was asked for by a session's checkpointer as the
    next of its own (``Checkpointer.save`` or ``save_completing``, which count the session's
    active time into it), not by ``Checkpointer.remember_late`` (which writes a late result
    into the latest checkpoint, whoever wrote it): the nearest checkpointer on the stack says."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Checkpointer):
            return frame.f_code.co_name in ("save", "save_completing")
        frame = frame.f_back
    return False


def _crash_in(group: BaseExceptionGroup) -> SimulatedCrash | None:
    for error in group.exceptions:
        if isinstance(error, SimulatedCrash):
            return error
        if isinstance(error, BaseExceptionGroup):
            found = _crash_in(error)
            if found is not None:
                return found
    return None
