"""A seventh set of single bugs the simulator was not built around (issue 48, item 4: the share
of bugs that break a promise found within 120 s).

Why it exists: each earlier set was measured and the simulator extended after it, so the share
only says something about bugs nobody had in mind while a fresh set keeps coming from someone
who has not read the simulator, its world, its checkers or its docs (nor the other sets beyond
their format, their one-line names and the files they planted into). These ten were written
from the product code, its ADR and its other docs alone, on ground the earlier sets left alone:
the store's run ownership (the epoch a take moves on, the epoch fence on a key's end), the cut
of an exchange at its moment (``core/cutoff.py``), the fence's refusals (of a call the gateway
has finished with, of a request with no call in reach), the MCP tool's definition and its
deadline check, the reading of a model reply's usage (``core/model.py``), the spelling an
idempotency key is hashed from (``core/types.py``, a function no set planted into), and the
rule the runner builds an MCP tool with (``runners/build.py``). Each is one honest
mistake a developer could make in one place: a term dropped, a wrong field, a case forgotten,
a condition left out, the wrong one of two neighbouring events.

Each is planted into a copy of the package, never into the tree (``planted_bugs.planted``);
every replacement's old text occurs exactly once in its file (``test_unseen_bug_sets.py``). The
comment above each says which promise it breaks and how, and whether a unit test of the suite
fails with it planted (checked by planting it into a copy and running the nearest unit test
files against the copy, without the simulator); ``mode`` is where it can first be met as far
as the product code says.
"""

from __future__ import annotations

from support.planted_bugs import Planted

