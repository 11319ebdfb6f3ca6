"""The people around a run in local mode: they approve, deny, settle truthfully or wrongly, edit
the spec and raise budgets, at any moment, through the calls the CLI makes (``Loop.approve``
with the groups they are in, ``Loop.reconcile``) in a process of their own that can die too.

Why it exists: half of the historical bugs were found where a person acted at an unlucky moment
(a spec edit at an unknown outcome, a settlement during a pause). A person here looks at the run
now and then (``keelgate status``: the stop, the actions it waits on and their arguments), and
decides from the schedule. Each decision goes into the world's books as its maker made it
(``Books.decisions``): about which call (its ``ref``, read off the arguments the person was
shown), with which groups, whether it was true when given (the shop's books say), and when the
product told them it stood; every unknown outcome a person is shown is booked as a question put
to them. alice created the run; bob and carol approve payments; carol and dave are shop
developers (``books.GROUPS``).
"""

from __future__ import annotations

from collections.abc import Callable

from keelgate.core import failpoints
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.state import RunState
from keelgate.core.types import ApprovalRule, KeyState, StopReason
from keelgate.errors import KeelgateError, SimulatedCrash
from keelgate.testing.sim import records
from keelgate.testing.sim.books import GROUPS, SERVICE_ACCOUNT, Books, Decision, Question
from keelgate.testing.sim.desk import EDITS, Desk
from keelgate.testing.sim.processes import Setting
from keelgate.testing.sim.stores import patiently
from keelgate.testing.sim.world import World

PEOPLE = tuple(GROUPS)
#: When the calm end begins (``simulate.CHAOS``: seconds of chaos).
CALM_START = 900.0
BUDGET_STOPS = frozenset(
    {
        StopReason.TOKEN_BUDGET,
        StopReason.DOLLAR_BUDGET,
        StopReason.MAX_ITERATIONS,
        StopReason.TIMEOUT,
    }
)


#: Seconds after the calm end began during which people look every 5 s; every minute after.
CALM_PROMPT = 600.0


def calm_look(world: World) -> float:
    """How soon a person looks again once all is calm: at once at first, then every minute (a
    run left waiting for hours is still looked at, without thousands of looks)."""
    return 5.0 if world.now < CALM_START + CALM_PROMPT else 60.0


def counts(person: str, rule: ApprovalRule | None, creator: str) -> bool:
    """Whether ``person`` may count under the rule a waiting action shows (who a calm person
    leaves the decision to)."""
    if rule is None:
        return True
    if rule.not_creator and person == creator:
        return False
    return rule.admits(GROUPS.get(person, ()))


def book_approval(
    books: Books,
    desk: Desk,
    *,
    at: float,
    by: str,
    human: str,
    action: str,
    ref: str,
    yes: bool,
    tool: str,
) -> Decision:
    """An approval or a deny of the call ``ref``, made at ``at`` by ``human`` under the name
    ``by`` (with the groups ``by`` is in), of ``tool`` as the run showed it, booked."""
    shown = books.shown(tool, at, desk.tool(tool))
    also = tuple(d for d in books.might_have_shown(tool, at, desk.tool(tool)) if d != shown)
    decision = Decision(
        at, "approve", by, human, action, ref, yes, GROUPS.get(by, ()), shown=shown, shown_also=also
    )
    books.decisions.append(decision)
    return decision


