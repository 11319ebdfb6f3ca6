"""The report: per store, ms per iteration, durable commits per iteration and stored bytes per
iteration for each system, the ratios against the targets, and the crash check.

Why it exists: figures go into docs/performance.md as printed, so the report says what was
measured, on what, with which versions, and under what load. It must never print a figure
without the spread it came with, nor call a target met that the figures do not meet.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

from peersbench.crash import CrashResult
from peersbench.measure import RAW, StoreFigures, steady

KEELGATE = "keelgate"
# (the other system, the most Keelgate may cost against it)
TARGETS = (("dbos", 0.5), ("langgraph sync", 0.6), ("langgraph async", 0.6), (RAW, 1.3))


def spread(values: Sequence[float], digits: int = 2) -> str:
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(
    stores: Sequence[StoreFigures],
    crashes: Sequence[CrashResult],
    *,
    load: tuple[str, str],
    versions: dict[str, str],
) -> str:
    lines = [
        f"machine: {os.cpu_count()} cores, shared with other work; load average {load[0]} at "
        f"start, {load[1]} at end",
        "versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "one iteration: a zero-latency plan, one WRITE (its side effect increments a counter), "
        "an accepting verify",
    ]
    for s in stores:
        lines.append("")
        lines.append(f"[{s.store}] {s.settings}")
        lines.append(
            f"  {s.rounds} rounds of {s.iterations} iterations per system, order rotated each "
            "round; median (min-max over rounds)"
        )
        header = f"  {'system':<22}{'ms/iter':>22}{'CPU ms/iter':>22}{'commits/iter':>16}"
        points = [row[0] for row in next(iter(s.systems.values())).growth] or [
            row[0] for f in s.systems.values() for row in f.growth
        ]
        points = sorted(set(points))
        header += "".join(f"{f'bytes/iter @{p}':>18}" for p in points)
        lines.append(header)
        for f in s.systems.values():
            median, low, high = steady(f.commits)
            commits = f"{median:g}" + ("" if low == high else f" ({low}-{high})")
            growth = {row[0]: row for row in f.growth}
            sizes = "".join(
                f"{growth[p][2]:>18.0f}" if p in growth else f"{'-':>18}" for p in points
            )
            lines.append(
                f"  {f.label:<22}{spread(f.ms):>22}{spread(f.cpu_ms):>22}{commits:>16}{sizes}"
            )
        if any(f.growth for f in s.systems.values()):
            lines.append(
                "  bytes/iter @N = stored bytes after N iterations of one run, over N; "
                "added per iteration between points:"
            )
            for f in s.systems.values():
                if f.growth:
                    marginal = ", ".join(
                        f"@{row[0]}: {row[3]:.0f} B ({row[1]} B in all)" for row in f.growth
                    )
                    lines.append(f"    {f.label:<20}{marginal}")
            lines.append(
                "  written per iteration (the growth run's last stretch; SQLite: this process's "
                "write(2) bytes, PostgreSQL: WAL bytes):"
            )
            for f in s.systems.values():
                if f.growth:
                    lines.append(f"    {f.label:<20}{f.written:,.0f} B")
        lines.append(
            "  CPU ms/iter: this process, every thread (the PostgreSQL server's is not counted)"
        )
        lines.append("  ratios, Keelgate over each, round by round (target):")
        for other, target in TARGETS:
            if other not in s.systems or KEELGATE not in s.systems:
                continue
            ratios = s.ratio(KEELGATE, other)
            met = "met" if statistics.median(ratios) <= target else "NOT met"
            lines.append(
                f"    keelgate / {other:<22}{spread(ratios) + 'x':>24}   (<= {target}x: {met})"
            )
    if crashes:
        lines.append("")
        lines.append(
            "crash check: the process dies (os._exit(137)) inside the WRITE, right after its "
            "side effect and before any record of it; a new process resumes the run"
        )
        lines.append(f"  {'store':<10}{'system':<18}{'side effects':>14}   after the resume")
        for c in crashes:
            lines.append(f"  {c.store:<10}{c.system:<18}{c.effects:>14}   {c.outcome}")
    return "\n".join(lines)
