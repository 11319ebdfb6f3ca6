"""The people around a run: they approve, deny, settle truthfully or wrongly, edit the spec and
raise budgets, at any moment, through the same calls the CLI makes (``Loop.approve``,
``Loop.reconcile``) in a process of their own that can die too.

Why it exists: half of the historical bugs were found where a person acted at an unlucky moment
(a spec edit at an unknown outcome, a settlement during a pause). A person here looks at the run
now and then, decides from the schedule, and the decisions the store accepted are logged for the
oracle (``Decision``), with whether they were true when given (the shop's ledger says).
"""

from __future__ import annotations

from dataclasses import dataclass

from keelgate.core import failpoints
from keelgate.core.loop import Loop
from keelgate.core.types import KeyState, StopReason
from keelgate.errors import KeelgateError, SimulatedCrash
from keelgate.testing.sim.desk import EDITS, Desk
from keelgate.testing.sim.downstream import Ledger
from keelgate.testing.sim.stores import StoreSite
from keelgate.testing.sim.world import World

PEOPLE = ("alice", "bob")
BUDGET_STOPS = frozenset({StopReason.TOKEN_BUDGET, StopReason.MAX_ITERATIONS})


@dataclass(frozen=True)
class Decision:
    """A person's decision the store accepted."""

    kind: str  # "settle" or "approve"
    action: str
    key: str
    yes: bool
    by: str
    at: float
    truthful: bool


class People:
    """Everyone who decides about one run (CLI users, in local mode)."""

    def __init__(
        self, world: World, site: StoreSite, ledger: Ledger, desk: Desk, *, tenant: str, run: str
    ) -> None:
        self.world = world
        self.site = site
        self.ledger = ledger
        self.desk = desk
        self.tenant = tenant
        self.run = run
        self.decisions: list[Decision] = []
        self.calm = False
        self.edits = (0, 100, 400)[world.schedule.pick(3)]  # spec edits per thousand looks
        self.wrong = (0, 30)[world.schedule.pick(2)]

    def look_later(self) -> None:
        delay = self.world.schedule.between(2.0, 60.0) if not self.calm else 5.0
        self.world.at(delay, "a person looks", self.look)

    def look(self) -> None:
        world = self.world
        schedule = world.schedule
        if not self.calm and schedule.chance(self.edits):
            self.desk.edit(EDITS[schedule.pick(len(EDITS))])
        stores = self.site.open()
        try:
            loop = Loop(stores=stores, busy_wait=0.0, clock=world.boot)
            try:
                state = loop.state(self.tenant, self.run)
            except KeelgateError:
                state = None
            if state is not None and state.stop is not None:
                stop = state.stop
                if stop.reason is StopReason.AWAITING_APPROVAL:
                    for pending in state.pending:
                        if self.calm or not schedule.chance(300):
                            given = {d.by for d in state.approvals.get(pending.action, ())}
                            self._approve(loop, pending.action, pending.tool, given)
                elif stop.reason is StopReason.OUTCOME_UNKNOWN:
                    for unknown in state.unknown:
                        if self.calm or not schedule.chance(300):
                            self._settle(loop, unknown.action, unknown.idempotency_key)
                elif stop.reason in BUDGET_STOPS and (self.calm or schedule.chance(500)):
                    self.desk.edit("raise budget")
                if not stop.is_resumable:
                    return  # finished: nothing more to decide, nobody looks again
        finally:
            stores.close()
        self.look_later()

    def _who(self) -> str:
        return PEOPLE[self.world.schedule.pick(len(PEOPLE))]

    def _approve(self, loop: Loop, action: str, tool: str, given: set[str]) -> None:
        """One person decides (a rule may need two: each look, one more). Calm, it is someone
        who has not approved yet; otherwise anyone, and the same person twice is refused."""
        schedule = self.world.schedule
        yes = self.calm or not schedule.chance(200)
        by = self._who()
        if self.calm and by in given:
            by = next((p for p in PEOPLE if p not in given), by)
        try:
            with failpoints.observed(self._window):
                loop.approve(self.tenant, self.run, action, approved=yes, by=by)
        except (KeelgateError, SimulatedCrash) as refused:
            self.world.say(
                f"{by} {'approves' if yes else 'denies'} {action}: {type(refused).__name__}"
            )
            return
        self.world.say(f"{by} {'approved' if yes else 'denied'} {action} ({tool})")
        self.decisions.append(Decision("approve", action, "", yes, by, self.world.now, True))

    def _settle(self, loop: Loop, action: str, key: str) -> None:
        world = self.world
        schedule = world.schedule
        happened = self.ledger.count(key) > 0
        truthful = self.calm or not schedule.chance(self.wrong)
        executed = happened if truthful else not happened
        for turn in range(1 + (0 if self.calm else int(schedule.chance(150)))):
            by = self._who()
            if turn:  # a second person, deciding the same thing a moment later
                executed = not executed if schedule.chance(500) else executed
                truthful = executed == happened
            try:
                with failpoints.observed(self._window):
                    loop.reconcile(self.tenant, self.run, action, executed=executed, by=by)
            except SimulatedCrash:
                world.say(f"{by}'s reconcile of {action} died after settling")
                self._logged(action, key, executed, by, truthful)
                continue
            except KeelgateError as refused:
                world.say(f"{by} settles {action} {executed}: {type(refused).__name__}")
                continue
            world.say(f"{by} settled {action} as {'executed' if executed else 'not executed'}")
            self._logged(action, key, executed, by, truthful)

    def _logged(self, action: str, key: str, executed: bool, by: str, truthful: bool) -> None:
        record = None
        stores = self.site.open()
        try:
            record = stores.idempotency.get(self.tenant, key)
        finally:
            stores.close()
        if record is None or record.state not in (KeyState.COMPLETED, KeyState.ABANDONED):
            return
        if record.settled_by != by:
            return  # someone else's decision stands
        self.decisions.append(
            Decision("settle", action, key, executed, by, self.world.now, truthful)
        )

    def _window(self, name: str) -> None:
        """A person's own command can die too (after its settlement, before its event)."""
        if name == "after_settle" and not self.calm and self.world.schedule.chance(100):
            raise SimulatedCrash(name, 1)
