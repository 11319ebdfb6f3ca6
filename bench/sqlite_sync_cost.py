"""Why the loop sits further above its raw commits on SQLite than on PostgreSQL.

``loop_vs_commits.py`` measures a loop iteration against the four durable commits it needs, with
``synchronous=FULL`` on both sides, as the store runs. On this machine's disk a fdatasync of
SQLite's WAL takes about a tenth of a millisecond, so the baseline is mostly the CPU of issuing
its statements, and the ratio is mostly the loop's Python against that. This script shows how
much of that Python is the fsyncs' doing: it runs the same loop and the same baseline side by
side, alternating rounds, once with ``synchronous=FULL`` (durable, as measured there) and once
with ``synchronous=OFF`` (no fsync at all, never a setting Keelgate uses), and prints wall time
and this process's user and system CPU per iteration for each of the four. If the loop's own
work cost the same with and without the fsyncs, its added CPU would be equal in both columns.

It measures; it proves nothing about durability and is not part of the targets. Its parts are
``bench/commitbench``'s (the calibrated payloads, the baseline, the zero-latency model).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from commitbench.loop import StampedModel, calibrate, drive
from commitbench.raw import SQLiteRaw
from commitbench.report import load_average
from keelgate.core.state import HISTORY_WINDOW
from keelgate.stores.sqlite import SQLiteStore

SETTINGS = ("FULL", "OFF")


def _timed(work: Callable[[], None], iterations: int) -> tuple[float, float, float]:
    """Wall, user and system milliseconds per iteration of ``work`` (which does them all)."""
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    work()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return (
        wall * 1000 / iterations,
        (after.ru_utime - before.ru_utime) * 1000 / iterations,
        (after.ru_stime - before.ru_stime) * 1000 / iterations,
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.getLogger("keelgate").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds")
    args = parser.parse_args(argv)
    if args.iterations < 10 or args.rounds < 1:
        parser.error("--iterations must be at least 10 and --rounds at least 1")
    payload = calibrate()
    figures: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    start_load = load_average()
    with tempfile.TemporaryDirectory(prefix="keelgate-sync-") as tmp:
        sides: dict[tuple[str, str], Callable[[], None]] = {}
        closers: list[Callable[[], None]] = []
        for setting in SETTINGS:
            store = SQLiteStore(Path(tmp) / f"loop-{setting}.db", synchronous=setting)
            raw = SQLiteRaw(Path(tmp) / f"raw-{setting}.db", setting, payload)
            closers += [store.close, raw.close]
            drive(store, "r", HISTORY_WINDOW + 5, StampedModel())
            raw.iterate(HISTORY_WINDOW + 5)

            def loop(store: SQLiteStore = store) -> None:
                drive(store, "r", args.iterations, StampedModel())

            def baseline(raw: SQLiteRaw = raw) -> None:
                raw.iterate(args.iterations)

            sides[("loop", setting)] = loop
            sides[("raw", setting)] = baseline
        try:
            order = list(sides)
            for number in range(args.rounds):
                # A different order each round, so drifting load falls on all four alike.
                shift = number % len(order)
                for side in order[shift:] + order[:shift]:
                    figures.setdefault(side, []).append(_timed(sides[side], args.iterations))
        finally:
            for close in closers:
                close()
    print(report(figures, args, (start_load, load_average())))
    return 0


def report(
    figures: dict[tuple[str, str], list[tuple[float, float, float]]],
    args: argparse.Namespace,
    load: tuple[str, str],
) -> str:
    def median(side: tuple[str, str], index: int) -> float:
        return statistics.median(row[index] for row in figures[side])

    lines = [
        f"machine: {os.cpu_count()} cores; load average {load[0]} at start, {load[1]} at end",
        f"SQLite, WAL; {args.rounds} rounds of {args.iterations} iterations, medians; "
        "a loop iteration includes its run's start and stop, amortised",
        "",
        f"{'':14}{'wall ms/iter':>14}{'user ms':>10}{'system ms':>11}",
    ]
    for setting in SETTINGS:
        for who in ("loop", "raw"):
            side = (who, setting)
            lines.append(
                f"{who + ' ' + setting:14}{median(side, 0):>14.3f}"
                f"{median(side, 1):>10.3f}{median(side, 2):>11.3f}"
            )
    lines.append("")
    added = {}
    for setting in SETTINGS:
        ratio = median(("loop", setting), 0) / median(("raw", setting), 0)
        added[setting] = median(("loop", setting), 1) - median(("raw", setting), 1)
        lines.append(
            f"synchronous={setting}: loop / raw {ratio:.2f}x; the loop's added user CPU "
            f"{added[setting]:.3f} ms an iteration"
        )
    if added["OFF"] > 0:
        lines.append(
            f"the same Python costs {added['FULL'] / added['OFF']:.1f}x as much between "
            "fsynced commits as without them"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
