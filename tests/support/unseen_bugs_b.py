"""A second set of single bugs the simulator was not built around, to measure it honestly
(issue 48, item 4: the share of bugs that break a promise found within 120 s).

Why it exists: a simulator tuned on its own planted bugs finds those and says little about the
next mistake. These ten were written from the product code and the contract alone (ADR-0004,
docs/ outside docs/simulation.md, operator/keelgate outside testing/), by someone who had not
read the simulator, its checkers or its earlier bug lists. Each is one mistake a person could
plausibly make in one place (a sign, a bound, a case forgotten, a check moved, a constant
mistyped), in the code that keeps Keelgate's promises: a WRITE never runs twice, never runs
unapproved, never after a truthful "not executed"; an unknown outcome stops the run; the audit
chain records what happened. They are spread over the core's approvals, gateway and fence, the
phases, the SQL store, the local runner and the HTTP and MCP tools, so the measurement also says
which parts the simulator never reaches.

Each bug is planted into a copy of the package, never into the tree (``planted_bugs.planted``);
every replacement's old text occurs exactly once in its file. ``name`` says which promise the
bug breaks and how. ``mode`` and ``store`` are where it can first be met, as far as the product
code says; the simulator may need more than it has today to meet some (the HTTP and MCP tools,
monitor ticks, approval rules with groups, expiry or ServiceAccounts: issue 48, item 3), and a
bug it cannot meet counts as not found.
"""

from __future__ import annotations

from support.planted_bugs import Planted

# The gateway's two questions about a tool's ToolError, in the order the product asks them.
_SENT_FIRST = (
    "            if call.end():\n"
    "                # Something of the call may have left before this error: it may have run.\n"
    "                self._leave_unknown(tool, action, call, error)\n"
    "                raise UnknownOutcomeStop(self._unknown_action(action)) from None\n"
)
_DEADLINE_SECOND = (
    "            if isinstance(error, fence.DeadlinePassed):\n"
    "                raise  # nothing of the call was sent: the caller claims afresh\n"
)

UNSEEN_B: tuple[Planted, ...] = (
    Planted(
        # unapproved: a sign slip in the age test, so an approval never grows too old and one
        # given long before expiresAfter still lets the WRITE run.
        "an expired approval still counts (the age of an approval computed with its sign flipped)",
        (
            (
                "core/approvals.py",
                "if rule.expires_after is not None and now - seconds(decision.at) > "
                "rule.expires_after:",
                "if rule.expires_after is not None and seconds(decision.at) - now > "
                "rule.expires_after:",
            ),
        ),
    ),
    Planted(
        # unapproved: the user-name prefix of a ServiceAccount mistyped as its group's prefix
        # (system:serviceaccounts:), so a ServiceAccount's yes counts under a rule for people.
        "a ServiceAccount's approval counts as a person's (its user prefix confused with the "
        "ServiceAccounts group's)",
        (
            (
                "core/approvals.py",
                'SERVICE_ACCOUNT = "system:serviceaccount:"',
                'SERVICE_ACCOUNT = "system:serviceaccounts:"',
            ),
        ),
        mode="operator",
    ),
    Planted(
        # unapproved: a decision whose person no groups are known for (the CLI, Python's
        # approve) is let through a rule that names groups, instead of refused.
        "a rule's groups admit a person with no groups known (a shortcut for local decisions)",
        (
            (
                "core/types.py",
                "return all(any(g in groups for g in each) for each in self.group_lists())",
                "return not groups or all(any(g in groups for g in each) for each in "
                "self.group_lists())",
            ),
        ),
    ),
    Planted(
        # twice: the deadline's refusal is read before asking whether an earlier request of the
        # same call was sent, so a composite call whose second request meets the deadline is
        # claimed afresh and sent again, its first request taking effect twice.
        "a composite call whose later request meets its deadline is sent again (the deadline "
        "check moved before the 'anything sent?' check)",
        (
            (
                "core/gateway.py",
                _SENT_FIRST + _DEADLINE_SECOND,
                _DEADLINE_SECOND + _SENT_FIRST,
            ),
        ),
    ),
    Planted(
        # twice: one refused request resets the call's count of requests sent instead of taking
        # back its own, so a composite call whose first request took effect and whose second
        # was refused reads as "nothing happened"; its key is dropped and the call made again.
        "a refused request of a composite call wipes out the requests sent before it (the "
        "send count reset, not decremented)",
        (("core/fence.py", "self._sends -= 1", "self._sends = 0"),),
    ),
    Planted(
        # after not executed: the settlement's deadline test compares the wrong way, so a
        # person's "not executed" is taken while a held-up owner may still send the call (and
        # refused once it no longer can).
        "a settlement 'not executed' accepted before the key's deadline (the store's "
        "comparison flipped)",
        (("stores/_sql.py", "OR deadline <= {clock})", "OR deadline >= {clock})"),),
    ),
    Planted(
        # twice / unknown stops: a monitor tick stopped on an unknown outcome is no longer
        # driven again; a new tick starts under a new run name, so new keys, and the WRITE
        # whose outcome nobody knows is placed again.
        "a monitor starts its next tick past one stopped on an unknown outcome (the case "
        "forgotten in the runner's waiting stops)",
        (
            (
                "runners/local.py",
                "_WAITING = frozenset({StopReason.OUTCOME_UNKNOWN, StopReason.AWAITING_APPROVAL})",
                "_WAITING = frozenset({StopReason.AWAITING_APPROVAL})",
            ),
        ),
    ),
    Planted(
        # twice / unknown stops: a read timeout (the request sent, the answer late) is taken as
        # proof that nothing reached the server, so an order that went through reads as
        # refused, its key is dropped and the model may place it again.
        "an HTTP read timeout read as 'nothing was sent' (ReadTimeout listed with the connect "
        "failures)",
        (
            (
                "adapters/tools/http.py",
                "    httpx.PoolTimeout,\n",
                "    httpx.PoolTimeout,\n    httpx.ReadTimeout,\n",
            ),
        ),
    ),
    Planted(
        # twice / unknown stops: JSON-RPC's internal error (which a server also returns for an
        # exception raised halfway through the tool) is taken as a refusal of the request, so a
        # WRITE that may have run has its key dropped instead of stopping the run.
        "an MCP internal error (-32603) read as the server refusing the call",
        (
            (
                "adapters/tools/mcp.py",
                "_REFUSED_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, "
                "INVALID_PARAMS})",
                "_REFUSED_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, "
                "INVALID_PARAMS, -32603})",
            ),
        ),
    ),
    Planted(
        # audit: the action's completion event is keyed by its tool, not its id; appending is
        # idempotent by key, so every later call of the same tool in the run leaves no
        # loop.action_completed on the chain.
        "a tool's second completion is missing from the audit chain (the event keyed by tool "
        "name instead of action id)",
        (
            (
                "core/phases.py",
                'key=f"completed:{action.id}",',
                'key=f"completed:{action.tool}",',
            ),
        ),
    ),
)
