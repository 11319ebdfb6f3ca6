"""A sixth set of single bugs the simulator was not built around (issue 48, item 4: the share of
bugs that break a promise found within 120 s).

Why it exists: each earlier set was measured and the simulator extended after it, so the share
only says something about bugs nobody had in mind while a fresh set keeps coming from someone
who has not read the simulator, its world, its checkers or its docs (nor the other sets beyond
their format, their one-line names and the files they planted into). These ten were written
from the product code, its ADR and its other docs alone, favouring places the earlier sets left
alone: the rule two rules combine to (``core/types.py``), the approval gate's look at a call on
record and the judge's case of a creator not on record (``core/approvals.py``), the pre-call
token check (``core/budgets.py``), the verify phase's charge (``core/phases.py``), the resume
gate of the verifier's limit (``core/state.py``), the manifest's approval rule
(``manifest/agentrun.py``), the Python tool's time limit, the HTTP confirmer's question, and
the Reconciliation reconciler's reading of the store. Each is one honest mistake a developer
could make in one place: a comparison turned, a wrong field, a case forgotten, a term dropped,
min for max.

Each is planted into a copy of the package, never into the tree (``planted_bugs.planted``);
every replacement's old text occurs exactly once in its file (``test_unseen_bug_sets.py``). The
comment above each says which promise it breaks and how, and whether a unit test of the suite
fails with it planted (checked by planting it into a copy and running the nearest unit test
files against the copy, without the simulator; where none fails, a scratch test against the
copy showed the break); ``mode`` is where it can first be met as far as the product code says.
"""

from __future__ import annotations

from support.planted_bugs import Planted

