"""The simulator (issues 39 and 48): seeded runs through the real loop, gateway, stores, tools
and model adapters on virtual time, judged by an oracle that reads the world's own books. These
tests are its part of ``make test``: the same seed replays the same trace, a fixed budget of
seeds keeps every promise (every move of the world switched on: ``BUDGET_OPTIONS``),
every planted bug of the project's history and the fastest-found of the unseen ones are found
within that budget, each of issue 46's moves is made, and a failure says how to replay it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from keelgate.core import clocks
from keelgate.core.protocols import RunLock, Stores
from keelgate.core.types import UnknownAction
from keelgate.testing.sim import decode, encode, shrink, simulate
from keelgate.testing.sim import stores as sim_stores
from keelgate.testing.sim.__main__ import _mode, _options, _parser
from keelgate.testing.sim.books import (
    Ask,
    Books,
    Effect,
    ProcessLife,
    Question,
    Sent,
    SpecVersion,
    rule_of,
)
from keelgate.testing.sim.desk import Desk
from keelgate.testing.sim.downstream import ProductConfirmer, Shop
from keelgate.testing.sim.model import Planner, Scenario
from keelgate.testing.sim.model import Question as ModelQuestion
from keelgate.testing.sim.modelserver import ModelServer
from keelgate.testing.sim.network import Network, Request
from keelgate.testing.sim.operator_mode import MOVES, NAMED_MOVES
from keelgate.testing.sim.options import HTTP_CONFIRMER_SHARE, NAMED_SHARE, SWITCHES, Options
from keelgate.testing.sim.people import CALM_PROMPT
from keelgate.testing.sim.simulate import (
    CHAOS,
    LIMIT,
    SETTLING,
    STILL,
    Stillness,
    _routed,
    seed_of,
)
from keelgate.testing.sim.world import BOOT, Clocks, Schedule, World
from support.planted_bugs import BUGS, IN_TWO_CLUSTERS, PACKAGE, Planted, find, planted
from support.unseen_bugs import UNSEEN
from support.unseen_bugs_b import UNSEEN_B
from support.unseen_bugs_c import UNSEEN_C
from support.unseen_bugs_d import UNSEEN_D
from support.unseen_bugs_e import UNSEEN_E
from support.unseen_bugs_f import UNSEEN_F
from support.unseen_bugs_g import UNSEEN_G
from support.unseen_bugs_h import UNSEEN_H

#: The seeds ``make test`` runs (base 0): every fourth on a SQLite file, the others in memory.
BUDGET = 300
#: The operator-mode seeds ``make test`` runs (memory store).
OPERATOR_BUDGET = 100
#: Seeds within which each planted bug must be found (docs/simulation.md has the table).
BUG_BUDGET = 150
#: What the budget's runs do: every move of the world, issue 46's moves and issue 48's
#: late-acting shop among them (their fixes are on main).
BUDGET_OPTIONS = replace(Options.whole(), two_clusters=False)
#: The whole world as it was before it gained the parts set E's misses called for (late
#: store answers and pages, h/slowstore's ``Options.whole()``): the seeds found in it are
#: replayed in it.
WHOLE_BEFORE_SET_E = Options(late_shop=True, moves=frozenset(MOVES), slow_store=True, paged=True)


def whole_before_set_e(seed: int) -> Options:
    """``make sim``'s world for ``seed`` (its shares drawn) as it was before set E's parts."""
    return replace(
        whole_before_set_f(seed),
        rejection_limit=False,
        mcp_often=False,
        dollars=False,
        cached_input=False,
    )


def whole_with_verdicts(seed: int) -> Options:
    """``make sim``'s world for ``seed`` as the rejection limit and MCP more often were found
    in, before dollar budgets and cached input came."""
    return replace(whole_before_set_f(seed), dollars=False, cached_input=False)


def whole_with_dollars(seed: int) -> Options:
    """``make sim``'s world for ``seed`` as dollar budgets and cached input were found in,
    before the rejection limit and MCP more often came."""
    return replace(whole_before_set_f(seed), rejection_limit=False, mcp_often=False)


def whole_before_set_f(seed: int | None = None) -> Options:
    """``make sim``'s world for ``seed`` as it was before set F's misses were closed: without
    the product's Python tool and runs with no creator on record."""
    return replace(whole_with_set_f(seed), python_tool=False, no_creator=False)


def whole_with_set_f(seed: int | None = None) -> Options:
    """``make sim``'s world for ``seed`` as set F's misses were closed in (the product's Python
    tool, runs with no creator on record, and every part before): a part the world gains
    later is turned off here, as those before turn off these (two clusters)."""
    return replace(whole_before_set_g(seed), two_clusters=False)


def whole_with_two_clusters(seed: int) -> Options:
    """``make sim``'s world for ``seed`` with two clusters (every part before, and the
    operator-mode run in a second cluster over the one store): the seeds found with it."""
    return replace(whole_before_set_g(seed), two_clusters=True)


def whole_before_set_g(seed: int | None = None) -> Options:
    """``make sim``'s world for ``seed`` as it was before set G's misses were closed in it: no
    MCP tool pointed at another remote tool, no arguments reordered (its share of two clusters
    as drawn)."""
    return replace(
        whole_before_suspends(seed), mcp_remote=False, reordered_args=False, pay_threads=False
    )


def whole_with_set_g(seed: int) -> Options:
    """``make sim``'s world for ``seed`` with two clusters and set G's first parts (an MCP tool
    pointed at another remote tool, arguments reordered): the seeds found with them, before
    ``pay``'s worker threads came."""
    return replace(whole_before_suspends(seed), two_clusters=True, pay_threads=False)


def whole_before_suspends(seed: int | None = None) -> Options:
    """``make sim``'s world for ``seed`` (its shares drawn) as it was before machines were
    suspended in it (``--suspends``): the seeds found in the whole world before then."""
    return replace(whole_before_set_h(seed), suspends=False)


def whole_before_set_h(seed: int | None = None) -> Options:
    """``make sim``'s world for ``seed`` (its shares drawn) as it was before set H's misses
    were closed in it: no time budget, no rule letting ServiceAccounts decide."""
    return replace(Options.whole(seed), time_budget=False, service_account_rules=False)


#: The unseen bugs the unit suite looks for (issue 48's own examples; the rest, with their
#: times, are bench/unseen_bugs.py's).
UNSEEN_IN_SUITE = (
    "a key that changes from one iteration to the next",
    "a resume that asks the model again after a settlement",
    "a one-decision approved: false read as an approval",
)


def test_the_same_seed_replays_the_same_trace() -> None:
    """Two runs of one seed give the same events, stamps, requests and audit chain (their hash),
    on both stores and in both modes, with issue 46's moves or without, whatever its model is
    reached by (in process, OpenAI's or Anthropic's wire); different seeds give different
    traces; the recorded choices replay it too."""
    digests = []
    models = set()
    for index in range(16):
        mode = "operator" if index % 4 == 3 else "local"
        store = "sqlite" if index % 4 == 0 else "memory"
        options = Options.whole() if index % 2 else Options()
        first = simulate(seed=seed_of(index, 77), store=store, mode=mode, options=options)
        second = simulate(seed=seed_of(index, 77), store=store, mode=mode, options=options)
        assert first.digest == second.digest, first.lines
        replayed = simulate(replay=first.choices, store=store, mode=mode, options=options)
        assert replayed.digest == first.digest
        digests.append(first.digest)
        models.add(first.lines[1].split()[2].rstrip(","))
    assert len(set(digests)) == len(digests)
    assert models == {"in-process", "openai", "anthropic"}


def test_a_fixed_budget_of_seeds_keeps_every_promise() -> None:
    """``make test``'s budget of simulated runs (deaths, pauses, lost nodes, drains, lost and
    late answers, people deciding rightly and wrongly, spec edits) breaks no promise."""
    broken = []
    for index in range(BUDGET):
        seed = seed_of(index)
        store = "sqlite" if index % 4 == 0 else "memory"
        outcome = simulate(seed=seed, store=store, options=BUDGET_OPTIONS)
        if not outcome.ok:
            where = f"--store {store} --seed {seed}"
            broken.append(f"{'; '.join(map(str, outcome.violations))} (replay: {where})")
    assert not broken, "\n".join(broken)


def test_a_fixed_budget_of_operator_runs_keeps_every_promise() -> None:
    """The same promise with the real operator in between: its reconcilers and status writers
    over an API server that delays and drops watch events, answers 409 and loses status
    answers, operators restarted or doubled, people deciding by patching the objects as
    admission lets them."""
    broken = []
    for index in range(OPERATOR_BUDGET):
        seed = seed_of(index)
        outcome = simulate(seed=seed, mode="operator", options=BUDGET_OPTIONS)
        if not outcome.ok:
            where = f"--mode operator --store memory --seed {seed}"
            broken.append(f"{'; '.join(map(str, outcome.violations))} (replay: {where})")
    assert not broken, "\n".join(broken)


def test_runs_take_virtual_time_not_real_time() -> None:
    """A run that lasts hours of virtual time (its calm end is at 15 minutes, people look every
    few seconds until it ends) takes well under a second here, and the real clocks are back
    afterwards."""
    started = time.monotonic()
    outcome = simulate(seed=seed_of(3))
    assert time.monotonic() - started < 2.0
    last = max(float(line.split()[0]) for line in outcome.lines)
    assert last >= 900.0  # the calm end, on virtual time
    assert abs(clocks.wall() - time.time()) < 5.0


def test_shrinking_finds_the_calm_schedule_that_still_fails() -> None:
    """Shrinking cuts a schedule's end and calms (zeroes) what is not needed for the failure."""

    def fails(choices: Sequence[int]) -> bool:
        padded = list(choices) + [0] * 10
        return padded[3] == 7 and padded[8] % 2 == 1

    noisy = [5, 9, 1, 7, 4, 4, 2, 8, 3, 6, 6, 1, 9]
    assert fails(noisy)
    small = shrink(noisy, fails)
    assert fails(small)
    assert small == [0, 0, 0, 7, 0, 0, 0, 0, 3]
    assert decode(encode(small)) == small


#: What a kept seed's trace must show: a line, or a line for each part of its story.
Shown = str | tuple[str, ...]

#: Seeds that met a gap in the product (docs/simulation.md, "What it found in the product"),
#: kept as regression tests: each still meets the window (its trace shows the product's
#: answer to it) and keeps every promise. A change to the simulator's choices moves a seed's
#: story; then find another with the same trace line (``--seed`` prints the trace). A story of
#: several parts names a line for each (``Shown``): one line alone may be met by another story.
FOUND_SEEDS = (
    (
        "a step held up before its claim, its session lost, thaws after the run moved on",
        12779263048228452984,
        "local",
        "ends with StaleClaim",
    ),
    (
        "a call refused after its session was lost and the next step stopped on its key",
        688020936059074329,
        "local",
        '"recorded":"outcome_unknown","settledBy":"","status":"refused"',
    ),
    (
        "a call refused late, after its stop named its key, on the cluster",
        7581803407526326335,
        "operator",
        '"recorded":"forgotten","settledBy":"","status":"refused"',
    ),
    (
        "a step held up past its deadline whose approvals grew too old: asked again",
        7814487065843138973,
        "local",
        (
            "alice approved 1:2 (place_order)",
            "step6 held up 302.0s at before_action",
            "step6 ends Stopped awaiting_approval",
            "dave approved 1:2 (place_order)",
        ),
    ),
    (
        "a confirmer's settlement whose writer died, the key's own step ending the call late",
        6912919696478250025,
        "local",
        "died at after_settle",
    ),
)


@pytest.mark.parametrize(
    ("why", "seed", "mode", "shown"), FOUND_SEEDS, ids=[f[0] for f in FOUND_SEEDS]
)
def test_the_seeds_that_found_product_gaps_keep_every_promise(
    why: str, seed: int, mode: str, shown: Shown
) -> None:
    """Each seed that met a gap (a stale step's claim sent and never asked about; a key a stop
    named dropped by a process that had lost it; a run waiting on a key its owner dropped after
    a late refusal; approvals used after a pause past the deadline made them too old; a
    confirmer's decision never on the chain) meets the same window again, and the product keeps
    every promise there."""
    _meets_its_window_and_keeps_every_promise(why, seed, shown, mode=mode, options=Options())


#: Seeds that broke a promise with every move of the world on, and what was at fault (here the
#: model: the product kept its promise), kept as regression tests as ``FOUND_SEEDS`` are.
FOUND_WITH_MOVES = (
    (
        # Issue 48, item 1 (its reported schedule belonged to the simulator before the world
        # kept its own books): a composite ``pay``'s charge held by the shop past its sender's
        # wait, acted on at the last moment the fence's assumption allows (the margin after the
        # call's deadline, where the real tools cut every request): the late result is recorded
        # and nobody is told "not executed" before it.
        "a WRITE held by the shop past its sender's wait acts within the margin after the cut",
        12290394002557474425,
        "(charge) held by the server for 34.0s (past its sender's wait)",
    ),
    (
        # The model's fault: alice approved a call while its tool's URL was edited away and
        # back; the world booked her as shown the manifest of that moment, but ``keelgate
        # pending`` shows the call as the step that stopped to ask defined it, and that is the
        # call the product bound her approval to and sent.
        "an approval of the call as the run showed it, while its tool was edited away and back",
        15364916661601569437,
        "spec edited: place_order url",
    ),
    (
        # The model's fault (make sim SECONDS=120, base 1796568454): place_order was a READ
        # when iteration 3 was planned and when step3 read that plan; step3, its node lost,
        # was held up before its action while the owner made the tool a WRITE again and a
        # later step planned the same call anew. step3 went on and sent its plan's READ (no
        # key); the oracle judged that send by the newer plan's spec, as a WRITE sent again.
        "a held-up step's READ, sent after the tool became a WRITE in a plan it never read",
        10330859331456577612,
        (
            "step3 held up 168.9s at before_action (node lost)",
            "EFFECT mcp http://shop.sim/mcp place_order p4 by step3",
        ),
    ),
    (
        # The oracle's fault (found by a scan of h/simreach2 on main 89c8220, unasked): step4,
        # its node lost, was held up before sending notify's n1; step5 stopped on the unknown
        # outcome and alice settled it "executed" (the store takes that at once); step4 then
        # sent it and never heard back. The oracle took only questions asked after the send as
        # its answer; an "executed" that stood answers every send of its call.
        "a call sent by a held-up step after a person settled it executed",
        7032642035253802670,
        (
            "163.273 alice settled 2:1 as executed",
            "166.129 EFFECT POST http://shop.sim/notices n1 by step4",
        ),
    ),
    (
        # The same, the confirmer's word (make sim SECONDS=600, base 1796584405): step4 sent
        # pay's charge and was held up before its receipt; the confirmer said "executed" (the
        # chain has it), the run finished, and step4 then sent the receipt, its answer lost.
        "a composite call's next request sent after the confirmer said executed",
        3814126678679824094,
        (
            "40.796 EFFECT charge p1 by step4",
            "54.335 EFFECT receipt p1 by step4",
        ),
    ),
)


@pytest.mark.parametrize(
    ("why", "seed", "shown"), FOUND_WITH_MOVES, ids=[f[0] for f in FOUND_WITH_MOVES]
)
def test_the_seeds_found_with_every_move_keep_every_promise(
    why: str, seed: int, shown: Shown
) -> None:
    """Each seed meets its window again (its trace shows it) with every move on, and keeps
    every promise."""
    _meets_its_window_and_keeps_every_promise(
        why, seed, shown, mode="local", options=Options.every()
    )


