"""A fifth set of single bugs the simulator was not built around (issue 48, item 4: the share of
bugs that break a promise found within 120 s).

Why it exists: sets A to D were measured and the simulator extended after each; a set written
after that work, by someone who had not read the simulator, its world or its checkers (nor the
other sets beyond their format and one-line names), says whether the share holds for bugs nobody
had in mind. These ten were written from the product code alone (not the simulator, its docs or
its tests) and spread over its floors: the gateway's confirmer (``core/gateway.py``), the price
(``core/spec.py``), the verifier's limit and the act phase's budget check (``core/phases.py``),
the SQL stores' reading of a key's owner (``stores/_sql.py``), the MCP tool's cutoff, the
Anthropic adapter's usage, a step pod's entrypoint (``runners/step.py``), and the operator's
AgentRun and Approval reconcilers. Each is one honest mistake a developer could make in one
place: a comparison turned, a wrong field, a case forgotten, a term dropped, min for max, and
for or.

Each is planted into a copy of the package, never into the tree (``planted_bugs.planted``);
every replacement's old text occurs exactly once in its file. The comment above each says which
promise it breaks and how, and whether a unit test of the suite fails with it planted (checked
by planting it into a copy and running that test against the copy, without the simulator);
``mode`` is where it can first be met as far as the product code says.
"""

from __future__ import annotations

from support.planted_bugs import Planted

