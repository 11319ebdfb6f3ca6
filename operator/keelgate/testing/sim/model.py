"""The simulated model and the scenario it follows: what each iteration plans, what it costs.

Why it exists: the loop must be driven by something that plans WRITEs the way a model does:
several per iteration, the same call again (the same ``ref``, the same arguments, so the same
key), a READ between, a composite WRITE (``pay``), a verifier that sometimes rejects, and, asked
again for an iteration it already answered, now and then a different plan (``Scenario.again``).
The scenario is drawn from the schedule before anything runs, so a shrunk schedule also shrinks
the story. The world's model (``Planner``) answers from the scenario and the question alone, and
books every question and answer (``Books.asks``), with the ref it put into each planned call's
arguments: the world's own identity of the call. It answers in process (``SimModel``, a user's
function for the product's ``python`` provider, in its dict form) or over HTTP to the product's
own OpenAI and Anthropic adapters (``keelgate.testing.sim.modelserver``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from keelgate.core.model import ModelReply, PlannedCall
from keelgate.core.types import Usage
from keelgate.testing.sim.books import Ask, Books, Intent, tick_ref
from keelgate.testing.sim.world import Schedule, World

SKUS = ("A1", "B2", "C3")
TOOL_CHOICES = ("place_order", "place_order", "notify", "check_stock", "pay")
#: A model's prices in a run with a dollar budget: dollars per million input and output tokens,
#: output dearer than input (four to eight times), as providers price them.
PRICES: tuple[tuple[str, str], ...] = (("3", "15"), ("2.5", "10"), ("1.25", "10"), ("0.8", "4"))


@dataclass(frozen=True)
class Scenario:
    """One run's story: the plans of its iterations (the last is "done"), and its settings."""

    plans: tuple[tuple[PlannedCall, ...], ...]
    rejected: frozenset[int]  # iterations whose verifier says "reject"
    approval: frozenset[str]  # tools asking for approval at the start
    max_iterations: int | None
    tokens: int | None
    confirmer: bool
    input_tokens: int
    output_tokens: int
    #: How many different people each of those tools' calls needs (1 or 2).
    approvers: int = 1
    #: For some plans, the plan the model gives instead when asked for it a second time.
    again: Mapping[int, tuple[PlannedCall, ...]] = field(default_factory=dict)
    #: The iterations whose plan the model answers at length, ``long_tokens`` of output more
    #: (runs with a token budget only): the product's estimate before a call reads its input,
    #: never its output, so only a long answer takes a run past its budget in one call.
    long_answers: frozenset[int] = frozenset()
    long_tokens: int = 0
    #: The model's prices (dollars per million input and output tokens, as the manifest's
    #: ``spec.pricing`` says them) and the dollar budget (``spec.budget.dollars``), in a run
    #: with one (``dollar_budgets``); None in the others. Out of the scenario's line in the
    #: trace, which reads as before they came (the desk says them).
    pricing: tuple[str, str] | None = field(default=None, repr=False)
    dollars: str | None = field(default=None, repr=False)

    @classmethod
    def drawn(
        cls, schedule: Schedule, *, rejections: int = 150, dollar_budgets: bool = False
    ) -> Scenario:
        """One story from ``schedule``; the verifier rejects each iteration with ``rejections``
        in a thousand (the same draws whatever its value). ``dollar_budgets`` (the whole world
        only): half the runs have a dollar budget too, read from a choice already made (no draw
        of its own)."""
        refs: dict[str, str] = {}
        iterations = 1 + schedule.pick(4)
        plans = tuple(_plan(schedule, refs) for _ in range(iterations))
        rejected = frozenset(i + 1 for i in range(iterations) if schedule.chance(rejections))
        approval = frozenset(
            tool for tool in ("place_order", "notify", "pay") if schedule.chance(300)
        )
        limit = schedule.pick(3)
        max_iterations = None if limit == 0 else iterations + len(rejected) - 1 + limit
        tokens: int | None = None
        long_answers: frozenset[int] = frozenset()
        long_tokens = 0
        token_budget, rest = schedule.chance_and_rest(250)
        if token_budget:
            # One draw, as ``pick(10)`` made it: its remainder is the budget, the rest of it
            # says which answers are long (none for the calm draw).
            drawn = schedule.raw()
            tokens = 1500 + 200 * (drawn % 10)
            long_answers, long_tokens = _long_answers(drawn // 10)
        confirmer = schedule.chance(300)
        input_tokens = 80 + 10 * schedule.pick(5)
        output_tokens = 20 + 10 * schedule.pick(4)
        again = {i: _plan(schedule, refs) for i in range(iterations) if schedule.chance(200)}
        pricing, dollars = (
            _dollar_budget(rest, input_tokens, output_tokens) if dollar_budgets else (None, None)
        )
        return cls(
            plans=plans,
            rejected=rejected,
            approval=approval,
            max_iterations=max_iterations,
            tokens=tokens,
            confirmer=confirmer,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            # Read from a choice already made (no new draw): two people for about half the
            # runs that ask for approval.
            approvers=2 if approval and (output_tokens // 10) % 2 == 1 else 1,
            again=again,
            long_answers=long_answers,
            long_tokens=long_tokens,
            pricing=pricing,
            dollars=dollars,
        )

    @property
    def quote(self) -> bool:
        """Whether ``pay`` asks for a quote before it charges (read from a choice already made:
        half the runs)."""
        return (self.input_tokens // 10) % 2 == 0

    @property
    def answer_dollars(self) -> Decimal:
        """What a plain answer costs at the run's prices (0 without)."""
        if self.pricing is None:
            return Decimal(0)
        return dollars_of(self.pricing, self.input_tokens, self.output_tokens)

    @property
    def call_tokens(self) -> int:
        """The most one answer costs (a long one, where the run has any)."""
        longest = self.long_tokens if self.long_answers else 0
        return self.input_tokens + self.output_tokens + longest

    def usage(self, question: Question) -> Usage:
        """What the model's answer to ``question`` costs, as it reports it."""
        long = question.phase == "plan" and question.iteration in self.long_answers
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens + (self.long_tokens if long else 0),
        )


def _long_answers(bits: int) -> tuple[frozenset[int], int]:
    """Which plans of a run with a token budget the model answers at length, and how many
    tokens more, read from ``bits`` (none for the calm draw): three plans in four, 500 to 1,400
    tokens more (a model that reasons aloud; a request's estimate in this world is 150 to 800
    tokens, a plain answer 100 to 170): so a run reaches its budget, and one answer may cross
    it."""
    iterations = frozenset(i for i in range(1, 9) if (bits >> (2 * i)) % 4)
    return iterations, (500 + 300 * (bits % 4)) if iterations else 0


def dollars_of(pricing: tuple[str, str], input_tokens: int, output_tokens: int) -> Decimal:
    """What an answer of these tokens costs at ``pricing`` (dollars per million input and
    output tokens): the world's own sum, never the product's."""
    per_input, per_output = (Decimal(price) for price in pricing)
    return (per_input * input_tokens + per_output * output_tokens) / 1_000_000


def _dollar_budget(
    bits: int, input_tokens: int, output_tokens: int
) -> tuple[tuple[str, str] | None, str | None]:
    """Whether a run has a dollar budget, its model's prices and the budget, read from ``bits``
    (none for the calm draw): half the runs, at one of ``PRICES``, a budget of two and a half
    to eight and a half plain answers (a run's iterations take three to nine), so that a run
    reaches it and an answer crosses it."""
    if bits % 2 == 0:
        return None, None
    pricing = PRICES[(bits // 2) % len(PRICES)]
    budget = dollars_of(pricing, input_tokens, output_tokens) * (5 + 2 * ((bits // 8) % 7)) / 2
    return pricing, dollars_text(budget)


def dollars_text(amount: Decimal) -> str:
    """An amount as a manifest's decimal string says it (never in exponent form)."""
    return format(amount, "f")


def _plan(schedule: Schedule, refs: dict[str, str]) -> tuple[PlannedCall, ...]:
    calls: list[PlannedCall] = []
    for _ in range(1 + schedule.pick(3)):
        tool = TOOL_CHOICES[schedule.pick(len(TOOL_CHOICES))]
        args: dict[str, Any] = {"sku": SKUS[schedule.pick(len(SKUS))]}
        if tool == "place_order":
            args["qty"] = 1 + schedule.pick(2)
        elif tool == "pay":
            args["amount"] = 10 * (1 + schedule.pick(3))
        # The world's identity of the call: the same call (tool and arguments) planned again
        # is the same ref, so the same arguments, so the same key.
        content = f"{tool}:{sorted(args.items())}"
        ref = refs.setdefault(content, f"{tool[:1]}{len(refs) + 1}")
        calls.append(PlannedCall(tool, {**args, "ref": ref}))
    return tuple(calls)


@dataclass(frozen=True)
class Question:
    """A question to the model, as the world reads it off the request (in process or on the
    wire): its phase and iteration, how many plans the conversation shows carried out, and
    whether this iteration was rejected before."""

    phase: str
    iteration: int
    acted: int  # plans the history shows (made and carried out), less those rejected
    rejected_before: bool


class Planner:
    """The world's model: answers from the scenario, books every question and answer."""

    def __init__(
        self, world: World, scenario: Scenario, books: Books, *, reordered: bool = False
    ) -> None:
        self.world = world
        self.scenario = scenario
        self.books = books
        #: A call planned before is given with its arguments in another order every other
        #: time (``Options.reordered_args``): a model writes a call's JSON object afresh each
        #: time it plans it, and nothing holds it to one order of its keys. How many times
        #: each call (by its ref) was planned so far.
        self.reordered = reordered
        self._planned: Counter[str] = Counter()
        self._asked: Counter[tuple[str, int]] = Counter()
        #: A monitor's tick processes and the tick each drives (its run's name): each tick is
        #: a run of its own, so its calls are the world's calls of that tick (``tick_ref``).
        self.ticks: dict[str, str] = {}

    def answer(self, question: Question, *, estimate: int = 0) -> ModelReply:
        """The model's answer to ``question``, booked with what it cost and ``estimate``
        (``estimate_floor`` of what the product sent; 0: not known)."""
        scenario = self.scenario
        usage = scenario.usage(question)
        if question.phase == "verify":
            reject = question.iteration in scenario.rejected and not question.rejected_before
            verdict = "reject" if reject else "accept"
            self._book(question, (), usage, estimate, done=False, verdict=verdict)
            if reject:
                return ModelReply(verdict="reject", reason="try again", usage=usage)
            return ModelReply(usage=usage)
        tick = self.ticks.get(self.world.actor, "")
        self._asked[tick, question.iteration] += 1
        index = max(0, question.acted)
        if index >= len(scenario.plans):
            self._book(question, (), usage, estimate, done=True)
            return ModelReply(done=True, answer="restocked", usage=usage)
        plan = scenario.plans[index]
        if self._asked[tick, question.iteration] > 1 and index in scenario.again:
            plan = scenario.again[index]  # asked again, it plans otherwise
        if tick:
            plan = tuple(
                PlannedCall(c.tool, {**c.args, "ref": tick_ref(str(c.args["ref"]), tick)})
                for c in plan
            )
        if self.reordered:
            plan = self._reordered(plan)
        self._book(question, plan, usage, estimate, done=False)
        return ModelReply(actions=plan, usage=usage)

    def _reordered(self, plan: Sequence[PlannedCall]) -> tuple[PlannedCall, ...]:
        """``plan`` as the model writes it out: a call it planned before (by its ref, in an
        earlier answer or earlier in this one) has its arguments in the reverse order at its
        second planning, its fourth, and so on; at the others, and at its first, in the
        scenario's order. It draws nothing from the schedule: the same call with the same
        arguments, which the world knows as the same call (its ref), so a product whose key
        is the call's one canonical spelling runs the very same story."""
        written = []
        for call in plan:
            ref = str(call.args["ref"])
            self._planned[ref] += 1
            if self._planned[ref] % 2 == 0:
                call = PlannedCall(call.tool, dict(reversed(list(call.args.items()))))
                self.world.say(f"the model writes {ref}'s arguments in another order")
            written.append(call)
        return tuple(written)

    def _book(
        self,
        question: Question,
        plan: Sequence[PlannedCall],
        usage: Usage,
        estimate: int,
        *,
        done: bool,
        verdict: str = "accept",
    ) -> None:
        intents = tuple(Intent(str(c.args["ref"]), c.tool, dict(c.args)) for c in plan)
        self.books.asks.append(
            Ask(
                self.world.now,
                self.world.actor,
                question.phase,
                question.iteration,
                intents,
                done,
                verdict,
                usage.tokens,
                self.books.next_order(),
                run=self.ticks.get(self.world.actor, ""),
                output_tokens=usage.output_tokens,
                estimate=estimate,
            )
        )


def question_of(request: Mapping[str, Any]) -> Question:
    """The question a request asks, read off the dict form the ``python`` provider hands its
    function (``ModelRequest.to_json``)."""
    history = request.get("history") or ()
    iteration = int(request["iteration"])
    rejected_before = any(
        entry.get("verdict") == "reject" and entry.get("iteration") == iteration
        for entry in history
    )
    acted = sum(1 for entry in history if "actions" in entry) - sum(
        1 for entry in history if entry.get("verdict") == "reject"
    )
    return Question(str(request["phase"]), iteration, acted, rejected_before)


class SimModel:
    """The world's model in process, as a user's function for the product's ``python``
    provider (``keelgate.adapters.models.python``): it is asked in the dict form and answers in
    it, so the product's own reading of a dict reply (its usage's ``inputTokens`` and
    ``outputTokens``, its actions, its verdict) is what the loop gets, never a reply the world
    built in the product's types."""

    name = "sim-model"

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        # The product estimates an in-process model's input from this very request.
        sent = json.dumps(request, separators=(",", ":"), default=str)
        question = question_of(request)
        return reply_as_dict(
            question.phase, self.planner.answer(question, estimate=estimate_floor(sent))
        )


def reply_as_dict(phase: str, reply: ModelReply) -> dict[str, Any]:
    """``reply`` in the dict form the ``python`` provider's function answers in (docs/providers.md):
    a verdict with its reason, or the planned calls, ``done`` and the answer; with the usage
    under the names that form has (``inputTokens``, ``outputTokens``)."""
    usage = {"inputTokens": reply.usage.input_tokens, "outputTokens": reply.usage.output_tokens}
    if phase == "verify":
        return {"verdict": reply.verdict, "reason": reply.reason, "usage": usage}
    written: dict[str, Any] = {
        "actions": [{"tool": call.tool, "args": dict(call.args)} for call in reply.actions],
        "usage": usage,
    }
    if reply.done:
        written["done"] = True
    if reply.answer is not None:
        written["answer"] = reply.answer
    return written


def estimate_floor(sent: str) -> int:
    """The least the product's estimate of a question's input can be, from the JSON text it
    estimates (the request it sends): its documented estimate is about four characters a token
    (``keelgate.core.model.estimate_input_tokens``), a provider's adapter three and a half
    (``estimate_tokens``), each a little over; so a quarter of the characters, rounded down,
    is never more than either. What the world knows of the estimate, never the product's own
    number."""
    return len(sent) // 4
