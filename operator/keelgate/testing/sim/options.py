"""What the world may do beyond its core (``Options``): the moves and faults added one issue at
a time, each switched on by a flag of ``python -m keelgate.testing.sim`` and all of them by
``--every-move`` (``Options.whole``), as ``make sim`` and ``bench/unseen_bugs.py`` run it.

Why it exists: a seed kept by a test replays the world it was found in, so each part the world
gains is a switch of its own and a kept seed names the switches it was found with
(``Options.flags``, printed in every replay command). It must never draw from the world's
schedule: a share of runs is drawn from a stream derived from the seed, so switching a part on
moves no other choice.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from keelgate.testing.sim.operator_mode import MOVES, NAMED_MOVES


@dataclass(frozen=True)
class Options:
    """Moves of the world that break promises on main while their fixes are under way, off in
    ``make test``'s budget and on in ``make sim`` (docs/simulation.md, "Switched off for now")."""

    #: The shop acts on a request held past its sender's wait at the very end of its write
    #: deadline's margin, the latest the fence assumes of a downstream (issue 48, item 1).
    late_shop: bool = False
    #: The moves of issue 46 people try (``MOVES``): a copy of someone's entry, a deny moved
    #: to the front, a run deleted and created again, a ServiceAccount's approval, a tool's
    #: definition edited after its call was approved; and those made only when named
    #: (``NAMED_MOVES``: an Approval deleted while the operators are down).
    moves: frozenset[str] = frozenset()
    #: The run's steps have the product's own HTTP confirmer ask the shop's status endpoint
    #: over the network (``downstream.ProductConfirmer``), in every mode; without it a run has
    #: the world's own confirmer where its scenario drew one.
    http_confirmer: bool = False
    #: A step's store answers now and then come back late (the statement landed, the answer
    #: slow): the moments a process reads before and after a claim drift apart.
    slow_store: bool = False
    #: A run stopped for a person pages someone, who looks within seconds (local mode).
    paged: bool = False
    #: The run's spec names a limit on the verifier's rejections (one or two, raised and
    #: lowered with the budget), and the verifier rejects an iteration in ten more often
    #: (three in ten), so that runs meet it: the default of three rarely is.
    rejection_limit: bool = False
    #: The shop's MCP server is used more (``place_order`` over MCP in half the runs, not a
    #: quarter, and ``notify`` in half of them): its exchanges meet the faults the HTTP tool's
    #: do (late claims, held requests) as often.
    mcp_often: bool = False
    #: Half the runs have a dollar budget, with the model's prices in their spec (output
    #: dearer than input), read from a choice already made (``Scenario.drawn``).
    dollars: bool = False
    #: The simulated Anthropic server reports part of each answer's input as prompt-cache
    #: writes or reads (``ModelServer._anthropic_usage``); it draws nothing.
    cached_input: bool = False
    #: ``pay`` runs in the product's own Python tool (``sim.pay``: its worker's wait on the
    #: world's time), not the world's wrapper of it (``downstream.SimTool``); in half the runs
    #: the function reports its sends (``about_to_send``), in the others it does not.
    python_tool: bool = False
    #: In half the local and monitor runs, the run's spec names no creator (a program that
    #: drives ``Loop`` with a ``LoopSpec`` naming none) until the calm, when its owner, told no
    #: approval can count under ``notCreator``, records it.
    no_creator: bool = False
    #: Operator mode: a second cluster, its own API server and operators, given the same
    #: AgentRun (as GitOps applies it to both), over the one store; the operators take runs
    #: there (``holder``: a holder and an epoch under a lease), and ownership moves between the
    #: clusters as their operators or API servers go for a while, or one is cut off from the
    #: store (``operator_mode.TwoClusters``). People decide in either cluster.
    two_clusters: bool = False
    #: With the ``definition`` move: a run whose ``place_order`` is a tool of the shop's MCP
    #: server has its owner point it at another tool of that server after its call was
    #: approved (``Desk.definition_edit``), where the URL and method edits change nothing.
    mcp_remote: bool = False
    #: The model, planning a call it planned before (a later iteration, an iteration asked
    #: again, the same call twice in one plan), gives its arguments in another order half the
    #: time (``Planner``): the same call, another JSON object on the wire.
    reordered_args: bool = False
    #: With ``python_tool``: a ``pay`` that reports its sends hands each request, in some runs,
    #: to a worker thread of its own, started with ``keelgate.fenced`` or bare (``sim.pay``).
    pay_threads: bool = False
    #: A share of the holds of a step process is its machine suspended (a laptop's lid shut, a
    #: node put to sleep): its ``CLOCK_MONOTONIC`` stands still meanwhile, its
    #: ``CLOCK_BOOTTIME`` runs on (``processes.SUSPEND_SHARE``); it draws nothing.
    suspends: bool = False
    #: Half the runs have a time budget (``budget.timeoutSeconds``, active seconds), raised
    #: and lowered with the others, read from a choice already made (``Desk``).
    time_budget: bool = False
    #: Approval rules now and then let ServiceAccounts decide (``serviceAccounts: true``), a
    #: rule's edit now and then turns it, and a person whose rule lets ServiceAccounts decide
    #: now and then decides through the CI job's ServiceAccount (``People._as``); each read from
    #: a choice already made.
    service_account_rules: bool = False

    @classmethod
    def every(cls) -> Options:
        """Every move of issues 46 and 48 as the kept seeds were found with (``--late-shop
        --moves``): their stories stay as they were when the world gains a fault."""
        return cls(late_shop=True, moves=frozenset(MOVES))

    @classmethod
    def whole(cls, seed: int | None = None) -> Options:
        """Everything the world can do (``--every-move``, as ``make sim`` runs it): every move
        and every fault added since the kept seeds were found. Given the seed of one of
        ``make sim``'s runs, a share of the runs also makes the named moves (``NAMED_SHARE``)
        and has the product's HTTP confirmer (``HTTP_CONFIRMER_SHARE``), and a share of the
        operator-mode runs has two clusters (``TWO_CLUSTERS_SHARE``), each drawn from a
        stream of its own derived from the seed, never from the world's schedule (a failing
        run prints its flags, which replay it without drawing the share again)."""
        whole = cls(late_shop=True, moves=frozenset(MOVES), **dict.fromkeys(SWITCHES, True))
        if seed is None:
            return whole
        named = random.Random(f"{seed}:named-moves").randrange(NAMED_SHARE) == 0
        http = random.Random(f"{seed}:confirmer").randrange(HTTP_CONFIRMER_SHARE) == 0
        two = random.Random(f"{seed}:two-clusters").randrange(TWO_CLUSTERS_SHARE) == 0
        return replace(
            whole,
            moves=whole.moves | (frozenset(NAMED_MOVES) if named else frozenset()),
            http_confirmer=http,
            two_clusters=two,
        )

    def flags(self) -> str:
        said = ["--late-shop"] if self.late_shop else []
        said += [f"--{name.replace('_', '-')}" for name in SWITCHES if getattr(self, name)]
        if self.moves:
            every = self.moves == frozenset(MOVES)
            said.append("--moves" if every else f"--moves {','.join(sorted(self.moves))}")
        if self.http_confirmer:
            said.append("--http-confirmer")
        return " ".join(said)


#: The world's parts that are each one flag of their own, named as the field with dashes
#: (``--slow-store``), in the order a replay command prints them; all on in the whole world.
SWITCHES = (
    "slow_store",
    "paged",
    "rejection_limit",
    "mcp_often",
    "dollars",
    "cached_input",
    "python_tool",
    "no_creator",
    "two_clusters",
    "mcp_remote",
    "reordered_args",
    "pay_threads",
    "suspends",
    "time_budget",
    "service_account_rules",
)
#: One in this many of ``make sim``'s every-move runs also makes the moves made only when
#: named (``Options.whole(seed)``).
NAMED_SHARE = 2
#: One in this many of them has the product's HTTP confirmer.
HTTP_CONFIRMER_SHARE = 2
#: One in this many of them has two clusters (in operator mode; the others one, as before).
TWO_CLUSTERS_SHARE = 2