UNSEEN_E: tuple[Planted, ...] = (
    Planted(
        # settled by the wrong party: a call made under an earlier definition of its tool is
        # left for a person only when the parts that changed are the confirmer's own (``in``
        # for ``not in`` CONFIRMER_PARTS), so after a manifest edit of its URL or method the
        # confirmer in force now, which asks another system than the one the call went to,
        # settles it: its "not found" abandons a WRITE that ran, which the model may then plan
        # again (a WRITE run twice).
        # Unit test: test_stale_processes.py's
        # a_confirmers_decision_reaches_the_chain_when_its_writer_died_and_the_call_ends_late
        # fails, but on the other half of the inversion (a confirmer added since is no longer
        # asked); no unit test covers the half that breaks the promise: a scratch test (a
        # Python tool's reference edited after its call read unknown, a confirmer saying "not
        # executed" once the deadline passed) saw the call abandoned and the run end Succeeded.
        "a call made under an earlier definition settled by today's confirmer (the parts "
        "that leave it to a person tested with in for not in)",
        (
            (
                "core/gateway.py",
                "changed = [p for p in self._rebound(action) or () if p not in CONFIRMER_PARTS]",
                "changed = [p for p in self._rebound(action) or () if p in CONFIRMER_PARTS]",
            ),
        ),
    ),
    Planted(
        # dollar budget: a reply's output tokens are charged at the input price (the wrong
        # field of the price), so with output dearer than input, as every provider prices it,
        # a run spends past its dollar budget before the budget reads spent, and acts on plans
        # it should not have made.
        # Unit test: test_loop_stops_and_budgets.py's
        # the_call_that_crosses_the_dollar_budget_is_kept_and_its_plan_runs_after_a_raise fails.
        "output tokens charged at the input price (a wrong field of the price)",
        (
            (
                "core/spec.py",
                "+ self.output_per_million * usage.output_tokens",
                "+ self.input_per_million * usage.output_tokens",
            ),
        ),
    ),
    Planted(
        # iteration limit: the verifier's limit on rejections stops the run only once it is
        # passed (``>`` for ``>=``), so a run allowed N rejections plans and acts (WRITEs
        # included) an iteration after its Nth.
        # Unit test: test_loop_stops_and_budgets.py's
        # the_verifier_rejection_limit_stops_for_good_until_it_is_raised fails.
        "the verifier's rejection limit lets one iteration more through (> for >=)",
        (
            (
                "core/phases.py",
                "if limit is not None and rejections >= limit:",
                "if limit is not None and rejections > limit:",
            ),
        ),
    ),
    Planted(
        # budgets: the act phase asks whether a budget is spent only for an action whose call
        # is on record (``is not None`` for ``is None``), so a plan whose model call crossed
        # the token or dollar budget still runs its fresh actions, WRITEs included, where
        # nothing further may be acted on.
        # Unit test: test_loop_stops_and_budgets.py's
        # the_call_that_crosses_the_token_budget_is_kept_and_its_plan_runs_after_a_raise fails
        # (the order is placed).
        "a spent budget holds back only the actions already called (the test turned)",
        (
            (
                "core/phases.py",
                "if prior is None:\n            spent = self.budgets.spent(state)",
                "if prior is not None:\n            spent = self.budgets.spent(state)",
            ),
        ),
    ),
    Planted(
        # outcome unknown: an in-flight key reads unknown only when its epoch is stale AND its
        # owner is gone (``and`` for ``or``), so a key whose owner died mid-call reads as in
        # flight for ever: every resume is busy, no OutcomeUnknown stop is recorded and no
        # person is asked, and a settlement is refused as "still in flight" (a run left
        # waiting for ever).
        # Unit test: test_store_contract.py's
        # closing_the_owner_makes_its_in_flight_keys_unknown fails.
        "a key whose owner died reads in flight unless its epoch is stale too (and for or)",
        (
            (
                "stores/_sql.py",
                "if stale or not self._alive(owner, judged):",
                "if stale and not self._alive(owner, judged):",
            ),
        ),
    ),
    Planted(
        # after not executed: the MCP tool cuts its exchange at its own time limit only, not at
        # the call's write deadline (``at_most`` dropped), so a process held up between its
        # claim and its request sends in time and keeps the exchange open past the store's
        # deadline, after which a person's truthful "not executed" is accepted while the
        # server may still act on it.
        # No unit test fails (test_cut_exchanges.py's MCP test, whose
        # call's deadline is the MCP tool's own limit, test_mcp_tool.py and
        # test_composite_tools.py pass); a scratch test (a Python tool with a 2 s limit calling
        # the MCP tool, limit 30 s, on its thread through keelgate.fenced, the answer trickling)
        # saw the request still open well past the call's deadline, where the HTTP tool's is
        # cut there (test_cut_exchanges.py's composite test).
        "an MCP exchange cut at its time limit only, not at the write deadline (at_most dropped)",
        (
            (
                "adapters/tools/mcp.py",
                "self.timeout_seconds, at_most=None if call is None else call.deadline.at",
                "self.timeout_seconds, at_most=None",
            ),
        ),
    ),
    Planted(
        # token budget: the Anthropic adapter counts a reply's input tokens without the cached
        # ones (cache writes and reads forgotten), so a run whose prompt is cached, as a long
        # loop's is, spends past its token budget before the budget reads spent.
        # Unit test: test_provider_anthropic.py's
        # tool_use_blocks_become_planned_actions_with_usage fails.
        "the Anthropic adapter's usage leaves out cached input tokens (a case forgotten)",
        (
            (
                "adapters/models/anthropic.py",
                "input_tokens=int(usage.input_tokens or 0) + int(cached),",
                "input_tokens=int(usage.input_tokens or 0),",
            ),
        ),
    ),
    Planted(
        # a run left waiting for ever: a step pod takes every run that is not Running as ended
        # (the phase test turned), so once a person settles an unknown outcome or approves a
        # WRITE, the next step pod finds the run Stopped, does nothing and exits with the old
        # stop: the run never goes on.
        # Unit test: test_controller_decisions.py's
        # not_executed_before_the_deadline_is_held_shown_and_recorded_once_it_has_passed fails
        # (the settled run still asks for a step pod after 10 steps); test_step.py and
        # test_step_start.py pass.
        "a step pod takes a stopped run for an ended one (the phase test turned)",
        (
            (
                "runners/step.py",
                "if outcome.phase is RunPhase.SUCCEEDED:",
                "if outcome.phase is not RunPhase.RUNNING:",
            ),
        ),
        mode="operator",
    ),
    Planted(
        # a run left waiting for ever: the AgentRun reconciler starts a step pod while approvals
        # are still pending and rests once none are (the test turned), so an approved WRITE's
        # run is never woken to send it.
        # Unit test: test_controller_agentrun.py's
        # a_pending_approval_stops_the_run_and_asks_for_an_approval fails (a step pod after
        # another while the approval is pending).
        "an approved run left at rest and a pending one stepped (the pending test turned)",
        (
            (
                "kube/controller/agentrun.py",
                "            if not state.pending:\n                return STEP\n",
                "            if state.pending:\n                return STEP\n",
            ),
        ),
        mode="operator",
    ),
    Planted(
        # unapproved (expiry): an Approval's entry the operator meets late (it was down or
        # behind) counts from the later of when it was seen and the object's last write (max
        # for min), so an approval made longer ago than the rule's expiresAfter, recorded
        # after an operator outage, counts as fresh and lets the WRITE run on an approval
        # the rule no longer accepts.
        # Unit test: test_approval_identity.py's
        # an_entry_seen_late_counts_from_the_objects_last_write_not_from_when_seen fails.
        "an Approval's entry met late counts from when the operator saw it, not from the "
        "object's last write (max for min)",
        (
            (
                "kube/controller/approval_sightings.py",
                "seen = min(seen, written)",
                "seen = max(seen, written)",
            ),
        ),
        mode="operator",
    ),
)