UNSEEN_F: tuple[Planted, ...] = (
    Planted(
        # unapproved: the rule a saved action was planned under and the tool's rule now are
        # combined to the lower count (``min`` for ``max``), so a WRITE planned under "2
        # approvals" whose manifest was edited to ``requiresApproval: true`` runs on one, and
        # one whose rule was raised from 1 to 3 runs on one: fewer approvals than the rule it
        # must meet asks.
        # Unit test: test_approval_rules.py's
        # the_rule_travels_with_the_saved_action_and_an_edit_only_adds (the order placed on
        # one approval) and rules_combine_to_the_stricter_of_both fail.
        "two rules combined keep the lower count of approvals (min for max)",
        (
            (
                "core/types.py",
                "required=max(self.required, other.required),",
                "required=min(self.required, other.required),",
            ),
        ),
    ),
    Planted(
        # unapproved: the approval gate takes a WRITE whose key is not on record for one whose
        # call was already made (the test of ``_begun`` turned), and lets it through to the
        # gateway to be settled there: every fresh WRITE under an approval rule runs without
        # anyone approving it (and one already called is put to people instead).
        # Unit test: test_loop_approvals.py's an_approved_write_runs_exactly_once fails (the
        # run meets its goal with the order placed, never awaiting approval), and twelve more.
        "a fresh WRITE taken for one already called, so the gate lets it through unasked "
        "(the on-record test turned)",
        (
            (
                "core/approvals.py",
                "        return record is not None\n",
                "        return record is None\n",
            ),
        ),
    ),
    Planted(
        # unapproved (notCreator): the judge forgets the case of a run whose creator is not on
        # record (no keelgate.dev/created-by), where no approval can count under notCreator
        # since nobody can tell who the creator is; with it gone the creator is "" and nobody
        # equals it, so everyone's approval counts, the unknown creator's own included, and the
        # WRITE runs approved by the person the rule excludes.
        # Unit test: test_approval_rules.py's not_creator_with_no_creator_on_record_counts_nobody
        # fails.
        "notCreator with no creator on record counts everyone's approval (the case forgotten)",
        (
            (
                "core/approvals.py",
                "    if approved and rule.not_creator and not creator:\n"
                "        return (\n"
                "            \"its rule says not the run's creator, and the run's creator is "
                'not on record "\n'
                '            "(annotation keelgate.dev/created-by): no approval can count; '
                'deny it, or "\n'
                '            "recreate the run with its creator recorded"\n'
                "        )\n",
                "",
            ),
        ),
    ),
    Planted(
        # token budget: the check before a model call weighs the call's estimated input alone
        # against the whole budget, forgetting the tokens already used (a term dropped), so a
        # run near its budget makes a call whose input alone passes it (the ADR's pre-call
        # check) and spends past its token budget by a whole call, not only by its output.
        # Unit test: none fails (test_loop_stops_and_budgets.py's and test_cli.py's refused
        # call is the run's first, with nothing used yet). A scratch test (950 of 1000 tokens
        # used, the next plan's input ~124 tokens) saw that plan call made and the run stop at
        # 1270 of 1000, where the tree refuses it at 950. (A grep of docs/ for the ADR's words
        # showed two lines of docs/simulation.md on this check after this bug was chosen;
        # nothing else of the simulator was seen.)
        "the token look-ahead forgets the tokens already used (a term dropped)",
        (
            (
                "core/budgets.py",
                "if budget.tokens is not None and state.usage.tokens + estimate > budget.tokens:",
                "if budget.tokens is not None and estimate > budget.tokens:",
            ),
        ),
    ),
    Planted(
        # dollar budget: the verify phase adds its reply's usage unpriced (the charge forgotten:
        # tokens counted, no dollars), so every verifier call costs $0 on the books and a run
        # plans and acts, WRITEs included, on dollars it no longer has.
        # Unit test: none fails (the suite's verify replies carry no usage;
        # test_loop_stops_and_budgets.py and the dollar tests of test_cli.py, test_runner.py and
        # test_manifest.py pass). A scratch test (verify calls at $0.30, plans at $0.10-$0.15,
        # a $0.50 budget) saw the order placed at a true spend of $0.55 (booked $0.25) and the
        # run end at $1.25 booked as $0.35, where the tree holds the order back with
        # dollar_budget.
        "a verifier's reply added to the usage unpriced (the charge forgotten)",
        (
            (
                "core/phases.py",
                "usage = state.usage.plus(self.budgets.charge(reply.usage))",
                "usage = state.usage.plus(reply.usage)",
            ),
        ),
    ),
    Planted(
        # verifier rejections: a run stopped at its verifier limit counts as going on under a
        # budget whose limit equals its rejections (``<=`` for ``<``), so ``keelgate resume``
        # with the limit unchanged (or, in a cluster, any edit of the spec) plans and acts
        # another iteration, WRITEs included, past the limit it stopped at.
        # Unit test: test_loop_stops_and_budgets.py's
        # the_verifier_rejection_limit_stops_for_good_until_it_is_raised fails (resumed at the
        # same limit, the run goes on to iteration 4 and succeeds).
        "a run stopped at its verifier limit resumes without a raise (<= for <)",
        (("core/state.py", "self.rejections < limit", "self.rejections <= limit"),),
    ),
    Planted(
        # unapproved (groups): the manifest builds a tool's approval rule without its
        # ``groups`` (a field forgotten), so anyone who may decide approves a WRITE the
        # manifest reserved to people of the groups it names (``keelgate run -f`` and the
        # operator alike).
        # Unit test: test_controller_approvals.py's
        # two_people_from_the_group_approve_and_the_write_runs_once fails, on the rule its
        # Approval shows ("2 approvals, not the run's creator"), and one more;
        # test_manifest.py and test_approval_rules.py pass (their rules are built in Python).
        "a manifest's approval groups left out of the rule it builds (a field forgotten)",
        (("manifest/agentrun.py", "            groups=tuple(self.groups),\n", ""),),
    ),
    Planted(
        # unknown outcome retried (a WRITE run twice): a Python tool whose function outlives
        # its time limit raises a definite failure (``ToolError`` for ``OutcomeUncertain``,
        # without the call still running), so for a function that reports no send of its own
        # the gateway reads "nothing happened": the key is dropped, the run goes on, and the
        # model's next plan of the same call claims it afresh and runs the function again
        # while (or after) the first one completes.
        # Unit test: test_timed_out_write.py's
        # a_write_still_running_after_its_timeout_cannot_be_settled_and_runs_once fails (the
        # run meets its goal instead of stopping outcome_unknown), and six more.
        "a Python tool's timeout read as a definite failure (ToolError for OutcomeUncertain)",
        (
            (
                "adapters/tools/python.py",
                "from keelgate.errors import OutcomeUncertain\n",
                "from keelgate.errors import OutcomeUncertain, ToolError\n",
            ),
            (
                "adapters/tools/python.py",
                "            raise OutcomeUncertain(\n"
                '                f"{self.name} did not return within {within}", '
                "still_running=call\n"
                "            )\n",
                '            raise ToolError(f"{self.name} did not return within {within}")\n',
            ),
        ),
    ),
    Planted(
        # a decision applied to another call: the HTTP confirmer fills ``{idempotencyKey}``
        # with the action's id (a wrong field), so the system of record is asked about a key
        # it never saw and answers executed: false; once the deadline has passed, a WRITE that
        # ran is settled as not executed (source confirmer), the run goes on as if it never
        # ran, and a model that plans it again with any argument changed places it twice.
        # Unit test: test_confirmer_http.py's
        # a_definite_answer_settles_and_the_arguments_are_never_sent fails (the URL asked).
        "the HTTP confirmer asks about the action's id instead of its key (a wrong field)",
        (
            (
                "adapters/confirmers.py",
                '"idempotencyKey": action.idempotency_key,',
                '"idempotencyKey": action.action,',
            ),
        ),
    ),
    Planted(
        # a decision lost: the Reconciliation reconciler reads only an in-flight key as
        # undecided (the case OUTCOME_UNKNOWN forgotten), so an unknown outcome reads as
        # settled: its Reconciliation is shown Settled, "abandoned" by nobody, as soon as it is
        # made, the person's decision patched into it is never recorded, and the run waits on
        # its unknown outcome for ever.
        # Unit test: test_controller_decisions.py's
        # a_person_settles_an_unknown_outcome_and_the_run_goes_on fails (the key stays
        # outcome_unknown), and seven more.
        "an unknown outcome read as settled by the Reconciliation reconciler (its undecided "
        "states without OUTCOME_UNKNOWN)",
        (
            (
                "kube/controller/reconciliations.py",
                "if record is None or record.state not in "
                "(KeyState.COMPLETED, KeyState.ABANDONED):",
                "if record is None or record.state is KeyState.IN_FLIGHT:",
            ),
        ),
        mode="operator",
    ),
)