#: Seeds that broke ``unapproved`` (and one ``waiting``) in operator mode with every move on,
#: where the product was at fault (docs/simulation.md), kept as regression tests, each by a
#: seed that meets the same window in today's world (the first seeds' stories move on as the
#: product changes what it reads and when; the docs name them).
FOUND_IN_OPERATOR_MODE = (
    (
        # The product's fault (h/seeds' search on f31f41b, unapproved): dave, whom the rule did
        # not let decide, approved 5:0 twice (refused), then denied it (refused too); the rule
        # was edited to let him decide and bob approved. The operator recorded the object's
        # entries in list order: bob's, then dave's first approval (counted now: 2 of 2), and
        # his later no was refused as "already approved". Now an object's new entries are
        # recorded denies first: dave's no denies, and p5 is never sent.
        "a no added after approvals refused under one rule and counted under its edit",
        2897527648295461615,
        (
            "559.536 dave adds to restock-5-place-order-f88060e171's decisions approved: False",
            "606.589 bob adds to restock-5-place-order-f88060e171's decisions approved: True",
        ),
    ),
    (
        # The oracle's fault (h/seeds' search on f31f41b, unapproved): dave denied as the rule
        # was edited; the run asked with the rule before the edit, which does not let him
        # decide, and the Approval showed his no refused ("may not decide it"). The run was made
        # again and bob approved as the new rule asks. One cluster's oracle took a no refused
        # so as binding; now, as two clusters', it binds no more once shown refused.
        "a deny refused as one the rule does not let decide, the run made again",
        12543163258399059243,
        (
            "41.305 dave patches restock-2-place-order-df7f18f35a approved: False",
            "63.510 alice deletes restock and creates it again",
            "136.205 EFFECT POST http://shop.sim/orders p2 by restock-s2-a1#2",
        ),
    ),
    (
        # The oracle's fault (make sim SECONDS=300 on 879093a, base 1796589670, unapproved):
        # notify's rule was removed (generation 5) after alice and dave had denied the call in
        # iterations 1 and 2; restock-s10-a2 planned iteration 4 under the loosened spec and
        # its save's answer was lost; restock-s10-a3 read that plan and acted on it, and
        # restock-s11-a1 sent notify's n3 with nobody asked, as the rule then said. The oracle
        # judged the send by iteration 2's plan too (the newest surely saved), whose rule asked
        # two approvals; a save a later step acted on is now taken as landed. That seed
        # (13662469121908281641) moved on when an early "not executed" came to be refused
        # (2026-12-07); this one (found by h/seeds' search on f31f41b, broken there) tells the
        # same story shorter: dave denied n2 (1:1) as notify's rule was removed; restock-s3-a1
        # planned iteration 2 (n2 again, one key) and lost its store unheard; restock-s3-a4
        # sent n2 from that plan. Iteration 1's plan, the newest surely saved, was done before
        # the model was asked again, so no later step followed it (``Books.plans_followed``).
        "a call sent under a loosened rule, its plan's save heard of only by a later step",
        9985398736884628465,
        (
            "46.472 spec edited: approval notify (generation 2)",
            "46.472 dave patches restock-1-1-notify-c42b4e67a1 approved: False",
            "50.771 restock-s3-a1 ends with StoreUnavailable (exit 5)",
            "61.432 EFFECT POST http://shop.sim/notices n2 by restock-s3-a4",
        ),
    ),
    # A deny and, in the same moment, the run deleted and made again: the Approval goes with the
    # run, before any operator read it (the finalizer keelgate.dev/decisions holds it until the
    # deny is recorded), and in the second the next step dies before its action as well. The
    # first seeds of these stories (1705127678694406672, 18143148156458450479) moved on with the
    # finalizer's look (one checkpoint read per look); these are a scan of base 7070 on today's
    # world.
    (
        "a deny on an Approval garbage-collected before the operator read it",
        14422162385340296264,
        (
            "46.324 bob adds to restock-1-1-place-order-1d8316e728's decisions approved: False",
            "46.324 alice deletes restock and creates it again",
        ),
    ),
    # 8323230461478192221 (its next step dying before its action) moved on when a run stopped
    # stalling on a pod gone unseen (h/waiting2); no seed of 1,500 (bases 7070, 7071) met a
    # death there again, so this one keeps the deny and the re-creation, its next steps
    # stopped before a send (a drain) instead.
    (
        "a deny overtaken by the run's deletion and re-creation",
        553672564280359288,
        (
            "21.069 bob adds to restock-2-place-order-df7f18f35a's decisions approved: False",
            "21.069 alice deletes restock and creates it again",
            "30.931 restock-s2-a1#2 asked to stop at before_send",
        ),
    ),
    (
        "a deny made just before a tool's edit, then the run re-created",
        7891466930517160157,
        "alice deletes restock and creates it again",
    ),
    # ``waiting`` (docs/simulation.md): approvals that kept expiring filled each person's 8
    # entries on the one Approval and the run waited for good (16620836951895759664, whose
    # story has since moved on). With rounds, an action whose approvals all expired is asked
    # afresh on ``-r2``; these seeds (a scan of base 7070 on today's world, after
    # 10468895190701761707 and 17057686793111651455 moved on) show it in the act: one round
    # more, and four rounds of one action, each person's decisions counted in their round only.
    (
        "approvals expiring on an Approval: its action asked afresh in a new round",
        7895289248420655706,
        "carol adds to restock-1-1-place-order-1d8316e728-r2's decisions approved: True",
    ),
    (
        "an action asked afresh four times",
        929832123942302282,
        (
            "carol adds to restock-1-1-notify-c42b4e67a1-r2's decisions approved: True",
            "bob adds to restock-1-1-notify-c42b4e67a1-r4's decisions approved: True",
        ),
    ),
    # A READ let through on approvals that then expired (unapproved, docs/simulation.md: seed
    # 17236921387873743512, whose story moved on before it was fixed; this one is a scan of
    # base 4646046 on today's world). place_order, declared a READ, is let through on carol's
    # approval (a rule with expiresAfter); restock-s13-a1 sends it and dies before its
    # checkpoint, restock-s13-a2 runs the READ again and is held up 455 s right before its
    # request leaves, its node lost. Unfenced, it then sent the call on an approval long
    # expired; now its deadline has passed, the gate is asked again, and nothing is sent.
    (
        "a READ under an approval rule held up until its approval expired",
        6308801014285360720,
        (
            "spec edited: place_order READ (generation 6)",
            "589.984 carol adds to restock-4-place-order-3953e4627f's decisions approved: True",
            "602.007 EFFECT mcp http://shop.sim/mcp place_order p5 by restock-s13-a1",
            "602.974 restock-s13-a2 held up 455.3s at before_send (node lost)",
            "restock-s13-a2 goes on after before_send",
        ),
    ),
    # The model's fault (make sim, base 0, run 718, on main 3d9976f: unasked): place_order was
    # a READ when restock-s1-a2 planned iteration 1 and saved it; restock-s1-a1, held up since
    # before the edit, then got its answer under the WRITE it had read and was fenced off
    # (StaleCheckpoint) before saving it; restock-s2-a1 read the saved plan and sent the READ,
    # a 503 then. The oracle judged the send by the newest answer, never saved, as an unknown
    # WRITE nobody was asked about. Today's story meets the same window, the READ answered.
    (
        "a plan fenced off unsaved, newer than the saved one a later step followed",
        14914398745568960774,
        (
            "spec edited: place_order READ (generation 2)",
            "restock-s1-a1 ends with StaleCheckpoint (exit 4)",
            "EFFECT POST http://shop.sim/orders p2 by restock-s2-a1",
        ),
    ),
    # The product's fault (make sim, on main 7eb6ace: audit): iteration 2 planned the same order
    # twice (2:1, 2:2: one key); the run was re-created while 2:1's call was held up, stalled
    # on the old run's pod, and the operator asked for a Reconciliation of 2:1 and of 2:2, never
    # called. carol settled both; the chain recorded her decision once, on 2:1, while the 2:2
    # object showed it Settled as hers. Now only 2:1 is asked for, and the repeat follows it.
    # (Since an early "not executed" is refused, the seed's bob settles 2:1 as executed, and
    # 2:2 follows it, replayed.)
    (
        "an order planned twice, its first call unknown as the run is re-created",
        12445575562178623897,
        (
            "alice deletes restock and creates it again",
            "bob patches restock-2-1-place-order-a226bed9f2 executed: True",
            '"action":"2:2","replayed":true',
        ),
    ),
    # The model's fault (on main 9c492ee: waiting): restock-s1-a1#2, held up at before_action
    # while it drove the run, was killed at the end of its pod's grace; the memory store let its
    # owner go but kept its run lock until its stack would unwind, 268 s later, so every step
    # pod after it ended RunBusy (exit 4). A killed process's session ends and its locks with
    # it; now restock-s1-a1#3 drives the run at once.
    (
        "a driver killed while held up: the next step drives the run at once",
        1680693229101390139,
        (
            "122.765 restock-s1-a1#2 held up 373.4s at before_action",
            "227.654 restock-s1-a1#2 killed",
            "230.176 restock-s1-a1#3 died at after_verify",
        ),
    ),
)


@pytest.mark.parametrize(
    ("why", "seed", "shown"), FOUND_IN_OPERATOR_MODE, ids=[f[0] for f in FOUND_IN_OPERATOR_MODE]
)
def test_the_seeds_found_in_operator_mode_with_every_move_keep_every_promise(
    why: str, seed: int, shown: Shown
) -> None:
    """Each seed meets its move again (its trace shows it) in operator mode with every move on,
    and keeps every promise: no call takes effect as approved after a deny."""
    _meets_its_window_and_keeps_every_promise(
        why, seed, shown, mode="operator", options=Options.every()
    )


#: Seeds of operator mode on a SQLite file, kept as ``FOUND_IN_OPERATOR_MODE`` are. The world of
#: 12729524454312395263 (docs/simulation.md: bob's one-decision deny, a failed reconcile, the
#: run re-created, dave's approval placed the order) has moved on; this seed meets the same
#: story in today's: bob's deny as operator1's reconcile of that very Approval fails, alice
#: re-creating her run later, the deny recorded.
FOUND_IN_OPERATOR_MODE_ON_SQLITE = (
    (
        # The oracle's fault (h/seeds' search on f31f41b, unapproved): alice denied round 2's
        # call as its rule was edited and the run made again; the run's rule did not let her
        # decide and her no was shown refused; bob approved and the call went. Kept beside
        # the memory-store seed of the same kind.
        "a deny refused as one the rule does not let decide, made as its rule was edited",
        12167846979756168869,
        (
            "492.258 alice adds to restock-2-2-place-order-a7fb7aa05d-r2's decisions approved: "
            "False",
            "508.424 bob adds to restock-2-2-place-order-a7fb7aa05d-r2's decisions approved: True",
            "513.957 EFFECT DELETE http://shop.sim/steal p5 by restock-s2-a1#3",
        ),
    ),
    (
        "a deny, its Approval's reconcile failing at once, the run re-created",
        9227316621196855893,
        (
            "87.481 bob adds to restock-2-1-pay-02e032c027's decisions approved: False",
            "87.481 operator1 Approval restock-2-1-pay-02e032c027: ApiFailure",
            "alice deletes restock and creates it again",
        ),
    ),
    # The product's fault (make sim SECONDS=600 on main f027603: waiting): operator6's watch
    # missed the deletion of restock-s1-a4 (an ended pod of the run as created at 688.354,
    # removed at 740.605), and its cache kept it. The run created again at 839.778, its steps
    # RunBusy while restock-s2-a1#2 held it, came to its fourth attempt and stood Stalled on
    # that ghost ("a pod named restock-s1-a4 exists and is not this run's") for good, the
    # operator never asking the server. Now it asks first: restock-s1-a4#2 runs at once.
    # That seed (12998402584335380776) moved on when an early "not executed" came to be
    # refused; this one (2026-12-07, a scan of base 20261208 on today's world, with the old
    # cache-only stall put back to find it) meets the same window: operator3's watch missed
    # the deletion of restock-s1-a2 (an ended pod of the run as created at 658.434, removed
    # at 695.831); alice created the run again at 715.009, its first attempt ended RunBusy
    # (restock-s5-a1, held up, held the run), and its second, under that ghost's name, runs.
    # With the old stall it stands Stalled on the ghost until the end (waiting).
    (
        "a pod deleted while the watch was away, under the next pod name of a run re-created",
        5882587655482203029,
        (
            "715.009 alice deletes restock and creates it again",
            "715.974 restock-s1-a1#4 ends with RunBusy (exit 4)",
            "721.677 restock-s1-a2#3 starts",
            "Succeeded goal_met",
        ),
    ),
)


@pytest.mark.parametrize(
    ("why", "seed", "shown"),
    FOUND_IN_OPERATOR_MODE_ON_SQLITE,
    ids=[f[0] for f in FOUND_IN_OPERATOR_MODE_ON_SQLITE],
)
def test_the_seeds_found_in_operator_mode_on_sqlite_keep_every_promise(
    why: str, seed: int, shown: Shown
) -> None:
    """Each seed meets its window again on a SQLite file, every move on, and keeps every
    promise: no call takes effect as approved after a deny."""
    _meets_its_window_and_keeps_every_promise(
        why, seed, shown, mode="operator", options=Options.every(), store="sqlite"
    )


