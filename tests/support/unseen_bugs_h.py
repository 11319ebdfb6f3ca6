"""An eighth set of single bugs the simulator was not built around (issue 48, item 4: the share
of bugs that break a promise found within 120 s).

Why it exists: as for set G (``unseen_bugs_g.py``), a share measured on bugs nobody had in
mind, from someone who read nothing of the simulator. These ten were written
from the product code, its ADR and its other docs alone, on ground the earlier sets left alone:
the active time a checkpoint counts toward the run's time budget (``core/persistence.py``), the
rule an action saved under a rule must meet once the manifest changes (``in_force``, and the
ServiceAccounts part of ``stricter``), the judge of who was shown which call (a deny made on
the tool as it was before an edit, a decision recorded late after an edit), what a run waits
for once a person denied, the operator's test of whether a run's unknown outcomes are settled,
its look at an Approval settled once and asked again, its cap on step pods being created, and
the clock every write deadline and exchange cut is read on (``core/clocks.py``, a module no
set planted into). Each is one honest mistake a developer could make in one place: a term
dropped, a condition left out, a case forgotten, a comparison turned, the wrong one of two
neighbours.

Planted, checked and commented as set G's are (``unseen_bugs_g.py``'s docstring): into a copy,
each old text once in its file, each comment naming the promise broken and the unit test that
fails with it planted, if any; ``mode`` where it can first be met.
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
        # Unit test: test_loop_stops_and_budgets.py's
        # test_timeout_counts_active_time_and_its_saved_plan_runs_after_a_raise fails
        # (test_write_ahead.py, test_runner.py and test_step.py pass).
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
        # Unit test: test_approval_rules.py's
        # test_the_rule_travels_with_the_saved_action_and_an_edit_only_adds fails.
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
        # Unit test: test_approval_calls.py's
        # test_a_deny_on_the_tool_as_it_was_before_an_edit_still_denies fails.
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
        # Unit test: test_approval_calls.py's
        # test_a_one_decision_approval_written_before_an_edit_never_counts_after_the_rebind
        # (both cases) and
        # test_a_step_image_edited_after_the_approvals_voids_them_and_nothing_is_sent fail.
        "an approval made before an edit and recorded after it counts for the edited call (the "
        "edit's moment compared the wrong way)",
        (
            (
                "core/approvals.py",
                "later = [moment for moment in moments if seconds(moment) >= since]",
                "later = [moment for moment in moments if seconds(moment) <= since]",
            ),
        ),
        mode="operator",
    ),
    Planted(
        # skipped: a deny recorded on an action that waits for several approvals leaves it
        # waiting (the deny's case forgotten where ``decide`` works out what the run still
        # waits for): bob denies a WRITE of a rule of two, the run's stop then says "approved
        # by bob (0 of 2); waiting for 2 more" and still lists the action as awaited, so the
        # operator leaves the run at rest and it never goes on with the deny the model should
        # be told of, while its Approval shows it denied.
        # Unit test: test_approval_rules.py's
        # test_any_deny_denies_even_after_approvals, test_approval_identity.py's
        # test_a_one_decision_approved_false_is_a_deny_never_an_approval and three of
        # test_controller_approvals.py (test_one_deny_among_approvals_denies and others) fail.
        "a deny leaves its action awaited and the stop says approved by the denier (the deny "
        "forgotten in what the run waits for)",
        (
            (
                "core/approvals.py",
                "    if after.met or not decision.approved:\n",
                "    if after.met:\n",
            ),
        ),
        mode="operator",
    ),
    Planted(
        # unapproved: two rules combined let ServiceAccounts decide if either does (``and``
        # written ``or``): a WRITE saved under a rule that let a bot's ServiceAccount approve
        # waits; the manifest is edited to count people only (the bot's token leaked), and the
        # bot's approval still runs the call on the rule in force, which asks a person.
        # Unit test: none fails (test_approval_rules.py, test_loop_approvals.py,
        # test_spec_edits.py, test_approval_calls.py, test_approval_identity.py,
        # test_controller_approvals.py and test_crash_approvals.py pass); in a scratch run
        # against the copy, the stricter of a rule letting ServiceAccounts decide and one of
        # one approval by a person let system:serviceaccount:shop:bot's approval count.
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
        # Unit test: test_controller_decisions.py's
        # test_a_person_settles_an_unknown_outcome_and_the_run_goes_on[False-abandoned-abandoned]
        # and three others fail.
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
        # settled", a deny added there is never recorded either, and the run waits while its
        # Approval says approved; once the missing approval is given elsewhere (keelgate
        # approve), the call runs though a no stands on its Approval.
        # Unit test: test_controller_approvals.py's
        # test_approvals_too_old_when_the_step_runs_ask_afresh_on_a_new_approval fails.
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
        # Unit test: test_controller_parts.py's
        # test_step_slots_keep_the_cap_when_reconciles_race fails.
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
        # Unit test: none fails (test_write_deadlines.py, test_cut_exchanges.py,
        # test_timed_out_write.py, test_composite_tools.py and test_stale_processes.py pass: no
        # test suspends the machine); in a scratch run against the copy, ``clocks.boot`` read
        # CLOCK_MONOTONIC. Since h/suspend, test_clocks.py's two tests of the clock a deadline
        # is read on fail, and the simulator's suspended machines (``--suspends``) meet it
        # (test_simulation.py's test_a_deadline_on_a_clock_that_stops_in_a_suspend_is_found).
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