class People:
    """Everyone who decides about one run (CLI users, in local mode)."""

    def __init__(
        self,
        setting: Setting,
        *,
        moves: frozenset[str] = frozenset(),
        ticks: Callable[[Stores], list[str]] | None = None,
        over: Callable[[], bool] | None = None,
        resume: Callable[[], None] | None = None,
    ) -> None:
        self.setting = setting
        #: A monitor's ticks on record (each a run people look at, as ``keelgate status``
        #: lists them), and whether the monitor is over; None: the one run, over once finished.
        self.ticks = ticks
        self.over = over
        #: What a person runs once they decided on a run (``keelgate run <monitor>``, as the
        #: CLI suggests), rather than wait for the cron job's next minute.
        self.resume = resume
        self.run = setting.run  # the run being looked at
        self.world = world = setting.world
        self.books = setting.planner.books
        self.moves = moves
        self.calm = False
        self.edits = (0, 100, 400)[world.schedule.pick(3)]  # spec edits per thousand looks
        self.wrong = (0, 30)[world.schedule.pick(2)]

    def look_later(self) -> None:
        delay = self.world.schedule.between(2.0, 60.0) if not self.calm else calm_look(self.world)
        self.world.at(delay, "a person looks", self.look)

    def look(self) -> None:
        with self.world.acting("people"):
            finished = self._look()
        if not finished:
            self.look_later()

    def _look(self) -> bool:
        world = self.world
        schedule = world.schedule
        if not self.calm and schedule.chance(self.edits):
            self.setting.desk.edit(EDITS[schedule.pick(len(EDITS))])
        stores = self.setting.site.open()
        try:
            loop = Loop(stores=stores, busy_wait=0.0, clock=world.boot)
            if self.ticks is None:
                return self._look_at(loop, self.setting.run)
            try:
                runs = patiently(lambda: self.ticks(stores) if self.ticks else [])
            except KeelgateError:
                runs = []
            for run in runs:
                self._look_at(loop, run)
            return self.over is not None and self.over()
        finally:
            stores.close()

    def _look_at(self, loop: Loop, run: str) -> bool:
        """One run looked at (``keelgate status``), and decided on; whether it is finished."""
        world = self.world
        schedule = world.schedule
        self.run = run
        try:
            state = patiently(lambda: loop.state(self.setting.tenant, run))
        except KeelgateError:
            state = None
        if state is None or state.stop is None:
            return False
        stop = state.stop
        if stop.reason is StopReason.AWAITING_APPROVAL:
            for pending in state.pending:
                if self.calm:
                    self._approve(loop, state, pending.action, pending.tool, pending.rule)
                    self._approve_the_rest(loop, pending.action, pending.tool, pending.rule)
                    continue
                # One draw, as ever: its remainder says whether the person decides now (``not
                # chance(300)``); one time in four, the rest of it has the run's owner name
                # other groups for the tool first (``Desk.regroup``: both lists in play).
                drawn = schedule.raw()
                if (drawn // 1000) % 4 == 3:
                    self.setting.desk.regroup(pending.tool)
                if self.setting.desk.service_account_rules and (drawn // 4000) % 4 == 3:
                    # With ServiceAccounts in the world, one time in four (read further on in
                    # the same draw) the owner turns whether they may decide it too.
                    self.setting.desk.turn_service_accounts(pending.tool)
                if drawn % 1000 < 700:
                    self._approve(loop, state, pending.action, pending.tool, pending.rule)
            if self.setting.desk.moves and not self.calm and schedule.chance(300):
                # The run's owner sends the tool somewhere else once its call is approved,
                # before the next step (issue 46).
                self.setting.desk.edit(self.setting.desk.definition_edit())
        elif stop.reason is StopReason.OUTCOME_UNKNOWN:
            for unknown in state.unknown:
                ref = _ref(state, unknown.action)
                self.books.questions.append(Question(world.now, "people", unknown.action, ref))
                if self.calm or not schedule.chance(300):
                    self._settle(loop, unknown.action, unknown.idempotency_key, ref)
                self._come_back(unknown.not_executed_after)
        elif stop.reason in BUDGET_STOPS and (self.calm or schedule.chance(500)):
            self.setting.desk.edit("raise budget")
        # Finished (nothing more to decide) once its stop is final under the spec as it
        # stands: a stop on the verifier's limit is not, where the limit was raised since.
        spec = self.setting.desk.loop_spec(self.setting.tenant, self.setting.run)
        return not state.continues_under(spec.budget)

    def _come_back(self, after: str) -> None:
        """``keelgate status`` says when an unknown outcome may be settled as not executed: a
        person who found nothing downstream comes back then (as the product invites them to)."""
        if not after:
            return
        when = self.world.clocks.true_of_store(records.stamp_seconds(after)) - self.world.now
        if 0.0 < when < 600.0:
            self.world.at(when + 0.5, "a person comes back", self.look_once)

    def paged(self) -> None:
        """A run stopped for a person raises an alert (``keelgate status`` in a watch, a
        CloudEvent to a pager): whoever is on call looks within seconds, not at their next
        round. Their usual rounds go on too."""
        if not self.calm:
            self.world.at(self.world.schedule.between(0.5, 8.0), "a page", self._answer_page)

    def _answer_page(self) -> None:
        self.world.say("a person answers the page")
        self.look_once()

    def look_once(self) -> None:
        """A look that schedules no other (the person's usual rounds go on anyway)."""
        with self.world.acting("people"):
            self._look()

    def _who(self, rule: ApprovalRule | None, given: set[str], creator: str) -> str:
        """Who decides: anyone, in the chaos; calm, someone who counts and has not approved."""
        schedule = self.world.schedule
        by = PEOPLE[schedule.pick(len(PEOPLE))]
        if self.calm:
            fit = [p for p in PEOPLE if p not in given and counts(p, rule, creator)]
            # Everyone who counts approved once already, and the product asks again (their
            # approvals grew too old): one of them approves again.
            fit = fit or [p for p in PEOPLE if counts(p, rule, creator)]
            if fit and by not in fit:
                by = fit[schedule.pick(len(fit))]
        return by

    def _approve_the_rest(
        self, loop: Loop, action: str, tool: str, rule: ApprovalRule | None
    ) -> None:
        """In the calm, approvals that expire and more than one of them needed: the people the
        rule asks agree on it together (a call, a chat), so that all it needs are given within
        its time, not one a look while the first grows too old."""
        if rule is None or rule.expires_after is None or rule.required < 2:
            return
        for _ in range(rule.required - 1):
            try:
                state = patiently(lambda: loop.state(self.setting.tenant, self.run))
            except KeelgateError:
                return
            if state is None or not any(p.action == action for p in state.pending):
                return
            self._approve(loop, state, action, tool, rule)

    def _approve(
        self, loop: Loop, state: RunState, action: str, tool: str, rule: ApprovalRule | None
    ) -> None:
        """One person decides (a rule may need two: each look, one more)."""
        world = self.world
        yes = self.calm or not world.schedule.chance(200)
        given = {d.by for d in state.approvals.get(action, ()) if d.approved}
        human = self._who(rule, given, state.spec.creator)
        by, groups = self._as(human, rule)
        decision = book_approval(
            self.books,
            self.setting.desk,
            at=world.now,
            by=by,
            human=human,
            action=action,
            ref=_ref(state, action),
            yes=yes,
            tool=tool,
        )
        before = len(state.approvals.get(action, ()))
        try:
            with failpoints.observed(self._window):
                loop.approve(
                    self.setting.tenant,
                    self.run,
                    action,
                    approved=yes,
                    by=by,
                    groups=groups,
                )
        except (KeelgateError, SimulatedCrash) as refused:
            world.say(f"{by} {'approves' if yes else 'denies'} {action}: {type(refused).__name__}")
            self._approval_stood(decision, before)
            return
        decision.accepted_at, decision.told = world.now, True
        world.say(f"{by} {'approved' if yes else 'denied'} {action} ({tool})")
        if self.resume is not None:
            self.resume()

    def _as(self, human: str, rule: ApprovalRule | None) -> tuple[str, tuple[str, ...]]:
        """The name and the groups ``human``'s command gives (``keelgate approve --by --group``,
        both the caller's word locally): their own, mostly; in the chaos now and then no
        ``--group`` at all (a person who leaves it out), or, with the ``service-account``
        move, the name of the ServiceAccount ``ci`` their CI job runs as, with their groups.
        With ``service_account_rules``, where the rule the run shows lets ServiceAccounts
        decide, half the other chaos decisions are made through ``ci`` too (the CI job the
        rule was written for; read from the rest of the same draw)."""
        schedule = self.world.schedule
        if self.calm:
            return human, GROUPS[human]
        odd, rest = schedule.chance_and_rest(150)
        if not odd:
            bots = rule is not None and rule.service_accounts
            if bots and self.setting.desk.service_account_rules and rest % 2 == 1:
                self.world.say(f"{human} decides as {SERVICE_ACCOUNT} (the rule lets it)")
                return SERVICE_ACCOUNT, (*GROUPS[human], "system:serviceaccounts")
            return human, GROUPS[human]
        if "service-account" in self.moves and schedule.chance(500):
            self.world.say(f"{human} decides as {SERVICE_ACCOUNT}")
            return SERVICE_ACCOUNT, (*GROUPS[human], "system:serviceaccounts")
        self.world.say(f"{human} decides without --group")
        return human, ()

    def _settle(self, loop: Loop, action: str, key: str, ref: str) -> None:
        world = self.world
        schedule = world.schedule
        happened = self.books.happened(ref, world.now)
        truthful = self.calm or not schedule.chance(self.wrong)
        executed = happened if truthful else not happened
        for turn in range(1 + (0 if self.calm else int(schedule.chance(150)))):
            by = PEOPLE[schedule.pick(len(PEOPLE))]
            if turn:  # a second person, deciding the same thing a moment later
                executed = not executed if schedule.chance(500) else executed
                truthful = executed == happened
            decision = Decision(
                world.now, "settle", by, by, action, ref, executed, truthful=truthful
            )
            self.books.decisions.append(decision)
            try:
                with failpoints.observed(self._window):
                    loop.reconcile(self.setting.tenant, self.run, action, executed=executed, by=by)
            except SimulatedCrash:
                world.say(f"{by}'s reconcile of {action} died after settling")
                self._stood(decision, key)
                continue
            except KeelgateError as refused:
                world.say(f"{by} settles {action} {executed}: {type(refused).__name__}")
                self._stood(decision, key)  # its answer may have been lost
                continue
            decision.accepted_at, decision.told = world.now, True
            world.say(f"{by} settled {action} as {'executed' if executed else 'not executed'}")
            if self.resume is not None:
                self.resume()

    def _approval_stood(self, decision: Decision, before: int) -> None:
        """A person told their decision failed (its answer lost) looks again: is it there?"""
        stores = self.setting.site.open()
        try:
            loop = Loop(stores=stores, busy_wait=0.0)
            state = patiently(lambda: loop.state(self.setting.tenant, self.run))
        except KeelgateError:
            return
        finally:
            stores.close()
        new = state.approvals.get(decision.action, ())[before:]
        if any(d.by == decision.by and d.approved == decision.yes for d in new):
            decision.accepted_at, decision.told = self.world.now, True

    def _stood(self, decision: Decision, key: str) -> None:
        """A person whose command died looks again (``keelgate status``): did it stand?"""
        stores = self.setting.site.open()
        try:
            record = patiently(lambda: stores.idempotency.get(self.setting.tenant, key))
        finally:
            stores.close()
        wanted = KeyState.COMPLETED if decision.yes else KeyState.ABANDONED
        if record is not None and record.state is wanted and record.settled_by == decision.by:
            decision.accepted_at, decision.told = self.world.now, True

    def _window(self, name: str) -> None:
        """A person's own command can die too (after its settlement, before its event)."""
        if name == "after_settle" and not self.calm and self.world.schedule.chance(100):
            raise SimulatedCrash(name, 1)


def _ref(state: RunState, action: str) -> str:
    """The ref of the call a person is shown for ``action`` (its arguments, as ``keelgate
    status`` shows them)."""
    planned = state.planned(action)
    return "" if planned is None else str(planned.args.get("ref", ""))
