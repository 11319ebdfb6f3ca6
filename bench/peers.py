"""Keelgate beside its peers: the same loop iteration (a zero-latency plan, one WRITE whose side
effect increments a counter, an accepting verify) through Keelgate, DBOS Transact and LangGraph
(sync and async savers), on the same SQLite disk and the same PostgreSQL server.

For each system and store it prints ms per iteration (median and min-max over rounds that
alternate the systems in one process, the order rotated each round), durable commits per
iteration (counted per SQLite file from the statements SQLite runs, and from the transaction ids
a PostgreSQL server hands out), stored bytes per iteration after 10, 100 and 1,000 iterations,
the ratios against the targets (Keelgate at most 0.5x DBOS, 0.6x LangGraph, 1.3x its own raw
commits), and a crash check: each system dies inside its WRITE, after the side effect, and a new
process resumes; how many times the WRITE ran.

The peers come from the ``bench`` extra (``make bench-peers`` installs it); they are never a
dependency of Keelgate. This script must never weaken any system's durability to look fast:
each keeps its defaults, except LangGraph's graphs, run with durability="sync" (see
peersbench/langgraph_peer.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def _versions(place_versions: dict[str, str]) -> dict[str, str]:
    names: tuple[str, ...] = ("keelgate", "dbos", "langgraph", "langgraph-checkpoint-sqlite")
    names += ("langgraph-checkpoint-postgres", "aiosqlite", "SQLAlchemy", "psycopg")
    out = {name: importlib.metadata.version(name) for name in names}
    out.update(place_versions)
    out["python"] = sys.version.split()[0]
    return out


@contextlib.contextmanager
def _places(names: Sequence[str], workdir: Path) -> Iterator[list[Any]]:
    from peersbench.places import SQLitePlace, started_postgres

    with contextlib.ExitStack() as stack:
        places: list[Any] = []
        for name in names:
            if name == "sqlite":
                places.append(SQLitePlace(workdir / "sqlite"))
            else:
                places.append(stack.enter_context(started_postgres()))
        yield places


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per store")
    parser.add_argument("--iterations", type=int, default=100, help="iterations per round")
    parser.add_argument(
        "--growth-at", default="10,100,1000", help="iterations at which to size the stores"
    )
    parser.add_argument("--no-crash", action="store_true", help="skip the crash check")
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds of 30 iterations, growth at 10,100"
    )
    parser.add_argument("--crash-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crash_worker:
        from peersbench.crash import work

        print(json.dumps({"outcome": work(json.loads(args.crash_worker))}), flush=True)
        return 0
    if args.quick:
        # Only what was left at its default: --quick --store sqlite --growth-at 10 keeps the 10.
        for name, quick in (("rounds", 3), ("iterations", 30), ("growth_at", "10,100")):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, quick)
    if args.iterations < 2 or args.rounds < 1:
        parser.error("--iterations must be at least 2 and --rounds at least 1")
    try:
        growth_at = sorted({int(n) for n in args.growth_at.split(",") if n.strip()})
    except ValueError:
        parser.error("--growth-at takes whole numbers separated by commas, e.g. 10,100,1000")
    if growth_at and growth_at[0] < 1:
        parser.error("--growth-at takes iterations of at least 1")
    try:
        from peersbench import dbos_peer, langgraph_peer
    except ImportError as missing:
        raise SystemExit(
            f"bench: the peers are not installed ({missing}); `make bench-peers` installs the "
            "bench extra"
        ) from None
    from peersbench.counting import install_sqlite_counter
    from peersbench.crash import check
    from peersbench.keelgate_peer import KeelgatePeer
    from peersbench.measure import RAW, RawPeer, measure
    from peersbench.report import load_average, report

    # Long runs raise budgets and note stops; that is for the audit chain, not the console.
    logging.getLogger("keelgate").setLevel(logging.ERROR)
    factories: list[tuple[str, Any]] = [
        ("keelgate", KeelgatePeer),
        (RAW, RawPeer),
        ("dbos", dbos_peer.DbosPeer),
        ("langgraph sync", langgraph_peer.LangGraphSync),
        ("langgraph async", langgraph_peer.LangGraphAsync),
    ]

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    names = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    start = load_average()
    stores, crashes, place_versions = [], [], {}
    with (
        install_sqlite_counter(),
        tempfile.TemporaryDirectory(prefix="keelgate-peers-") as tmp,
        _places(names, Path(tmp)) as places,
    ):
        os.chmod(tmp, 0o755)
        for place in places:
            say(f"measuring {place.name} ...")
            if place.name == "postgres":
                place_versions["postgresql"] = place.version
            stores.append(
                measure(
                    place,
                    factories,
                    iterations=args.iterations,
                    rounds=args.rounds,
                    growth_at=growth_at,
                    say=say,
                )
            )
            if not args.no_crash:
                say(f"  [{place.name}] crash check")
                crashes.extend(check(place, Path(tmp)))
    print(report(stores, crashes, load=(start, load_average()), versions=_versions(place_versions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
