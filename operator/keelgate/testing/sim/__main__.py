"""``python -m keelgate.testing.sim``: run simulations, report broken promises (``make sim``).

Seeds are numbered from a base (``--base``; ``--seconds`` without one takes a fresh one from the
clock and prints it): the same base runs the same simulations, in the same order. A failure
prints its seed, the broken promise, a shrunk schedule and the one command that replays it; the
exit code is 1 if any run broke a promise. ``--json`` ends with one JSON line (the planted-bug
tests read it); ``--report-each`` prints one as each failure is found (bench/unseen_bugs.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from keelgate.testing.sim.operator_mode import MOVES, NAMED_MOVES
from keelgate.testing.sim.options import SWITCHES, Options
from keelgate.testing.sim.simulate import (
    MODES,
    STORES,
    Outcome,
    decode,
    encode,
    seed_of,
    shrink,
    simulate,
)


def _parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="python -m keelgate.testing.sim", description=__doc__)
    what = parse.add_mutually_exclusive_group()
    what.add_argument("--seeds", type=int, default=200, help="How many seeds to run.")
    what.add_argument("--seconds", type=float, help="Run fresh seeds for this long.")
    what.add_argument("--seed", type=int, help="Run this one seed and show its trace.")
    what.add_argument("--replay", help="Replay this schedule (as a failure printed it).")
    parse.add_argument(
        "--base",
        type=int,
        help="Where the seed numbering starts (default 0; with --seconds, taken from the clock).",
    )
    parse.add_argument("--store", choices=(*STORES, "mix"), default="mix")
    parse.add_argument("--mode", choices=(*MODES, "mix"), default="mix")
    parse.add_argument("--first", action="store_true", help="Stop at the first failure.")
    parse.add_argument("--no-shrink", action="store_true", help="Report failures unshrunk.")
    parse.add_argument("--trace", action="store_true", help="Print each failure's trace.")
    parse.add_argument("--json", action="store_true", help="End with a JSON summary line.")
    parse.add_argument(
        "--report-each",
        action="store_true",
        help="Print a JSON line for each failure as it is found (seed, mode, store, seconds).",
    )
    _world_parts(parse)
    return parse


#: Each switch's flag help (``options.SWITCHES``, the flag named as the field with dashes).
_SWITCH_HELP = {
    "slow_store": "A step's store answers now and then come back late (the statement landed).",
    "paged": "A run stopped for a person pages someone, who looks within seconds (local mode).",
    "rejection_limit": (
        "The run's spec limits the verifier's rejections to one or two (raised and "
        "lowered with the budget)."
    ),
    "mcp_often": (
        "place_order is an MCP tool in half the runs (not a quarter), notify in half too."
    ),
    "dollars": "Half the runs have a dollar budget, with the model's prices in their spec.",
    "cached_input": (
        "The Anthropic server reports part of each answer's input as prompt-cache tokens."
    ),
    "python_tool": (
        "pay runs in the product's own Python tool, on the world's time (its function "
        "reporting its sends in half the runs)."
    ),
    "no_creator": "Half the local and monitor runs name no creator until the calm.",
    "two_clusters": (
        "Operator mode: a second cluster given the same AgentRun over the one store, "
        "ownership of the run moving between them (operators or API server gone, a cluster "
        "cut off from the store, one coming back)."
    ),
    "mcp_remote": (
        "With the definition move, an MCP place_order is pointed at another tool of the "
        "shop's MCP server after its call was approved."
    ),
    "reordered_args": (
        "The model, planning a call it planned before, gives its arguments in another "
        "order half the time."
    ),
    "pay_threads": (
        "With --python-tool, pay sends from worker threads, fenced or bare, in some runs."
    ),
    "suspends": (
        "A third of a step process's holds is its machine suspended: its CLOCK_MONOTONIC "
        "stands still, its CLOCK_BOOTTIME runs on."
    ),
    "time_budget": (
        "Half the runs have a time budget (timeoutSeconds, active seconds), raised and "
        "lowered with the others."
    ),
    "service_account_rules": (
        "Approval rules now and then let ServiceAccounts decide, an edit turns it, and a "
        "person whose rule lets them now and then decides through the CI job's ServiceAccount."
    ),
}


def _world_parts(parse: argparse.ArgumentParser) -> None:
    """The flags that turn parts of the simulated world on (``options.SWITCHES``)."""
    parse.add_argument(
        "--late-shop",
        action="store_true",
        help="The shop acts on a request held past its sender's wait at the last moment the "
        "fence's assumption allows (the write deadline's margin's end; issue 48).",
    )
    parse.add_argument(
        "--moves",
        nargs="?",
        const=",".join(MOVES),
        default="",
        metavar="NAMES",
        help="People try issue 46's moves: all, or those named ("
        + ", ".join((*MOVES, *NAMED_MOVES))
        + "; delete only when named).",
    )
    for name in SWITCHES:
        flag = f"--{name.replace('_', '-')}"
        parse.add_argument(flag, action="store_true", help=_SWITCH_HELP[name])
    parse.add_argument(
        "--http-confirmer",
        action="store_true",
        help="Every run has the product's HTTP confirmer ask the shop's status endpoint (not "
        "the world's own confirmer, in some runs).",
    )
    parse.add_argument(
        "--every-move",
        action="store_true",
        help="--late-shop, every move, late store answers, pages, a rejection limit, MCP "
        "more often, dollar budgets, cached input, the product's Python tool, runs with no "
        "creator, MCP tools pointed elsewhere, arguments reordered, pay's worker threads, "
        "machines suspended and (operator mode) two clusters; a share of the runs (drawn from "
        "each seed, apart from its world) also makes the named moves and has the HTTP "
        "confirmer. "
        "The kept seeds were found with --late-shop --moves.",
    )


def _kind(index: int, choice: str, options: Sequence[str], every: int) -> str:
    """For "mix": the first option, and every ``every``-th run the next ones in turn."""
    if choice != "mix":
        return choice
    if len(options) == 1 or index % every:
        return options[0]
    return options[1 + (index // every) % (len(options) - 1)]


def _mode(index: int, choice: str) -> str:
    """For "mix": every third run in operator mode, and about one in eight a monitor (local
    mode, its ticks started by a cron job); the rest local."""
    if choice != "mix":
        return choice
    if index % 3 == 0:
        return "operator"
    return "monitor" if index % 5 == 1 else "local"


def _options(args: argparse.Namespace) -> Options:
    """The world the flags name (``Options.flags`` prints them so)."""
    return Options(
        late_shop=args.late_shop,
        moves=frozenset(m for m in args.moves.split(",") if m),
        http_confirmer=args.http_confirmer,
        **{name: getattr(args, name) for name in SWITCHES},
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.getLogger("keelgate").setLevel(logging.CRITICAL)  # the product's own warnings
    for noisy in ("httpx", "httpx2", "mcp", "openai", "anthropic"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    moves = frozenset(m for m in args.moves.split(",") if m)
    known = (*MOVES, *NAMED_MOVES)
    unknown = moves - set(known)
    if unknown:
        _parser().error(f"unknown moves: {', '.join(sorted(unknown))} (known: {', '.join(known)})")
    named = _options(args)

    def options_of(seed: int | None) -> Options:
        """The world of one run: with ``--every-move`` the whole world (its shares drawn from
        the seed), with any part named besides on in every run (``--two-clusters``)."""
        if not args.every_move:
            return named
        whole = Options.whole(seed)
        for name in (*SWITCHES, "http_confirmer"):
            if getattr(args, name):
                whole = replace(whole, **{name: True})  # type: ignore[arg-type]
        return whole

    if args.replay is not None or args.seed is not None:
        store = args.store if args.store != "mix" else STORES[0]
        mode = args.mode if args.mode != "mix" else MODES[0]
        if args.replay is not None:
            outcome = simulate(
                replay=decode(args.replay), store=store, mode=mode, options=options_of(None)
            )
        else:
            outcome = simulate(
                seed=args.seed, store=store, mode=mode, options=options_of(args.seed)
            )
        print("\n".join(outcome.lines))
        _show(outcome, args.seed, shrunk=None)
        return 0 if outcome.ok else 1
    fresh = 0 if args.seconds is None else int(time.time())
    base = args.base if args.base is not None else fresh
    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    started = time.monotonic()
    runs = failures = 0
    first_failure: int | None = None
    first_seconds: float | None = None
    rules: list[str] = []
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            break
        if deadline is None and runs >= args.seeds:
            break
        index = runs
        seed = seed_of(index, base)
        store = _kind(index, args.store, STORES, 4)
        mode = _mode(index, args.mode)
        outcome = simulate(seed=seed, store=store, mode=mode, options=options_of(seed))
        runs += 1
        if not outcome.ok:
            failures += 1
            if first_failure is None:
                first_failure, first_seconds = runs, time.monotonic() - started
            rules.extend(v.rule for v in outcome.violations)
            if args.report_each:
                found = {
                    "seed": seed,
                    "mode": mode,
                    "store": store,
                    "run": runs,
                    "seconds": round(time.monotonic() - started, 2),
                    "rules": sorted({v.rule for v in outcome.violations}),
                }
                print(json.dumps({"failure": found}), flush=True)
            shrunk = None if args.no_shrink else _shrunk(outcome)
            _show(outcome, seed, shrunk=shrunk, trace=args.trace)
            if args.first:
                break
    took = time.monotonic() - started
    rate = runs / took * 60 if took else 0.0
    print(
        f"{runs} simulated runs (base {base}) in {took:.1f}s ({rate:.0f} a minute): "
        f"{failures} broke a promise"
    )
    if args.json:
        summary = {
            "runs": runs,
            "failures": failures,
            "first": first_failure,
            "first_seconds": None if first_seconds is None else round(first_seconds, 2),
            "rules": sorted(set(rules)),
            "seconds": round(took, 2),
        }
        print(json.dumps(summary))
    return 1 if failures else 0


def _shrunk(outcome: Outcome) -> list[int]:
    rules = {v.rule for v in outcome.violations}

    def fails(choices: Sequence[int]) -> bool:
        again = simulate(
            replay=choices, store=outcome.store, mode=outcome.mode, options=outcome.options
        )
        return bool(rules & {v.rule for v in again.violations})

    return shrink(outcome.choices, fails)


def _show(
    outcome: Outcome, seed: int | None, *, shrunk: list[int] | None, trace: bool = False
) -> None:
    if outcome.ok:
        return
    where = f"{outcome.mode}, {outcome.store} store"
    print(f"BROKEN PROMISE (seed {seed}, {where}):")
    for violation in outcome.violations:
        print(f"  {violation}")
    flags = outcome.options.flags()
    command = (
        f".venv/bin/python -m keelgate.testing.sim --mode {outcome.mode} --store {outcome.store}"
        + (f" {flags}" if flags else "")
    )
    if shrunk is not None:
        text = encode(shrunk)
        print(f"  shrunk schedule: {text} ({len(shrunk)} choices, of {len(outcome.choices)})")
        print(f"  replay: {command} --replay '{text}'")
    elif seed is not None:
        print(f"  replay: {command} --seed {seed}")
    if trace:
        print("\n".join(f"    {line}" for line in outcome.lines))


if __name__ == "__main__":
    sys.exit(main())
