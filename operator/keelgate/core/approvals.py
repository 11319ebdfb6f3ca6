"""Approvals: which planned actions wait for people, and what each person decided.

Why it exists: a tool with an approval rule stops the run before its call
(``awaiting_approval``), and the call runs only once the rule is met: enough people, each a
different one, from the groups it names, not the run's creator if it says so, each approval
young enough when the call would run. Any no denies it for good, and the model is told. The rule
travels with the saved action (``Action.approval_rule``) and is combined with the rule in force
when the call would run, so an edited manifest can add a question, never remove one or lower a
count. A decision is made on a call as it will be sent: the action's key (its tool and
arguments) and the definition of the tool it is bound to (``core.calls``); one made on an
earlier definition no longer counts. ``refusal`` is the one judge of whether a person's
decision can count under a rule: the command line, ``decide``, the gate and the operator's
Approval status all ask it. This module must never let such a call run with fewer approvals
than the rule asks, never ask a person about a call that may already have run (its outcome is
settled first), and never let a decision change, or a person count twice, once recorded.

Why one module past 500 lines: a rule is judged here once (``refusal``), and what reads its
verdict (who counts, when an approval stops counting, what the run waits for) is read beside it,
so no second reading of a rule can drift from the first.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from keelgate.core import clocks
from keelgate.core.audit import AuditDraft, utc_now
from keelgate.core.calls import fingerprint
from keelgate.core.gateway import in_flight_elsewhere, once_not_in_flight
from keelgate.core.persistence import persist
from keelgate.core.protocols import IdempotencyStore, Stores, Tool
from keelgate.core.redaction import redact_text
from keelgate.core.state import HISTORY_WINDOW, Decision, RunState
from keelgate.core.types import (
    Action,
    ActionResult,
    ApprovalRule,
    PendingApproval,
    ResultStatus,
    SideEffect,
    Stop,
    StopReason,
    stricter,
    utc_iso,
)
from keelgate.core.values import MAX_DECISIONS, MAX_GROUPS, one_line
from keelgate.errors import InputError, SettleError


def rule_of(tool: Tool) -> ApprovalRule | None:
    """The approval rule a tool asks for now: its ``approval`` (a tool may carry one), else one
    approval if it ``requires_approval``, else none. A tool written before rules has no
    ``approval`` attribute and means what it always meant."""
    rule = getattr(tool, "approval", None)
    if isinstance(rule, ApprovalRule):
        return rule
    return ApprovalRule() if tool.requires_approval else None


def in_force(action: Action, tool: Tool | None) -> ApprovalRule | None:
    """The rule an action must meet before its call: the one it was planned under, made
    stricter by the tool's now (None: nobody needs to be asked)."""
    planned = action.approval_rule()
    now = None if tool is None else rule_of(tool)
    if planned is None:
        return now
    return planned.stricter(now)


#: How a ServiceAccount's user name starts (``system:serviceaccount:<namespace>:<name>``).
SERVICE_ACCOUNT = "system:serviceaccount:"
#: The most decisions one person may make on one action (a person decides again only once their
#: approval expired, or to deny): no one person fills an action's ``MAX_DECISIONS``.
MAX_PER_PERSON = 8


def is_service_account(by: str) -> bool:
    """Whether ``by`` names a ServiceAccount (as the API server names one), not a person."""
    return by.startswith(SERVICE_ACCOUNT)


