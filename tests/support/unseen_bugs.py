"""Single realistic bugs the simulator was not built around (issue 48, item 4), planted one at a
time into a copy of the package, to measure what share of them it finds, and how fast.

Why it exists: a simulator tuned on its own list of bugs (``planted_bugs.BUGS``) is measured on
what it was taught; these were written from the product's code alone, each one mistake a person
could make in one place (a sign, a bound, a field read from the wrong place, a case forgotten),
including the four issue 48 names. ``bench/unseen_bugs.py`` runs the simulator for a while on
each (docs/simulation.md has the table); ``tests/test_simulation.py`` keeps the fastest to find
in the unit suite. As in ``planted_bugs``, a replacement whose text is gone fails loudly: the
product moved, and the bug must be planted again where it now belongs.
"""

from __future__ import annotations

from support.planted_bugs import Planted

UNSEEN: tuple[Planted, ...] = (
    Planted(
        "a key that changes from one iteration to the next",
        (
            (
                "core/phases.py",
                "idempotency_key(state.tenant, state.run, call.tool, call.args),",
                "idempotency_key(state.tenant, f'{state.run}:{iteration}', call.tool, call.args),",
            ),
        ),
    ),
    Planted(
        "a resume that asks the model again after a settlement",
        (
            (
                "core/phases.py",
                "                state.but(stop=None, unknown=(), pending=()),\n"
                "                AuditDraft(\n"
                '                    "loop.resumed",',
                "                state.but(stop=None, unknown=(), pending=())\n"
                "                if state.stop.reason is not StopReason.OUTCOME_UNKNOWN\n"
                "                else state.but(\n"
                "                    stop=None, unknown=(), pending=(), step=Step.PLAN,\n"
                "                    iteration=state.iteration - 1, results=(),\n"
                "                ),\n"
                "                AuditDraft(\n"
                '                    "loop.resumed",',
            ),
        ),
    ),
    Planted(
        "a one-decision approved: false read as an approval",
        (
            (
                "kube/controller/approval_entries.py",
                '                spec["approved"] is True,\n',
                '                spec["approved"] is not None,\n',
            ),
        ),
        mode="operator",
    ),
    Planted(
        "the write deadline checked only before a composite call's first request",
        (
            (
                "core/fence.py",
                "            self.deadline.check()\n            self._sends += 1",
                "            if self._sends == 0:\n"
                "                self.deadline.check()\n"
                "            self._sends += 1",
            ),
        ),
    ),
    Planted(
        "approvals that expire a thousand times later (seconds read as milliseconds)",
        (
            (
                "core/approvals.py",
                "now - seconds(decision.at) > rule.expires_after:",
                "now - seconds(decision.at) > rule.expires_after * 1000:",
            ),
        ),
    ),
    Planted(
        "every decision of the run counted for every action",
        (
            (
                "core/approvals.py",
                "        decisions = state.approvals.get(action.id, ())\n"
                "        # A recorded no stands",
                "        decisions = tuple(d for ds in state.approvals.values() for d in ds)\n"
                "        # A recorded no stands",
            ),
        ),
    ),
    Planted(
        "a saved WRITE's class dropped for the tool's class now (the gateway)",
        (
            (
                "core/gateway.py",
                "        side_effect = stricter(tool.side_effect, action.side_effect)\n"
                "        if side_effect not in self.allowed:\n"
                "            refused = ActionResult(",
                "        side_effect = tool.side_effect\n"
                "        if side_effect not in self.allowed:\n"
                "            refused = ActionResult(",
            ),
        ),
    ),
    Planted(
        "the HTTP tool reads a 5xx as a refusal",
        (
            (
                "adapters/tools/http.py",
                "        if 400 <= response.status_code < 500:",
                "        if 400 <= response.status_code < 600:",
            ),
            (
                "adapters/tools/http.py",
                "        if 400 <= status < 500:",
                "        if 400 <= status < 600:",
            ),
        ),
    ),
    Planted(
        "the HTTP tool reads any timeout as nothing sent",
        (("adapters/tools/http.py", "    httpx.ConnectTimeout,", "    httpx.TimeoutException,"),),
    ),
    Planted(
        "the store's deadline set a margin short of the call's instead of beyond it",
        (
            (
                "core/gateway.py",
                "deadline_in=seconds + fence.MARGIN,",
                "deadline_in=seconds - fence.MARGIN,",
            ),
        ),
    ),
    Planted(
        "the confirmer's 'not executed' believed while a held-up process may still send",
        (
            (
                "core/gateway.py",
                "settlement is not None and not settlement.executed and record.sendable",
                "settlement is not None and not settlement.executed "
                "and record.state is KeyState.IN_FLIGHT",
            ),
        ),
    ),
    Planted(
        "an unknown outcome's key dropped instead of kept for a person",
        (
            (
                "core/gateway.py",
                "        else:\n"
                "            call.end()\n"
                "            self.keys.release(self.tenant, action.key)",
                "        else:\n"
                "            call.end()\n"
                "            self.keys.forget(self.tenant, action.key)",
            ),
        ),
    ),
    Planted(
        "a late refusal forgets the key even when part of the call was sent",
        (
            (
                "core/gateway.py",
                "elif isinstance(error, ToolError) and not sent:",
                "elif isinstance(error, ToolError):",
            ),
        ),
    ),
    Planted(
        "every entry of an Approval attributed to its first author",
        (
            (
                "kube/controller/approval_entries.py",
                '        by = str(item.get("by") or "")',
                '        by = str((spec.get("decisions") or [{}])[0].get("by") or "")',
            ),
        ),
        mode="operator",
    ),
    Planted(
        "a checkpoint that overwrites one of the same number",
        (
            (
                "stores/_sql.py",
                "WHERE keelgate_checkpoints.seq < excluded.seq",
                "WHERE keelgate_checkpoints.seq <= excluded.seq",
            ),
        ),
    ),
)
