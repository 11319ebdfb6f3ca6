"""An eighth set of single bugs the simulator was not built around (issue 48, item 4: the share
of bugs that break a promise found within 120 s).

Why it exists: each earlier set was measured and the simulator extended after it, so the share
only says something about bugs nobody had in mind while a fresh set keeps coming from someone
who has not read the simulator, its world, its checkers or its docs (nor the other sets beyond
their format, their one-line names and the files they planted into). These ten were written
from the product code, its ADR and its other docs alone, on ground the earlier sets left alone:
the active time a checkpoint counts toward the run's time budget (``core/persistence.py``), the
rule an action saved under a rule must meet once the manifest changes (``in_force``, and the
ServiceAccounts part of ``stricter``), the judge of who was shown which call (a deny made on
the tool as it was before an edit, a decision recorded late after an edit), the asking of an
action afresh (its round), the operator's test of whether a run's unknown outcomes are settled,
its look at an Approval settled once and asked again, its cap on step pods being created, and
the clock every write deadline and exchange cut is read on (``core/clocks.py``, a module no
set planted into). Each is one honest mistake a developer could make in one place: a term
dropped, a condition left out, a case forgotten, a comparison turned, the wrong one of two
neighbours.

Each is planted into a copy of the package, never into the tree (``planted_bugs.planted``);
every replacement's old text occurs exactly once in its file (``test_unseen_bug_sets.py``). The
comment above each says which promise it breaks and how, and whether a unit test of the suite
fails with it planted (checked by planting it into a copy and running the nearest unit test
files against the copy, without the simulator); ``mode`` is where it can first be met as far
as the product code says.
"""

from __future__ import annotations

from support.planted_bugs import Planted