def refusal(
    rule: ApprovalRule,
    *,
    approved: bool,
    by: str,
    groups: Collection[str],
    creator: str,
    counted: Collection[str] = (),
    note: str = "",
) -> str | None:
    """Why ``by``'s decision cannot count under ``rule`` (None: it can): the one judge of a
    rule, asked by the command line, ``decide``, the gate (through ``tally``) and the
    operator. ``groups``: those the API server authenticated the person in; ``creator``: the
    run's (as its annotation says; "" unknown); ``counted``: who counts already.

    A ServiceAccount decides only if the rule says so (anyone who holds its token or may
    impersonate it would decide as it); a person decides only from the rule's groups; an
    approval counts only if not the creator's under notCreator (with no creator on record,
    nobody's: who it is cannot be known, and not knowing is a reason to stop), and once per
    person; a deny says why if the rule asks a reason.
    """
    if is_service_account(by) and not rule.service_accounts:
        return (
            f"{by} is a ServiceAccount, and the rule counts people only (its serviceAccounts: "
            "true lets ServiceAccounts decide)"
        )
    if approved and rule.not_creator and not creator:
        return (
            "its rule says not the run's creator, and the run's creator is not on record "
            "(annotation keelgate.dev/created-by): no approval can count; deny it, or "
            "recreate the run with its creator recorded"
        )
    if approved and rule.not_creator and by == creator:
        return f"{by} created the run, and its rule asks for someone else ({rule.describe()})"
    if not rule.admits(groups):
        return f"{by} may not decide it: the rule asks {rule.describe()}"
    if not approved:
        if rule.reason_to_deny and not note.strip():
            return "its rule asks a reason to deny: give one (a note)"
        return None
    if by in counted:
        return f"{by} approved it already ({len(counted)} of {rule.required}): a person counts once"
    return None


def on_call(decision: Decision, definition: str) -> bool:
    """Whether ``decision`` was made on the call as it is bound now (``definition``: the
    fingerprint of the action's definition). A decision recorded before definitions were
    names none, and counts as it always did."""
    return not decision.definition or not definition or decision.definition == definition


@dataclass(frozen=True)
class Tally:
    """An action's decisions, counted against its rule at one moment."""

    rule: ApprovalRule
    counted: tuple[Decision, ...]  # the approvals that count, one per person, oldest first
    denied: Decision | None  # the first no, if any (it decides)
    expires_at: float | None  # when the first approval that counts stops counting
    expired: tuple[Decision, ...]  # approvals that no longer count because they are too old
    # Approvals made on an earlier definition of the call (a manifest edit since): void.
    voided: tuple[Decision, ...] = ()

    @property
    def met(self) -> bool:
        return self.denied is None and len(self.counted) >= self.rule.required

    @property
    def count(self) -> str:
        """ "1 of 2"."""
        return f"{len(self.counted)} of {self.rule.required}"

    @property
    def spent(self) -> bool:
        """Whether no decision made so far can count any more: approvals were made, each
        expired or was made on an earlier definition, and nobody denied (``ask_again``)."""
        return self.denied is None and not self.counted and bool(self.expired or self.voided)

    def pending(
        self, action: str, tool: str, *, definition: str = "", round: int = 1
    ) -> PendingApproval:
        """The action as a person waiting for it sees it: what it needs and what it has."""
        plain = self.rule == ApprovalRule()
        return PendingApproval(
            action,
            tool,
            rule=None if plain else self.rule,
            approvals=len(self.counted),
            approved_by=tuple(d.by for d in self.counted),
            expires_at="" if self.expires_at is None else utc_iso(self.expires_at),
            definition=definition,
            round=round,
        )


def tally(
    decisions: Sequence[Decision],
    rule: ApprovalRule,
    *,
    creator: str,
    now: float,
    definition: str = "",
) -> Tally:
    """Count ``decisions`` against ``rule`` at ``now`` (seconds since the epoch), for the call
    bound to ``definition`` (its fingerprint; "" for an action saved before definitions).

    Any no denies. A yes counts if ``refusal`` has nothing against it, was made on the call as
    it is bound now, and was given at most ``expires_after`` seconds before ``now``; each
    person counts once, with their newest yes.
    """
    denied = next((d for d in decisions if not d.approved), None)
    newest: dict[str, Decision] = {}
    voided: dict[str, Decision] = {}
    for decision in decisions:
        if not decision.approved:
            continue
        if on_call(decision, definition):
            newest[decision.by] = decision
        else:
            voided[decision.by] = decision
    counted: list[Decision] = []
    expired: list[Decision] = []
    for decision in newest.values():
        if (
            refusal(rule, approved=True, by=decision.by, groups=decision.groups, creator=creator)
            is not None
        ):
            continue
        if rule.expires_after is not None and now - seconds(decision.at) > rule.expires_after:
            expired.append(decision)
            continue
        counted.append(decision)
    counted.sort(key=lambda d: d.at)
    expires_at = None
    if rule.expires_after is not None and counted:
        expires_at = seconds(counted[0].at) + rule.expires_after
    gone = tuple(d for by, d in voided.items() if by not in newest)
    return Tally(rule, tuple(counted), denied, expires_at, tuple(expired), gone)


