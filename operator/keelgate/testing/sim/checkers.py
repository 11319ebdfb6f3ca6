"""The oracle's checkers: one small function per promise, each judging one simulated run from
the world's books, and comparing the product's records with them.

Why it exists: the simulator is only as good as its judge, and a judge that reads what the
product says about itself passes a product that lies (a key that changes between iterations, a
deny recorded as a yes, a decision on the chain that nobody made). Each checker here is told
what the world saw (``Books``) and what the product recorded (``Records``), and returns the
ways its one promise broke; ``CHECKERS`` names them all, and each is tested alone, fed a
hand-made history that breaks exactly its promise (tests/test_sim_checkers.py), as
TigerBeetle's simulator keeps one checker per invariant.

Calls are told apart by the world's own ``ref`` (the model's, carried in the request), never by
the product's idempotency key; the key is read only where a product record must be matched to
a request it claims (``told_not_run``). This module must never read a store, never import the
product's logic, and never excuse a broken promise for a reason the books do not show.

Why one module past 500 lines: every checker is small and tested alone, but all of them share
the matching of the product's records to the world's requests by ``ref``; read side by side, a
reviewer sees that each promise is judged once and none is left out of ``CHECKERS``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal

from keelgate.testing.sim.books import (
    SERVICE_ACCOUNT,
    Ask,
    Books,
    Decision,
    Effect,
    Rule,
    Sent,
    definition,
    tick_of,
)
from keelgate.testing.sim.records import Event, Records

#: Results by which the run says, in its own words, that a call did not happen.
NOT_RUN = frozenset({"error", "refused", "denied"})
#: Seconds a product's stamp may read early against the world's moment of the same act (stamps
#: are cut to the millisecond).
STAMP_SLACK = 0.002
#: Seconds of the write deadline's margin beyond a call's time limit (keelgate.core.fence).
MARGIN = 5.0


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {RULES[self.rule]} ({self.detail})"


Checker = Callable[[Books, Records], list[Violation]]
CHECKERS: dict[str, Checker] = {}
RULES: dict[str, str] = {}


def checker(rule: str, promise: str) -> Callable[[Checker], Checker]:
    def register(function: Checker) -> Checker:
        CHECKERS[rule] = function
        RULES[rule] = promise
        return function

    return register


def judge(books: Books, records: Records) -> list[Violation]:
    """Every broken promise of one finished run, checker by checker."""
    found: list[Violation] = []
    for check in CHECKERS.values():
        found.extend(check(books, records))
    return found


def _short(ref: str) -> str:
    return ref[:14]


# A WRITE once


@checker("spun", "the product went round one moment for ever, its run no further (a busy loop)")
def spun(books: Books, records: Records) -> list[Violation]:
    return [Violation("spun", books.spun)] if books.spun else []


@checker("twice", "a call took effect more than once (by the world's ref, whatever its key)")
def twice(books: Books, records: Records) -> list[Violation]:
    counts = Counter(
        (e.ref, e.part) for e in books.effects if books.changes_things(books.sent[e.sent])
    )
    return [
        Violation(
            "twice",
            f"{_short(ref)}{'' if part == 'request' else f' ({part})'} took effect {n} times",
        )
        for (ref, part), n in sorted(counts.items())
        if n > 1
    ]


@checker("retried", "a call was sent again after a send that was not refused for sure")
def retried(books: Books, records: Records) -> list[Violation]:
    """Not knowing is a reason to stop, never to retry: once a request of a call may have taken
    effect (it left, and no definite refusal came back to its sender), no request of the same
    call goes out again, whoever sends it (the same call planned again has the same key)."""
    found: list[Violation] = []
    earlier: dict[tuple[str, str], Sent] = {}
    for sent in books.sent:
        if not sent.ref or not books.changes_things(sent) or _acts_on_nothing(sent):
            continue  # a READ may be sent as often as the model likes, and so may a read
        slot = (sent.ref, sent.part)
        before = earlier.get(slot)
        if before is not None:
            found.append(
                Violation(
                    "retried",
                    f"{_short(sent.ref)} ({sent.part}) sent by {sent.process} at {sent.at:.1f} "
                    f"after {before.process}'s send at {before.at:.1f}",
                )
            )
            continue
        if not sent.refused:
            earlier[slot] = sent
    return found


def _acts_on_nothing(sent: Sent) -> bool:
    """Whether a request is one the world's shop never acts on, whatever call it belongs to: a
    GET (``Shop.handle`` answers it and books no effect), such as a composite WRITE's quote
    before its charge. Sent again, it changes nothing, and what it came to need not be asked:
    a tool that sends it without reporting it may be tried afresh after a deadline passed
    (``DeadlinePassed``: nothing changed), or read as a definite failure (``ToolError``)."""
    return sent.endpoint.startswith("GET ")


@checker("again", "a tick placed a call again past a tick whose call's outcome was unknown")
def again(books: Books, records: Records) -> list[Violation]:
    """A monitor's tick is a run of its own, and may place the call an earlier tick placed (a
    restock each hour). Not while an earlier tick's request of that call may have taken effect
    and nobody has settled it: its sender never learned what it came to (no answer, no definite
    refusal, by the time the later one left), and no settlement of it (a person's that stood,
    the confirmer's) came before. Not knowing stops the monitor, never starts its next tick."""
    found: list[Violation] = []
    for sent in books.sent:
        base, tick = tick_of(sent.ref)
        if not tick or not books.changes_things(sent) or _acts_on_nothing(sent):
            continue
        for earlier in books.sent:
            if earlier.order >= sent.order or earlier.refused or earlier.part != sent.part:
                continue
            their_base, their_tick = tick_of(earlier.ref)
            if their_base != base or not 0 < their_tick < tick:
                continue
            if not books.changes_things(earlier):
                continue
            if earlier.known_at is not None and earlier.known_at <= sent.at:
                continue
            if _settled_before(books, earlier.ref, sent.at):
                continue
            found.append(
                Violation(
                    "again",
                    f"{_short(sent.ref)} ({sent.part}) sent by {sent.process} at {sent.at:.1f} "
                    f"while {_short(earlier.ref)}, sent by {earlier.process} at "
                    f"{earlier.at:.1f}, was unknown and unsettled",
                )
            )
            break
    return found


def _settled_before(books: Books, ref: str, at: float) -> bool:
    return any(
        d.kind == "settle"
        and d.ref == ref
        and d.at <= at
        and (d.source == "confirmer" or (d.accepted_at is not None and d.accepted_at <= at))
        for d in books.decisions
    )


def judge_ticks(
    books: Books, ticks: Mapping[int, Records], *, over: bool, shown: str
) -> list[Violation]:
    """Every broken promise of a monitor: each tick judged as a run of its own from its own
    books (``Books.of_tick``) and records (a tick is finished once it stopped for good), the
    ticks together by ``again``, and the monitor left waiting if its last tick is not over."""
    found: list[Violation] = []
    for number, records in sorted(ticks.items()):
        for violation in judge(books.of_tick(number), records):
            if violation.rule != "again":
                found.append(Violation(violation.rule, f"tick {number}: {violation.detail}"))
    found += again(books, Records())
    if not over:
        found.append(Violation("waiting", f"at the end the monitor's latest tick is {shown}"))
    return found


# Never unapproved


@checker("unapproved", "a call took effect without the approvals it needed, as approved")
def unapproved(books: Books, records: Records) -> list[Violation]:
    """Each effect of a call whose tool asked approval (by the spec it was planned under, made
    stricter by the spec of the process that sent it) had, before its request left, enough
    different people's approvals of that very call, each counting under the rule (in its
    groups, not the creator if it says so, young enough, a person and not a ServiceAccount
    unless the rule lets ServiceAccounts decide: "only if both let them", the rule it was
    planned under and each spec's since), none of it denied, and each made when the tool was
    the one the request went to."""
    found: list[Violation] = []
    for effect in books.effects:
        sent = books.sent[effect.sent]
        intent = books.intent(effect.ref)
        if intent is None:
            continue  # a call nobody planned: ``altered`` says so
        rule = _rule_for(books, sent, intent.tool)
        if not rule.required:
            continue
        best, denied = _approvals(books, effect, sent, rule)
        if denied or best < rule.required:
            found.append(
                Violation(
                    "unapproved",
                    f"{intent.tool} {_short(effect.ref)} sent by {sent.process} at "
                    f"{sent.at:.1f} to {sent.endpoint}: {best} of {rule.required} approvals"
                    + (f", denied by {denied}" if denied else ""),
                )
            )
    return found


def _rule_for(books: Books, sent: Sent, tool: str) -> Rule:
    rule = Rule()
    for version in books.versions_of(sent):
        rule = rule.stricter(version.rule(tool))
    return rule


def _approvals(books: Books, effect: Effect, sent: Sent, rule: Rule) -> tuple[int, str]:
    """The most approvals that count for ``sent`` under one question about its call (an action
    the people were shown), and who denied it, if a deny came before its approvals were enough.

    Decisions are taken in the order they were made: a deny by someone the rule asks, made
    while the approvals were not yet enough, denies for good; once enough people approved, a
    later deny is too late (the call was approved)."""
    made = [
        d
        for d in books.decisions
        if d.kind == "approve"
        and d.ref == effect.ref
        and d.at <= sent.at
        and not d.move
        and d.accepted_at is not None
        and not (not d.yes and d.refused_at is not None and d.refused_at <= sent.at)
        and not (not d.yes and d.unread and (d.read_at is None or d.read_at > sent.at))
    ]
    best, denied = 0, ""
    for label in dict.fromkeys(d.action for d in made):
        people: set[str] = set()
        no = ""
        for decision in sorted((d for d in made if d.action == label), key=_binds_from):
            bot = decision.by == SERVICE_ACCOUNT
            if decision.human != decision.by and not (bot and rule.service_accounts):
                continue  # a ServiceAccount the rule does not let decide (nor anyone's copy)
            if not decision.yes:
                # A ServiceAccount's groups are what its token says, not the world's: its deny
                # binds for sure only under a rule that names no groups.
                asked = not rule.groups if bot else rule.may_decide(decision.human)
                if asked and len(people) < rule.required:
                    no = no or decision.by
                continue
            if _counts(books, decision, rule, sent):
                # A ServiceAccount counts as itself: whoever holds its token or impersonates
                # it, one name however many people act through it (docs/manifest.md).
                people.add(decision.by if bot else decision.human)
        if no:
            denied = denied or no
        elif len(people) > best:
            best = len(people)
    return best, denied if best < rule.required else ""


def _binds_from(decision: Decision) -> float:
    """When a decision takes its place among the others: when it was made, or, a deny made
    on a cluster's object (two clusters), when an operator of that cluster first looked at
    the object after it. Until then nothing of the product could read it (none ran there, or
    the one that did stopped first), and the other cluster, holding the run once the lease
    lapsed, could not know of it (docs/operator.md states the limit); once read, it must be
    recorded or shown refused (``refused_at``) before it stops binding."""
    if not decision.yes and decision.unread and decision.read_at is not None:
        return decision.read_at
    return decision.at


def _counts(books: Books, decision: Decision, rule: Rule, sent: Sent) -> bool:
    # A ServiceAccount's groups are what its token says, and notCreator cannot tell who acted
    # through it (docs/manifest.md, ``serviceAccounts``): the world does not judge either.
    if decision.by != SERVICE_ACCOUNT and not rule.admits(decision.human):
        return False
    if decision.shown and _went_to(books, sent) not in (decision.shown, *decision.shown_also):
        return False  # approved a call to somewhere else
    if rule.expires_after is not None:
        # The gate counts approvals when it lets the call through; the request may leave up to
        # the call's time limit later (its write deadline), on clocks that drift a little.
        allowed = rule.expires_after + books.call_seconds + MARGIN + 1.0
        if sent.at - decision.at > allowed:
            return False
    return True


def _went_to(books: Books, sent: Sent) -> str:
    """Where a request went, as a tool's definition says it: its endpoint on the wire, or, for a
    Python tool (the world's own code, which knows where it sends), its callable as the sender's
    spec names it."""
    intent = books.intent(sent.ref)
    versions = books.versions_of(sent)
    tool = versions[-1].tool(intent.tool) if intent is not None and versions else None
    if tool is not None and "python" in tool:
        return definition(tool)
    return sent.endpoint


# Never after a true "not executed"


@checker("after-not-executed", "a call took effect after a true 'not executed' stood")
def after_not_executed(books: Books, records: Records) -> list[Violation]:
    found: list[Violation] = []
    for decision in _settled_not(books, records):
        at = decision.accepted_at
        assert at is not None
        if books.happened(decision.ref, at):
            continue  # not true when it came to stand: ``told-not-run`` is not about people
        later = [
            e
            for e in books.effects
            if e.ref == decision.ref and e.at > at and books.changes_things(books.sent[e.sent])
        ]
        if later:
            found.append(
                Violation(
                    "after-not-executed",
                    f"{_short(decision.ref)} settled not executed by {decision.by} "
                    f"(standing at {at:.1f}), took effect at {later[0].at:.1f}",
                )
            )
    return found


def _settled_not(books: Books, records: Records) -> Iterable[Decision]:
    """The "not executed" decisions that stood."""
    return _settlements_that_stood(books, records, executed=False)


def _settlements_that_stood(
    books: Books, records: Records, *, executed: bool
) -> Iterable[Decision]:
    """The settlements ``executed`` (or "not executed") that stood: those the product told
    their maker stood, and the confirmer's, from the moment the chain records them (a
    confirmer is not told)."""
    for decision in books.decisions:
        if decision.kind != "settle" or decision.yes is not executed or decision.move:
            continue
        if decision.source == "human" and decision.accepted_at is not None:
            yield decision
        elif decision.source == "confirmer":
            event = _recorded(records, decision)
            if event is not None:
                yield Decision(
                    event.at,
                    "settle",
                    decision.by,
                    decision.human,
                    decision.action,
                    decision.ref,
                    executed,
                    accepted_at=event.at,
                    source="confirmer",
                )


def _recorded(records: Records, decision: Decision) -> Event | None:
    """The chain's record of a confirmer's settlement (the first the product made of its
    verdict about that action, at or after it was given): a confirmer is told nothing, so it
    stands from there."""
    verdict = "executed" if decision.yes else "abandoned"
    return next(
        (
            e
            for e in records.of_type("loop.reconciled")
            if e.data.get("source") == "confirmer"
            and e.data.get("action") == decision.action
            and e.data.get("verdict") == verdict
            and e.at + STAMP_SLACK >= decision.at
        ),
        None,
    )


@checker("confirmed", "a confirmer's settlement stood that was false of the call it settled")
def confirmed(books: Books, records: Records) -> list[Violation]:
    """A confirmer is trusted code (ADR-0004): its definite verdict settles the call the product
    asked it about, and nobody looks again. The system of record it asks tells the truth of
    what it was asked (the world's shop answers from its own ledger, or says nothing), so a
    verdict the world knows was false of that call when it was given (``Decision.truthful``:
    the shop's ledger, by the call's ref), once the chain records it, was the product's doing:
    it asked about another call than the one it settled. (A verdict read otherwise than the
    shop said is ``audit``'s: a settlement on the chain nobody made.) A person's wrong
    settlement is a person's (people err in this world); this is the product's."""
    found: list[Violation] = []
    for decision in books.decisions:
        if decision.kind != "settle" or decision.source != "confirmer" or decision.truthful:
            continue
        event = _recorded(records, decision)
        if event is None or decision.move:
            continue
        said, was = ("executed", "had not") if decision.yes else ("not executed", "had")
        found.append(
            Violation(
                "confirmed",
                f"{decision.by} said {said} of {_short(decision.ref)} ({decision.action}) at "
                f"{decision.at:.1f}, recorded at {event.at:.1f}; it {was} taken effect",
            )
        )
    return found


# Never told "it did not happen" of a call that did


@checker("told-not-run", "a call took effect, or was sent, while its run recorded that it did not")
def told_not_run(books: Books, records: Records) -> list[Violation]:
    """A refusal, a failure or a denial the run recorded for the action that sent a request
    that took effect (an error of a call that may have sent something, read as "nothing
    happened"); or a request sent after its action was recorded so (a stale process sending its
    old plan's call after the run moved on). The request is matched to the action by the key it
    carried, which the product's ``loop.action_started`` names."""
    started = [
        (str(e.data.get("idempotencyKey")), str(e.data.get("action")), e.stamp)
        for e in records.of_type("loop.action_started")
    ]
    not_run: dict[str, float] = {}
    for e in records.of_type("loop.action_completed"):
        if e.data.get("status") in NOT_RUN:
            not_run.setdefault(str(e.data.get("action")), e.stamp)
    found: list[Violation] = []
    took = {e.sent for e in books.effects}
    for index, sent in enumerate(books.sent):
        if not sent.key:
            continue
        when = books.stamp(sent.at)
        by = [a for k, a, at in started if k == sent.key and at <= when]
        if not by or by[-1] not in not_run:
            continue
        if index not in took and not_run[by[-1]] >= when:
            continue  # sent before its result was recorded, and refused: the refusal itself
        what = "took effect" if index in took else "was sent"
        found.append(
            Violation(
                "told-not-run",
                f"{_short(sent.ref)} ({by[-1]}) {what} at {sent.at:.1f}, recorded as not run",
            )
        )
    return found


# Every unknown outcome put to someone; nobody left waiting


@checker("unasked", "a call whose outcome its sender could not know was never put to anyone")
def unasked(books: Books, records: Records) -> list[Violation]:
    if not records.finished:
        return []  # ``waiting`` says so
    found: list[Violation] = []
    executed = {d.ref for d in _settlements_that_stood(books, records, executed=True)}
    for sent in books.sent:
        if sent.known_at is not None or not books.changes_things(sent) or _acts_on_nothing(sent):
            continue
        asked = any(q.ref == sent.ref and q.at >= sent.at for q in books.questions)
        # "Executed", once it stood, answers every send of its call, even one that left after
        # it: a process held up past it can only make it truer (docs/design.md, deadlines 3;
        # "not executed" is refused until no send can follow).
        if not asked and sent.ref not in executed:
            found.append(
                Violation(
                    "unasked",
                    f"{_short(sent.ref)} ({sent.part}) sent by {sent.process} at {sent.at:.1f}; "
                    "nobody was asked what it came to",
                )
            )
    return found


@checker("waiting", "the run was left waiting after the calm end")
def waiting(books: Books, records: Records) -> list[Violation]:
    if records.finished:
        return []
    return [Violation("waiting", f"at the end the run is {records.shown}")]


# The audit chain: whole, and true both ways


@checker("audit", "the audit chain is broken, lacks a decision, or holds one nobody made")
def audit(books: Books, records: Records) -> list[Violation]:
    found = [Violation("audit", problem) for problem in records.chain_problems]
    found += _settlements_on_chain(records)
    found += _decisions_missing(books, records)
    found += _decisions_invented(books, records)
    found += _effects_missing(books, records)
    return found


def _effects_missing(books: Books, records: Records) -> list[Violation]:
    """Every WRITE that took effect is on the chain, once its run finished: the action that
    sent it completed (whatever it recorded: ``told-not-run`` judges that), its key settled by
    someone, or its late end noted. The request is matched to its action by the key it carried,
    which the action's ``loop.action_started`` names, and its end is the first completion of
    that action after it on the chain."""
    if not records.finished:
        return []  # a person may still be about to settle it: ``waiting`` says so
    # A completion ends the starts of its action before it on the chain (a call claimed
    # afresh starts again under the same key); a key whose every start is still open has no
    # end there, even if its action completed before (another plan's call of the same id).
    open_starts: dict[str, list[str]] = {}
    ended: set[str] = set()
    for event in sorted(records.events, key=lambda e: e.seq):
        action = str(event.data.get("action"))
        if event.type == "loop.action_started":
            open_starts.setdefault(action, []).append(str(event.data.get("idempotencyKey")))
        elif event.type == "loop.action_completed":
            ended.update(open_starts.pop(action, []))
    keyed = {
        str(e.data.get("idempotencyKey"))
        for e in records.of_type("loop.reconciled", "loop.late_result")
    }
    found: list[Violation] = []
    missing: set[str] = set()
    for effect in books.effects:
        sent = books.sent[effect.sent]
        if not sent.key or not books.changes_things(sent) or sent.key in missing:
            continue
        if sent.key in keyed or sent.key in ended:
            continue
        missing.add(sent.key)
        found.append(
            Violation(
                "audit",
                f"{_short(effect.ref)} took effect at {effect.at:.1f} (sent by {sent.process}, "
                f"key {sent.key[:12]}); the chain has no end of its call",
            )
        )
    return found


def _settlements_on_chain(records: Records) -> list[Violation]:
    """Every settlement the store holds is on the chain, as the store holds it."""
    found = []
    reconciled = {str(e.data.get("idempotencyKey")): e for e in records.of_type("loop.reconciled")}
    for key, view in sorted(records.keys.items()):
        if not view.source:
            continue
        event = reconciled.get(key)
        verdict = "executed" if view.state == "completed" else "abandoned"
        if event is None:
            found.append(Violation("audit", f"the settlement of {key[:12]} is not on the chain"))
        elif event.actor != view.settled_by or event.data.get("verdict") != verdict:
            found.append(
                Violation(
                    "audit",
                    f"{key[:12]}: the chain says {event.data.get('verdict')} by {event.actor}, "
                    f"the store {verdict} by {view.settled_by}",
                )
            )
    return found


def _decisions_missing(books: Books, records: Records) -> list[Violation]:
    """Every decision the product told its maker it recorded is on the chain."""
    found = []
    for decision in books.decisions:
        if not decision.told or decision.move or decision.source != "human":
            continue
        if decision.kind == "approve":
            kind = "loop.approved" if decision.yes else "loop.denied"
            on = any(
                e.actor == decision.by and e.data.get("action") == decision.action
                for e in records.of_type(kind)
            )
        else:
            verdict = "executed" if decision.yes else "abandoned"
            on = any(
                e.actor == decision.by
                and e.data.get("action") == decision.action
                and e.data.get("verdict") == verdict
                for e in records.of_type("loop.reconciled")
            )
        if not on:
            what = "approval" if decision.kind == "approve" and decision.yes else decision.kind
            found.append(
                Violation(
                    "audit",
                    f"{decision.by}'s {what} of {decision.action} at {decision.at:.1f} is "
                    "missing from the chain",
                )
            )
    return found


def _decisions_invented(books: Books, records: Records) -> list[Violation]:
    """Every decision on the chain was made by the one it names, before it was recorded: as
    many times as they made it (a copy of someone's entry is not their decision)."""
    found = []
    made = [d for d in books.decisions if not d.move]
    for kind, yes in (("loop.approved", True), ("loop.denied", False)):
        seen: Counter[tuple[str, str]] = Counter()
        for event in records.of_type(kind):
            slot = (event.actor, str(event.data.get("action")))
            seen[slot] += 1
            theirs = [
                d
                for d in made
                if d.kind == "approve"
                and d.by == event.actor
                and d.action == slot[1]
                and d.yes == yes
                and d.at <= event.at + STAMP_SLACK
            ]
            if len(theirs) < seen[slot]:
                word = "approval" if yes else "deny"
                found.append(
                    Violation(
                        "audit",
                        f"the chain records {event.actor}'s {word} of {slot[1]} at "
                        f"{event.at:.1f} ({seen[slot]} of them), made {len(theirs)} times",
                    )
                )
    for event in records.of_type("loop.reconciled"):
        verdict = event.data.get("verdict") == "executed"
        source = str(event.data.get("source") or "human")
        theirs = [
            d
            for d in made
            if d.kind == "settle"
            and d.source == source
            and d.by == event.actor
            and d.action == event.data.get("action")
            and d.yes == verdict
            and d.at <= event.at + STAMP_SLACK
        ]
        if not theirs:
            found.append(
                Violation(
                    "audit",
                    f"the chain records {event.actor}'s settlement of "
                    f"{event.data.get('action')} as {event.data.get('verdict')}, never made",
                )
            )
    return found


# Budgets


@checker("budget", "a budget was passed by more than one call")
def budget(books: Books, records: Records) -> list[Violation]:
    found = []
    limit = books.max_iterations
    if limit is not None:
        asked = max((a.iteration for a in books.asks if a.phase == "plan"), default=0)
        if asked > limit:
            found.append(
                Violation(
                    "budget", f"the model was asked to plan iteration {asked}, at most {limit}"
                )
            )
        if records.iteration > limit:
            found.append(Violation("budget", f"{records.iteration} iterations, at most {limit}"))
    if books.max_tokens is not None and records.tokens > books.max_tokens + books.call_tokens:
        found.append(
            Violation("budget", f"{records.tokens} tokens, budget at most {books.max_tokens}")
        )
    return found


@checker("spent", "something was acted on, or the model asked, once a budget was used up")
def spent(books: Books, records: Records) -> list[Violation]:
    """Nothing further once a budget is used up (ADR-0004, budgets; ``core/budgets.py``).

    Every model call's tokens are recorded with its answer (the plan's checkpoint, the
    verdict's), and a run's checkpoints hold one answer for each plan and each verdict of its
    iterations: so when a plan of iteration N is acted on, its run has recorded at least the
    tokens of N plans and N - 1 verdicts, and when the model is asked, those of every answer
    before it. The world knows what each answer cost (the model's own record), whatever the
    run recorded. Once those tokens pass the token budget of the process that acts (the spec
    it was given: edits take effect for a process as it starts), or their price at that
    spec's ``pricing`` passes its dollar budget, it calls no tool, READs included, of that plan
    or any later one, and asks the model nothing more: the call that crossed the budget is
    paid for, and its plan waits for a larger budget. Nor does it ask the model a question
    whose input alone would take those tokens (or dollars, at the input price) past the budget
    (the pre-call check): by the model's own count of that input, where the product's estimate
    of it, which the world reads off what the product sent, can have been no less
    (``_input_alone``). The iteration budget counts plans instead: no plan is asked for past
    it, and a plan asked for within it is acted on whole (an iteration is judged before it is
    planned). A time budget (``timeoutSeconds``, active seconds: a session's time from its start
    to its checkpoints, summed over the run's sessions; time stopped between them not counted)
    is judged before each question to the model: once the active time the world knows the
    process counted (``_carried``, ``_active_when_asked``) passes the budget of its spec, it
    asks nothing more (its sends are not judged for time: the moment of the check before a
    call is not one the world sees).
    """
    found: list[Violation] = []
    carried = _carried(books)
    for ask in books.asks:
        budget = _budget(books, ask.process)
        seconds = budget.get("timeoutSeconds")
        active = _active_when_asked(books, ask, carried)
        if seconds is not None and active is not None and active > float(str(seconds)) + 1e-6:
            found.append(
                Violation(
                    "spent",
                    f"{ask.process} asked the model ({ask.phase} {ask.iteration}) at "
                    f"{ask.at:.1f} after at least {active:.1f}s of active time, its budget "
                    f"{seconds}s",
                )
            )
        limit = budget.get("maxIterations")
        if ask.phase == "plan" and limit is not None and ask.iteration > int(str(limit)):
            found.append(
                Violation(
                    "spent",
                    f"{ask.process} asked the model to plan iteration {ask.iteration} at "
                    f"{ask.at:.1f}, its budget allowing {limit}",
                )
            )
        alone = _input_alone(ask)
        for spending in _spending(books, ask.process):
            used = _recorded_before(books, ask, spending.cost)
            ahead = spending.cost(alone)
            if used + ahead > spending.limit:
                why = (
                    ""
                    if used > spending.limit
                    else f", its input alone ({spending.said(ahead)}) passing"
                )
                found.append(
                    Violation(
                        "spent",
                        f"{ask.process} asked the model ({ask.phase} {ask.iteration}) at "
                        f"{ask.at:.1f} after {spending.said(used)}{why}, its budget "
                        f"{spending.said(spending.limit, unit=False)}",
                    )
                )
    for sent in books.sent:
        plans = books.plans_followed(sent) if sent.ref else []
        if not plans:
            continue
        for spending in _spending(books, sent.process):
            used = min(_recorded_with(books, plan, spending.cost) for plan in plans)
            if used > spending.limit:
                found.append(
                    Violation(
                        "spent",
                        f"{_short(sent.ref)}"
                        f"{'' if sent.part == 'request' else f' ({sent.part})'} sent by "
                        f"{sent.process} at {sent.at:.1f}, its plan (iteration "
                        f"{plans[0].iteration}) made after {spending.said(used)}, its budget "
                        f"{spending.said(spending.limit, unit=False)}",
                    )
                )
    return found


def _carried(books: Books) -> dict[str, float]:
    """The least active seconds each step process's session started from: what the latest
    checkpoint it could have loaded held at least, by the world's books alone.

    The product counts a run's active time in its checkpoints (``core/persistence.py``): a
    session counts from its start (``ProcessLife.clock_from``, the first reading of its loop's
    clock), and each checkpoint it saves holds what its session loaded plus the time since the
    start, on its machine's boot clock, as the save was asked for (``ProcessLife.saves``);
    nothing else adds any (a person's decision adds none), and the checkpoints follow one
    another, so each holds at least what every earlier one held. A save that returned before
    a session started was there for it to load (it loads after its start)."""
    lives = sorted(
        ((name, life) for name, life in books.processes.items() if life.clock_from is not None),
        key=lambda pair: pair[1].clock_from or 0.0,
    )
    carried: dict[str, float] = {}
    for name, life in lives:
        start = life.clock_from or 0.0
        loaded = 0.0
        for other, theirs in lives:
            if other not in carried or theirs.run != life.run:
                continue
            began = theirs.clock_from or 0.0
            for asked, returned, _ in theirs.saves:
                if returned < start:
                    loaded = max(loaded, carried[other] + asked - began)
        carried[name] = loaded
    return carried


def _active_when_asked(books: Books, ask: Ask, carried: Mapping[str, float]) -> float | None:
    """The least active seconds ``ask``'s process counted when it judged its budgets before
    asking (``Budgets.refusal``, on the session's clock): what its session started from, and
    the time from its start to its latest save of its own that returned before the question
    reached the model (booked before it: the save came before the judging, as nothing of its
    own is saved while it waits for the model, however long its retries take). None: not a
    step process's question."""
    life = books.processes.get(ask.process)
    if life is None or life.clock_from is None or ask.process not in carried:
        return None
    latest = max((r for _, r, order in life.saves if order < ask.order), default=life.clock_from)
    return carried[ask.process] + latest - life.clock_from


def _input_alone(ask: Ask) -> Ask:
    """What ``ask``'s input alone came to, as an answer that wrote nothing: the model's own
    count of it, where the product's estimate can have been no less (``Ask.estimate``, read
    off what it sent), else the estimate; nothing where the estimate is not known. The
    product refuses a model call whose estimated input alone would pass a budget (ADR-0004,
    "Pre-call budget check"); where its estimate falls short of the true input, the call it
    makes is still within its promise, so only the smaller of the two is held against it."""
    if not ask.estimate:
        return replace(ask, tokens=0, output_tokens=0)
    return replace(ask, tokens=min(ask.tokens - ask.output_tokens, ask.estimate), output_tokens=0)


def _budget(books: Books, process: str) -> Mapping[str, object]:
    """The budget of the spec ``process`` was given ({} if it is no version the owner kept)."""
    return _of_spec(books, process, "budget")


def _of_spec(books: Books, process: str, name: str) -> Mapping[str, object]:
    version = books.spec(books.generation_of(process))
    found = None if version is None else version.manifest.get(name)
    return found if isinstance(found, Mapping) else {}


@dataclass(frozen=True)
class _Spending:
    """One budget of what answers cost: its limit, and what one answer costs against it."""

    limit: Decimal
    cost: Callable[[Ask], Decimal]
    dollars: bool = False

    def said(self, amount: Decimal, *, unit: bool = True) -> str:
        if self.dollars:
            return f"${amount}"
        return f"{amount} tokens" if unit else str(amount)


def _spending(books: Books, process: str) -> list[_Spending]:
    """The budgets of what answers cost in the spec ``process`` was given: its tokens, and its
    dollars where the spec states the model's prices (``pricing``: dollars per million input
    and output tokens). An answer's dollars are the world's own sum, from the model's record
    of its input tokens (cached or not) and its output tokens, never the product's."""
    budget = _budget(books, process)
    found = []
    tokens = budget.get("tokens")
    if tokens is not None:
        found.append(_Spending(Decimal(str(tokens)), lambda ask: Decimal(ask.tokens)))
    dollars = budget.get("dollars")
    pricing = _of_spec(books, process, "pricing")
    per_input = pricing.get("inputPerMillionTokens")
    per_output = pricing.get("outputPerMillionTokens")
    if dollars is not None and per_input is not None and per_output is not None:
        prices = (Decimal(str(per_input)), Decimal(str(per_output)))

        def cost(ask: Ask) -> Decimal:
            written = ask.output_tokens
            return (prices[0] * (ask.tokens - written) + prices[1] * written) / 1_000_000

        found.append(_Spending(Decimal(str(dollars)), cost, dollars=True))
    return found


def _recorded_with(books: Books, plan: Ask, cost: Callable[[Ask], Decimal]) -> Decimal:
    """The least a run has recorded once it saved ``plan``: its iteration's plan and every plan
    and verdict of the iterations before (the cheapest answer of each, asked by then: the run
    records one of them)."""
    return _cheapest(books, plan.order + 1, cost, plans=plan.iteration, verdicts=plan.iteration - 1)


def _recorded_before(books: Books, ask: Ask, cost: Callable[[Ask], Decimal]) -> Decimal:
    """The least a run has recorded when it asks ``ask``: the answers of every plan and
    verdict before it (a verdict follows its iteration's plan)."""
    plans = ask.iteration - 1 if ask.phase == "plan" else ask.iteration
    return _cheapest(books, ask.order, cost, plans=plans, verdicts=ask.iteration - 1)


def _cheapest(
    books: Books, before: int, cost: Callable[[Ask], Decimal], *, plans: int, verdicts: int
) -> Decimal:
    cheapest: dict[tuple[str, int], Decimal] = {}
    for ask in books.asks:
        if ask.order >= before:
            continue
        slot = (ask.phase, ask.iteration)
        paid = cost(ask)
        cheapest[slot] = min(cheapest.get(slot, paid), paid)
    zero = Decimal(0)
    return sum((cheapest.get(("plan", i), zero) for i in range(1, plans + 1)), zero) + sum(
        (cheapest.get(("verify", i), zero) for i in range(1, verdicts + 1)), zero
    )


# A plan is saved before it runs, and never asked for again


@checker("replanned", "the model was asked again for a step whose plan had already been acted on")
def replanned(books: Books, records: Records) -> list[Violation]:
    """A plan is saved before any of its calls is sent (write-ahead), and a resume goes on from
    the saved plan: once a process sent a call of the plan it was given for an iteration, the
    model is never asked to plan that iteration again (a model asked again may plan otherwise,
    and its new calls run beside the old)."""
    found: list[Violation] = []
    for index, ask in enumerate(books.asks):
        if ask.phase != "plan":
            continue
        for earlier in books.asks[:index]:
            if earlier.phase != "plan" or earlier.iteration != ask.iteration:
                continue
            refs = {i.ref for i in earlier.intents}
            acted = next(
                (
                    s
                    for s in books.sent
                    if s.process == earlier.process
                    and s.ref in refs
                    and earlier.order < s.order < ask.order
                ),
                None,
            )
            # A process that started before the plan was acted on may still be asking (a
            # held-up step retrying its model call): its answer can no longer be saved. One
            # that started after read the saved plan, and must not ask.
            started = books.processes[ask.process].order if ask.process in books.processes else 0
            if acted is not None and (ask.process == earlier.process or started > acted.order):
                found.append(
                    Violation(
                        "replanned",
                        f"iteration {ask.iteration} asked again by {ask.process} at "
                        f"{ask.at:.1f}; {earlier.process} had sent {_short(acted.ref)} of its "
                        f"plan at {acted.at:.1f}",
                    )
                )
                break
    return found


# Nothing but what was planned


@checker("altered", "a call went out, or a plan was kept, that the model never planned")
def altered(books: Books, records: Records) -> list[Violation]:
    found: list[Violation] = []
    for sent in books.sent:
        intent = books.intent(sent.ref) if sent.ref else None
        if intent is None:
            found.append(
                Violation(
                    "altered", f"{sent.endpoint} by {sent.process}: no call of it was planned"
                )
            )
            continue
        changed = sorted(k for k, v in sent.args.items() if not _same(intent.args.get(k), v))
        if changed:
            found.append(
                Violation(
                    "altered",
                    f"{_short(sent.ref)} sent with {', '.join(changed)} other than planned",
                )
            )
    for action in records.planned:
        ref = str(action.args.get("ref", ""))
        intent = books.intent(ref)
        if intent is None or intent.tool != action.tool or dict(intent.args) != dict(action.args):
            found.append(
                Violation(
                    "altered",
                    f"the run's plan holds {action.action} ({action.tool}), "
                    "which the model never planned so",
                )
            )
    return found


def _same(planned: object, sent: object) -> bool:
    """Whether an argument went out as planned (a query string carries it as text)."""
    if planned == sent:
        return True
    if isinstance(sent, str) and not isinstance(planned, str):
        text = ("true" if planned else "false") if isinstance(planned, bool) else str(planned)
        return text == sent
    return False


# The verifier's limit


#: The limit on a run's rejections where its spec names none (``budget.maxVerifierRejections``'s
#: default in the contract and the CRD; a null, as the owner may write it, means no limit).
DEFAULT_REJECTIONS = 3


@checker("rejected", "a run went on after the verifier rejected it as often as its limit allows")
def rejected(books: Books, records: Records) -> list[Violation]:
    """The verifier's limit (ADR-0004, budgets; ``core/phases.py``, ``RunState.continues_under``):
    each rejection a run records counts, over the whole run; the one that brings the count to
    the limit of the spec its process was given stops the run for good, and only a spec whose
    limit lies above the count lets a resume go on. A limit lowered while a run goes on is met
    at its next rejection.

    Judged from the world's model alone: a run that asks for the plan of iteration N + 1 has
    recorded a verdict for every iteration up to N, one the model gave by then; where every
    verdict it gave for an iteration was a rejection, the run recorded a rejection for it. So
    the rejections of the iterations whose every verdict was one are a count the run reached at
    least (``_rejections_before``). Where every process the model rejected iteration N for was
    given a limit within that count, whichever of them recorded it stopped the run there; a
    process that then asks for the plan of iteration N + 1 under a limit within the count broke
    the promise. Nothing of a plan is sent before the plan is asked for, so the plans judge
    the sends too."""
    found: list[Violation] = []
    for ask in books.asks:
        if ask.phase != "plan" or ask.iteration < 2:
            continue
        verdicts = _verdicts(books, ask, ask.iteration - 1)
        if not verdicts or any(v.verdict != "reject" for v in verdicts):
            continue
        count = _rejections_before(books, ask)
        if not all(_stops_at(books, v.process, count) for v in verdicts):
            continue  # a process that rejection did not stop may have recorded it
        if not _stops_at(books, ask.process, count):
            continue  # its limit above the count (or none): a resume goes on
        limit = _budget(books, ask.process).get("maxVerifierRejections", DEFAULT_REJECTIONS)
        found.append(
            Violation(
                "rejected",
                f"{ask.process} asked the model to plan iteration {ask.iteration} at "
                f"{ask.at:.1f} after {count} rejection(s), its limit {limit}",
            )
        )
    return found


def _stops_at(books: Books, process: str, count: int) -> bool:
    """Whether ``process`` stops a run (or keeps it stopped) at ``count`` rejections: the spec
    it was given has a limit within the count (False for a spec the owner never kept: its
    limit is not known)."""
    if books.spec(books.generation_of(process)) is None:
        return False
    limit = _budget(books, process).get("maxVerifierRejections", DEFAULT_REJECTIONS)
    return limit is not None and int(str(limit)) <= count


def _verdicts(books: Books, ask: Ask, iteration: int) -> list[Ask]:
    """The verdicts the model gave for ``iteration`` of ``ask``'s run before ``ask``."""
    return [
        a
        for a in books.asks
        if a.phase == "verify"
        and a.run == ask.run
        and a.iteration == iteration
        and a.order < ask.order
    ]


def _rejections_before(books: Books, ask: Ask) -> int:
    """The rejections ``ask``'s run had recorded at least when it asked (a plan's ask): those
    of the iterations before it whose every verdict given by then was a rejection."""
    count = 0
    for iteration in range(1, ask.iteration):
        verdicts = _verdicts(books, ask, iteration)
        count += bool(verdicts) and all(v.verdict == "reject" for v in verdicts)
    return count


# One cluster drives a run at a time


@checker("two-drivers", "two clusters' step processes drove the run at once")
def two_drivers(books: Books, records: Records) -> list[Violation]:
    """With two clusters over one store, the store is the arbiter of who drives the run: one
    holder at a time, each under an epoch of its own, a later take under a later epoch, every
    write of an earlier epoch refused from then on. Judged from the world's own record of what
    each step process did (``ProcessLife.wrote``: the windows it passed right after a write of
    its own landed) and of the epoch its pod gave it (read off the pod by its kubelet): two
    clusters' processes that wrote under one epoch (or none) drove the run together, and one
    that wrote after another cluster's process had written under a later epoch drove it past
    its holder's take. A partitioned old holder may still send a call it claimed before (the
    store cannot stop a send): that is the other promises' to judge, not this one's."""
    lives = [(name, life) for name, life in books.processes.items() if life.cluster and life.wrote]
    for name, life in lives:
        for other, theirs in lives:
            if theirs.cluster == life.cluster:
                continue
            if theirs.epoch == life.epoch and name < other:
                return [
                    Violation(
                        "two-drivers",
                        f"{name} and {other} wrote the run from two clusters under one epoch "
                        f"({life.epoch})",
                    )
                ]
            mine, later = -1 if life.epoch is None else life.epoch, theirs.epoch
            if later is not None and later > mine and life.wrote[-1] > theirs.wrote[0]:
                return [
                    Violation(
                        "two-drivers",
                        f"{name} (epoch {life.epoch}) wrote the run after {other} of the other "
                        f"cluster had written it under epoch {later}",
                    )
                ]
    return []