UNSEEN_H: tuple[Planted, ...] = (
    Planted(
        # budget: a session's active time is judged as the time since its last checkpoint
        # alone (the run's checkpointed active seconds, the first term of ``active``, dropped),
        # so a run with timeoutSeconds whose checkpoints come more often than that budget never
        # reads as spent: it plans, calls tools and spends past its time budget, iteration
        # after iteration, while its own usage (which ``_next`` still adds up) says it is over.
        # Unit test: UNIT_H_ACTIVE
        "a run's active time judged from its last checkpoint only (the checkpointed seconds "
        "dropped)",
        (
            (
                "core/persistence.py",
                "return state.usage.active_seconds + (self.clock() - self.mark)",
                "return self.clock() - self.mark",
            ),
        ),
    ),
    Planted(
        # unapproved: the rule an action must meet before its call is the tool's rule now
        # whenever the tool still has one, not the one it was planned under made stricter by
        # it: a WRITE planned under "2 approvals from payments, not the creator" waits; an
        # edit of the manifest to requiresApproval: true (one approval by anyone) is resumed
        # under, and the creator's one approval runs the call the saved rule held back (an
        # edit may add a question, never remove one or lower a count).
        # Unit test: UNIT_H_IN_FORCE
        "a saved action held to the tool's rule now, not the stricter of both (an edit lowers "
        "its count)",
        (
            (
                "core/approvals.py",
                "    return planned.stricter(now)\n",
                "    return now if now is not None else planned\n",
            ),
        ),
    ),
    Planted(
        # skipped: a deny that names the tool's definition it was shown is refused when the
        # action is now bound to another one, as an approval is (the ``approved and`` of the
        # definition check left out): a person denies a WRITE on its Approval, the manifest was
        # edited meanwhile and the resumed run rebound the action, so the deny is refused with
        # "look again"; another person approves the new definition and the call runs, though
        # a no was given on it (a no is never voided by an edit).
        # Unit test: UNIT_H_AWAITED
        "a deny made on the tool as it was before an edit refused like an approval (approved "
        "left out of the definition check)",
        (
            (
                "core/approvals.py",
                "    if approved and definition and bound and definition != bound:",
                "    if definition and bound and definition != bound:",
            ),
        ),
    ),
    Planted(
        # rebound: an approval recorded late (from an Approval entry, with the moment it states)
        # is refused only when the tool was edited before it, not after (the comparison of
        # ``_rebound_since`` turned): alice approves the call to the old URL, the manifest
        # changes the URL, the operator records her entry a minute later (it was away) and her
        # approval counts for a call she was never shown; a decision made after an edit is
        # refused instead ("look again").
        # Unit test: UNIT_H_REBOUND
        "an approval made before an edit and recorded after it counts for the edited call (the "
        "edit's moment compared the wrong way)",
        (
            (
                "core/approvals.py",
                "later = [moment for moment in moments if seconds(moment) >= since]",
                "later = [moment for moment in moments if seconds(moment) <= since]",
            ),
        ),
    ),
    Planted(
        # hidden: ``ask_again`` asks an action afresh whatever round the caller saw (its round
        # test left out): an Approval full in round 1 is asked again by one look (round 2), a
        # second look that read the run before it (another operator, or a retry after a
        # crash) asks again too, and the approvals people gave in round 2 meanwhile leave the
        # checkpoint: round 3 asks them again, their decisions no longer count anywhere.
        # Unit test: UNIT_H_ASK_AGAIN
        "an action asked afresh again by a caller that saw an earlier round (the round test "
        "left out of ask_again)",
        (
            (
                "core/approvals.py",
                "    if asked is None or state.round_of(action) != round:\n",
                "    if asked is None:\n",
            ),
        ),
    ),
    Planted(
        # unapproved: two rules combined let ServiceAccounts decide if either does (``and``
        # written ``or``): a WRITE saved under a rule that let a bot's ServiceAccount approve
        # waits; the manifest is edited to count people only (the bot's token leaked), and the
        # bot's approval still runs the call on the rule in force, which asks a person.
        # Unit test: UNIT_H_STRICTER
        "two rules combined let ServiceAccounts decide if either does (or for and)",
        (
            (
                "core/types.py",
                "service_accounts=self.service_accounts and other.service_accounts,",
                "service_accounts=self.service_accounts or other.service_accounts,",
            ),
        ),
    ),
    Planted(
        # skipped: the operator reads a run's unknown outcomes as settled only when each was
        # settled as executed (the abandoned case forgotten): a person settles a WRITE as not
        # executed on its Reconciliation, the store records it, the Reconciliation shows it
        # Settled, and the run stays at rest on its outcome_unknown stop for good: the
        # decision is on record and nothing acts on it.
        # Unit test: UNIT_H_SETTLED
        "a run whose unknown outcome was settled as not executed never goes on (abandoned "
        "forgotten in the settled test)",
        (
            (
                "kube/controller/decision_objects.py",
                "            done = record.state in _SETTLED\n",
                "            done = record.state is KeyState.COMPLETED\n",
            ),
        ),
        mode="operator",
    ),
    Planted(
        # skipped: an Approval shown Settled is treated as decided even when its action waits
        # again in the same round (``and not waiting`` left out): two approvals met a rule of
        # two, one of them expired before the call ran, and the run asks again on the same
        # object; the entry a third person adds there is told "not counted: added after it was
        # settled", a deny added there is never recorded either, and the run waits for good
        # while its Approval says approved.
        # Unit test: UNIT_H_LOOK
        "entries on a Settled Approval whose action waits again are not recorded (not waiting "
        "left out)",
        (
            (
                "kube/controller/approvals.py",
                'if old.get("phase") == "Settled" and not waiting:',
                'if old.get("phase") == "Settled":',
            ),
        ),
        mode="operator",
    ),
    Planted(
        # limit: the step-pod cap counts only the pods the cache holds, not the ones being
        # created right now (a term dropped): reconciles on several worker threads each take a
        # slot before any of their pods reaches the cache, and a burst of runs starts more
        # step pods than --max-step-pods allows at once.
        # Unit test: UNIT_H_SLOTS
        "step slots taken without the pods being created (the creating count dropped from the cap)",
        (
            (
                "kube/controller/slots.py",
                "if self._cache.active_step_pods() + self._creating >= self._limit:",
                "if self._cache.active_step_pods() >= self._limit:",
            ),
        ),
        mode="operator",
    ),
    Planted(
        # after "not executed": the boot clock is read as CLOCK_MONOTONIC (the wrong one of
        # two neighbours), which stops while the machine is suspended: a process claims a WRITE,
        # its machine sleeps past the store's deadline, a person truthfully finds nothing
        # downstream and settles it as not executed, and the process wakes with its own
        # deadline not yet passed and sends the call (its exchange's cut rings late by the
        # suspend too).
        # Unit test: UNIT_H_CLOCK
        "the write deadline read on a clock that stops while the machine sleeps (CLOCK_MONOTONIC "
        "for CLOCK_BOOTTIME)",
        (
            (
                "core/clocks.py",
                '_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)',
                '_BOOTTIME = getattr(time, "CLOCK_MONOTONIC", None)',
            ),
        ),
    ),
)