def seconds(at: str) -> float:
    """A decision's moment (UTC ISO 8601, as ``utc_now`` writes it) in seconds since the epoch."""
    return dt.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


class ApprovalGate:
    """Asked before each action of a session: may it go to the gateway?"""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        keys: IdempotencyStore,
        *,
        allowed: frozenset[SideEffect],
        busy_wait: float,
        creator: str = "",
    ) -> None:
        self.tools = tools
        self.keys = keys
        self.allowed = allowed
        self.busy_wait = busy_wait
        self.creator = creator

    def check(self, state: RunState, action: Action) -> ActionResult | PendingApproval | None:
        """What stands between ``action`` and the gateway: nothing (None), a decision that it
        does not run (its result: denied), or people to ask first (the run stops).

        Asked when the call would run: the approvals are counted now, so one given longer ago
        than the rule's ``expiresAfter`` (a budget stop in between, say) is asked for again;
        the old decision stays on record."""
        decisions = state.approvals.get(action.id, ())
        # A recorded no stands, whatever the manifest says now.
        denied = next((d for d in decisions if not d.approved), None)
        if denied is not None:
            return ActionResult(action.id, ResultStatus.DENIED, error=f"denied by {denied.by}")
        tool = self.tools.get(action.tool)
        if tool is None:
            return None  # the gateway reports the unknown tool; nothing runs
        rule = in_force(action, tool)
        if rule is None:
            return None
        side_effect = stricter(tool.side_effect, action.side_effect)
        if side_effect not in self.allowed:
            return None  # the gateway refuses it; no person needs to be asked
        definition = fingerprint(action.definition)
        counted = tally(
            decisions, rule, creator=self.creator, now=clocks.wall(), definition=definition
        )
        if counted.met:
            return None
        if side_effect is not SideEffect.READ and self._begun(state, tool, action):
            # Its call was made before (the manifest asked no approval then): what it came to
            # is settled first, by the gateway. A person asked now would be asked about a
            # call that may already have run, and asked again once it is settled.
            return None
        return counted.pending(
            action.id, tool.name, definition=definition, round=state.round_of(action.id)
        )

    def may_lapse(self, action: Action) -> bool:
        """Whether what lets ``action`` through the gate can stop holding while its call waits
        to leave: a rule in force whose approvals expire (``expiresAfter``). Such a call, READ
        or WRITE, is sent only within a deadline of being let through, and the gate is asked
        again before it is tried afresh (``Gateway.call(still_let_through=)``); a call under no
        such rule has nothing that could lapse, and a READ of it goes out unfenced."""
        tool = self.tools.get(action.tool)
        rule = None if tool is None else in_force(action, tool)
        return rule is not None and rule.expires_after is not None

    def _begun(self, state: RunState, tool: Tool, action: Action) -> bool:
        """Whether the action's key is on record, settled or unknown: its call was made.

        A key still in flight in a live process may yet be dropped (a late definite refusal),
        and the call then counts as never made: it is waited for, as the gateway waits, and
        past that the run is busy. A key that is not in flight can no longer disappear, so
        the gateway meets the same record and never calls the tool.
        """
        record = once_not_in_flight(
            lambda: self.keys.get(state.tenant, action.key),
            wait=self.busy_wait,
            busy=lambda record: in_flight_elsewhere(
                state.tenant, state.run, tool, action, here=record.here
            ),
        )
        return record is not None