def _simulator_on(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m keelgate.testing.sim ARGS`` over the package copy at ``root`` (a bug planted
    in it), with nothing of this process's environment but the path."""
    env = {"PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "keelgate.testing.sim", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _planted_run(
    bug: Planted, tmp_path: Path, *, seed: int, mode: str, options: Options
) -> subprocess.CompletedProcess[str]:
    """One seed of the simulator over a copy with ``bug`` planted, in the world ``options``
    makes (given as the flags a replay prints), so that the planted run and the clean one a
    test compares it with are one world."""
    return _simulator_on(
        planted(bug, tmp_path),
        *("--seed", str(seed), "--mode", mode, "--store", "memory"),
        *options.flags().split(),
    )


def _with_and_without(seed: int, mode: str, **off: bool) -> tuple[Any, Any]:
    """One seed's run in the whole world of one cluster, then with the parts ``off`` names
    switched off (a part that draws nothing must leave the story as it was)."""
    whole = replace(Options.whole(), two_clusters=False)
    return (
        simulate(seed=seed, store="memory", mode=mode, options=whole),
        simulate(seed=seed, store="memory", mode=mode, options=replace(whole, **off)),
    )


def _meets_its_window_and_keeps_every_promise(
    why: str, seed: int, shown: Shown, *, mode: str, options: Options, store: str = "memory"
) -> None:
    """A kept seed's run shows ``shown`` (each of its lines) in its trace and breaks no
    promise."""
    outcome = simulate(seed=seed, store=store, mode=mode, options=options)
    wanted = (shown,) if isinstance(shown, str) else shown
    unmet = [part for part in wanted if not any(part in line for line in outcome.lines)]
    assert not unmet, f"{why}: the seed no longer meets it (no line shows {unmet})"
    assert outcome.ok, "; ".join(map(str, outcome.violations))


def test_an_effect_and_an_event_of_the_same_millisecond_compare_as_stamps() -> None:
    """The oracle reads an event's moment from its stamp (milliseconds, cut, on a wall clock that
    drifts) and a world moment as it would be stamped then: an effect in the very millisecond
    its start was stamped is seen after that start, however the clock's last digits fall and
    however the wall clock runs (an approved WRITE was once judged unapproved for it)."""
    from keelgate.core.audit import AuditDraft, seal
    from keelgate.testing.sim.records import stamp_seconds
    from keelgate.testing.sim.world import Clocks

    for drift in (Clocks(), Clocks(wall_ppm=250.0, wall_offset=-1.7)):
        books = Books(clocks=drift)
        for moment in (39.8999999, 39.9, 39.9000004, 0.0004999, 12.3456789):
            with clocks.simulated(wall=lambda m=moment, d=drift: d.wall(m), boot=lambda: 0.0):
                event = seal("shop", "r", None, AuditDraft("loop.action_started", {}))
            stamp = stamp_seconds(event.at)
            assert stamp == books.stamp(moment), moment
            assert abs(books.true_of_stamp(stamp) - moment) < 0.002, moment


@pytest.mark.parametrize("move", (*MOVES, *NAMED_MOVES))
def test_each_move_of_issue_46_is_made(move: str) -> None:
    """With a move switched on, the world's people make it within a few operator-mode runs (the
    oracle then judges what the product made of it: ``make sim`` runs them all)."""
    shown = {
        "copy": "copies",
        "reorder": "deny to the front",
        "recreate": "creates it again",
        "service-account": "as system:serviceaccount",
        "definition": "spec edited: place_order",
        "delete": "the operators are down; alice deletes",
    }[move]
    options = Options(moves=frozenset({move}))
    for index in range(40):
        outcome = simulate(seed=seed_of(index, 46), mode="operator", options=options)
        if any(shown in line for line in outcome.lines):
            return
    raise AssertionError(f"no run made the move {move!r}")


@pytest.mark.parametrize(
    ("shown", "move"),
    [("decides without --group", ""), ("decides as system:serviceaccount", "service-account")],
)
def test_local_people_decide_without_their_groups_or_as_a_service_account(
    shown: str, move: str
) -> None:
    """In local mode a person now and then leaves out ``--group``, and with the
    service-account move approves as the ServiceAccount their CI job runs as (both the
    caller's word to ``keelgate approve``), within a few runs; the oracle counts neither."""
    options = Options(moves=frozenset({move} if move else ()))
    for index in range(60):
        outcome = simulate(seed=seed_of(index, 46), mode="local", options=options)
        if any(shown in line for line in outcome.lines):
            assert outcome.ok, "; ".join(map(str, outcome.violations))
            return
    raise AssertionError(f"no local person {shown}")


@pytest.mark.parametrize(
    "bug",
    UNSEEN + UNSEEN_B + UNSEEN_C + UNSEEN_D + UNSEEN_E + UNSEEN_F,
    ids=[b.name for b in UNSEEN + UNSEEN_B + UNSEEN_C + UNSEEN_D + UNSEEN_E + UNSEEN_F],
)
def test_each_unseen_bug_still_plants_where_it_was_written(bug: Planted) -> None:
    """bench/unseen_bugs.py measures the bug it names: each replacement's text is still in the
    product, once (a product that moved on would have the bench plant nothing, or elsewhere)."""
    for file, old, _ in bug.edits:
        assert (PACKAGE / file).read_text().count(old) == 1, f"{bug.name}: {file}"


def test_approvals_deleted_while_the_operators_are_down_keep_every_promise() -> None:
    """With the move delete (an Approval deleted while the operators are down, right after
    people decided, alice trying to remove its finalizer), the first operator-mode runs that
    make it keep every promise: a deny made just before is recorded when an operator is back,
    and no call takes effect as approved after it. (Without the finalizer, 3 of the first 10
    such runs broke ``unapproved``: the deny went with the Approval, and a fresh one's approval
    sent the order.)"""
    made = 0
    for index in range(40):
        outcome = simulate(
            seed=seed_of(index, 4646), mode="operator", options=Options(moves=frozenset({"delete"}))
        )
        lines = outcome.lines
        moved = [line for line in lines if "the operators are down; alice deletes" in line]
        if not moved:
            continue
        assert outcome.ok, "; ".join(map(str, outcome.violations))
        # The story is a deny made on the Approval in that moment: one whose decisions were
        # recorded and released before (the run between stops) goes at once, nothing to hold.
        denied = [
            line
            for line in moved
            if f"{line.split()[0]} {line.split()[-1]}"
            in {f"{d.split()[0]} {d.split()[-4][:-2]}" for d in lines if "approved: False" in d}
        ]
        if not denied:
            continue
        assert any("removes" in line and "finalizer: refused" in line for line in lines)
        made += 1
        if made == 3:
            return
    raise AssertionError(f"only {made} runs made the move delete")


#: Every planted bug the suite looks for: those of the project's history, and issue 48's
#: unseen ones (the rest, with their times, are bench/unseen_bugs.py's).
SEARCHED = BUGS + tuple(b for b in UNSEEN if b.name in UNSEEN_IN_SUITE)


@pytest.fixture(scope="module")
def searches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Each planted bug's search, in its own process, as many at once as there are cores."""
    # Made one after another: pytest 9.2's mktemp, called from several threads at once, can
    # find the base folder it checks against made twice ("not a normalized and relative path").
    folders = {bug.name: tmp_path_factory.mktemp("planted") for bug in SEARCHED}

    def search(bug: Planted) -> tuple[str, dict[str, object]]:
        return bug.name, find(bug, folders[bug.name], seeds=bug.seeds or BUG_BUDGET)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(pool.map(search, SEARCHED))


@pytest.mark.parametrize("bug", BUGS, ids=[b.name for b in BUGS])
def test_each_planted_bug_is_found_within_the_budget(
    bug: Planted, searches: dict[str, dict[str, object]]
) -> None:
    """A bug of the project's history, planted into a copy of the package, breaks a promise in
    one of the first ``BUG_BUDGET`` seeds, or the more its window needs (which the product
    itself passes), or, for a window fresh seeds meet too rarely, on the seed kept for it
    (one of ``FOUND_SEEDS``, which the product passes: else finding it there proves nothing)."""
    if bug.window_seed is not None:
        assert (bug.window_seed, bug.mode) in {(f[1], f[2]) for f in FOUND_SEEDS}, bug.name
    found = searches[bug.name]
    assert found["first"] is not None, found["output"]


@pytest.mark.parametrize("name", UNSEEN_IN_SUITE)
def test_the_unseen_bugs_issue_48_names_are_found(
    name: str, searches: dict[str, dict[str, object]]
) -> None:
    """Bugs written from the product's code alone, which the simulator of issue 39 missed (a key
    that changes between iterations, a resume that asks the model again, a one-decision deny
    read as an approval), break a promise within the budget: judged from the world's books, not
    from what the product recorded."""
    found = searches[name]
    assert found["first"] is not None, found["output"]


def test_a_failure_prints_its_seed_a_shrunk_schedule_and_the_replay(tmp_path: Path) -> None:
    """A broken promise is reported with its seed, a shrunk schedule (fewer choices than the
    run made) and one command; that command replays it (exit 1, the same broken promise)."""
    # A failure that shrinks fast: the shorter schedules of "a claim recorded after the tool
    # call" run longer (its calm steps retry for hours of virtual time), a replay of half of
    # it takes seconds and the shrink minutes.
    bug = next(b for b in BUGS if b.name == "a rule of two people met by one")
    root = planted(bug, tmp_path)
    done = _simulator_on(root, "--seeds", "5", "--mode", "local", "--store", "memory", "--first")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "BROKEN PROMISE (seed " in out
    broken = {line.split(":")[0].strip() for line in out.splitlines() if line.startswith("  ")}
    assert "unapproved" in broken, out
    shrunk = next(line for line in out.splitlines() if "shrunk schedule:" in line)
    command = next(line for line in out.splitlines() if "replay:" in line and "--replay" in line)
    text = command.split("--replay ", 1)[1].strip().strip("'")
    assert text in shrunk
    kept, _, of = shrunk.rsplit("(", 1)[1].partition(" choices, of ")
    assert int(kept) < int(of.rstrip(")")), shrunk
    again = _simulator_on(root, "--mode", "local", "--store", "memory", "--replay", text)
    assert again.returncode == 1
    assert any(f"  {rule}:" in again.stdout for rule in broken), again.stdout


def test_a_run_stuck_for_good_is_judged_once_nothing_has_moved(tmp_path: Path) -> None:
    """A run the product leaves waiting for good (set C's spec store keeping an older
    generation: the operator starts a step pod again and again, each stopping on the budget the
    newer spec raised) is judged as it would be at the limit, ``waiting``, once the calm world
    has stood still for ``STILL`` virtual seconds, not two virtual hours on: the trace ends
    there, a step pod restarted thousands of times fewer."""
    bug = next(b for b in UNSEEN_C if "older generation" in b.name)
    # In the world the seed was found in (``Options.every()``).
    done = _planted_run(
        bug, tmp_path, seed=5686236089204240597, mode="operator", options=Options.every()
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "  waiting: the run was left waiting after the calm end" in done.stdout
    assert "nothing has moved for 900s: judged as at the end" in done.stdout
    trace = [line.split() for line in done.stdout.splitlines()]
    moments = [float(w[0]) for w in trace if w and w[0].replace(".", "", 1).isdigit()]
    moments = [m for m in moments if m > 0.0]
    assert max(moments) <= CHAOS + CALM_PROMPT + STILL + 60.0 + SETTLING < LIMIT


def test_a_calm_world_that_moves_is_never_taken_for_still() -> None:
    """The stillness watch judges early only a world where nothing moves: while the books gain
    a question every ten virtual minutes (less than ``STILL``) it never says still; once they
    stop, it says so ``STILL`` seconds after the last change, and not before."""
    world = World(Schedule(seed=1))
    books = Books()
    site = sim_stores.site("memory", world.store_clock)
    try:
        still = Stillness(world, site, books)
        world.at(0.0, "looked at", still.look)
        for moment in range(0, 3600, 600):
            world.at(
                float(moment),
                "asked",
                lambda: books.questions.append(Question(world.now, "alice", "1:0", "p1")),
            )
        world.run(until=3000.0 + STILL - 61.0, done=lambda: still.still)
        assert not still.still
        world.run(until=4 * 3600.0, done=lambda: still.still)
        assert still.still
        assert 3000.0 + STILL <= world.now <= 3000.0 + STILL + 60.0
    finally:
        site.close()


def test_a_product_that_spins_on_one_moment_stops_the_world_and_breaks_a_promise() -> None:
    """Something that requeues itself at once for ever (a busy loop of the product's: set H's
    deny left awaited had the operator go round one moment until the search ran out of
    memory, 4 GB, its first run never ending) stops the world at ``SPIN`` events within one
    virtual second: no event runs or is queued after, the trace says what spun, and the
    oracle judges it ``spun``. A world that moves on (one event a virtual millisecond, a
    thousand a second) never stops so."""
    from keelgate.testing.sim.checkers import judge
    from keelgate.testing.sim.records import Records
    from keelgate.testing.sim.world import SPIN

    world = World(Schedule(seed=1))
    acted: list[float] = []

    def again() -> None:
        acted.append(world.now)
        world.at(0.0, "again", again)

    world.at(5.0, "later", lambda: acted.append(-1.0))
    world.at(0.5, "again", again)
    world.run(until=LIMIT, done=lambda: False)
    assert len(acted) == SPIN and -1.0 not in acted
    assert world.pending() == 0 and world.spun.startswith(f"{SPIN} events within second 0")
    assert any("the world stops" in line and "'again'" in line for line in world.trace.lines)
    books = Books(spun=world.spun)
    assert [v.rule for v in judge(books, Records())] == ["spun"]
    moving = World(Schedule(seed=1))
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(moving.now)
        if len(ticks) < 3 * SPIN:
            moving.at(0.001, "tick", tick)

    moving.at(0.0, "tick", tick)
    moving.run(until=LIMIT, done=lambda: False)
    assert len(ticks) == 3 * SPIN and not moving.spun


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_driver_killed_while_held_up_lets_its_run_go_at_once(kind: str) -> None:
    """A step process killed while it drives a run (held up mid-step, so its stack never
    unwinds to release) frees the run as a dead process's does (``RunLock``: by the kernel's
    or the server's doing): the next process drives it at once, not RunBusy until the dead
    one's pause would have ended; and the dead one's late unwinding never frees the run under
    its new driver. (Seed 1680693229101390139 in operator mode left every later step pod
    RunBusy while its killed driver's pause lasted.)"""
    world = World(Schedule(seed=1))
    site = sim_stores.site(kind, world.store_clock)

    def lock(stores: Stores) -> Callable[[], None] | None:
        store = stores.idempotency
        assert isinstance(store, RunLock)
        return store.lock_run("shop", "restock")

    try:
        killed, next_one, third = site.open(), site.open(), site.open()
        late_release = lock(killed)
        assert late_release is not None
        assert lock(next_one) is None
        site.kill(killed)
        driving = lock(next_one)
        assert driving is not None, "the run stayed locked by a killed process"
        late_release()  # the killed one's stack unwinds when its pause is over
        assert lock(third) is None, "the dead driver's unwinding freed its successor's run"
        driving()
        assert lock(third) is not None
        next_one.close()
        third.close()
    finally:
        site.close()


#: Monitor-mode seeds ``make test`` runs (each a monitor of two or three ticks).
MONITOR_BUDGET = 40


def test_monitor_runs_tick_and_keep_every_promise_tick_by_tick() -> None:
    """A monitor's cron job starts the product's ``LocalRunner.tick`` a minute, each tick
    process dying, held up or losing its node at any window: within a few seeds the world
    drives second and third ticks and their calls take effect under refs of their own tick
    (``p1@t2``), each tick judged as a run of its own and the ticks together; every seed of
    the budget keeps every promise, and replays to the same trace."""
    broken, driven, effects = [], set(), set()
    for index in range(MONITOR_BUDGET):
        seed = seed_of(index, 4848)
        store = "sqlite" if index % 4 == 0 else "memory"
        outcome = simulate(seed=seed, mode="monitor", store=store, options=BUDGET_OPTIONS)
        if not outcome.ok:
            where = f"--mode monitor --store {store} --seed {seed}"
            broken.append(f"{'; '.join(map(str, outcome.violations))} (replay: {where})")
        driven |= {line.split()[-1] for line in outcome.lines if " drives restock.tick-" in line}
        effects |= {
            line.split()[2].rsplit("@", 1)[1]
            for line in outcome.lines
            if line.split()[1:2] == ["effect"] and "@t" in line.split()[2]
        }
        if index < 3:
            again = simulate(seed=seed, mode="monitor", store=store, options=BUDGET_OPTIONS)
            assert again.digest == outcome.digest
    assert not broken, "\n".join(broken)
    assert {"restock.tick-1", "restock.tick-2", "restock.tick-3"} <= driven
    assert {"t1", "t2", "t3"} <= effects


def test_a_monitor_starting_its_next_tick_past_an_unknown_outcome_is_found(
    tmp_path: Path,
) -> None:
    """Set B's "a monitor starts its next tick past one stopped on an unknown outcome" (the
    runner's waiting stops forget OUTCOME_UNKNOWN): a few monitor-mode seeds break a promise,
    the tick stopped on the unknown outcome left waiting, or its call placed again by a later
    tick (``again``)."""
    bug = next(b for b in UNSEEN_B if "monitor starts its next tick" in b.name)
    done = _simulator_on(
        planted(bug, tmp_path),
        *("--seeds", "10", "--mode", "monitor", "--store", "memory", "--every-move"),
        *("--first", "--no-shrink", "--json"),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["first"] is not None
    assert set(summary["rules"]) <= {"again", "waiting"}, summary


def test_mix_runs_about_one_monitor_in_eight_and_keeps_the_operators_third() -> None:
    """``make sim``'s mix: every third run in operator mode, as before monitors came; of the
    rest, one in five a monitor."""
    modes = [_mode(index, "mix") for index in range(120)]
    assert modes.count("operator") == 40
    assert 12 <= modes.count("monitor") <= 20
    assert _mode(7, "local") == "local"


def test_slow_store_answers_and_pages_come_only_with_the_whole_world() -> None:
    """With the whole world on (``--every-move``), a step's store answer now and then comes
    back late (the statement landed): the step waits, its node's next requests are held long,
    and a stop for a person pages someone who looks within seconds; every promise is kept.
    The kept seeds' world (``--late-shop --moves``) never draws either, so their stories stay
    as they were found."""
    slow = held_after = pages = 0
    for index in range(24):
        seed = seed_of(index, 5)
        whole = simulate(seed=seed, store="memory", mode="local", options=Options.whole())
        assert whole.ok, "\n".join(whole.lines)
        lines = whole.lines
        for at, line in enumerate(lines):
            if "hears the store's answer" in line:
                slow += 1
                later = lines[at + 1] if at + 1 < len(lines) else ""
                held_after += "held by the server" in later
        pages += sum("a person answers the page" in line for line in lines)
        kept = simulate(seed=seed, store="memory", mode="local", options=Options.every())
        assert not any(
            "store's answer" in line or "answers the page" in line for line in kept.lines
        )
    assert slow >= 10 and held_after >= 1 and pages >= 10, (slow, held_after, pages)


def test_an_exchange_left_open_past_its_deadline_is_found_once_claims_answer_late(
    tmp_path: Path,
) -> None:
    """Set C's HTTP exchange cut at the later of its time limit and the write deadline was out
    of the world's reach while a claim's answer came back at once (the deadline taken before
    the claim and the tool's cut-off counted after it fell on one instant). With late answers:
    step5's claim heard 4.6 s late, its DELETE held past its sender's wait, the stop at the
    cut, a truthful "not executed" at the store's deadline, and the shop acting after it. The
    clean product keeps every promise on the same seed (its exchange ends at the deadline)."""
    seed = 9192020537635010690
    bug = next(b for b in UNSEEN_C if "max for min" in b.name)
    done = _planted_run(bug, tmp_path, seed=seed, mode="local", options=WHOLE_BEFORE_SET_E)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "step5 hears the store's answer 4.6s late" in done.stdout
    assert "after-not-executed: a call took effect after a true 'not executed'" in done.stdout
    clean = simulate(seed=seed, store="memory", mode="local", options=WHOLE_BEFORE_SET_E)
    assert clean.ok, "\n".join(clean.lines)
    assert any("step5 hears the store's answer 4.6s late" in line for line in clean.lines)


class _Asking:
    """A step process that asks its confirmer and is never held up (``network.Sender``)."""

    name = "step1"
    alive = True
    congested = False  # its node in no network incident: the network draws its fate alone

    def window(self, name: str) -> None:
        pass

    def late(self, call: object) -> None:
        pass


def _ask_the_shop(
    choices: Sequence[int], *, received: str = "k1", took_effect: bool = True
) -> tuple[bool | None, Books, World]:
    """The product's HTTP confirmer asks the shop's status endpoint, over the simulated
    network, about key ``k1`` of call ``p1``; the shop received a request of ``p1`` under
    ``received``, which took effect or not; ``choices`` are the world's draws."""
    world = World(Schedule(replay=choices))
    books = Books(clocks=world.clocks)
    network = Network(world, books)
    shop = Shop(world, books)
    network.servers["shop.sim"] = shop
    network.senders["step1"] = _Asking()
    endpoint = "POST http://shop.sim/orders"
    books.sent.append(Sent(0.0, "step1", "p1", "request", endpoint, {}, received, reached=True))
    if took_effect:
        books.effects.append(Effect(0.0, "p1", "request", 0))
    unknown = UnknownAction(action="1:0", tool="place_order", idempotency_key="k1")
    with (
        clocks.simulated(wall=world.wall, boot=world.boot, sleep=world.sleep, alarm=world.alarm),
        _routed(network),
        world.acting("step1"),
    ):
        verdict = ProductConfirmer(world, shop).confirm("shop", "restock", unknown, {"ref": "p1"})
    return verdict, books, world


@pytest.mark.parametrize(
    ("choices", "took_effect", "received", "verdict"),
    [
        ((0, 0), True, "k1", True),  # {"executed": true}
        ((0, 0), False, "k1", False),  # {"executed": false}
        ((0, 1), True, "k1", None),  # no executed in the answer
        ((0, 2), True, "k1", None),  # {"executed": null}
        ((0, 999), False, "k0", None),  # a key the shop never received: 404
        ((0, 0), False, "k0", False),  # ... or, as another shop says it, not executed
        ((1,), True, "k1", None),  # the connection refused
        ((2,), True, "k1", None),  # dropped after the question left
        ((3,), True, "k1", None),  # no answer within the confirmer's time limit
        ((4, 0), True, "k1", None),  # 500
        ((5, 500, 0), True, "k1", True),  # a slow answer, within the limit
        ((6, 0), True, "k1", None),  # answered, the answer lost on its way back
    ],
)
def test_the_products_http_confirmer_reads_the_shops_status_answers(
    choices: Sequence[int], took_effect: bool, received: str, verdict: bool | None
) -> None:
    """The product's own HTTP confirmer, over the simulated network, settles a call only on a
    definite ``executed`` from the shop's status endpoint (answered from the shop's ledger:
    the requests it received under the key, and whether their call took effect); every other
    answer (none, no or a null ``executed``, a 404, a 5xx, silence, a dropped connection)
    leaves it to a person. A definite answer that reached it goes into the world's books as the
    confirmer's decision about the call the product asked of (its ref), as a person's does; no
    other answer does (so a confirmer that reads one as a verdict settles on a decision the
    books never saw: ``audit``)."""
    said, books, world = _ask_the_shop(choices, received=received, took_effect=took_effect)
    assert said is verdict
    decided = [(d.by, d.action, d.ref, d.yes, d.source) for d in books.decisions]
    if verdict is None:
        assert decided == []
        assert books.questions == []
    else:
        assert decided == [("http-confirmer", "1:0", "p1", verdict, "confirmer")]
        assert [(q.to, q.ref) for q in books.questions] == [("http-confirmer", "p1")]
    assert books.sent[1:] == []  # the question is no request of a call
    if choices[0] == 3:
        assert world.now >= 10.0  # it waited out its time limit on virtual time
    if choices[0] == 5:
        assert 0.0 < world.now < 10.0


def test_make_sims_every_move_runs_draw_their_share_apart_from_the_world() -> None:
    """``make sim`` (``--every-move``) turns on, in a share of its runs, the moves made only
    when named (``delete``) and the product's HTTP confirmer, each drawn from a stream of its
    own derived from the seed: the same seed draws the same, both shares are about their
    size, and ``Options.every()`` without a seed (what the kept seeds replay) draws neither."""
    assert Options.every() == Options(late_shop=True, moves=frozenset(MOVES))
    drawn = [Options.whole(seed_of(index, 48)) for index in range(400)]
    assert drawn == [Options.whole(seed_of(index, 48)) for index in range(400)]
    named = sum(set(NAMED_MOVES) <= o.moves for o in drawn)
    http = sum(o.http_confirmer for o in drawn)
    assert 400 / NAMED_SHARE * 0.8 < named < 400 / NAMED_SHARE * 1.2
    assert 400 / HTTP_CONFIRMER_SHARE * 0.8 < http < 400 / HTTP_CONFIRMER_SHARE * 1.2
    assert all(o.late_shop and frozenset(MOVES) <= o.moves for o in drawn)
    both = next(o for o in drawn if o.http_confirmer and "delete" in o.moves)
    assert both.flags().endswith(",service-account --http-confirmer")
    assert "delete" in both.flags()


def test_every_part_of_the_world_is_replayed_by_the_flags_a_failure_prints() -> None:
    """A failing run prints its world as flags (``Options.flags``); read back by the command
    line, they make the very same world, for every part the world can switch on alone and
    for ``make sim``'s whole world with its shares; so a part added to ``Options`` without
    its flag could not hide from a replay."""
    parse = _parser()
    alone = [Options(**{f.name: True}) for f in dataclasses.fields(Options) if f.default is False]
    for options in (*alone, *(Options.whole(seed_of(i, 48)) for i in range(8))):
        assert _options(parse.parse_args(options.flags().split())) == options, options.flags()
    assert {f.name for f in dataclasses.fields(Options) if f.default is False} == {
        "late_shop",
        "http_confirmer",
        *SWITCHES,
    }


def test_make_sims_operator_runs_delete_approvals_and_keep_every_promise() -> None:
    """``make sim``'s world (every move, the share of its seeds) deletes Approvals while the
    operators are down in the operator-mode runs of its share, as ``--moves delete`` does:
    its first seeds (base 0) include such a run, and the runs up to it keep every promise."""
    for index in range(0, 120, 3):  # make sim's operator-mode runs
        seed = seed_of(index, 0)
        options = whole_with_set_f(seed)
        if "delete" not in options.moves:
            continue
        outcome = simulate(seed=seed, mode=_mode(index, "mix"), options=options)
        assert outcome.ok, f"{seed}: " + "; ".join(map(str, outcome.violations))
        if any("the operators are down; alice deletes" in line for line in outcome.lines):
            return
    raise AssertionError("no run of make sim's world deleted an Approval")


#: A seed of ``make sim``'s share with the product's HTTP confirmer (base 48's 72nd run, a
#: monitor), where the shop answers the confirmer without saying ``executed``.
HTTP_CONFIRMER_SEED = 2979256229704649517


def test_an_http_confirmer_that_reads_no_answer_as_not_executed_is_found(tmp_path: Path) -> None:
    """Set D's "the HTTP confirmer reads an answer without executed as not executed", out of
    the simulator's reach while the world's confirmer was its own: on a seed of ``make
    sim``'s share (``--every-move``) the product's HTTP confirmer settles a call "not executed"
    on an answer that said nothing, a settlement the world's books never saw (``audit``); the
    clean product keeps every promise there, its confirmer leaving that answer to a person."""
    # The world it was found in: the seed's share of ``make sim``'s, before set E's parts.
    found_in = whole_before_set_e(HTTP_CONFIRMER_SEED)
    assert found_in.http_confirmer
    clean = simulate(seed=HTTP_CONFIRMER_SEED, mode="monitor", options=found_in)
    assert clean.ok, "; ".join(map(str, clean.violations))
    assert any("http-confirmer hears about" in line for line in clean.lines)
    bug = next(b for b in UNSEEN_D if "without executed" in b.name)
    done = _simulator_on(
        planted(bug, tmp_path),
        *("--seed", str(HTTP_CONFIRMER_SEED), "--mode", "monitor", "--store", "memory"),
        *found_in.flags().split(),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "settlement of" in done.stdout and "as abandoned, never made" in done.stdout
    assert "--http-confirmer --seed" in done.stdout  # its replay names the share's options


def _desk(seed: int, *, rejection_limit: bool = False, **parts: bool) -> tuple[Desk, Schedule]:
    """A run's desk whose place_order asks approval (its rule drawn from ``seed``), its spec
    limiting the verifier's rejections with ``rejection_limit``, and the desk's other parts
    (``time_budget``, ``service_account_rules``) as ``parts`` says."""
    schedule = Schedule(seed=seed)
    world = World(schedule)
    scenario = Scenario(
        plans=(),
        rejected=frozenset(),
        approval=frozenset({"place_order"}),
        max_iterations=None,
        tokens=None,
        confirmer=False,
        input_tokens=100,
        output_tokens=20,
    )
    return Desk(scenario, world, Books(), rejection_limit=rejection_limit, **parts), schedule


def test_rule_edits_mostly_name_other_groups_and_draw_what_they_drew() -> None:
    """A rule edit changes its one drawn field as before, with one draw more for its groups or
    its expiry, and nothing else drawn (the run's later choices are drawn as before); from the
    rest of its draw, most edits name other groups than the rule named, so an action planned
    under one list and called under another is common (issue 48, set D: one edit in four
    changed the groups, and 1,077 runs never met both lists), and notCreator, the expiry and
    the count change with it now and then."""
    others = not_creator = expiry = count = edits = 0
    for seed in range(120):
        desk, schedule = _desk(seed)
        for _ in range(4):
            before = rule_of(desk.tool("place_order") or {})
            drawn = len(schedule.made)
            desk.edit("rule place_order")
            after = rule_of(desk.tool("place_order") or {})
            which = schedule.made[drawn] % 4
            assert len(schedule.made) - drawn == (2 if which in (1, 3) else 1)
            edits += 1
            others += bool(after.groups) and after.groups != before.groups
            not_creator += which != 2 and after.not_creator != before.not_creator
            expiry += which != 3 and after.expires_after != before.expires_after
            count += which != 0 and after.required != before.required
    assert others / edits > 0.6, others
    assert min(not_creator, expiry, count) / edits > 0.1, (not_creator, expiry, count)


def test_the_owner_names_other_groups_for_a_waiting_call_drawing_nothing() -> None:
    """``Desk.regroup`` (a person waiting on an approval has the owner name other groups first)
    turns a rule's named list into the other one, as a new generation, drawing nothing; a rule
    naming no groups is left as it is."""
    for seed in range(40):
        desk, schedule = _desk(seed)
        named = rule_of(desk.tool("place_order") or {}).groups
        drawn, generation = len(schedule.made), desk.generation
        desk.regroup("place_order")
        assert len(schedule.made) == drawn
        after = rule_of(desk.tool("place_order") or {}).groups
        if not named:
            assert (desk.generation, after) == (generation, ())
            continue
        assert desk.generation == generation + 1
        assert after and after != named
        assert {g for lists in (named, after) for g in lists[0]} == {
            "payments-approvers",
            "shop-devs",
        }


def test_in_a_run_with_a_token_budget_the_model_answers_at_length_now_and_then() -> None:
    """The world's model answers most plans at length in a run with a token budget (a plain
    answer costs less than the product's estimate of a request, so no call could cross the
    budget), and books what each answer cost; a run without a token budget is as before."""
    long = plain = 0
    for seed in range(200):
        scenario = Scenario.drawn(Schedule(seed=seed))
        if scenario.tokens is None:
            assert scenario.long_answers == frozenset()
            continue
        for iteration in range(1, 5):
            asked = scenario.usage(ModelQuestion("plan", iteration, 0, False)).tokens
            if iteration in scenario.long_answers:
                assert asked == scenario.call_tokens > 500
                long += 1
            else:
                assert asked == scenario.input_tokens + scenario.output_tokens
                plain += 1
        assert scenario.usage(ModelQuestion("verify", 1, 0, False)).tokens < 200
    assert long > 2 * plain > 0


#: Set D's bugs the simulator missed (docs/simulation.md, "Set D"), each with a seed that finds
#: it now (bench/unseen_bugs.py --set D, base 48: run and seconds in the docs) and the promise
#: broken there; the clean product keeps every promise on the same seed.
SET_D_FOUND = (
    (
        "the token budget judged spent on input tokens only (a wrong field)",
        671047883635681448,
        "spent",
    ),
    (
        "two rules combined drop the second list of groups (an off-by-one in stricter)",
        12974425881302633549,
        "unapproved",
    ),
)


@pytest.mark.parametrize(("name", "seed", "rule"), SET_D_FOUND, ids=[f[0] for f in SET_D_FOUND])
def test_set_d_bugs_once_missed_break_a_promise_on_their_seed(
    name: str, seed: int, rule: str, tmp_path: Path
) -> None:
    """Planted into a copy of the package, each bug breaks its promise on its seed (local mode,
    every move), judged from the world's books; the clean product keeps every promise there
    (else finding it proves nothing)."""
    bug = next(b for b in UNSEEN_D if b.name == name)
    assert simulate(seed=seed, options=Options.every()).ok
    # In the world the seed was found in (``Options.every()``), as the clean run above.
    done = _planted_run(bug, tmp_path, seed=seed, mode="local", options=Options.every())
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"  {rule}: " in done.stdout, done.stdout[-2000:]


def test_calm_people_give_every_approval_a_rule_that_expires_needs_at_once() -> None:
    """``make sim`` on main (base 1796597064, a monitor, ``waiting``): tick 3's notify needed two
    approvals from payments-approvers, each counting for a minute, and the calm people (a look a
    minute) gave one a look, each older than a minute when the next came, and then none (bob
    and carol had approved before): the run waited for ever, asked again each time, the product
    right. Now the people a rule asks agree on it together in the calm, and approve again when
    the product asks again: the run finishes, and the two approvals come at one moment."""
    seed = 9802991565184251092
    outcome = simulate(seed=seed, mode="monitor", store="memory", options=WHOLE_BEFORE_SET_E)
    assert outcome.ok, "; ".join(map(str, outcome.violations))
    calm = [line.split() for line in outcome.lines if "approved 3:1 (notify)" in line]
    moments = [float(words[0]) for words in calm if float(words[0]) > CHAOS]
    assert any(moments.count(m) == 2 for m in moments), calm


#: A seed of ``make sim``'s world on which set E's rejection limit passed (``>`` for ``>=``)
#: breaks a promise: operator mode, memory store.
REJECTION_LIMIT_SEED = 5686236089204240597


def test_a_rejection_limit_is_drawn_only_in_the_whole_world_and_moves_with_the_budget() -> None:
    """With ``rejection_limit`` (the whole world's) the run's spec limits the verifier's
    rejections to one or two, drawn last of the desk's choices (one draw more, the others as
    before); a budget raised raises it by one, lowered lowers it, never below one. Without it
    the spec names no limit (the product's default of three) and the desk draws what it drew,
    so the kept seeds' stories stay."""
    limits: set[int] = set()
    for seed in range(40):
        plain, drawn = _desk(seed)
        limited, drawn_limited = _desk(seed, rejection_limit=True)
        assert "maxVerifierRejections" not in plain.manifest["budget"]
        assert drawn_limited.made[:-1] == drawn.made
        limit = limited.manifest["budget"]["maxVerifierRejections"]
        limits.add(limit)
        limited.edit("raise budget")
        assert limited.manifest["budget"]["maxVerifierRejections"] == limit + 1
        for _ in range(3):
            limited.edit("lower budget")
        assert limited.manifest["budget"]["maxVerifierRejections"] == 1
    assert limits == {1, 2}


def test_whole_world_runs_meet_their_rejection_limit_and_keep_every_promise() -> None:
    """In the whole world runs stop for the verifier's rejections (a limit of one or two is met
    by a run with a rejection or two, where the default of three hardly ever was), and the
    clean product keeps every promise, ``rejected`` among them."""
    stopped = 0
    for index in range(24):
        outcome = simulate(
            seed=seed_of(index, 7), store="memory", mode="local", options=Options.whole()
        )
        assert outcome.ok, "\n".join(outcome.lines)
        stopped += any('"reason":"verifier_rejections"' in line for line in outcome.lines)
    assert stopped >= 3, stopped


def test_a_rejection_limit_let_past_by_one_is_found(tmp_path: Path) -> None:
    """Set E's verifier limit that stops a run only once it is passed (``>`` for ``>=``): the
    run's spec allows one rejection, the verifier rejects iteration 1, and the step asks the
    model for iteration 2's plan (``rejected``). The clean product stops there, the run Failed
    for the verifier's rejections, and keeps every promise on the same seed."""
    bug = next(b for b in UNSEEN_E if "rejection limit" in b.name)
    where = ("--seed", str(REJECTION_LIMIT_SEED), "--mode", "operator", "--store", "memory")
    found_in = whole_with_verdicts(REJECTION_LIMIT_SEED)
    done = _simulator_on(planted(bug, tmp_path), *where, *found_in.flags().split())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "rejected: a run went on after the verifier rejected it" in done.stdout
    assert "plan iteration 2 at 45.2 after 1 rejection(s), its limit 1" in done.stdout
    clean = simulate(
        seed=REJECTION_LIMIT_SEED,
        store="memory",
        mode="operator",
        options=found_in,
    )
    assert clean.ok, "\n".join(clean.lines)
    assert any("ends Failed verifier_rejections" in line for line in clean.lines)


def test_a_run_failed_on_the_verifiers_limit_is_not_over_while_a_raised_limit_resumes_it() -> None:
    """The world took a run Failed for the verifier's rejections as over, and stopped its
    operators, though the spec's limit had been raised while the step that stopped it was held
    up (219.6 s): the operator had already recorded the next step, whose pod then ran with no
    operator left (``waiting``, "Running failed"). The run is over only once no step is
    intended either; on the same seed the resumed run goes on and keeps every promise. The
    kept operator seeds' stories do not move (no kept run ends so)."""
    seed = 6621456869021822887
    outcome = simulate(
        seed=seed, store="memory", mode="operator", options=whole_with_verdicts(seed)
    )
    assert outcome.ok, "\n".join(outcome.lines)
    lines = outcome.lines
    failed = next(i for i, line in enumerate(lines) if "ends Failed verifier_rejections" in line)
    assert any("restock-s5-a1 starts" in line for line in lines[failed:])
    assert any('"from":"verifier_rejections"' in line for line in lines)


def test_an_approval_after_a_step_that_recorded_nothing_is_judged_as_shown() -> None:
    """Monitor mode: tick14 stopped tick 3 for an approval of place_order (a POST); the owner
    made it a DELETE, tick15 lost its store and ended having recorded nothing; carol approved
    what ``keelgate pending`` showed (the POST), and tick16 sent it. The oracle took tick15's
    DELETE for what carol was shown and read her approval as none (``unapproved``); judged
    by the step that stopped the run to ask, the product keeps every promise."""
    seed = 15482323029717145780
    outcome = simulate(seed=seed, store="memory", mode="monitor", options=whole_with_verdicts(seed))
    assert outcome.ok, "\n".join(outcome.lines)
    assert any("tick15 ends with StoreUnavailable" in line for line in outcome.lines)
    assert any(
        "EFFECT POST http://shop.sim/orders p2@t3 by tick16" in line for line in outcome.lines
    )


def test_people_keep_looking_at_a_run_whose_raised_rejection_limit_resumes_it() -> None:
    """Local mode: the verifier's limit stopped the run (for good, under its spec), a person
    looked then and, taking the run as over, never looked again; an edit had raised the limit
    meanwhile, the run went on and stopped for approvals nobody came to give (``waiting``).
    People take a run as over only once its stop is final under the spec as it stands; on the
    same seed they approve in the calm, and every promise is kept."""
    seed = 18177176184284550005
    outcome = simulate(seed=seed, store="memory", mode="local", options=whole_with_verdicts(seed))
    assert outcome.ok, "\n".join(outcome.lines)
    assert any('"from":"verifier_rejections"' in line for line in outcome.lines)


#: A seed of ``make sim``'s world (monitor mode, memory store) on which set E's MCP exchange
#: cut at its time limit only breaks a promise.
MCP_EXCHANGE_SEED = 5447360289403228715


def test_an_mcp_exchange_left_open_past_its_deadline_is_found(tmp_path: Path) -> None:
    """Set E's MCP exchange cut at the tool's time limit only (the write deadline dropped):
    tick9's claim heard 21.8 s late, the MCP session opens with 30 s of wait where 8 s of the
    deadline are left; the shop holds the ``tools/call`` past that wait and acts 2 s after
    dave's truthful "not executed", taken once the store's deadline passed
    (``after-not-executed``). The clean product's exchange ends at the deadline, and every
    promise is kept on the same seed. Reached with MCP more often in the whole world
    (``place_order`` over MCP in half the runs, ``notify`` too)."""
    bug = next(b for b in UNSEEN_E if "MCP exchange" in b.name)
    where = ("--seed", str(MCP_EXCHANGE_SEED), "--mode", "monitor", "--store", "memory")
    whole = whole_with_verdicts(MCP_EXCHANGE_SEED)
    done = _simulator_on(planted(bug, tmp_path), *where, *whole.flags().split())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tick9 hears the store's answer 21.8s late" in done.stdout
    assert "tick9 mcp http://shop.sim/mcp place_order held by the server" in done.stdout
    assert "after-not-executed: a call took effect after a true 'not executed'" in done.stdout
    assert whole.mcp_often
    clean = simulate(seed=MCP_EXCHANGE_SEED, store="memory", mode="monitor", options=whole)
    assert clean.ok, "\n".join(clean.lines)


def test_a_dollar_budget_is_read_from_a_choice_already_made_and_only_in_the_whole_world() -> None:
    """``Scenario.drawn(dollar_budgets=True)`` (``--dollars``, on in the whole world) gives
    about half the runs a dollar budget and the model's prices, output dearer than input, the
    budget between two and a half and eight and a half plain answers; it draws nothing of its
    own (the same choices, the same story otherwise), and without it no run has one."""
    priced = 0
    for seed in range(300):
        plain_schedule, priced_schedule = Schedule(seed=seed), Schedule(seed=seed)
        plain = Scenario.drawn(plain_schedule)
        scenario = Scenario.drawn(priced_schedule, dollar_budgets=True)
        assert priced_schedule.made == plain_schedule.made
        assert replace(scenario, pricing=None, dollars=None) == plain
        assert plain.dollars is None and plain.pricing is None
        if scenario.dollars is None:
            continue
        priced += 1
        assert scenario.pricing is not None
        per_input, per_output = (Decimal(p) for p in scenario.pricing)
        assert per_output >= 4 * per_input
        answers = Decimal(scenario.dollars) / scenario.answer_dollars
        assert Decimal("2.5") <= answers <= Decimal("8.5"), answers
    assert 300 * 0.35 < priced < 300 * 0.65, priced


def test_runs_with_a_dollar_budget_stop_on_it_are_raised_and_keep_every_promise() -> None:
    """In the whole world, runs with a dollar budget stop on it (the product's ``dollar_budget``
    stop), their owners raise it (by five plain answers, as a token budget is raised), and they
    finish, every promise kept (``spent`` judging dollars from the world's books); the kept
    seeds' world (``--late-shop --moves``) sets no dollar budget."""
    budgets = stops = 0
    for index in range(30):
        seed = seed_of(index, 6)
        mode = "operator" if index % 5 == 4 else "local"
        whole = simulate(seed=seed, store="memory", mode=mode, options=Options.whole())
        assert whole.ok, "; ".join(map(str, whole.violations))
        budgets += any("dollar budget $" in line for line in whole.lines)
        stops += any('"reason":"dollar_budget"' in line for line in whole.lines)
        if index < 6:
            kept = simulate(seed=seed, store="memory", mode=mode, options=Options.every())
            assert not any("dollar budget" in line for line in kept.lines)
    assert budgets >= 8 and stops >= 4, (budgets, stops)


def test_raising_and_lowering_a_dollar_budget_moves_it_by_plain_answers() -> None:
    """The owner's budget edits move a dollar budget as they move a token budget: raised by
    five plain answers at the run's prices, lowered by two, never below one; a run without a
    dollar budget gets none."""
    desk, _ = _desk(1)
    assert "dollars" not in desk.manifest["budget"]
    desk.edit("raise budget")
    assert "dollars" not in desk.manifest["budget"]
    schedule = Schedule(seed=2)
    scenario = replace(
        desk.scenario, pricing=("3", "15"), dollars="0.0030", input_tokens=100, output_tokens=40
    )
    priced = Desk(scenario, World(schedule), Books())
    assert priced.manifest["pricing"] == {
        "inputPerMillionTokens": "3",
        "outputPerMillionTokens": "15",
    }
    assert priced.manifest["budget"]["dollars"] == "0.0030"
    priced.edit("raise budget")
    assert Decimal(priced.manifest["budget"]["dollars"]) == Decimal("0.0075")
    for left in ("0.0057", "0.0039", "0.0021", "0.0009", "0.0009"):
        priced.edit("lower budget")
        assert Decimal(priced.manifest["budget"]["dollars"]) == Decimal(left)


def test_the_anthropic_server_reports_part_of_the_input_as_prompt_cache_tokens() -> None:
    """With ``cached_input`` (on in the whole world), the simulated Anthropic ``messages``
    answer splits its input as Anthropic's does: three quarters of it, the prompt's prefix (the
    system prompt and tools), written to the cache when no entry of that prefix is alive
    (``cache_creation_input_tokens``, with its five-minute breakdown), read from it when one is
    (``cache_read_input_tokens``: within five minutes of its last use), and ``input_tokens``
    the rest; the three always sum to the input the model counted (the world's books), and
    another prefix (the tools edited) is written anew. Without it, all input is
    ``input_tokens``."""
    world = World(Schedule(seed=3))
    books = Books()
    scenario = replace(Scenario.drawn(Schedule(seed=3)), input_tokens=120, output_tokens=30)
    server = ModelServer(world, Planner(world, scenario, books), cached_input=True)

    def usage(tools: str = "place_order") -> dict[str, Any]:
        body = {
            "model": "sim-claude",
            "system": "You plan.",
            "tools": [{"name": tools}],
            "messages": [{"role": "user", "content": "Iteration 1: call the next tools"}],
        }
        reply = server.handle(Request("POST", "http://model.sim/v1/messages", body, ""), None)
        said: dict[str, Any] = reply.body["usage"]
        return said

    def split(said: dict[str, Any]) -> tuple[int, int, int]:
        parts = (
            said["input_tokens"],
            said["cache_creation_input_tokens"],
            said["cache_read_input_tokens"],
        )
        assert sum(parts) == 120 and said["output_tokens"] == 30
        assert said["cache_creation"]["ephemeral_5m_input_tokens"] == parts[1]
        return parts

    assert split(usage()) == (30, 90, 0)
    world.now = 299.0
    assert split(usage()) == (30, 0, 90)
    assert split(usage("notify")) == (30, 90, 0)
    world.now = 599.0
    assert split(usage()) == (30, 0, 90)
    world.now = 900.0
    assert split(usage()) == (30, 90, 0)
    assert [ask.tokens for ask in books.asks] == [150] * 5
    server.cached_input = False
    assert usage() == {"input_tokens": 120, "output_tokens": 30}


def test_cached_input_draws_nothing_and_the_product_counts_every_input_token() -> None:
    """The cached input's report draws nothing from the schedule, and the product's Anthropic
    adapter counts cached tokens as input: whole-world runs reaching their model over
    Anthropic's wire, each with a budget, run the very same story (the same trace, hash for
    hash) whether the server reports cache tokens or not."""
    anthropic = 0
    for index in range(80):
        seed = seed_of(index, 9)
        schedule = Schedule(seed=seed)
        Clocks.drawn(schedule)
        scenario = Scenario.drawn(schedule, dollar_budgets=True)
        if scenario.tokens is None and scenario.dollars is None:
            continue
        whole = simulate(seed=seed, store="memory", options=Options.whole())
        if "model anthropic," not in whole.lines[1]:
            continue
        anthropic += 1
        plain = simulate(
            seed=seed, store="memory", options=replace(Options.whole(), cached_input=False)
        )
        assert whole.ok and whole.digest == plain.digest
    assert anthropic >= 3, anthropic


#: Set E's bugs out of the world's reach before dollar budgets and cached input came
#: (docs/simulation.md, "Set E"), each with a seed that finds it now in the whole world
#: (``--every-move``) and the promise broken there; the clean product keeps every promise on it.
SET_E_FOUND = (
    ("output tokens charged at the input price", 5686236089204240597, "local"),
    (
        "the Anthropic adapter's usage leaves out cached input tokens",
        5862954417768748097,
        "operator",
    ),
)


@pytest.mark.parametrize(("words", "seed", "mode"), SET_E_FOUND, ids=[f[0] for f in SET_E_FOUND])
def test_set_e_bugs_of_dollars_and_cached_input_break_a_promise_on_their_seed(
    words: str, seed: int, mode: str, tmp_path: Path
) -> None:
    """Planted into a copy of the package, output priced as input (a dollar budget passed
    unseen) and cached input left out of the Anthropic adapter's usage (a budget passed
    unseen) each let a run act or ask its model once its budget was used up, by the world's
    count: ``spent`` on the seed (memory store, the whole world as ``make sim`` draws it for
    the seed); the clean product keeps every promise there."""
    bug = next(b for b in UNSEEN_E if words in b.name)
    clean = simulate(seed=seed, store="memory", mode=mode, options=whole_with_dollars(seed))
    assert clean.ok, "; ".join(map(str, clean.violations))
    done = _simulator_on(
        planted(bug, tmp_path),
        *("--seed", str(seed), "--mode", mode, "--store", "memory"),
        *whole_with_dollars(seed).flags().split(),
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "  spent: " in done.stdout, done.stdout[-2000:]


#: Set F's bugs the whole world missed (docs/simulation.md, "Set F's misses"), each with a seed
#: that finds it in the world they were closed in (``whole_with_set_f``), the promise it breaks
#: there, and the lines of its window in the clean product's trace of the seed.
SET_F_FOUND = (
    (
        "notCreator with no creator on record",
        15867211268725775087,
        "local",
        "unapproved",
        (
            "the run's spec names no creator",
            "dave approves 1:2: SettleError",
            "alice records herself as the run's creator",
        ),
    ),
    (
        "the token look-ahead forgets the tokens already used",
        16620630897596954255,
        "local",
        "spent",
        ("step5 ends Stopped token_budget",),
    ),
    (
        "a Python tool's timeout read as a definite failure",
        14995329164322029502,
        "local",
        "told-not-run",
        (
            "pay sends without reporting them",
            "step7 POST http://shop.sim/charges (charge) held by the server for 34.0s",
            "step7 stops waiting for its call as it ends",
        ),
    ),
    (
        "the HTTP confirmer asks about the action's id instead of its key",
        1166570309058947158,
        "operator",
        "confirmed",
        ("restock-s2-a3 asks http-confirmer about 2:0 p3",),
    ),
)


@pytest.mark.parametrize(
    ("words", "seed", "mode", "rule", "shown"), SET_F_FOUND, ids=[f[0] for f in SET_F_FOUND]
)
def test_set_f_bugs_once_missed_break_a_promise_on_their_seed(
    words: str, seed: int, mode: str, rule: str, shown: tuple[str, ...], tmp_path: Path
) -> None:
    """Planted into a copy of the package, each of set F's four misses breaks a promise on its
    seed in the whole world as it is now: alice's own approval counted under notCreator in a
    run whose spec names no creator (``unapproved``: the world knows she created it); the model
    asked to verify with 1,490 of 1,500 tokens used and the question's input alone 90 more
    (``spent``); a Python tool's call read as a definite failure when its caller stopped waiting
    on it, its charge held by the shop and taken after (``told-not-run``); the HTTP confirmer's
    "not executed" of an order the shop took, asked about another key (``confirmed``). The
    clean product keeps every promise on each seed, which meets the window it was found by."""
    bug = next(b for b in UNSEEN_F if words in b.name)
    _meets_its_window_and_keeps_every_promise(
        words, seed, shown, mode=mode, options=whole_with_set_f(seed)
    )
    done = _planted_run(bug, tmp_path, seed=seed, mode=mode, options=whole_with_set_f(seed))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"  {rule}: " in done.stdout, done.stdout[-2000:]


def test_pay_runs_in_the_products_python_tool_and_runs_name_no_creator_in_the_whole_world() -> None:
    """In the whole world (``--every-move``) the product's own Python tool runs ``pay`` (its
    function reporting its sends in some runs, not in others), and some local runs' specs name
    no creator until the calm; every promise is kept, and the seam is given back after each
    run. The kept seeds' world (``Options.every()``) draws none of it."""
    from keelgate.adapters.tools import python as python_tools

    said: Counter[str] = Counter()
    for index in range(16):
        seed = seed_of(index, 11)
        whole = simulate(seed=seed, store="memory", mode="local", options=Options.whole())
        assert whole.ok, "; ".join(map(str, whole.violations))
        assert python_tools._workers is python_tools._WORKERS
        for line in whole.lines[:4]:
            for what in ("pay reports its sends", "without reporting them", "names no creator"):
                said[what] += what in line
        kept = simulate(seed=seed, store="memory", mode="local", options=Options.every())
        assert not any("pay " in line[:20] or "no creator" in line for line in kept.lines[:4])
    assert all(said[what] >= 3 for what in said) and len(said) == 3, said


def test_a_person_may_have_been_shown_the_call_as_the_last_step_that_recorded_left_it() -> None:
    """What a person approving was shown: the tool as the newest step to have ended defined it;
    and, where that step ended without saying it recorded where its run stands (died, lost its
    store), as it defined it too (it may have recorded its stop before its store went: seed
    3478791516567543597) and as each step before it back to the newest that recorded defined it
    (the run may still be bound as that one left it); and as each step still running defined it
    (it may have bound the call anew and stopped the run already). Nothing else."""
    books = Books()
    tools = ("POST http://shop.sim/orders", "DELETE http://shop.sim/orders", "POST x/steal")
    for generation, shown in enumerate(tools, 1):
        method, url = shown.split()
        place_order = {"name": "place_order", "http": {"method": method, "url": url}}
        books.specs.append(SpecVersion(generation, 0.0, {"tools": [place_order]}))
    lives = (("step1", 1, True), ("step2", 3, False), ("step3", 1, True), ("step4", 2, False))
    for order, (name, generation, recorded) in enumerate(lives, 1):
        books.processes[name] = ProcessLife(float(order), order, generation, float(order), 0)
        books.processes[name].recorded = recorded
        if order == 3:
            assert books.might_have_shown("place_order", 3.5, None) == ()
    assert books.shown("place_order", 4.5, None) == tools[1]
    assert books.might_have_shown("place_order", 4.5, None) == (tools[1], tools[0])
    books.processes["step3"].recorded = False
    assert books.might_have_shown("place_order", 4.5, None) == (tools[1], tools[0], tools[2])
    books.processes["step5"] = ProcessLife(5.0, 5, 3)  # still running
    assert books.might_have_shown("place_order", 4.5, None) == (tools[1], tools[0], tools[2])
    assert books.might_have_shown("place_order", 5.5, None) == (tools[1], tools[0], tools[2])
    books.processes["step3"].recorded = True
    assert books.might_have_shown("place_order", 5.5, None) == (tools[1], tools[0], tools[2])
    books.processes["step4"].recorded = True
    assert books.might_have_shown("place_order", 5.5, None) == (tools[2],)


def test_a_monitor_whose_newest_step_lost_its_store_before_binding_an_edit_keeps_its_promise() -> (
    None
):
    """``--every-move --mode monitor`` (base 1796599068, run 159): bob approved tick 2's order
    at 756.3, two approvals of two needed, while the newest step (tick16, given a spec whose
    place_order had become a DELETE) had ended on its store before binding the call anew: the
    run still showed the POST it was bound to, and the product counted bob's approval for it;
    once the calm restored the tool, the order went as that POST. The world took bob to have
    approved the DELETE (the newest step's spec) and judged the order unapproved: the model's
    fault. It now takes either as what bob was shown (``Books.might_have_shown``); the run
    keeps every promise."""
    seed = 3630300620798533828
    outcome = simulate(seed=seed, mode="monitor", store="memory", options=whole_with_dollars(seed))
    assert outcome.ok, "; ".join(map(str, outcome.violations))
    said = [line.strip() for line in outcome.lines]
    assert "739.837 tick16 ends with StoreUnavailable (exit 5)" in said
    assert "756.340 bob approved 2:1 (place_order)" in said
    assert "905.972 EFFECT POST http://shop.sim/orders p3@t2 by tick23" in said


def test_a_run_stopped_by_a_step_whose_store_answers_late_shows_that_step_s_call() -> None:
    """``--every-move`` (base 1796600224, run 1103; on main 592b042 too, without dollar budgets):
    step9, given the spec that sent ``place_order`` back to the shop's orders, bound the call
    anew and stopped the run to ask at 225 s, but heard its store late and ended only at
    241 s; bob approved at 235.4, shown the POST to the orders the run was bound to, and the
    product counted it; the order went there at 248.9. The world took what bob was shown from
    the newest step to have ended (step8, whose spec sent it to ``/steal``) and judged the
    order unapproved: the model's fault. A step still running may have stopped the run already
    (``Books.might_have_shown``); the run keeps every promise."""
    seed = 6870649156577813982
    outcome = simulate(seed=seed, mode="local", store="memory", options=whole_with_dollars(seed))
    assert outcome.ok, "; ".join(map(str, outcome.violations))
    said = [line.strip() for line in outcome.lines]
    assert "224.256 step9 starts" in said and "240.980 step9 ends Stopped awaiting_approval" in said
    assert "235.433 bob approved 2:0 (place_order)" in said
    assert "248.947 EFFECT POST http://shop.sim/orders p3 by step10" in said


# Two clusters over one store (issue 50, item 4; ``--two-clusters``)

#: Seeds with two clusters whose trace shows the run moving between them: base 1 of
#: ``seed_of``, every move of the world off but the second cluster.
TWO_CLUSTER_SEEDS = 30


def test_two_clusters_move_the_run_between_them_and_keep_every_promise() -> None:
    """With a second cluster given the same AgentRun over the one store, the faults that move
    ownership (a cluster's operators or API server gone for a while, a cluster cut off from
    the store, each coming back) hand the run from one cluster to the other: in most runs both
    clusters' step pods drive it in turn, in some a step pod of the cluster that lost it is
    fenced off (exit 6), and in some a decision made in the cluster that does not hold it is
    shown not counted there; and every promise is kept, judged as for one cluster, with
    ``two-drivers`` besides."""
    moved = fenced = refused = 0
    for index in range(TWO_CLUSTER_SEEDS):
        seed = seed_of(index, 1)
        outcome = simulate(seed=seed, mode="operator", options=Options(two_clusters=True))
        assert outcome.ok, f"{seed}: " + "; ".join(map(str, outcome.violations))
        lines = outcome.lines
        starts = {
            line.split()[1].split("/")[0]
            for line in lines
            if "/restock-" in line and line.endswith(" starts")
        }
        moved += starts == {"east", "west"}
        fenced += any("(exit 6)" in line for line in lines)
        refused += any("is shown not counted here" in line for line in lines)
    # Measured on this base: 22 runs moved, 5 with a step fenced, 4 with a deny refused.
    assert moved >= TWO_CLUSTER_SEEDS // 2, moved
    assert fenced >= 3, fenced
    assert refused >= 1, refused


def test_the_whole_world_has_two_clusters_in_a_share_of_its_runs_only() -> None:
    """``make sim``'s world (``Options.whole(seed)``) has two clusters in about half its runs,
    drawn apart from the world's schedule; the kept seeds' worlds (``whole_with_set_f`` and
    those before it) never; and ``make test``'s budget keeps one cluster."""
    drawn = [Options.whole(seed_of(index, 48)).two_clusters for index in range(400)]
    assert 150 < sum(drawn) < 250, sum(drawn)
    assert not any(whole_with_set_f(seed_of(index, 48)).two_clusters for index in range(50))
    assert not whole_before_set_f(seed_of(0, 48)).two_clusters
    assert whole_with_two_clusters(seed_of(0, 48)).two_clusters
    assert not BUDGET_OPTIONS.two_clusters


@pytest.mark.parametrize("bug", IN_TWO_CLUSTERS, ids=lambda bug: bug.name)
def test_a_product_that_drives_a_run_from_both_clusters_is_found(
    bug: Planted, tmp_path: Path
) -> None:
    """A product that makes a step pod for a run the other cluster holds (under the holder's
    epoch, so the store refuses none of its writes) breaks ``two-drivers``: the world's record
    of which cluster's step wrote under which epoch shows two clusters driving the run."""
    summary = find(bug, tmp_path, seeds=120)
    assert summary["first"] is not None, f"{bug.name}: not found in {summary['runs']} runs"
    assert "two-drivers" in summary["rules"], summary["rules"]  # type: ignore[operator]


#: Seeds found with two clusters that broke a promise on main 643c3da: a deny made on the
#: Approval of the cluster that lost the run, while that cluster could not reach the store,
#: was neither counted nor shown refused before the other cluster ran the call on an approval
#: made there (docs/simulation.md, "Found: a deny made where the run no longer is"). Since the
#: cut-off cluster shows such a decision not counted yet (and the other shows the run
#: Standby), the world takes another path from this seed: it is kept as a run that must keep
#: every promise.
#: The second (make sim SECONDS=300 on main 6ece748, seed 1347250666130754872, its whole
#: world): east's operator, restarted while east was cut off from the store, held no run, so its
#: hold was never in doubt and bob's deny there went unshown; west ran place_order on bob's
#: later approval made there. Now an Approval whose looks have found the store away for longer
#: than a renewal period is shown so too. (Its shrunk schedule found the simulated API server
#: keeping no field managers' times: bob's approval in east was dated from a later look.)
FOUND_WITH_TWO_CLUSTERS = (
    (10842917703596741432, Options(two_clusters=True)),
    (1347250666130754872, whole_with_two_clusters(1347250666130754872)),
)


@pytest.mark.parametrize(("seed", "options"), FOUND_WITH_TWO_CLUSTERS)
def test_a_deny_made_where_the_run_no_longer_is_is_not_lost(seed: int, options: Options) -> None:
    """A deny made in the cluster that held the run, while it is cut off from the store and the
    other cluster takes the run over, counts (carried over) or is shown not counted before the
    call it denies runs elsewhere: never lost. The seed that once lost one keeps every
    promise."""
    outcome = simulate(seed=seed, mode="operator", options=options)
    assert outcome.ok, "; ".join(map(str, outcome.violations))
    assert any("is shown not counted here" in line for line in outcome.lines), "no deny refused"


def test_a_deny_made_as_its_clusters_operator_stopped_is_judged_from_its_next_look() -> None:
    """make sim SECONDS=600 on main 09e8ad4 (seed 5140709416924394793, two clusters): bob
    denied on east's Approval in the very moment east's operator stopped, before it looked;
    east's API server then went away, and west ran the order on bob's later approval made
    there. No process of the product read that deny; the oracle takes a deny from the first
    look of an operator of its cluster after it. The seed meets that story and keeps every
    promise."""
    seed = 5140709416924394793
    _meets_its_window_and_keeps_every_promise(
        "a deny made as its cluster's operator stopped",
        seed,
        (
            "138.541 bob adds to restock-1-place-order-7ee374e8a0's decisions approved: False",
            "138.541 east/operator1 stops",
            "east's API server is gone for 181.8s",
            "EFFECT mcp http://shop.sim/mcp place_order p1 by west/restock-s1-a1",
        ),
        mode="operator",
        options=whole_with_set_g(seed),
    )


def test_a_deny_made_where_no_operator_runs_is_judged_from_when_one_runs_there_again() -> None:
    """The two-cluster search after the merge (docs/simulation.md) found seed
    12340832287265749308 broken on the oracle's side: dave denied on east's Approval while no
    operator of east ran, and west, holding the run once east's lease lapsed, ran the charge on
    dave's approval made there. Nothing of the product could read that deny (the limit
    docs/operator.md states); the oracle now takes such a deny from when an operator runs in its
    cluster again. The seed meets that story and keeps every promise."""
    seed = 12340832287265749308
    _meets_its_window_and_keeps_every_promise(
        "a deny made where no operator runs",
        seed,
        (
            "east's operators are gone for 213.3s",
            "167.479 dave adds to restock-2-1-pay-02e032c027's decisions approved: False in east",
            "EFFECT charge p3 by west/restock-s2-a1",
            "354.014 east is back",
        ),
        mode="operator",
        options=whole_with_two_clusters(seed),
    )


#: Found with two clusters (seed 12531444287855935590, make sim's whole world; docs/simulation.md,
#: "A run left waiting after the verifier's limit was raised"): the run Failed on the verifier's
#: limit; every edit after that (none raising the limit) had east's operator make a step pod
#: after each such pod's end (13 in 30 s, each saying the edit is not used), and the people of
#: both clusters, finding the run Failed, looked no more; an edit then raised the limit, the run
#: went on and stopped for an approval nobody came to give (`waiting`). Two faults, one each:
#: the operator now makes no pod for a stop final under the spec as it stands, and people stop
#: looking only at a run finished under it (``RunState.continues_under``, as in local mode).
WAITING_AFTER_THE_LIMIT = 12531444287855935590
#: The operator's fault, planted back: a run Failed on the verifier's limit gets a step pod
#: after each edit that keeps the limit, and again after each of those pods.
POD_AFTER_EACH_EDIT_AT_THE_LIMIT = Planted(
    "a run Failed on the verifier's limit gets a step pod for each edit that keeps the limit",
    (
        (
            "kube/controller/agentrun.py",
            "if stop.reason is StopReason.FAILED or not state.continues_under(loop_spec.budget):",
            "if stop.reason is StopReason.FAILED:",
        ),
    ),
    mode="operator",
    store="memory",
    window_seed=WAITING_AFTER_THE_LIMIT,
    # The seed's whole world as it was found (``whole_with_two_clusters``), named part by
    # part: ``--every-move`` has gained parts since, which change its story.
    flags=(
        "--late-shop",
        "--moves",
        "copy,definition,delete,recreate,reorder,service-account",
        "--http-confirmer",
        "--slow-store",
        "--paged",
        "--rejection-limit",
        "--mcp-often",
        "--dollars",
        "--cached-input",
        "--python-tool",
        "--no-creator",
        "--two-clusters",
    ),
)


def test_a_run_failed_on_the_verifiers_limit_makes_no_pod_for_an_edit_in_the_seed_found() -> None:
    """The seed once left waiting keeps every promise, and where its run Failed on the
    verifier's limit, the edits that followed (none raising it) make no step pod: the run
    stays Failed and the world ends."""
    seed = WAITING_AFTER_THE_LIMIT
    outcome = simulate(seed=seed, mode="operator", options=whole_with_two_clusters(seed))
    assert outcome.ok, "; ".join(map(str, outcome.violations))
    lines = outcome.lines
    ended = "east/restock-s1-a2 ends Failed verifier_rejections"
    failed = next(at for at, line in enumerate(lines) if line.endswith(ended))
    assert any(line.endswith("spec edited: approval pay (generation 7)") for line in lines[failed:])
    assert not any("restock-s2-a1 starts" in line for line in lines), "a pod for a Failed run"


def test_people_look_on_at_a_run_failed_on_the_verifiers_limit_once_an_edit_raised_it(
    tmp_path: Path,
) -> None:
    """The seed as it was found (the operator's pod after each edit planted back): the people
    of both clusters, who found the run Failed on the verifier's limit, look on once an edit
    raised the limit and the run went on, and approve the call it then stops for; the run
    finishes (before, they looked no more, and it was left waiting)."""
    summary = find(POD_AFTER_EACH_EDIT_AT_THE_LIMIT, tmp_path, seeds=1)
    output = str(summary["output"])
    assert summary["first"] is None, output
    assert "restock-s13-a1 ends Failed verifier_rejections" in output  # the bug is in play
    assert "spec edited: raise budget" in output
    raised = output.index("spec edited: raise budget")
    assert "patches restock-2-place-order-df7f18f35a approved" in output[raised:], output
    assert "ends Succeeded goal_met" in output[raised:], output


#: Set G's misses closed in the world (docs/simulation.md, "Set G's misses closed in the
#: world"): each bug, the world that meets it (the kept seeds' world and the one part it
#: gained), how many seeds of base 0 (local mode, memory store) are searched, and the promise
#: it breaks there.
SET_G_CLOSED = (
    (
        "mcp.tool left out of the definition",
        replace(Options.every(), mcp_often=True, mcp_remote=True),
        50,
        "unapproved",
    ),
    (
        "json.dumps for the canonical spelling",
        replace(Options.every(), reordered_args=True),
        12,
        "twice",
    ),
    ("outputTokens as output_tokens", Options.every(), 12, "spent"),
    (
        "or for and in the no-call refusal",
        replace(Options.every(), python_tool=True, pay_threads=True),
        40,
        "after-not-executed",
    ),
    (
        "the ended test dropped",
        replace(Options.every(), python_tool=True, pay_threads=True),
        40,
        "told-not-run",
    ),
)


@pytest.mark.parametrize(
    ("words", "options", "seeds", "rule"), SET_G_CLOSED, ids=[c[0] for c in SET_G_CLOSED]
)
def test_set_g_misses_closed_in_the_world_break_a_promise_within_a_few_seeds(
    words: str, options: Options, seeds: int, rule: str, tmp_path: Path
) -> None:
    """Planted into a copy of the package, each of the five set G bugs the world now meets
    breaks its promise within a few seeds: an MCP ``place_order`` pointed at another tool of
    the shop's MCP server after its call was approved runs on approvals given for the other
    tool (``unapproved``: the world knows where each request went, the remote tool named);
    the same call planned again with its arguments in another order gets another key and
    takes effect twice (``twice``: the shop's ledger, by the world's ref); the in-process
    model's dict replies read without their output tokens let a run ask and act past its
    budget (``spent``: the world's own count of what each answer cost); a ``pay`` whose
    requests leave from a bare worker thread is let through unchecked and a held-up process
    sends after a truthful "not executed" (``after-not-executed``); a late worker's request,
    sent after the gateway finished with its call as having sent nothing, reaches the shop
    while the run recorded the call as not run (``told-not-run``). The clean product keeps
    every promise on each of those seeds, so each finding is the bug's."""
    bug = next(b for b in UNSEEN_G if words in b.name)
    done = _simulator_on(
        planted(bug, tmp_path),
        *("--seeds", str(seeds), "--mode", "local", "--store", "memory"),
        *("--no-shrink", "--json", *options.flags().split()),
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"  {rule}: " in done.stdout, done.stdout[-3000:]
    if rule == "unapproved":
        assert " to mcp http://shop.sim/mcp place_" in done.stdout, done.stdout[-3000:]
    for index in range(seeds):
        seed = seed_of(index)
        clean = simulate(seed=seed, store="memory", mode="local", options=options)
        assert clean.ok, f"{seed}: " + "; ".join(map(str, clean.violations))


#: Where a call of ``place_order`` pointed at the shop's other remote tool goes.
RUSHED = "mcp http://shop.sim/mcp place_rush_order"


def test_an_mcp_tool_is_pointed_at_another_remote_tool_and_the_product_asks_again() -> None:
    """With ``--mcp-remote`` the run's owner points an MCP ``place_order`` at another tool of
    the shop's MCP server (``place_rush_order``) once its call was approved; the product sees
    the call changed since it was planned and asks again, and once approved as it now stands
    the call goes to the remote tool it names and the shop takes it there; every promise is
    kept. The kept seeds' world never makes the edit."""
    edited = rushed = 0
    options = replace(Options.every(), mcp_often=True, mcp_remote=True)
    for index in range(110):
        seed = seed_of(index)
        outcome = simulate(seed=seed, store="memory", mode="local", options=options)
        assert outcome.ok, f"{seed}: " + "; ".join(map(str, outcome.violations))
        edited += any("spec edited: place_order remote" in line for line in outcome.lines)
        rushed += any(f"EFFECT {RUSHED}" in line for line in outcome.lines)
        if index < 10:
            kept = simulate(seed=seed, store="memory", mode="local", options=Options.every())
            assert not any("place_order remote" in line for line in kept.lines)
    assert edited >= 10 and rushed >= 2, (edited, rushed)


def test_reordered_arguments_draw_nothing_and_the_clean_product_runs_the_same_story() -> None:
    """With ``--reordered-args`` the model writes a call it planned before with its arguments
    in another order (every other time it plans it), drawing nothing from the schedule: the
    clean product, whose key is the call's one canonical spelling, runs the very same story in
    the whole world, line for line but for the model's reorderings, in local and operator
    mode, and keeps every promise."""
    said = 0
    for index in range(8):
        seed = seed_of(index, 21)
        mode = "operator" if index % 3 == 0 else "local"
        reordered, plain = _with_and_without(seed, mode, reordered_args=False)
        lines = [line for line in reordered.lines if "arguments in another order" not in line]
        said += len(reordered.lines) - len(lines)
        assert lines == list(plain.lines), seed
        assert reordered.ok, f"{seed}: " + "; ".join(map(str, reordered.violations))
    assert said >= 5, said


def test_a_write_planned_before_its_tool_was_edited_to_read_keeps_its_key() -> None:
    """make sim SECONDS=600 on main ded4dc4 (seed 14512072761602648587, two clusters): the
    owner edited place_order to READ after the run planned it as a WRITE; the step sent the
    order without its key (the HTTP tool went by its definition now), the shop, holding the
    request, took it, and the confirmer asking it by the key was told "not executed": the
    WRITE recorded as never run (``confirmed``). The call now keeps the class it was planned
    as: its key goes with it, the shop knows the key, and the confirmer says nothing false."""
    seed = 14512072761602648587
    _meets_its_window_and_keeps_every_promise(
        "a WRITE planned before its tool was edited to READ",
        seed,
        (
            "96.396 spec edited: place_order READ (generation 2)",
            "150.360 effect p2 kg-cc7797462 west/restock-s2-a1",
            "east/restock-s2-a2's http-confirmer says None of 1:1",
        ),
        mode="operator",
        options=whole_with_set_g(seed),
    )


def test_a_write_heard_late_is_placed_where_it_landed_not_where_it_was_heard() -> None:
    """make sim SECONDS=300 on main 4604a95 (seed 8745416488838695267, two clusters) broke
    ``two-drivers`` on the world's side: west's step under epoch 4 wrote the run at 268.1 and
    heard the store's answer 19.8 s late, while east took the run under epoch 5 and wrote it;
    the world placed west's write where it was heard, after east's. It is now placed where it
    landed (the store refused west's next write: StaleEpoch). The seed meets that story and
    keeps every promise."""
    seed = 8745416488838695267
    _meets_its_window_and_keeps_every_promise(
        "a write heard late, another cluster's take meanwhile",
        seed,
        (
            "268.065 west/restock-s3-a1 hears the store's answer 19.8s late",
            "283.331 east/restock-s5-a1 starts",
            "west/restock-s3-a1 ends with StaleEpoch (exit 6)",
        ),
        mode="operator",
        options=whole_with_set_g(seed),
    )


def test_a_held_request_is_acted_on_at_its_moment_whatever_holds_up_its_client() -> None:
    """make sim SECONDS=600 on main 03ae3f1 (seed 14281777981605777794, local) broke
    ``after-not-executed`` on the world's side: step3's order, held by the shop 15 s within
    its wait, was acted on only when step3's wait ended, and that wait had run on while
    another process was held up inside it (the world runs one thread: a hold met in an event
    of the wait moves the clock on), so the shop acted at 428.0, after alice's truthful "not
    executed" at 427.6, though a real shop acts at its moment (406.7). The shop now acts at
    its moment as an event of its own. The seed keeps every promise."""
    seed = 14281777981605777794
    _meets_its_window_and_keeps_every_promise(
        "a held order acted on at its moment while its client's wait runs long",
        seed,
        ("402.401 step3 POST http://shop.sim/orders held by the server for 22.9s",),
        mode="local",
        options=whole_before_suspends(seed),
    )


def test_a_deny_is_read_when_the_operators_cache_holds_it_and_refused_when_shown_so() -> None:
    """make sim SECONDS=600 on main 03ae3f1 broke ``unapproved`` twice on the oracle's side,
    two clusters: a deny made on east's Approval was taken as read at a look whose cache did
    not hold it yet (its watch event late: shrunk from seed 602766628176821640), and, in the
    seed itself, bob's deny was shown refused on east's Approval ("bob: restock 1:0: the run
    is not awaiting an approval": the run was between two stops) and the oracle knew only the
    "not counted here" refusal. A deny is now read at the first look whose copy holds it, and
    refused by any refusal its Approval shows naming its maker. The seed meets its story and
    keeps every promise."""
    seed = 602766628176821640
    _meets_its_window_and_keeps_every_promise(
        "a deny shown refused on a run between two stops, its cluster gone after",
        seed,
        (
            "73.321 bob adds to restock-1-pay-8cd27b6e96's decisions approved: False in east",
            "bob's deny in east is shown not counted here",
            "99.459 east's operators are gone",
        ),
        mode="operator",
        options=whole_before_suspends(seed),
    )


def test_a_suspended_machines_monotonic_clock_stands_still_while_its_boot_clock_runs_on() -> None:
    """The world answers ``clock_gettime`` as the acting process's machine would on Linux: while
    step1's machine is suspended its ``CLOCK_MONOTONIC`` stands still and its ``CLOCK_BOOTTIME``
    runs on (at the boot clock's drift), so after the suspend they stand its length apart;
    another machine's clocks never part; a clock id the world does not model is refused in
    one line naming it."""
    world = World(Schedule(seed=1), clocks=Clocks(boot_ppm=200.0))

    def read(actor: str) -> tuple[float, float]:
        with world.acting(actor):
            return world.clock_gettime(time.CLOCK_BOOTTIME), world.clock_gettime(
                time.CLOCK_MONOTONIC
            )

    assert read("step1") == read("step2") == (BOOT, BOOT)
    world.advance(10.0)
    with world.suspended("step1", 100.0):
        world.advance(40.0)
        boot, monotonic = read("step1")
        assert boot == world.boot() and monotonic == world.clocks.boot(10.0)
        world.advance(70.0)  # it woke at 110 s; its owner goes on later (held meanwhile)
    boot, monotonic = read("step1")
    assert boot - monotonic == pytest.approx(100.0 * (1 + 200e-6))
    assert read("step2") == (world.boot(), world.boot())
    with pytest.raises(ValueError, match=f"not for clock id {time.CLOCK_REALTIME}"):
        world.clock_gettime(time.CLOCK_REALTIME)


def test_an_alarm_on_a_clock_that_stops_in_a_suspend_rings_late_by_the_suspend() -> None:
    """The product's alarm (an exchange's cut) is set on the boot clock the product reads on
    its machine and read again when due, as the alarm's thread does: read on
    ``CLOCK_BOOTTIME`` it rings 30 s after it was set though the machine slept 100 s of
    them; read on ``CLOCK_MONOTONIC`` it rings 30 s of waking time later, 130 s after."""
    for clock_id, rings_at in ((time.CLOCK_BOOTTIME, 30.0), (time.CLOCK_MONOTONIC, 130.0)):
        world = World(Schedule(seed=1))
        rang: list[float] = []
        with (
            clocks.simulated(
                wall=world.wall,
                boot=lambda w=world, c=clock_id: w.clock_gettime(c),
                alarm=world.alarm,
            ),
            world.acting("step1"),
        ):
            clocks.alarm(clocks.boot() + 30.0, lambda w=world, r=rang: r.append(w.now))
            with world.suspended("step1", 100.0):
                world.advance(100.0)
            world.advance(100.0)
        assert rang == [pytest.approx(rings_at)], clock_id


def _as_held(line: str) -> str:
    """A trace line of a machine suspended, as it reads for a process held up."""
    return re.sub(r"^(\s*[\d.]+ \S+)'s machine suspended ", r"\1 held up ", line)


def test_a_suspended_machine_draws_nothing_and_the_clean_product_runs_the_same_story() -> None:
    """With ``--suspends`` (the whole world) a third of the step processes' holds are their
    machines suspended, of every length a hold has (about a call's limit give or take its
    margin among them, right before a request leaves), read from the draw that decides whether
    the node is lost: the clean product, whose deadlines and cuts are on ``CLOCK_BOOTTIME``,
    runs the very same story as without them, line for line but for the trace saying which
    holds were suspends, in local and operator mode, and keeps every promise. The kept seeds'
    world (``Options.every()``) suspends nothing."""
    suspends = near_the_deadline = 0
    for index in range(40):
        seed = seed_of(index, 23)
        mode = "operator" if index % 4 == 3 else "local"
        asleep, held = _with_and_without(seed, mode, suspends=False)
        assert asleep.ok, f"{seed}: " + "; ".join(map(str, asleep.violations))
        assert [_as_held(line) for line in asleep.lines] == list(held.lines), seed
        said = [line.split() for line in asleep.lines if "'s machine suspended " in line]
        suspends += len(said)
        near_the_deadline += sum(
            words[6] == "before_send" and 24.0 <= float(words[4].rstrip("s")) <= 37.0
            for words in said
        )
        if index < 3:
            kept = simulate(seed=seed, store="memory", mode=mode, options=Options.every())
            assert not any("machine suspended" in line for line in kept.lines)
    assert suspends >= 12 and near_the_deadline >= 1, (suspends, near_the_deadline)


#: A seed of the kept seeds' world with machines suspended (``--late-shop --moves --suspends``,
#: local, memory store): step6 claims notify's n3 and its machine is suspended 386.7 s right
#: before the request leaves, its node lost; alice's settlement comes too early, bob's "not
#: executed" stands at 797.2 once the store's deadline passed.
SUSPEND_SEED = 5690507877862093436
SUSPEND_OPTIONS = replace(Options.every(), suspends=True)


def test_a_deadline_on_a_clock_that_stops_in_a_suspend_is_found(tmp_path: Path) -> None:
    """Set H's "the write deadline read on a clock that stops while the machine sleeps"
    (``CLOCK_MONOTONIC`` for ``CLOCK_BOOTTIME``), planted into a copy of the package, breaks
    ``after-not-executed`` on its seed: step6's machine wakes after bob truthfully settled the
    call as not executed, its deadline read on a clock that did not count the suspend, and
    sends n3, which the shop takes. The clean product, on the same seed, refuses the send
    (its deadline, on the clock that counted the suspend, has passed) and keeps every
    promise."""
    story = (
        "step6's machine suspended 386.7s at before_send (node lost)",
        "bob settled 2:0 as not executed",
        "step6 goes on after before_send",
    )
    bug = next(b for b in UNSEEN_H if "a clock that stops while the machine sleeps" in b.name)
    done = _planted_run(bug, tmp_path, seed=SUSPEND_SEED, mode="local", options=SUSPEND_OPTIONS)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "  after-not-executed: " in done.stdout, done.stdout[-3000:]
    assert all(part in done.stdout for part in story), done.stdout[-3000:]
    assert "EFFECT POST http://shop.sim/notices n3 by step6" in done.stdout
    _meets_its_window_and_keeps_every_promise(
        "a WRITE's machine suspended past its store deadline, settled meanwhile",
        SUSPEND_SEED,
        story,
        mode="local",
        options=SUSPEND_OPTIONS,
    )
    clean = simulate(seed=SUSPEND_SEED, store="memory", mode="local", options=SUSPEND_OPTIONS)
    assert not any("n3 by step6" in line for line in clean.lines if "EFFECT" in line)


#: The world of seed 3478791516567543597 (found measuring set H, 2026-12-07), as its replay
#: line names it: pinned, so that parts added to the whole world later leave its path alone.
EDIT_AND_BACK = [
    *("--mode", "local", "--store", "memory", "--late-shop", "--slow-store", "--paged"),
    *("--rejection-limit", "--mcp-often", "--dollars", "--cached-input", "--python-tool"),
    *("--no-creator", "--mcp-remote", "--reordered-args", "--pay-threads", "--moves"),
]


def test_an_approval_of_a_call_a_step_bound_before_it_lost_its_store_counts_for_that_call() -> None:
    """Measuring set H met ``unapproved`` here (local mode, seed 3478791516567543597), and it
    was the world's: step14 bound the calls 3:0 and 3:1 to ``place_order`` as generation 19
    defined it (the remote tool ``place_rush_order``), recorded its stop for approval, and then
    lost its store (exit 5, so it did not say it recorded); the owner sent the tool to
    ``place_order`` and carol approved 3:1 as the run showed it, bound to
    ``place_rush_order``, and the owner sent it back. The world took what carol was shown from
    the last step that exited on a stop for a person (step13, an earlier binding), never from a
    step that died after recording one; it now counts that step's binding as what she may have
    been shown, and the product, whose question, binding and call agreed throughout, keeps every
    promise."""
    seed = 3478791516567543597
    args = _parser().parse_args([*EDIT_AND_BACK, "--seed", str(seed)])
    _meets_its_window_and_keeps_every_promise(
        "an approval made between an edit of its tool and the edit's undoing",
        seed,
        (
            "445.353 spec edited: place_order remote (generation 20)",
            "531.157 carol approved 3:1 (place_order)",
            "531.157 spec edited: place_order remote (generation 23)",
        ),
        mode="local",
        options=_options(args),
    )


#: The world of seed 12673368144159078233 (make sim SECONDS=300 on b7ae668), as its replay
#: line names it: pinned, so that parts added to the whole world later leave its path alone.
SETTLED_BEFORE_THE_OLD_SEND = [
    *("--mode", "operator", "--store", "memory", "--late-shop", "--slow-store", "--paged"),
    *("--rejection-limit", "--mcp-often", "--dollars", "--cached-input", "--python-tool"),
    *("--no-creator", "--two-clusters", "--mcp-remote", "--reordered-args", "--pay-threads"),
    *("--suspends", "--moves"),
]


def test_a_not_executed_decided_before_the_old_holders_deadline_is_not_taken_as_truth() -> None:
    """make sim SECONDS=300 broke ``unasked`` (operator mode, two clusters): east's step
    claimed p1 at 71.4 and was held 11.9 s before sending, its node lost; west took the run
    and stopped on p1's unknown outcome at 75.5; bob wrote "not executed" on west's
    Reconciliation at 82.6 (true then: the shop had nothing); east's step sent p1 at 83.3,
    inside its write deadline (the shop acted). The operator held bob's decision until the
    deadline and then recorded it, a word about a moment before the send taken as the truth
    after it, and nobody was asked again. Now a "not executed" written before the deadline
    never counts: refused once it has passed (``DecidedTooEarly``), bob looks again, finds
    that p1 took effect, and corrects it to executed."""
    seed = 12673368144159078233
    args = _parser().parse_args([*SETTLED_BEFORE_THE_OLD_SEND, "--seed", str(seed)])
    _meets_its_window_and_keeps_every_promise(
        "a 'not executed' decided before the old holder's send",
        seed,
        (
            "82.611 bob patches restock-1-place-order-7ee374e8a0 executed: False in west",
            "83.297 EFFECT mcp http://shop.sim/mcp place_order p1 by east/restock-s1-a1#2",
            "bob looks again at restock-1-place-order-7ee374e8a0: executed: True in west",
        ),
        mode="operator",
        options=_options(args),
    )


def test_an_approval_after_edits_between_steps_counts_for_the_call_the_run_showed() -> None:
    """make sim SECONDS=240 on 25e45d2 broke ``unapproved`` (local mode, seed
    4126872944486340536), of the same class as the seed above: ``place_order``'s method, URL
    and groups were edited between two steps, a step bound the call to ``DELETE
    http://shop.sim/steal``, recorded its stop and lost its store; bob approved 1:1 as the run
    showed it then, and p2 went to that URL. The product asked about, counted and sent the
    same definition each time; the world now takes a step that died after its stop as one that
    may have shown the call."""
    seed = 4126872944486340536
    args = _parser().parse_args(
        [*EDIT_AND_BACK, "--suspends", "--http-confirmer", "--seed", str(seed)]
    )
    _meets_its_window_and_keeps_every_promise(
        "an approval made while its tool's edits were unread",
        seed,
        ("161.558 bob approved 1:1 (place_order)", "163.844 EFFECT DELETE http://shop.sim/steal"),
        mode="local",
        options=_options(args),
    )


def test_a_time_budget_is_read_from_a_choice_already_made_and_moves_with_the_budget() -> None:
    """With ``time_budget`` (the whole world's) half the runs' specs have a time budget
    (``timeoutSeconds``), read from the rest of a draw the desk made anyway: every choice is
    drawn as without it. A budget raised raises it by two minutes, lowered lowers it by half
    a minute, never below 15 s."""
    seconds: Counter[int | None] = Counter()
    for seed in range(60):
        plain, drawn = _desk(seed)
        timed, drawn_timed = _desk(seed, time_budget=True)
        assert "timeoutSeconds" not in plain.manifest["budget"]
        assert drawn_timed.made == drawn.made
        assert plain.manifest["tools"] == timed.manifest["tools"]
        limit = timed.manifest["budget"].get("timeoutSeconds")
        seconds[limit] += 1
        if limit is None:
            continue
        timed.edit("raise budget")
        assert timed.manifest["budget"]["timeoutSeconds"] == limit + 120
        for _ in range(12):
            timed.edit("lower budget")
        assert timed.manifest["budget"]["timeoutSeconds"] == 15
    assert set(seconds) == {None, 30, 60, 120, 240}
    assert 15 <= seconds[None] <= 45, seconds


def _timed_books(limit: float) -> Books:
    """Books of a run whose spec gives ``limit`` active seconds: step1 counted from boot 10 s,
    asked the model at 11, saved at 12 (returned 12.5) and at 30 (returned 31); step2, started
    at 100 (a person took 70 s to decide: not active time), saved at 100, asked at 101, saved
    at 125 and asked at 126 (in that order)."""
    books = Books()
    books.specs.append(SpecVersion(1, 0.0, {"budget": {"timeoutSeconds": limit}}))
    boot = books.clocks.boot  # the boot clock at a moment of the world's
    first = ProcessLife(0.0, 1, 1)
    first.clock_from = boot(10.0)
    first.saves = [(boot(12.0), boot(12.5), 2), (boot(30.0), boot(31.0), 3)]
    second = ProcessLife(90.0, 5, 1)
    second.clock_from = boot(100.0)
    second.saves = [(boot(100.0), boot(100.5), 6), (boot(125.0), boot(125.5), 8)]
    books.processes.update(step1=first, step2=second)
    for at, process, phase, order in ((11.0, "step1", "plan", 1), (101.0, "step2", "plan", 7)):
        books.asks.append(Ask(at, process, phase, 1, order=order))
    books.asks.append(Ask(126.0, "step2", "verify", 1, order=9))
    return books


def test_spent_judges_a_time_budget_from_the_sessions_the_world_saw() -> None:
    """A time budget is active seconds: a session's time from its start to its saves, summed
    over the run's sessions, time stopped between them not counted (docs/manifest.md,
    ``spec.budget``). The world's floor of it, when a step asks the model: what the newest
    save it could have loaded held at least (step1's last save, 20 s after its start) and the
    time since its own start up to its newest save returned before the question (step2's
    verify: 25.5 s). A budget below that floor is spent, and asking breaks ``spent``; one at
    or above it is not (the time between the sessions, 70 s, never counts)."""
    from keelgate.testing.sim.checkers import spent
    from keelgate.testing.sim.records import Records

    said = [str(v) for v in spent(_timed_books(40.0), Records())]
    assert said == [
        "spent: something was acted on, or the model asked, once a budget was used up (step2 "
        "asked the model (verify 1) at 126.0 after at least 45.5s of active time, its budget "
        "40.0s)"
    ], said
    assert spent(_timed_books(45.5), Records()) == []
    assert len(spent(_timed_books(19.0), Records())) == 2  # step2's plan too, 20 s carried
    late = _timed_books(19.0)
    boot = late.clocks.boot
    late.processes["step1"].saves[-1] = (boot(30.0), boot(100.5), 3)  # heard after step2 began
    assert [v.detail for v in spent(late, Records())] == [
        "step2 asked the model (verify 1) at 126.0 after at least 27.5s of active time, its "
        "budget 19.0s"
    ]
    # A save booked after the question (its retries outlasted the budget), however close in
    # time, came after the judging.
    after = _timed_books(21.0)
    assert len(spent(after, Records())) == 1
    after.processes["step2"].saves[-1] = (boot(126.0), boot(126.0), 10)
    assert spent(after, Records()) == []


#: The world of seed 13575514142627900702 (set H's time budget, found in the whole world of
#: h/simh), as its replay line names it: pinned, so that parts added later leave its path alone.
TIME_BUDGET_WORLD = [
    *("--late-shop", "--slow-store", "--paged", "--rejection-limit", "--mcp-often"),
    *("--dollars", "--cached-input", "--python-tool", "--no-creator", "--mcp-remote"),
    *("--reordered-args", "--pay-threads", "--suspends", "--time-budget"),
    *(
        "--service-account-rules",
        "--moves",
        "copy,definition,delete,recreate,reorder,service-account",
    ),
]
TIME_BUDGET_SEED = 13575514142627900702


def test_a_time_budget_judged_from_the_last_checkpoint_only_is_found(tmp_path: Path) -> None:
    """Set H's "a run's active time judged from its last checkpoint only", planted into a copy
    of the package, breaks ``spent`` on its seed (operator mode, a budget of 30 active
    seconds): restock-s2-a1 spent 26 s on a held charge, restock-s3-a1 5.5 s on late store
    answers, and restock-s4-a1, 35 s into its own step (a store answer 14.8 s late, an order
    held 20.8 s), asks the model for its verdict, its budget judged on its own time alone.
    The clean product, on the same seed, stops there on its time budget (``timeout``), the
    owner raises it, and the run keeps every promise."""
    args = _parser().parse_args([*TIME_BUDGET_WORLD, "--seed", str(TIME_BUDGET_SEED)])
    options = _options(args)
    bug = next(b for b in UNSEEN_H if "active time judged from its last checkpoint" in b.name)
    done = _planted_run(bug, tmp_path, seed=TIME_BUDGET_SEED, mode="operator", options=options)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    said = (
        "  spent: something was acted on, or the model asked, once a budget was used up "
        "(restock-s4-a1 asked the model (verify 1) at 329.5 after at least 46.9s of active "
        "time, its budget 30s)"
    )
    assert said in done.stdout, done.stdout[-3000:]
    _meets_its_window_and_keeps_every_promise(
        "a step past the run's time budget, counted over three sessions",
        TIME_BUDGET_SEED,
        (
            "308.683 restock-s4-a1 mcp http://shop.sim/mcp place_order held by the server",
            "329.529 restock-s4-a1 ends Stopped timeout",
            "spec edited: raise budget (generation 2)",
        ),
        mode="operator",
        options=options,
    )


def test_whole_world_runs_stop_on_their_time_budget_and_let_service_accounts_decide() -> None:
    """In the whole world runs stop on their time budget (``timeout``) and are raised, and
    people decide through the CI job's ServiceAccount where the rule the run shows lets them
    (an approval the product records), and the clean product keeps every promise (``spent``
    judging the time budget, ``unapproved`` the ServiceAccounts). The kept seeds' world
    (``Options.every()``) has neither."""
    said: Counter[str] = Counter()
    for index in range(24):
        mode = "operator" if index % 3 == 2 else "local"
        whole = simulate(
            seed=seed_of(index, 11), store="memory", mode=mode, options=Options.whole()
        )
        assert whole.ok, "; ".join(map(str, whole.violations))
        for line in whole.lines:
            said["timeout"] += line.endswith(" ends Stopped timeout")
            said["bot"] += "(the rule lets it)" in line or "'s CI job adds to" in line
            said["recorded"] += " system:serviceaccount:shop:ci approved " in line
    assert said["timeout"] >= 3 and said["bot"] >= 5 and said["recorded"] >= 2, said
    kept = simulate(seed=seed_of(0, 11), store="memory", mode="local", options=Options.every())
    assert not any("timeout" in line or "(the rule lets it)" in line for line in kept.lines)


#: The world of seed 5465419071341559111 (set H's ServiceAccounts under two rules, found in the
#: whole world of h/simh), as its replay line names it: pinned, so that parts added later leave
#: its path alone.
SERVICE_ACCOUNTS_WORLD = [
    *("--late-shop", "--slow-store", "--paged", "--rejection-limit", "--mcp-often"),
    *("--dollars", "--cached-input", "--python-tool", "--no-creator", "--two-clusters"),
    *("--mcp-remote", "--reordered-args", "--pay-threads", "--suspends", "--time-budget"),
    *("--service-account-rules", "--moves", "--http-confirmer"),
]
SERVICE_ACCOUNTS_SEED = 5465419071341559111


def test_two_rules_that_let_service_accounts_decide_if_either_does_is_found(
    tmp_path: Path,
) -> None:
    """Set H's "two rules combined let ServiceAccounts decide if either does", planted into a
    copy of the package, breaks ``unapproved`` on its seed (monitor mode): tick 1's order p3
    was planned under a rule for people only; the owner let ServiceAccounts decide the tool
    since, and sent it to ``/steal`` after bob's approval, which then no longer counted. The
    run, asking again, showed a rule that let ServiceAccounts decide, and bob's CI job approved
    as ``ci``: the order went to ``/steal`` on it. The clean product showed the rule of both
    (people only), bob approved himself, and the run keeps every promise."""
    args = _parser().parse_args([*SERVICE_ACCOUNTS_WORLD, "--seed", str(SERVICE_ACCOUNTS_SEED)])
    options = _options(args)
    bug = next(b for b in UNSEEN_H if "ServiceAccounts decide if either does" in b.name)
    done = _planted_run(bug, tmp_path, seed=SERVICE_ACCOUNTS_SEED, mode="monitor", options=options)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "787.273 system:serviceaccount:shop:ci approved 1:2 (place_order)" in done.stdout
    said = (
        "  unapproved: a call took effect without the approvals it needed, as approved (tick 1: "
        "place_order p3@t1 sent by tick19 at 795.7 to POST http://shop.sim/steal: 0 of 1 "
        "approvals)"
    )
    assert said in done.stdout, done.stdout[-3000:]
    _meets_its_window_and_keeps_every_promise(
        "a call planned under a rule for people, asked again under one letting ServiceAccounts",
        SERVICE_ACCOUNTS_SEED,
        (
            "spec edited: ServiceAccounts let decide place_order (generation 8)",
            "707.656 spec edited: place_order url (generation 9)",
            "787.273 bob approved 1:2 (place_order)",
        ),
        mode="monitor",
        options=options,
    )


def test_two_clusters_are_not_over_while_one_holds_a_run_not_yet_looked_at() -> None:
    """make sim SECONDS=600 on 84f8835 (seed 4465224165673260178, two clusters, ``waiting``):
    west showed the run Failed on the verifier's limit (its operator no longer held it), the
    owner raised the limit, and east took the run on; alice made the run again in east, and as
    east's step ended between two steps, the world took the run as over (a cluster showed it
    Failed, none a step pending) and stopped both operators, the run left Running. An AgentRun
    no operator has looked at yet (no phase) now keeps the run going: the run ends."""
    seed = 4465224165673260178
    flags = [
        *("--mode", "operator", "--store", "memory", "--late-shop", "--slow-store", "--paged"),
        *("--rejection-limit", "--mcp-often", "--dollars", "--cached-input", "--python-tool"),
        *("--no-creator", "--two-clusters", "--mcp-remote", "--reordered-args", "--pay-threads"),
        *("--suspends", "--time-budget", "--service-account-rules"),
        *("--moves", "copy,definition,delete,recreate,reorder,service-account"),
    ]
    args = _parser().parse_args([*flags, "--seed", str(seed)])
    _meets_its_window_and_keeps_every_promise(
        "two clusters, a run made again in the one that holds it",
        seed,
        (
            "53.001 alice deletes restock and creates it again in east",
            "56.858 east/restock-s1-a2 ends Running failed",
        ),
        mode="operator",
        options=_options(args),
    )
