"""How much a Keelgate loop iteration costs over the durable commits it cannot avoid.

One iteration with one WRITE is measured side by side with the raw commits that iteration needs,
issued directly with sqlite3 / psycopg on the same file or server with the same durability
settings and the same payloads. The raw baseline per iteration is the design's minimum:

  1. write-ahead plan: the checkpoint holding the planned action, with its audit event;
  2. claim: the idempotency key recorded in flight before the tool runs, with the action's
     start event (as the loop commits it since a WRITE's start rides with its claim);
  3. completion: the key recorded completed, with its result, after the tool returns;
  4. the action checkpoint (its completed event);
  5. the observe checkpoint;
  6. the verify checkpoint (its verdict event).

Each is one transaction, i.e. one durable commit (an fsync of SQLite's WAL with
synchronous=FULL; a WAL flush in PostgreSQL with fsync=on and synchronous_commit=on). The rows
and JSON documents the baseline writes are the ones a calibration run of the loop produced, so
payload sizes match byte for byte.

Measurements alternate (loop then raw, raw then loop, ...) so that load from other work on the
machine affects both alike; the report gives medians and the spread over rounds. Commits are
counted in separate, untimed passes: SQLite through the connection's trace callback, PostgreSQL
through the transaction ids the server assigned (only a transaction that writes gets one, and
every such commit is flushed). A third pass records checkpoint sizes and bytes written at
iterations ~10, ~200 and ~1000, to show that an iteration's cost does not grow with the run.

Its parts live in ``bench/commitbench/`` (the loop, the baseline, the stores, the measurements,
the report), importing Keelgate as installed. This script must never weaken durability to look
fast: it uses each store's default settings and gives the baseline exactly the same ones.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from commitbench.backends import opened
from commitbench.measure import BYTES_AT, measure
from commitbench.report import load_average, report


def main(argv: Sequence[str] | None = None) -> int:
    # Each round raises the budget of one long run; that is on the audit chain, not the console.
    logging.getLogger("keelgate").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--iterations", type=int, default=100, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds per store")
    parser.add_argument(
        "--no-growth", action="store_true", help="skip the bytes-per-iteration pass"
    )
    parser.add_argument(
        "--growth-at",
        default=",".join(str(n) for n in BYTES_AT),
        help="iterations at which to measure checkpoint bytes (comma-separated)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of loop iterations"
    )
    args = parser.parse_args(argv)
    if args.iterations < 2 or args.rounds < 1:
        parser.error("--iterations must be at least 2 and --rounds at least 1")
    try:
        growth_at = sorted({int(n) for n in args.growth_at.split(",") if n.strip()})
    except ValueError:
        parser.error("--growth-at takes whole numbers separated by commas, e.g. 10,200,1000")
    if not growth_at or growth_at[0] < 1:
        parser.error("--growth-at takes iterations of at least 1")
    names = ("sqlite", "postgres") if args.store == "all" else (args.store,)
    results = []
    start_load = load_average()
    with tempfile.TemporaryDirectory(prefix="keelgate-bench-") as tmp:
        os.chmod(tmp, 0o755)
        with opened(names, Path(tmp)) as backends:
            for backend in backends:
                print(f"measuring {backend.name} ...", file=sys.stderr, flush=True)
                results.append(
                    measure(
                        backend,
                        iterations=args.iterations,
                        rounds=args.rounds,
                        growth=() if args.no_growth else growth_at,
                        profile=args.profile,
                    )
                )
    print(report(results, rounds=args.rounds, load=(start_load, load_average())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