def recent(
    approvals: Mapping[str, tuple[Decision, ...]], iteration: int
) -> Mapping[str, tuple[Decision, ...]]:
    """The recorded decisions a run still keeps when it plans ``iteration``: those of actions
    planned in the last ``HISTORY_WINDOW`` iterations, so a run that asks a person at every
    WRITE does not carry every decision ever made in each checkpoint.

    Dropping an older one can never let a call run unapproved or twice: an action's id names
    the iteration that planned it (``"7:0"``), no later plan reuses it, and the gate is only
    ever asked about the current plan's actions; a dropped decision cannot be made again either
    (``decide`` only takes an action the run awaits now). The decision stays on the audit chain.
    The window leaves a late caller (a retried update, an operator catching up on an Approval
    object) many iterations in which to find the decision it recorded.
    """
    oldest = iteration - HISTORY_WINDOW
    if all(_planned_in(action) >= oldest for action in approvals):
        return approvals  # the usual case: nothing to drop, nothing copied
    return {a: d for a, d in approvals.items() if _planned_in(a) >= oldest}


@dataclass(frozen=True)
class Denial:
    """An action a person denied: it never ran (the model was told)."""

    action: str
    tool: str
    decision: Decision

    def describe(self) -> str:
        """ "place_order (2:0) denied by bob: wrong sku"."""
        why = f": {self.decision.note}" if self.decision.note else ""
        return f"{self.tool} ({self.action}) denied by {self.decision.by}{why}"


def denials(state: RunState) -> tuple[Denial, ...]:
    """The actions of the run a person denied, oldest first, as its checkpoint still keeps
    them (the last ``HISTORY_WINDOW`` iterations; the chain keeps every one)."""
    tools: dict[str, str] = {}
    for entry in state.history:
        for seen in entry.get("actions") or ():
            tools[str(seen.get("id"))] = str(seen.get("tool") or "")
    if state.plan is not None:
        tools.update({a.id: a.tool for a in state.plan.actions})
    found = []
    for action, decisions in state.approvals.items():
        denied = next((d for d in decisions if not d.approved), None)
        if denied is not None:
            found.append(Denial(action, tools.get(action, "?"), denied))
    found.sort(key=lambda d: (_planned_in(d.action), d.action))
    return tuple(found)


def _planned_in(action: str) -> int:
    """The iteration an action id names; an id of another shape is kept (never dropped)."""
    head = action.split(":", 1)[0]
    return int(head) if head.isascii() and head.isdigit() else 1 << 62


def check_groups(groups: Collection[str], *, field: str = "groups") -> tuple[str, ...]:
    """The groups a decision names, sorted and each once: a name on one line each, at most
    ``MAX_GROUPS`` of them (they go on the record with the decision)."""
    found = tuple(sorted(set(groups)))
    if len(found) > MAX_GROUPS:
        raise InputError(field, f"names {len(found)} groups, at most {MAX_GROUPS}")
    for group in found:
        one_line(group, field, "a group")
    return found


