"""What fencing every write by the run's epoch costs a loop iteration: its durable commits and
its time, with and without the epoch check, side by side in one run.

Three stores drive the same loop (one WRITE per iteration, a zero-latency model and tool, as
``loop_vs_commits.py`` drives it) on the same SQLite file and the same PostgreSQL server (fsync
on, a server of its own):

- ``no check``: the statements as they were before migration 8, built here by giving the store
  class trivially true fences (the same parameters, no lookup): the baseline;
- ``check, run not taken``: today's store on a run nobody took (each write looks the run up in
  ``keelgate_owners`` and finds nothing);
- ``check, run taken``: today's store after ``take``, every write carrying its epoch (the lookup
  finds the run's row and compares the epoch).

Variants alternate within each round so that other load on the machine falls on all alike; the
report gives medians and the spread over rounds. Commits are counted in a separate, untimed pass
(SQLite: the connection's statements; PostgreSQL: transaction ids the server handed out). The
check adds a condition to statements the iteration sends anyway, never a statement or a commit:
the commit columns must be equal, and the bench says so if they are not. Renewing a lease is a
commit of its own, once per lease third (10 s by default), not per iteration, and is not here.

It must never weaken durability to look fast: each store runs with its default settings.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from commitbench.backends import opened
from commitbench.loop import TENANT, StampedModel, drive, per_iteration
from commitbench.report import load_average, spread

VARIANTS = ("no check", "check, run not taken", "check, run taken")


def unfenced(store_class: type[Any]) -> type[Any]:
    """``store_class`` with the statements it had before migration 8: every fence trivially
    true (it still takes the same parameters), no key judged by its epoch."""
    from keelgate.stores import _sql

    class Before(_sql.OwnershipStatements):
        def __init__(self, d: Any) -> None:
            super().__init__(d)
            self.run_fence = (
                f"(CAST(? AS TEXT) IS NULL OR CAST(? AS TEXT) IS NULL "
                f"OR CAST(? AS {d.bigint}) IS NULL OR 1 = 1)"
            )
            self.key_fence = "(1 = 1)"
            self.stale_key = "0"

    with mock.patch.object(_sql, "OwnershipStatements", Before):
        made = type(
            f"Unfenced{store_class.__name__}", (store_class,), {"dialect": store_class.dialect}
        )
    statements = (made.sql.save, made.sql.claim, made.sql.complete, made.sql.key)
    assert not any("keelgate_owners" in text for text in statements), "a check was left in"
    return made


@contextlib.contextmanager
def variant_store(backend: Any, variant: str, run: str) -> Iterator[Any]:
    where = backend.path if backend.name == "sqlite" else backend.url
    store_class = unfenced(backend.store_class) if variant == "no check" else backend.store_class
    store = store_class(where)
    try:
        if variant == "check, run taken":
            store.take(TENANT, run, holder="bench", lease=600.0)
        yield store
    finally:
        store.close()


def timed(backend: Any, variant: str, iterations: int) -> float:
    """Milliseconds per iteration of ``iterations`` more iterations of the variant's run."""
    run = f"ownership-{variant.replace(' ', '-').replace(',', '')}"
    with variant_store(backend, variant, run) as store:
        model = StampedModel()
        drive(store, run, iterations, model)
        return per_iteration(model.stamps) * 1000


def commits(backend: Any, variant: str, iterations: int) -> float:
    """Durable commits per iteration of the variant, counted in a pass of its own."""
    run = f"ownership-count-{variant.replace(' ', '-').replace(',', '')}"
    with variant_store(backend, variant, run) as store:
        drive(store, run, 2, StampedModel())  # warm: the chain head is known from here on
        count: Callable[[], int] = backend.commit_counter(store)
        before = count()
        drive(store, run, iterations, StampedModel())
        return (count() - before) / iterations


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("keelgate").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--iterations", type=int, default=100, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds per store")
    args = parser.parse_args(argv)
    names = ("sqlite", "postgres") if args.store == "all" else (args.store,)
    started = load_average()
    lines = [
        f"loop iteration (one WRITE) with and without the epoch check: {args.rounds} rounds x "
        f"{args.iterations} iterations, medians (min-max); load average at start {started}",
        f"{'store':<9} {'variant':<22} {'ms/iteration':>20} {'x no check':>10} {'commits/it':>10}",
    ]
    with (
        tempfile.TemporaryDirectory(prefix="kg-ownership-bench-") as work,
        opened(names, Path(work)) as backends,
    ):
        for backend in backends:
            for variant in VARIANTS:
                timed(backend, variant, 5)  # each run exists and is warm before timing
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for round_ in range(args.rounds):
                order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    times[variant].append(timed(backend, variant, args.iterations))
            counted = {v: commits(backend, v, args.iterations) for v in VARIANTS}
            base = statistics.median(times["no check"])
            for variant in VARIANTS:
                ratio = statistics.median(times[variant]) / base
                lines.append(
                    f"{backend.name:<9} {variant:<22} {spread(times[variant]):>20} "
                    f"{ratio:>10.3f} {counted[variant]:>10.2f}"
                )
            if len(set(counted.values())) != 1:
                lines.append(f"  {backend.name}: the commits differ between variants!")
            print(backend.settings, file=sys.stderr)
    lines.append(f"load average at end {load_average()}; took {time.process_time():.0f} s CPU")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
