"""A third set of single bugs the simulator was not built around (issue 48, item 4: the share of
bugs that break a promise found within 120 s).

Why it exists: sets A and B were measured, and the simulator was then extended where they
escaped; a fresh set says whether that work generalises or only fits the bugs it was shown.
These ten were written from the product code alone (core/, stores/, adapters/, the HTTP tool's
cut-off), before their author read the simulator's moves, world or checkers: each is one honest
mistake a developer could make in one place (an off-by-one in a retry, a comparison turned the
wrong way, a key derived from the wrong field, a flag tested on the wrong branch, a case left
out of a repair).

Each is planted into a copy of the package, never into the tree (``planted_bugs.planted``);
every replacement's old text occurs exactly once in its file. The comment above each says which
promise it breaks and how; ``mode`` is where it can first be met as far as the product code
says.
"""

from __future__ import annotations

from support.planted_bugs import Planted

UNSEEN_C: tuple[Planted, ...] = (
    Planted(
        # unapproved: the gateway asks whether the call's approvals still hold only from the
        # third claim on (the attempt counted from 1, not 0), so a call held up past its first
        # deadline is claimed afresh and sent on approvals that have expired meanwhile.
        "a claim made afresh after a passed deadline skips the approvals' check once (an "
        "off-by-one in the gateway's retry)",
        (
            (
                "core/gateway.py",
                "if attempt and still_let_through is not None and not still_let_through():",
                "if attempt > 1 and still_let_through is not None and not still_let_through():",
            ),
        ),
    ),
    Planted(
        # twice / retried: httpx's NetworkError (the base of ConnectError, but also of ReadError
        # and WriteError) listed as "nothing was sent", so a connection reset after the request
        # left reads as a definite refusal: the key is dropped and the same WRITE made again.
        "the HTTP tool reads a reset after sending as nothing sent (NetworkError listed instead "
        "of ConnectError)",
        (
            (
                "adapters/tools/http.py",
                "    httpx.ConnectError,\n",
                "    httpx.NetworkError,\n",
            ),
        ),
    ),
    Planted(
        # after not executed: the exchange's cut-off takes the later of the tool's time limit
        # and the write deadline, so a request sent late in its call stays open past the
        # deadline, and the downstream may act after a true "not executed".
        "an HTTP exchange cut at the later of its time limit and the write deadline (max for min)",
        (("core/cutoff.py", "min(at, at_most)", "max(at, at_most)"),),
    ),
    Planted(
        # audit: the gateway's repair of a settlement's missing event (a settler that died
        # before writing it) is done for a person's settlement only, as if a confirmer always
        # wrote its own; a confirmer's decision can be missing from the chain.
        "a confirmer's settlement never repaired onto the chain (the repair tests source == "
        "'human')",
        (
            (
                "core/gateway.py",
                "        if record.source:\n"
                "            # Settled by a person or a confirmer: make sure the chain says so",
                '        if record.source == "human":\n'
                "            # Settled by a person or a confirmer: make sure the chain says so",
            ),
        ),
    ),
    Planted(
        # unapproved: the stated moment of a decision is kept only when it is later than now
        # (the comparison turned), so a decision an operator records late counts from when it
        # was read, not from when it was made, and an approval lives past its expiresAfter.
        "a decision's stated moment ignored when it is in the past (its comparison turned)",
        (
            (
                "core/approvals.py",
                "    if moment >= seconds(now):\n        return now\n",
                "    if moment <= seconds(now):\n        return now\n",
            ),
        ),
    ),
    Planted(
        # budget: the iteration limit compared with > instead of >=, so the model is asked to
        # plan one iteration past maxIterations.
        "the iteration limit lets one iteration more through (> for >=)",
        (
            (
                "core/phases.py",
                "if limit is not None and state.iteration >= limit:",
                "if limit is not None and state.iteration > limit:",
            ),
        ),
    ),
    Planted(
        # unapproved: a rule with several group lists ("from payments and from finance") read
        # as any of them, so a person in one list only is counted.
        "a rule's group lists read as any of them, not each of them",
        (
            (
                "core/types.py",
                "return all(any(g in groups for g in each) for each in self.group_lists())",
                "return any(any(g in groups for g in each) for each in self.group_lists())",
            ),
        ),
    ),
    Planted(
        # unapproved: notCreator tested on a deny instead of an approval, so the run's creator
        # approves their own call under a rule that asks for someone else.
        "notCreator applied to the creator's denies instead of their approvals",
        (
            (
                "core/approvals.py",
                "    if approved and rule.not_creator and by == creator:\n",
                "    if not approved and rule.not_creator and by == creator:\n",
            ),
        ),
    ),
    Planted(
        # audit: a decision's event keyed by the person instead of by its place on the action,
        # so a person's second decision on an action (a deny after an approval, a new approval
        # after theirs expired) is taken for a repeat of their first and never reaches the chain.
        "a decision's audit key derived from its author, not its place (a person's second "
        "decision skipped as a repeat)",
        (
            (
                "core/approvals.py",
                'key=f"decided:{keyed}" if not prior else f"decided:{keyed}:{prior}",',
                'key=f"decided:{keyed}:{decision.by}",',
            ),
        ),
    ),
    Planted(
        # unapproved / altered: the spec store's stale-writer check turned, so an older
        # generation of the manifest replaces a newer one (and the newer one is refused): a
        # step runs under a rule or tool definition that was already edited away.
        "the spec store keeps an older generation over a newer one (its comparison turned)",
        (
            (
                "stores/_sql.py",
                '"OR keelgate_specs.generation <= excluded.generation"',
                '"OR keelgate_specs.generation >= excluded.generation"',
            ),
        ),
    ),
)