def decide(
    stores: Stores,
    state: RunState,
    action: str,
    *,
    approved: bool,
    by: str,
    groups: Collection[str] = (),
    key: str = "",
    ref: str = "",
    definition: str = "",
    note: str = "",
    at: str = "",
) -> RunState:
    """Record a person's decision on an action the run awaits (``by`` already checked): the
    checkpoint and its ``loop.approved`` or ``loop.denied`` event, together.

    ``groups`` are those the person was authenticated in (admission checked them in a cluster);
    ``key`` and ``definition``, when given, are the idempotency key and the definition's
    fingerprint of the call the person was shown, and must be the action's (a decision on other
    arguments, or on the tool as it was before an edit, is refused); ``ref`` names the entry of
    an Approval object the decision comes from: a second call with the same ``ref`` records
    nothing and returns the state as it is. ``note`` is the person's reason (a rule may ask one
    to deny); ``at``, when earlier than now, the moment the decision was made (an approval's
    age counts from it). An approval that states no definition was made on the one in force at
    ``at``: made before the action was bound to an edited definition (``loop.call_changed``),
    it is refused like one that states the earlier definition (issue 46: an edit after a
    decision voids it, however late the decision is recorded).
    """
    decisions = state.approvals.get(action, ())
    if ref and any(d.ref == ref for d in decisions):
        return state  # this very entry is on record (an operator looking again)
    asked, bound = _awaited(state, action, key=key, definition=definition, approved=approved)
    made = _made_at(at)
    if approved and not definition and at:
        # Only a decision made before it was recorded (an Approval object's) can predate a
        # rebind: one recorded at once is made on the definition in force now.
        changed = _rebound_since(stores, state, action, made)
        if changed:
            raise SettleError(
                state.run,
                action,
                f"was approved at {made}, before its tool was changed at {changed} (the call "
                f"is now bound to {bound}): the approval was made on the earlier definition; "
                "look again",
            )
    rule = asked.rule or ApprovalRule()
    groups = check_groups(groups)
    creator = state.spec.creator
    now = clocks.wall()
    before = tally(decisions, rule, creator=creator, now=now, definition=bound)
    why = refusal(
        rule,
        approved=approved,
        by=by,
        groups=groups,
        creator=creator,
        counted=tuple(d.by for d in before.counted),
        note=note,
    )
    if why is not None:
        raise SettleError(state.run, action, why)
    _check_room(state.run, action, decisions, by, approved=approved)
    decision = Decision(
        approved,
        by,
        made,
        groups,
        ref,
        # A deny is recorded with the definition it was made on (it may be an earlier one).
        definition=bound if approved else (definition or bound),
        note=one_line_note(redact_text(note.strip())),
    )
    after = tally((*decisions, decision), rule, creator=creator, now=now, definition=bound)
    draft = _decided_event(asked, decision, after, prior=len(decisions), round=asked.round)
    waiting, message = _waiting_after(state.pending, asked, decision, after)
    state = state.but(
        seq=state.seq + 1,
        approvals={**state.approvals, action: (*decisions, decision)},
        pending=waiting,
        stop=Stop(StopReason.AWAITING_APPROVAL, message, True),
    )
    # No active time passes while a person decides: this save adds none.
    return persist(stores, state, (*state.outbox, draft), joint=stores.joint)


def _check_room(
    run: str, action: str, decisions: Sequence[Decision], by: str, *, approved: bool
) -> None:
    """Refuse a decision past what an action's round keeps: ``MAX_DECISIONS`` in all (the
    checkpoint's and the Approval object's bound), ``MAX_PER_PERSON`` approvals of one person
    (so no one fills it; a person's one deny always has room). A round whose approvals all
    stopped counting is asked afresh (``ask_again``), with room again."""
    if len(decisions) >= MAX_DECISIONS:
        raise SettleError(run, action, f"has {len(decisions)} decisions: no more are taken")
    if approved and sum(d.by == by and d.approved for d in decisions) >= MAX_PER_PERSON:
        raise SettleError(
            run, action, f"has {MAX_PER_PERSON} approvals of {by}: no more are taken of them"
        )


def asked_now(state: RunState, action: str) -> PendingApproval | None:
    """The question the run puts to people about ``action`` now: the run is stopped awaiting
    approval and ``action`` is among what it waits on (a decision on it is recorded now, or
    refused for what it is: its maker, its call, its rule). None when it does not ask."""
    if not _awaiting(state):
        return None
    return next((p for p in state.pending if p.action == action), None)


def _awaiting(state: RunState) -> bool:
    return state.stop is not None and state.stop.reason is StopReason.AWAITING_APPROVAL


#: Why an action is asked afresh (``ask_again``).
SPENT, FULL = "spent", "full"


