"""The oracle: after every simulated run, the promise, checked against what really happened.

Why it exists: the simulator is only as good as its judge, and a judge that knew the code would
share its blind spots. This one knows the promise (README, docs/design.md) and the ground truth
the world kept: the shop's ledger of effects, the decisions people made and whether they were
true, the spec versions, the plans the model gave; from the store it reads only what a person
can read (the run's checkpoint, its keys, its audit chain, verified). Each broken promise is one
line, named by the rule it breaks (``RULES``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from keelgate.core.audit import AuditEvent
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.types import KeyState, RunPhase
from keelgate.testing.sim.downstream import Ledger
from keelgate.testing.sim.people import Decision
from keelgate.testing.sim.world import EPOCH

RULES = {
    "twice": "a WRITE's effect happened more than once under one idempotency key",
    "unapproved": "a WRITE took effect without the approvals it needed (that many people)",
    "after-not-executed": "a WRITE took effect after a true 'not executed'",
    "unasked": "an unknown outcome was never put to a person",
    "told-not-run": "a WRITE took effect, or was sent, while its run recorded that it did not run",
    "waiting": "the run was left waiting with nobody asked",
    "audit": "the audit chain does not verify, or lacks a decision",
    "budget": "a budget was passed by more than one call",
}


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {RULES[self.rule]} ({self.detail})"


@dataclass(frozen=True)
class PlanMade:
    """A plan the model gave, and the approval rules of the spec it was asked under (tool ->
    how many people)."""

    at: float
    iteration: int
    approval: Mapping[str, int]


@dataclass
class Truth:
    """What the world knows happened, for the oracle."""

    ledger: Ledger
    decisions: list[Decision] = field(default_factory=list)
    plans: list[PlanMade] = field(default_factory=list)
    #: People decided by editing objects (operator mode): their settlements are read from the
    #: chain, at the moment they were recorded, not from when they were asked for.
    human_from_audit: bool = False
    max_iterations: int | None = None
    max_tokens: int | None = None
    call_tokens: int = 0


def judge(stores: Stores, tenant: str, run: str, truth: Truth) -> list[Violation]:
    """Every broken promise of one finished simulation."""
    found: list[Violation] = []
    loop = Loop(stores=stores, busy_wait=0.0)
    events = stores.audit.events(tenant, run)
    ledger = truth.ledger
    # At most once per key (each request of a composite call: its charge once, its receipt
    # once).
    requests = {(effect.key, effect.part) for effect in ledger.effects}
    for key, part in sorted(requests):
        count = ledger.count(key, part)
        if count > 1:
            what = "" if part == "request" else f" ({part})"
            found.append(Violation("twice", f"{key[:12]}{what} took effect {count} times"))
    plans = _plans(events)
    approved = _decided(events, "loop.approved")
    denied = _decided(events, "loop.denied")
    # Never without the approvals it needs, each by a different person: as many as the spec
    # the sending process ran asks, and as the spec the action was planned under asks (the
    # action is the last one started under the key before the effect); never after a deny.
    # Events are stamped to the millisecond, cut: each effect's moment is compared as stamped
    # the same way (``_stamped``).
    started = [
        (str(e.data.get("idempotencyKey")), str(e.data.get("action")), _at(e))
        for e in events
        if e.type == "loop.action_started"
    ]
    for effect in ledger.effects:
        effect_at = _stamped(effect.at)
        sent = [a for k, a, at in started if k == effect.key and at <= effect_at]
        action = sent[-1] if sent else ""
        needed = effect.approval_in_spec
        for planned, tool, at in plans.get(effect.key, []):
            if planned == action:
                needed = max(needed, _rules_at(truth.plans, action, at).get(tool, 0))
        people = {by for a, by, at in approved if a == action and at <= effect_at}
        no = [by for a, by, at in denied if a == action and at <= effect_at]
        if needed and (len(people) < needed or no):
            found.append(
                Violation(
                    "unapproved",
                    f"{effect.tool} {action} {effect.key[:12]} at {effect.at:.1f}: "
                    f"{len(people)} of {needed} approvals" + (f", denied by {no[0]}" if no else ""),
                )
            )
    # Never told "it did not happen" of a call that took effect: a refusal, a failure or a
    # denial the run recorded for the action that sent it (after the effect: an error of a call
    # that may have sent something read as "nothing happened"); and never sent after being
    # recorded so (a stale process sending its old plan's call after the run moved on), even a
    # request the shop then refused. A person's or a confirmer's "not executed" is judged
    # below, not here.
    not_run: dict[str, float] = {}
    for e in events:
        if e.type == "loop.action_completed" and e.data.get("status") in _NOT_RUN:
            not_run.setdefault(str(e.data.get("action")), _at(e))
    told = [(effect, "took effect") for effect in ledger.effects]
    told += [(request, "was sent") for request in ledger.received]
    for request, what in told:
        request_at = _stamped(request.at)
        sent_by = [a for k, a, at in started if k == request.key and at <= request_at]
        if not sent_by or sent_by[-1] not in not_run:
            continue
        if what == "was sent" and not_run[sent_by[-1]] >= request_at:
            continue  # sent before its action's result was recorded: the refusal itself
        found.append(
            Violation(
                "told-not-run",
                f"{request.tool} {sent_by[-1]} {request.key[:12]} {what} at "
                f"{request.at:.1f}, recorded as not run",
            )
        )
    # Never after a "not executed" that was true when given.
    settled_not = [
        (d.key, _stamped(d.at)) for d in truth.decisions if d.kind == "settle" and not d.yes
    ]
    settled_not += [
        (str(e.data.get("idempotencyKey")), _at(e))
        for e in events
        if e.type == "loop.reconciled"
        and (e.data.get("source") == "confirmer" or truth.human_from_audit)
        and e.data.get("verdict") == "abandoned"
    ]
    for key, at in settled_not:
        before = [e for e in ledger.effects if e.key == key and _stamped(e.at) <= at]
        after = [e for e in ledger.effects if e.key == key and _stamped(e.at) > at]
        if not before and after:
            found.append(
                Violation(
                    "after-not-executed",
                    f"{key[:12]} settled not executed at {at:.1f}, "
                    f"took effect at {after[0].at:.1f}",
                )
            )
    # Every unknown outcome put to a person; nobody left waiting.
    outcome = loop.outcome(tenant, run) if stores.checkpoints.load(tenant, run) else None
    finished = outcome is not None and outcome.phase in (RunPhase.SUCCEEDED, RunPhase.FAILED)
    if not finished:
        shown = (
            "never started"
            if outcome is None
            else (f"{outcome.phase.value} {outcome.stop.reason.value}: {outcome.stop.message}")
        )
        found.append(Violation("waiting", f"at the end the run is {shown}"))
    for key in sorted(_planned_keys(events)):
        record = stores.idempotency.get(tenant, key)
        if record is None:
            continue
        if record.state in (KeyState.OUTCOME_UNKNOWN, KeyState.IN_FLIGHT) and finished:
            found.append(
                Violation("unasked", f"{key[:12]} is {record.state.value} and the run finished")
            )
    # The audit chain verifies and records each decision as it stands.
    report = loop.verify_audit(tenant, run)
    if not report.ok:
        found.append(Violation("audit", "; ".join(report.problems)))
    reconciled = {
        str(e.data.get("idempotencyKey")): e for e in events if e.type == "loop.reconciled"
    }
    for key in sorted(_planned_keys(events)):
        record = stores.idempotency.get(tenant, key)
        if record is None or not record.source:
            continue
        event = reconciled.get(key)
        verdict = "executed" if record.state is KeyState.COMPLETED else "abandoned"
        if event is None:
            found.append(Violation("audit", f"the settlement of {key[:12]} is not on the chain"))
        elif event.actor != record.settled_by or event.data.get("verdict") != verdict:
            found.append(
                Violation(
                    "audit",
                    f"{key[:12]}: the chain says {event.data.get('verdict')} by {event.actor}, "
                    f"the store {verdict} by {record.settled_by}",
                )
            )
    decided = {(e.data.get("action"), e.actor, e.type) for e in events}
    for decision in truth.decisions:
        if decision.kind != "approve":
            continue
        kind = "loop.approved" if decision.yes else "loop.denied"
        if (decision.action, decision.by, kind) not in decided:
            found.append(
                Violation("audit", f"{decision.by}'s decision on {decision.action} is missing")
            )
    # Budgets passed by at most one call.
    if outcome is not None:
        if truth.max_iterations is not None and outcome.iteration > truth.max_iterations:
            found.append(
                Violation(
                    "budget", f"{outcome.iteration} iterations, at most {truth.max_iterations}"
                )
            )
        if truth.max_tokens is not None:
            tokens = outcome.usage.tokens
            if tokens > truth.max_tokens + truth.call_tokens:
                found.append(
                    Violation("budget", f"{tokens} tokens, budget at most {truth.max_tokens}")
                )
    return found


#: Results by which the run says, in its own words, that a call did not happen.
_NOT_RUN = frozenset({"error", "refused", "denied"})


def _at(event: AuditEvent) -> float:
    moment = dt.datetime.fromisoformat(event.at.replace("Z", "+00:00"))
    return moment.timestamp() - EPOCH


def _stamped(moment: float) -> float:
    """A moment of the world as an audit event stamped then reads back (``_at``): cut to the
    millisecond as the product stamps it, so that it compares with events' moments. (Compared
    unstamped, an event stamped in the very millisecond of an effect could read as after it.)"""
    text = dt.datetime.fromtimestamp(EPOCH + moment, dt.UTC).isoformat(timespec="milliseconds")
    return dt.datetime.fromisoformat(text).timestamp() - EPOCH


def _plans(events: Sequence[AuditEvent]) -> dict[str, list[tuple[str, str, float]]]:
    """Each key's planned actions: (action, tool, when the plan was saved)."""
    found: dict[str, list[tuple[str, str, float]]] = {}
    for event in events:
        if event.type != "loop.plan_saved":
            continue
        for action in event.data.get("actions") or []:
            found.setdefault(str(action["idempotencyKey"]), []).append(
                (str(action["action"]), str(action["tool"]), _at(event))
            )
    return found


def _planned_keys(events: Sequence[AuditEvent]) -> set[str]:
    return set(_plans(events))


def _decided(events: Sequence[AuditEvent], kind: str) -> list[tuple[str, str, float]]:
    """(action, who, when) of each decision of ``kind`` on the chain."""
    return [(str(e.data.get("action")), e.actor, _at(e)) for e in events if e.type == kind]


def _rules_at(plans: Sequence[PlanMade], action: str, at: float) -> Mapping[str, int]:
    """The approval rules (tool -> people) of the spec the plan holding ``action`` was made
    under."""
    iteration = int(action.split(":", 1)[0])
    made = [p for p in plans if p.iteration == iteration and p.at <= at]
    return made[-1].approval if made else {}