UNSEEN_G: tuple[Planted, ...] = (
    Planted(
        # stale epoch: a take of a run whose lease lapsed hands it to the new holder under the
        # epoch it already had (the ``+ 1`` of the take's upsert dropped), so the old holder,
        # thawed after its pause, still carries the run's epoch: its checkpoints, claims and
        # completions pass every fence, two drivers write the run at once, and a key it left
        # in flight never reads unknown to the new holder for its epoch.
        # Unit test: test_store_contract.py's
        # a_run_has_one_holder_under_a_lease_and_each_take_is_a_new_epoch and other ownership
        # checks fail on every backend, and test_run_ownership.py's
        # test_a_holder_that_dies_at_any_window_never_gets_a_step_sent_twice (after_take,
        # after_claim) and others.
        "a run taken over keeps its epoch (the take's + 1 dropped)",
        (
            (
                "stores/_sql.py",
                '"epoch = keelgate_owners.epoch + 1, expires = excluded.expires "',
                '"epoch = keelgate_owners.epoch, expires = excluded.expires "',
            ),
        ),
    ),
    Planted(
        # stale epoch: ``complete`` and ``release`` are written without the key's epoch fence
        # (the condition left out of their shared WHERE), so a holder that lost the run and
        # thaws with its call's answer records it on a key the new holder read as an unknown
        # outcome and stopped on: the old holder's write lands under an epoch the run no longer
        # has, and the key a person was asked to settle changes under them.
        # Unit test: test_store_contract.py's
        # a_holder_whose_lease_lapsed_is_refused_at_its_next_write fails on every backend.
        "a call's end recorded under an epoch its run no longer has (the key fence left out "
        "of complete and release)",
        (
            (
                "stores/_sql.py",
                "AND state = 'in_flight' AND {d.mine} \"\n"
                '            f"AND {ownership.key_fence}"\n',
                "AND state = 'in_flight' AND {d.mine} \"\n",
            ),
        ),
    ),
    Planted(
        # twice / after "not executed": ``about_to_send`` lets a request through with no call
        # in reach when it has a key but its tool's class is not said to change things (the
        # refusal's ``or`` turned to ``and``), which is every Python tool's report: a WRITE's
        # request made on a thread the tool started without ``keelgate.fenced`` is sent with no
        # deadline checked and no send recorded, so a process held up past its deadline sends
        # after a truthful "not executed", and an error the tool raises after it reads as
        # "nothing happened": the key is dropped and the WRITE claimed and sent again.
        # Unit test: none fails (test_composite_tools.py, test_write_deadlines.py and
        # test_approval_rules.py pass); in a scratch run against the copy, ``about_to_send``
        # with a key and no call in reach returned instead of refusing.
        "a Python tool's request on an unfenced thread is let through (or for and in the "
        "no-call refusal)",
        (
            (
                "core/fence.py",
                "if call is None and (changes_things or idempotency_key is not None):",
                "if call is None and changes_things and idempotency_key is not None:",
            ),
        ),
    ),
    Planted(
        # after "not executed": the cut of an exchange takes the connections of Unix sockets
        # and TLS only (``connect_tcp`` forgotten from the trace events it watches), so a plain
        # HTTP request whose server holds it open (headers or body a byte at a time) is never
        # shut at the write deadline: it stays open past the store's deadline, a person
        # truthfully settles the call "not executed" by then, and the server acts on it after.
        # Unit test: test_cut_exchanges.py's
        # test_an_http_write_whose_answer_trickles_is_cut_at_its_deadline_and_stops_unknown
        # and six more fail (each hangs until pytest's time limit).
        "an exchange over plain TCP is not cut at its moment (connect_tcp forgotten)",
        (
            (
                "core/cutoff.py",
                '_CONNECTED = ("connect_tcp.complete", "connect_unix_socket.complete", '
                '"start_tls.complete")',
                '_CONNECTED = ("connect_unix_socket.complete", "start_tls.complete")',
            ),
        ),
    ),
    Planted(
        # twice: a request of a call the gateway has already finished with is no longer
        # refused (the ended test dropped from ``Invocation.sending``): a thread a tool left
        # running sends after the gateway judged the call as having sent nothing, dropped its
        # key and let the run claim and send it afresh, so the WRITE reaches the downstream
        # twice (and a request sent after the outcome was taken is recorded nowhere).
        # Unit test: test_composite_tools.py's
        # test_a_thread_left_running_after_its_call_was_refused_sends_nothing fails.
        "a request of a call the gateway has ended is still sent (the ended test dropped)",
        (
            (
                "core/fence.py",
                "            if self._ended:\n"
                "                raise CallEnded(self.key)\n"
                "            self.deadline.check()\n",
                "            self.deadline.check()\n",
            ),
        ),
    ),
    Planted(
        # unapproved (wrong approvals): the MCP tool's definition leaves out the remote tool it
        # calls (a field forgotten), so an edit that points the manifest's tool at another tool
        # of the same server after people approved the call voids nothing: the WRITE runs a
        # tool nobody approved, on the approvals given for the other one.
        # Unit test: none fails (test_mcp_tool.py, test_approval_calls.py, test_manifest.py and
        # test_provider_openai.py pass); in a scratch run against the copy, two MCP tools that
        # differ only in their remote tool had one fingerprint.
        "an MCP tool pointed at another remote tool keeps its approvals (mcp.tool left out "
        "of the definition)",
        (("adapters/tools/mcp.py", '            "mcp.tool": self.remote_name,\n', ""),),
    ),
    Planted(
        # after "not executed": the MCP tool checks the write deadline (and records the send)
        # once the tools/call request's body has gone, not before its headers are written (the
        # wrong one of httpcore's trace events): a process held up past its deadline sends the
        # whole request, and only then is told the deadline passed and reports "nothing was
        # sent"; the call takes effect after a truthful "not executed", and its refusal is
        # believed (no send recorded), so the key is dropped and the call claimed again.
        # Unit test: test_composite_tools.py's
        # test_an_mcp_write_checks_its_deadline_when_its_request_is_sent_not_before fails.
        "the MCP tool checks the write deadline after its request's body has gone (the wrong "
        "trace event)",
        (
            (
                "adapters/tools/mcp.py",
                'if not event.endswith(".send_request_headers.started"):',
                'if not event.endswith(".send_request_body.complete"):',
            ),
        ),
    ),
    Planted(
        # budget: a model reply in the dict form (the ``python`` and ``scripted`` providers)
        # has its output tokens read under the snake-case name, never present (a wrong field),
        # so every reply is charged its input only: the token and dollar budgets are judged on
        # a usage that leaves out every output token, and a run spends past its budget with
        # every pre-call check passing.
        # Unit test: test_loop_stops_and_budgets.py's
        # test_the_call_that_crosses_the_token_budget_is_kept_and_its_plan_runs_after_a_raise,
        # its dollar twin and two more fail.
        "a dict reply's output tokens read under a name it never has (outputTokens as "
        "output_tokens)",
        (
            (
                "core/model.py",
                'output_tokens=int(usage_data.get("outputTokens", 0)),',
                'output_tokens=int(usage_data.get("output_tokens", 0)),',
            ),
        ),
    ),
    Planted(
        # twice: a WRITE's idempotency key is hashed from ``json.dumps`` of its call, not from
        # the one canonical spelling (sorted keys), so the key follows the order the model
        # happened to give the arguments in: the same call planned again with them in another
        # order (a later iteration, after a verifier's rejection say) gets another key, the
        # gateway finds no record of it, claims it afresh and the WRITE runs a second time.
        # Unit test: none fails (test_loop_approvals.py, test_loop_settlements.py,
        # test_spec_edits.py, test_runner.py, test_approval_calls.py, test_stale_processes.py,
        # test_audit_trail.py and test_composite_tools.py pass): each derives its keys through
        # the same function; in a scratch run against the copy, one call's key with its two
        # arguments in either order differed.
        "the same call's key changes with the order of its arguments (json.dumps for the "
        "canonical spelling)",
        (
            (
                "core/types.py",
                "digest = hashlib.sha256(canonical_json([tenant, run, tool, args]).encode())",
                "digest = hashlib.sha256(json.dumps([tenant, run, tool, args]).encode())",
            ),
        ),
    ),
    Planted(
        # unapproved (fewer approvals): the runner builds an MCP tool without the manifest's
        # approval rule (the ``approval`` entry forgotten from the arguments it passes on, while
        # ``requires_approval`` is kept), so every MCP tool under a rule is held to the default
        # one: "2 approvals from payments, not the creator, within an hour" is met by any one
        # person's approval, the creator's and an expired one included, and the WRITE runs.
        # Unit test: none fails (test_mcp_tool.py, test_manifest.py, test_approval_rules.py
        # and test_approval_calls.py pass); a scratch build of a manifest's MCP tool with
        # ``approval: {required: 2, groups: [payments]}`` showed it held to one approval by
        # anyone (``rule_of`` gave the default rule).
        "an MCP tool held to one approval by anyone (the manifest's rule not passed to it)",
        (("runners/build.py", '        "approval": tool.approval_rule(),\n', ""),),
    ),
)