def ask_again(
    stores: Stores, state: RunState, action: str, *, round: int, why: str = SPENT
) -> RunState:
    """Ask ``action`` afresh, in round ``round`` + 1, when round ``round`` can decide nothing
    any more: ``why`` is ``SPENT`` (every approval made in it expired or was made on an
    earlier definition, and none counts now) or ``FULL`` (its Approval object holds as many
    entries as it takes, so nobody could add one). The round's decisions leave the checkpoint
    (the chain keeps them, with a ``loop.asked_again`` event naming the round), so none of
    them counts again and the new round has all its room; a deny is never dropped: with one on
    record, or the action no longer waiting, or the run in another round than ``round`` (asked
    afresh already), nothing changes and ``state`` is returned as it is."""
    asked = asked_now(state, action)
    decisions = state.approvals.get(action, ())
    if asked is None or state.round_of(action) != round:
        return state
    if any(not d.approved for d in decisions):
        return state
    rule = asked.rule or ApprovalRule()
    planned = state.planned(action)
    bound = fingerprint(planned.definition) if planned is not None else asked.definition
    now = clocks.wall()
    counted = tally(decisions, rule, creator=state.spec.creator, now=now, definition=bound)
    if why == SPENT and not counted.spent:
        return state
    if why not in (SPENT, FULL):
        raise ValueError(f"ask_again: why must be {SPENT!r} or {FULL!r}, not {why!r}")
    fresh = replace(
        asked, approvals=0, approved_by=(), expires_at="", definition=bound, round=round + 1
    )
    before = ", ".join(dict.fromkeys(d.by for d in decisions if d.approved)) or "nobody"
    said = (
        f"every approval of round {round} stopped counting ({before})"
        if why == SPENT
        else f"round {round} holds {len(decisions)} decisions, as many as it takes"
    )
    data: dict[str, object] = {
        "action": action,
        "tool": asked.tool,
        "round": round + 1,
        "why": why,
        "approvedBefore": [d.by for d in decisions if d.approved],
    }
    state = state.but(
        seq=state.seq + 1,
        approvals={**state.approvals, action: ()},
        rounds={**state.rounds, action: round + 1},
        pending=tuple(fresh if p.action == action else p for p in state.pending),
        stop=Stop(
            StopReason.AWAITING_APPROVAL,
            f"{asked.tool} ({action}) asked afresh (round {round + 1}): {said}; "
            f"waiting for {rule.required} ({rule.describe()})",
            True,
        ),
    )
    draft = AuditDraft("loop.asked_again", data, key=f"asked_again:{action}:{round + 1}")
    return persist(stores, state, (*state.outbox, draft), joint=stores.joint)


def _waiting_after(
    pending: Sequence[PendingApproval],
    asked: PendingApproval,
    decision: Decision,
    after: Tally,
) -> tuple[tuple[PendingApproval, ...], str]:
    """What the run waits for once ``decision`` is counted, and its stop's message: the action
    leaves the questions when its rule is met or it is denied (the run may resume); otherwise
    its question shows the new count and how many more approvals it waits for."""
    action, tool, rule = asked.action, asked.tool, after.rule
    if after.met or not decision.approved:
        who = ", ".join(d.by for d in after.counted) if decision.approved else decision.by
        tail = f" ({after.count})" if decision.approved and rule.required > 1 else ""
        verdict = "approved" if decision.approved else "denied"
        return (
            tuple(p for p in pending if p.action != action),
            f"{tool} ({action}) {verdict} by {who}{tail}; resume to continue",
        )
    left = rule.required - len(after.counted)
    return (
        tuple(
            after.pending(action, tool, definition=decision.definition, round=asked.round)
            if p.action == action
            else p
            for p in pending
        ),
        f"{tool} ({action}) approved by {decision.by} ({after.count}); waiting for {left} "
        f"more ({rule.describe()})",
    )


