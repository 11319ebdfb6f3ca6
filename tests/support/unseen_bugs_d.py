"""A fourth set of single bugs the simulator was not built around (issue 48, item 4: the share of
bugs that break a promise found within 120 s).

Why it exists: sets A, B and C were measured and the simulator extended after each; a set written
after that work, by someone who had not read the simulator, its world or its checkers (nor the
other sets beyond their format), says whether the share holds for bugs nobody had in mind. These
ten were written from the product code alone and spread over its floors: the approval rule's
combination (``core/types.py``), the tally (``core/approvals.py``), the budgets, the plan's saved
rule (``core/phases.py``), the checkpoints' outbox (``core/persistence.py``), the SQL store's
claim, the monitor's ticks (``runners/local.py``), the HTTP confirmer, and the operator's
Approval reconciler and finalizer. Each is one honest mistake a developer could make in one
place: an off-by-one, a comparison turned, a wrong field or variable, a case forgotten, two
lines in the wrong order, a value coerced.

Each is planted into a copy of the package, never into the tree (``planted_bugs.planted``);
every replacement's old text occurs exactly once in its file. The comment above each says which
promise it breaks and how, and whether a unit test of the suite fails with it planted (checked
by planting it into a copy and running that test against the copy, without the simulator);
``mode`` is where it can first be met as far as the product code says.
"""

from __future__ import annotations

from support.planted_bugs import Planted

