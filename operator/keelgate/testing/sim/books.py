"""The world's own books: what really happened in one simulated run, kept by the world alone.

Why it exists: a judge that reads the product's records passes a product that lies in them (a
key that changes, a decision recorded that nobody made, a deny read as a yes). So every actor of
the world writes down, as it acts, what it did and saw, in the world's own terms, and the oracle
(``keelgate.testing.sim.checkers``) judges every promise from these books; the product's
records are only ever compared with them. The world's identity of a call is its ``ref``: the
model puts one in the arguments of every call it plans (the same ref for the same call planned
again), the shop reads it from the request it receives, and people read it from the call they
are shown. The product's idempotency key is written down only as a request carried it on the
wire, never used to tell two calls apart.

Why one module past 500 lines: every page of the books (plans, calls, effects, decisions,
settlements, step writes of two clusters) is read by the same checkers side by side, and one
file keeps each fact's record and the questions asked of it together.

This module must never import the product's logic: it holds facts, and the few questions the
checkers ask of them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from keelgate.core.exits import EXIT_RESUMABLE
from keelgate.testing.sim.world import Clocks

#: The people of every run: their groups as the API server authenticates them. alice creates
#: the run; two people (bob, carol) are in every group a rule may name, so that any rule the
#: desk draws, however edits combine it, can be met without alice; the ServiceAccount ``ci``
#: only ever acts for someone (``Decision.human``).
GROUPS: Mapping[str, tuple[str, ...]] = {
    "alice": ("shop-devs",),
    "bob": ("payments-approvers", "shop-devs"),
    "carol": ("payments-approvers", "shop-devs"),
    "dave": ("shop-devs",),
}
CREATOR = "alice"
SERVICE_ACCOUNT = "system:serviceaccount:shop:ci"


@dataclass(frozen=True)
class Rule:
    """An approval rule as the world reads a manifest's tool (``required`` 0: none). A person
    counts only if in one group of each of ``groups`` (no lists: anyone); a ServiceAccount
    may decide only under a rule with ``service_accounts`` (docs/manifest.md, approval rules:
    ``serviceAccounts``)."""

    required: int = 0
    groups: tuple[tuple[str, ...], ...] = ()
    not_creator: bool = False
    expires_after: float | None = None
    service_accounts: bool = False

    def stricter(self, other: Rule) -> Rule:
        """Both rules at once (the world's reading of "a saved action keeps its rule")."""
        if not self.required:
            return other
        if not other.required:
            return self
        expiries = [e for e in (self.expires_after, other.expires_after) if e is not None]
        return Rule(
            max(self.required, other.required),
            tuple(dict.fromkeys((*self.groups, *other.groups))),
            self.not_creator or other.not_creator,
            min(expiries) if expiries else None,
            # "ServiceAccounts only if both let them" (docs/manifest.md).
            self.service_accounts and other.service_accounts,
        )

    def admits(self, person: str) -> bool:
        """Whether ``person`` (a real person, by the groups they really are in) may count."""
        if self.not_creator and person == CREATOR:
            return False
        return self.may_decide(person)

    def may_decide(self, person: str) -> bool:
        """Whether ``person`` is one the rule asks at all (its groups): their deny denies."""
        mine = GROUPS.get(person, ())
        return all(any(g in mine for g in names) for names in self.groups)


def rule_of(tool: Mapping[str, Any]) -> Rule:
    """The approval rule of a manifest's tool entry, as its owner wrote it."""
    rule = tool.get("approval")
    if isinstance(rule, Mapping):
        expires = rule.get("expiresAfter")
        groups = tuple(sorted(rule.get("groups") or ()))
        return Rule(
            int(rule.get("required", 1)),
            (groups,) if groups else (),
            bool(rule.get("notCreator", False)),
            None if expires is None else float(str(expires).rstrip("s")),  # the desk's "60s"
            bool(rule.get("serviceAccounts", False)),
        )
    return Rule(1) if tool.get("requiresApproval") else Rule()


def definition(tool: Mapping[str, Any] | None) -> str:
    """What decides where a tool's call goes, in one line: its HTTP method and URL, its MCP
    server and tool, its Python callable (an approval is of the call to this)."""
    if tool is None:
        return ""
    if "http" in tool:
        return f"{tool['http'].get('method', 'GET')} {tool['http']['url']}"
    if "mcp" in tool:
        return f"mcp {tool['mcp']['url']} {tool['mcp'].get('tool') or tool['name']}"
    return f"python {tool.get('python', {}).get('callable', '')}"


#: Between a call's ref and the tick it was planned in (``p1@t2``: the call ``p1`` of tick 2).
TICK_MARK = "@t"


def tick_ref(ref: str, tick: str) -> str:
    """The ref of the call ``ref`` planned in the monitor's tick ``tick`` (``<name>.tick-<n>``):
    the same call in another tick is another call of the world's, the same request again."""
    return f"{ref}{TICK_MARK}{tick.rsplit('-', 1)[1]}"


def tick_of(ref: str) -> tuple[str, int]:
    """The call a tick's ref is of, and its tick's number (0: a ref of no tick)."""
    base, mark, number = ref.rpartition(TICK_MARK)
    if not mark or not number.isdigit():
        return ref, 0
    return base, int(number)


@dataclass(frozen=True)
class Intent:
    """A call the model planned: the world's identity of it is ``ref``."""

    ref: str
    tool: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class Ask:
    """One question the model was asked, and its answer as it left the model."""

    at: float
    process: str
    phase: str  # plan | verify
    iteration: int
    intents: tuple[Intent, ...] = ()
    done: bool = False
    verdict: str = "accept"
    tokens: int = 0
    #: Its place among everything booked (moments can be equal; the order never is).
    order: int = 0
    #: The monitor's tick it was asked in (its run's name; "" for a run that is no monitor).
    run: str = ""
    #: Of ``tokens``, those the model wrote (an output token is priced apart); the rest are
    #: its input, every one of them, cached or not.
    output_tokens: int = 0
    #: The least the product's own estimate of the question's input can have been, read off
    #: what it sent (``model.estimate_floor``); 0: not known.
    estimate: int = 0


@dataclass
class Sent:
    """A request that left a process (its bytes on the wire), and what became of it."""

    at: float
    process: str
    ref: str
    part: str  # request, or a composite call's charge or receipt
    endpoint: str  # "METHOD URL", as the shop received it (or would have)
    args: Mapping[str, Any]
    key: str  # the Idempotency-Key it carried ("" for none)
    reached: bool = False  # the shop received it
    #: When its sender learned for sure what it came to: an answer that says it took effect,
    #: or a definite refusal (None: never; a timeout, a reset, a 5xx, a death say nothing).
    known_at: float | None = None
    refused: bool = False  # answered with a definite refusal (nothing happened)
    order: int = 0  # its place among everything booked


@dataclass(frozen=True)
class Effect:
    """A change a downstream system made, and the request that made it."""

    at: float
    ref: str
    part: str
    sent: int  # index into ``Books.sent``


@dataclass
class Decision:
    """A decision as its maker made it: an approval (``approve``) or a settlement (``settle``),
    by a person, or by the confirmer (``by`` "shop-confirmer")."""

    at: float
    kind: str  # approve | settle
    by: str  # the name it was made under
    human: str  # who really made it (a ServiceAccount acts for a person)
    action: str  # the label the maker was shown (the run's action id)
    ref: str  # the call the maker was shown
    yes: bool  # approved / executed
    groups: tuple[str, ...] = ()
    #: The tool's definition as it stood when the decision was made (what was approved).
    shown: str = ""
    #: The definitions it may have stood at instead, as far as the world can tell (``Books.
    #: might_have_shown``): a step that ended without recording may have bound the call anew.
    shown_also: tuple[str, ...] = ()
    #: A settlement: whether it was true when made (the shop's ledger says).
    truthful: bool = True
    #: When it came to stand: the product told its maker so (local mode), or it was made on
    #: an object still waiting for it and admitted (operator mode). None: it never did.
    accepted_at: float | None = None
    #: Whether the product told its maker it was recorded (then the chain must show it).
    told: bool = False
    source: str = "human"  # human | confirmer
    #: Made by copying, moving or replaying an entry someone else made (issue 46's moves): not
    #: a decision of ``by`` at all, only what the object now shows.
    move: str = ""
    #: With two clusters: the cluster whose object it was made on, and when that cluster's
    #: operator showed it refused there (``not counted here``: the run held by the other), its
    #: maker told it does not count. None: never refused so.
    cluster: str = ""
    refused_at: float | None = None
    #: With two clusters: made on an object of a cluster, and when an operator of that cluster
    #: first looked at the object after it (None: none did; it may have stopped first, or none
    #: ran there). A deny binds from then: nothing of the product could read it before.
    unread: bool = False
    read_at: float | None = None


@dataclass(frozen=True)
class Question:
    """An unknown outcome put to someone (a person shown it, the confirmer asked)."""

    at: float
    to: str
    action: str
    ref: str


@dataclass(frozen=True)
class SpecVersion:
    """One version of the run's manifest as its owner kept it, in force from ``at``."""

    generation: int
    at: float
    manifest: Mapping[str, Any]

    def tool(self, name: str) -> Mapping[str, Any] | None:
        return next((t for t in self.manifest.get("tools") or () if t.get("name") == name), None)

    def rule(self, name: str) -> Rule:
        tool = self.tool(name)
        return Rule() if tool is None else rule_of(tool)


@dataclass
class ProcessLife:
    """A step process: when it started, under which version of the spec, how it ended."""

    started: float
    order: int = 0  # its place among everything booked, when it started
    generation: int = 0
    ended: float | None = None
    code: int | None = None
    #: The monitor's tick it drove (its run's name; "" for a step of a run that is no monitor).
    run: str = ""
    #: Whether its end says it recorded where its run stands before it exited (a goal met, a
    #: stop, a failure: ``keelgate.core.exits.RECORDED``); a step that died, or could not
    #: reach its store, may have saved part of its work or none.
    recorded: bool = False
    #: The cluster whose kubelet ran it ("" with one cluster), and the epoch its pod was given
    #: (``KEELGATE_EPOCH``, None: none), as the kubelet read them off the pod it started.
    cluster: str = ""
    epoch: int | None = None
    #: With two clusters: the places (``Books.next_order``) where its own writes landed in the
    #: store (a plan, an action's or the iteration's checkpoint, a verdict: each seen at the
    #: window right after it, however late its answer was heard): where it drove the run, by
    #: the world's own record.
    wrote: list[int] = field(default_factory=list)
    #: Its boot clock when its loop first read it (the session's start, from which the product
    #: counts its active time: ``Checkpointer.mark``), and, for each checkpoint save of its
    #: own that returned (it landed), the boot clock when the save was asked for (the moment
    #: the product took its active time at: nothing runs between) and when it returned, and
    #: its place among everything booked then (``Books.next_order``: moments can be equal). Read
    #: off the world's clock as the product read it, never off the product's usage; its main
    #: flow only (a late call's save, after its session stopped, counts no time of its own).
    clock_from: float | None = None
    saves: list[tuple[float, float, int]] = field(default_factory=list)


@dataclass
class Books:
    """Everything the world knows happened in one run."""

    clocks: Clocks = field(default_factory=Clocks)
    asks: list[Ask] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    specs: list[SpecVersion] = field(default_factory=list)
    processes: dict[str, ProcessLife] = field(default_factory=dict)
    #: The call time limit every WRITE's tool has, and the write deadline's margin: the longest
    #: a request may leave after the gate let it through.
    call_seconds: float = 30.0
    #: What spun, when the world stopped on a busy loop (``world.SPIN``); "" when nothing did.
    spun: str = ""
    #: The largest budgets ever set (None: unlimited at some point), and one call's tokens.
    max_iterations: int | None = None
    max_tokens: int | None = None
    call_tokens: int = 0
    #: The plans (their asks' ``order``) their steps saved for sure, and those whose save may
    #: have landed while its answer was lost.
    saved: set[int] = field(default_factory=set)
    unsure: set[int] = field(default_factory=set)
    _booked: int = 0

    def next_order(self) -> int:
        """The place of the next thing booked (``Ask.order``, ``Sent.order``)."""
        self._booked += 1
        return self._booked

    def of_tick(self, number: int) -> Books:
        """The books of one tick of a monitor (a run of its own): its questions to the model,
        its calls' requests, effects, decisions and questions (by their refs' tick, a request
        of no planned call by its sender's tick); the rest (spec versions, processes, budgets)
        as they are."""

        def mine(ref: str, process: str) -> bool:
            tick = tick_of(ref)[1]
            if tick:
                return tick == number
            life = self.processes.get(process)
            return life is not None and life.run.endswith(f"-{number}")

        kept = [i for i, s in enumerate(self.sent) if mine(s.ref, s.process)]
        index = {old: new for new, old in enumerate(kept)}
        return replace(
            self,
            asks=[a for a in self.asks if a.run.endswith(f"-{number}")],
            sent=[self.sent[i] for i in kept],
            effects=[replace(e, sent=index[e.sent]) for e in self.effects if e.sent in index],
            decisions=[d for d in self.decisions if tick_of(d.ref)[1] == number],
            questions=[q for q in self.questions if tick_of(q.ref)[1] == number],
        )

    # Questions the checkers ask

    def intent(self, ref: str) -> Intent | None:
        for ask in self.asks:
            for intent in ask.intents:
                if intent.ref == ref:
                    return intent
        return None

    def planned_before(self, ref: str, order: int) -> Ask | None:
        """The newest answer that planned ``ref`` before the thing booked at ``order``."""
        found = None
        for ask in self.asks:
            if ask.order < order and any(i.ref == ref for i in ask.intents):
                found = ask
        return found

    def plan_saved(self, process: str) -> None:
        """``process`` saved the plan it was given (it passed the window right after the save):
        the steps started after it read that plan."""
        ask = self._last_plan_of(process)
        if ask is not None:
            self.saved.add(ask.order)

    def answer_lost(self, process: str) -> None:
        """A store answer to ``process`` was lost: the plan it was given and had not saved may
        have been saved unheard (a commit whose answer never came)."""
        ask = self._last_plan_of(process)
        if ask is not None and ask.order not in self.saved:
            self.unsure.add(ask.order)

    def _last_plan_of(self, process: str) -> Ask | None:
        return next(
            (a for a in reversed(self.asks) if a.process == process and a.phase == "plan"), None
        )

    def plans_followed(self, sent: Sent) -> list[Ask]:
        """The answers whose plan a request's sender may have been following: the newest that
        planned its call asked by the sender itself; else the newest saved before the sender
        started (a step reads the saved plan once, as it starts), with any newer whose save
        may have landed unheard; only those, when the model was asked to plan again after that
        newest save and before the sender started (the plan it saved was done by then). A plan
        asked but never saved (its step fenced off, dead before
        the save) or saved while the sender ran was never the sender's: a held-up step goes on
        with the plan it read, however the spec was edited since. Where the books know of no
        save (a history written by hand), the newest before the sender started."""
        life = self.processes.get(sent.process)
        if life is None:
            plan = self.planned_before(sent.ref, sent.order)
            return [] if plan is None else [plan]
        planning = [
            a
            for a in self.asks
            if a.order < sent.order and any(i.ref == sent.ref for i in a.intents)
        ]
        own = [a for a in planning if a.process == sent.process]
        if own:
            return own[-1:]
        before = [a for a in planning if a.order < life.order]
        saved = [a for a in before if a.order in self.saved]
        saved += [a for a in before if a.order in self.unsure and self._landed(a, life.order)]
        saved.sort(key=lambda a: a.order)
        if not saved:
            return before[-1:]
        unheard = [a for a in before if a.order > saved[-1].order and a.order in self.unsure]
        if unheard and any(
            a.phase == "plan"
            and a.iteration > saved[-1].iteration
            and saved[-1].order < a.order < life.order
            for a in self.asks
        ):
            # The model was asked to plan a later iteration after that save, before the sender
            # started: the step that asked had read that plan done, so no later step followed
            # it. The sender followed one of those unheard saves (its own call proves one
            # landed: a step that read none would have asked the model itself).
            return unheard
        return [saved[-1], *unheard]

    def _landed(self, ask: Ask, before: int) -> bool:
        """Whether an answer whose save may have landed unheard did land before the process
        that started at ``before``: a process that started after it was asked, and before that
        one, sent a call only this answer had planned, never planned by that process itself (it
        could have read it only from the saved plan)."""
        earlier = {i.ref for a in self.asks if a.order < ask.order for i in a.intents}
        fresh = {i.ref for i in ask.intents} - earlier
        for sent in self.sent:
            life = self.processes.get(sent.process)
            if sent.ref not in fresh or life is None or not ask.order < life.order < before:
                continue
            own = any(
                a.process == sent.process and any(i.ref == sent.ref for i in a.intents)
                for a in self.asks
            )
            if not own:
                return True
        return False

    def versions_of(self, sent: Sent) -> list[SpecVersion]:
        """The versions of the spec a request's call was planned under and sent under (the
        processes' own, as the world gave them)."""
        found = []
        for process in (*(plan.process for plan in self.plans_followed(sent)), sent.process):
            version = self.spec(self.generation_of(process)) if process else None
            if version is not None:
                found.append(version)
        return found

    def changes_things(self, sent: Sent) -> bool:
        """Whether a request's call is a WRITE or PROPOSE: its tool's class as planned, made
        stricter by the sender's spec (a READ is the spec owner's word that nothing changes)."""
        intent = self.intent(sent.ref)
        if intent is None:
            return bool(sent.key)
        classes = [
            str(tool.get("sideEffect"))
            for version in self.versions_of(sent)
            if (tool := version.tool(intent.tool)) is not None
        ]
        return not classes or any(c != "READ" for c in classes)

    def spec_at(self, at: float) -> SpecVersion | None:
        found = None
        for version in self.specs:
            if version.at <= at:
                found = version
        return found

    def spec(self, generation: int) -> SpecVersion | None:
        return next((v for v in self.specs if v.generation == generation), None)

    def shown(self, tool: str, at: float, manifest: Mapping[str, Any] | None) -> str:
        """Where the call a person approves at ``at`` goes, as they are shown it (``keelgate
        pending``, an Approval): the tool as the step that stopped the run to ask defined it
        (the last step to have ended on a stop for a person, ``EXIT_RESUMABLE``: one that died
        or lost its store first recorded nothing, and shows nothing), not as ``manifest`` (the
        spec now) may have been edited since: the run binds a later edit anew, and asks
        again."""
        ended = [
            life for life in self.processes.values() if life.ended is not None and life.ended <= at
        ]
        ended = [life for life in ended if life.code == EXIT_RESUMABLE] or ended
        asked = self.spec(max(ended, key=lambda life: life.order).generation) if ended else None
        found = asked.tool(tool) if asked is not None else None
        return definition(found if found is not None else manifest)

    def might_have_shown(
        self, tool: str, at: float, manifest: Mapping[str, Any] | None
    ) -> tuple[str, ...]:
        """Where else the call a person approves at ``at`` may go as they are shown it, besides
        ``shown``'s, as far as the world can tell: where the newest step to have ended did not
        record where its run stands (it died, or lost its store), the run may still be bound as
        an earlier one left it, back to the newest step that did record; and a step still
        running may already have bound the call anew and stopped the run to ask (its stop
        recorded, its store's answer late). A step binds an edited tool anew only as it acts."""
        lives = sorted(self.processes.values(), key=lambda life: life.order)
        ended = [life for life in lives if life.ended is not None and life.ended <= at]
        running = [
            life for life in lives if life.started <= at and (life.ended is None or life.ended > at)
        ]
        earlier: list[ProcessLife] = []
        # The newest to have ended without saying it recorded (it died, or lost its store) may
        # still have recorded its stop first (a store lost after the stop's commit): it, and
        # each one before it back to the newest that did record, may be what is shown.
        for life in reversed(ended if ended and not ended[-1].recorded else []):
            earlier.append(life)
            if life.recorded:
                break
        also: list[str] = []
        for life in (*earlier, *running):
            version = self.spec(life.generation)
            found = version.tool(tool) if version is not None else None
            also.append(definition(found if found is not None else manifest))
        return tuple(dict.fromkeys(also))

    def generation_of(self, process: str) -> int:
        life = self.processes.get(process)
        return 0 if life is None else life.generation

    def happened(self, ref: str, before: float) -> bool:
        """Whether any request of the call ``ref`` took effect at or before ``before``."""
        return any(e.ref == ref and e.at <= before for e in self.effects)

    def stamp(self, at: float) -> float:
        """``at`` as a product's audit stamp made then reads back (its wall clock, to the
        millisecond, cut): what compares with the product's stamps."""
        text = dt.datetime.fromtimestamp(self.clocks.wall(at), dt.UTC).isoformat(
            timespec="milliseconds"
        )
        return dt.datetime.fromisoformat(text).timestamp()

    def true_of_stamp(self, stamp: float) -> float:
        """The world moment a product stamp was made at (its wall clock read back)."""
        return self.clocks.true_of_wall(stamp)