def _awaited(
    state: RunState, action: str, *, key: str, definition: str, approved: bool = True
) -> tuple[PendingApproval, str]:
    """The question the run puts to people about ``action`` now, and the fingerprint of the
    definition its call is bound to; refused (``SettleError``, in words) if the run does not
    await a decision on it, it was denied, or the person was shown another call (``key``) or,
    for an approval, the tool as it was before an edit (``definition``). A deny made on the
    tool as it was before an edit still denies: an edit voids approvals of the earlier call,
    never a no (a deny only stops, and one recorded before the edit stands too); else an edit
    made before the operator recorded a deny would void it, and a later approval run the call."""
    decisions = state.approvals.get(action, ())
    denied = next((d for d in decisions if not d.approved), None)
    if denied is not None:
        raise SettleError(state.run, action, f"already denied by {denied.by}")
    asked = asked_now(state, action)
    if asked is None and decisions:
        who = ", ".join(dict.fromkeys(d.by for d in decisions))
        raise SettleError(state.run, action, f"already approved by {who}")
    if not _awaiting(state):
        raise SettleError(state.run, action, "the run is not awaiting an approval")
    if asked is None:
        awaited = ", ".join(p.action for p in state.pending) or "none"
        raise SettleError(state.run, action, f"not awaiting approval (awaiting: {awaited})")
    planned = state.planned(action)
    if key and planned is not None and planned.key != key:
        raise SettleError(
            state.run,
            action,
            f"was shown as the call with Idempotency-Key {key}, but the run's action is "
            f"{planned.key}: its arguments are not the ones shown; look again",
        )
    bound = fingerprint(planned.definition) if planned is not None else asked.definition
    if approved and definition and bound and definition != bound:
        raise SettleError(
            state.run,
            action,
            f"was shown with its tool's definition {definition}, but the call is now bound to "
            f"{bound}: the tool was changed since; look again",
        )
    return asked, bound


def _rebound_since(stores: Stores, state: RunState, action: str, made: str) -> str:
    """The latest moment ``action`` was bound to an edited definition of its tool at or after
    ``made`` (the chain's ``loop.call_changed``, or one the checkpoint carries still unappended);
    "" when it was not: a decision made at ``made`` was made on the definition it is bound to."""
    since = seconds(made)
    moments = [
        draft.at
        for draft in state.outbox
        if draft.type == "loop.call_changed" and draft.data.get("action") == action
    ]
    moments.extend(
        event.at
        for event in stores.audit.iter_events(state.tenant, state.run)
        if event.type == "loop.call_changed" and event.data.get("action") == action
    )
    later = [moment for moment in moments if seconds(moment) >= since]
    return max(later, key=seconds, default="")


def _decided_event(
    asked: PendingApproval, decision: Decision, after: Tally, *, prior: int, round: int = 1
) -> AuditDraft:
    """The ``loop.approved`` or ``loop.denied`` event of ``decision`` (``prior``: how many the
    action had before it in its round ``round``): the count after it for a rule of several, the
    rule's groups the person was in, the note, and the definition it was made on; never the
    call's arguments."""
    verdict = "approved" if decision.approved else "denied"
    rule = after.rule
    data: dict[str, object] = {"action": asked.action, "tool": asked.tool, "verdict": verdict}
    if decision.approved and rule != ApprovalRule():
        data["approvals"] = len(after.counted)
        data["required"] = rule.required
    named = sorted({g for each in rule.group_lists() for g in each} & set(decision.groups))
    if named:
        data["groups"] = named
    if decision.note:
        data["note"] = decision.note
    if decision.definition:
        data["definition"] = decision.definition
    action = asked.action
    # A round past the first starts its count again: its keys name it, so none is taken for
    # an earlier round's (an event whose key is on the chain already is not appended again).
    keyed = action if round == 1 else f"{action}:r{round}"
    if round != 1:
        data["round"] = round
    return AuditDraft(
        f"loop.{verdict}",  # a denial is not an approval, even with verdict=denied
        data,
        actor=decision.by,
        # The first decision keeps the key a single decision always had.
        key=f"decided:{keyed}" if not prior else f"decided:{keyed}:{prior}",
    )


#: The longest note a decision keeps (an Approval entry's bound).
NOTE_MAX = 1024


def one_line_note(note: str) -> str:
    """A note as a record keeps it: one line (line breaks become spaces), at most
    ``NOTE_MAX`` characters."""
    flat = " ".join(note.split())
    return flat if len(flat) <= NOTE_MAX else flat[: NOTE_MAX - 3] + "..."


def _made_at(stated: str) -> str:
    """When a decision counts from: the moment ``stated`` (UTC ISO 8601) if it is earlier than
    now, else now. A stated moment can only make an approval older (count for less), never
    younger: one in the future, or unreadable, is now."""
    now = utc_now()
    if not stated:
        return now
    try:
        moment = seconds(stated)
    except ValueError:
        return now
    if moment >= seconds(now):
        return now
    return (
        dt.datetime.fromtimestamp(moment, dt.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