UNSEEN_D: tuple[Planted, ...] = (
    Planted(
        # unapproved (groups): combining the rule an action was planned under with the one in
        # force now keeps the first list of groups and drops the second (``lists[2:]`` for
        # ``lists[1:]``), so after a manifest edit that changes a tool's groups a person in the
        # planned groups only (or the new ones only) counts, where the rule asks both.
        # Unit test: test_approval_rules.py's the_rule_travels_with_the_saved_action fails.
        "two rules combined drop the second list of groups (an off-by-one in stricter)",
        (("core/types.py", "also_groups=tuple(lists[1:]),", "also_groups=tuple(lists[2:]),"),),
    ),
    Planted(
        # unapproved (definition binding): the tally asks whether each approval was made on the
        # call as bound now by comparing the decision's definition with itself (the wrong
        # variable), so approvals given before a manifest edit changed the tool keep counting
        # for the edited call. Unit test: test_approval_calls.py's
        # an_edit_after_the_approvals_voids_them_and_nothing_is_sent fails (the order goes out).
        "approvals made on an earlier definition still count (the tally compares a decision's "
        "definition with itself)",
        (
            (
                "core/approvals.py",
                "if on_call(decision, definition):",
                "if on_call(decision, decision.definition):",
            ),
        ),
    ),
    Planted(
        # budgets: a spent token budget is judged on the input tokens alone (a wrong field), so
        # a plan whose model call crossed the budget with its output still runs its actions,
        # WRITEs included, where nothing further may be acted on. Unit test:
        # test_loop_stops_and_budgets.py's the_call_that_crosses_the_token_budget fails.
        "the token budget judged spent on input tokens only (a wrong field)",
        (
            (
                "core/budgets.py",
                "if budget.tokens is not None and state.usage.tokens > budget.tokens:",
                "if budget.tokens is not None and state.usage.input_tokens > budget.tokens:",
            ),
        ),
    ),
    Planted(
        # unapproved (an edit never lowers a rule): a planned action saves its tool's rule only
        # when it asks more than one approval (``required == 1`` tested for "the plain rule"),
        # so a one-approval rule with groups, notCreator or an expiry is saved as plain, and a
        # manifest edit that loosens the tool's rule loosens it for calls already planned.
        # No unit test fails (test_approval_rules, test_spec_edits, test_loop_approvals and
        # test_crash_approvals pass: their loosening edit is from a two-approval rule); a
        # scratch test (one approval from payments, edited to requiresApproval) let a person
        # outside payments approve.
        "a planned action keeps a one-approval rule as plain (its groups, notCreator and "
        "expiry not saved with it)",
        (
            (
                "core/phases.py",
                "return True, None if rule == ApprovalRule() else rule",
                "return True, None if rule.required == 1 else rule",
            ),
        ),
    ),
    Planted(
        # audit: the checkpointer clears the events the gateway left pending before it takes
        # them into the checkpoint's outbox (two lines in the wrong order), so what the gateway
        # emits (a READ's start, a confirmer's settlement, a late result) never reaches the
        # chain. Unit test: test_audit_trail.py's an_edited_spec_is_recorded_on_the_chain fails.
        "the gateway's pending events cleared before the checkpoint takes them (two lines swapped)",
        (
            (
                "core/persistence.py",
                "        outbox = (*state.outbox, *self.pending, *drafts)\n"
                "        self.pending.clear()\n",
                "        self.pending.clear()\n"
                "        outbox = (*state.outbox, *self.pending, *drafts)\n",
            ),
        ),
    ),
    Planted(
        # twice: a claim lands while the run's checkpoint is at or past the one its action was
        # planned from (``>=`` for ``=``), so a process held up before its claim while another
        # drove the run on (its call refused and dropped, the run moved on) still claims and
        # sends the WRITE. Unit test: test_stale_processes.py's
        # a_process_held_up_before_its_claim_never_sends_once_the_run_moved_on fails.
        "a claim lands after the run's checkpoint moved on (>= for = in the claim's condition)",
        (
            (
                "stores/_sql.py",
                "WHERE tenant = ? AND run = ? AND seq = ?)) AND {ownership.run_fence} ",
                "WHERE tenant = ? AND run = ? AND seq >= ?)) AND {ownership.run_fence} ",
            ),
        ),
    ),
    Planted(
        # twice / not knowing: the monitor drives its latest tick again only when it stopped
        # to wait for a person, forgetting the tick that never reached a stop (its process
        # died mid-call): a fresh tick starts instead, plans the same WRITE under new keys and
        # sends it, while the first tick's outcome is unknown. No unit test fails
        # (test_runner, test_monitor pass: their unfinished tick stopped with outcome_unknown);
        # a scratch test (a crash after the tick's call) saw tick 2 started.
        "a monitor tick that died without a stop is left behind and a fresh one started",
        (
            (
                "runners/local.py",
                "if stop is None or stop.reason in _WAITING:",
                "if stop is not None and stop.reason in _WAITING:",
            ),
        ),
    ),
    Planted(
        # not knowing: the HTTP confirmer coerces its answer to a boolean, so an answer that
        # says nothing of ``executed`` (a missing field, null) settles the call as not executed
        # (abandoned) instead of leaving it to a person. Unit test: test_confirmer_http.py's
        # anything_but_a_definite_answer_leaves_it_for_a_person fails.
        "the HTTP confirmer reads an answer without executed as not executed (bool() of it)",
        (
            (
                "adapters/confirmers.py",
                "return executed if isinstance(executed, bool) else None",
                "return bool(executed)",
            ),
        ),
    ),
    Planted(
        # unapproved (rounds): the Approval reconciler treats an object as superseded only two
        # rounds back (an off-by-one), so the previous round's Approval is read as the current
        # one: its entries, expired approvals and approvals added after the action was asked
        # afresh, are recorded into the new round and count there. Unit test:
        # test_controller_approvals.py's asked-afresh tests fail (the old object is written on
        # every look); a scratch test (carol on the round-1 object after round 2 was asked,
        # dave on round 2) saw the order go out.
        "the previous round's Approval recorded into the current round (an off-by-one in the "
        "superseded test)",
        (("kube/controller/approvals.py", "if here < asked:", "if here < asked - 1:"),),
        mode="operator",
    ),
    Planted(
        # denies: the finalizer judges an unrecorded deny only while the run asks about the
        # action (its test turned), so an Approval deleted while the run is between stops goes
        # with a deny nobody recorded, and a later approval on a fresh Approval runs the call.
        # Unit test: test_approval_finalizer.py's a_deny_waits_in_a_deleted_approval fails.
        "a deleted Approval released with an unrecorded deny while its run is between stops "
        "(the finalizer's test turned)",
        (
            (
                "kube/controller/approval_finalizer.py",
                "or asked_now(state, action) is not None",
                "or asked_now(state, action) is None",
            ),
        ),
        mode="operator",
    ),
)
