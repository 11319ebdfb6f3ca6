"""The benchmark's report: medians and spreads over rounds, commits per iteration, the baseline
described, growth and profiles.

Why it exists: figures go into docs/performance.md as printed, so the report says what was
measured and on what. It must never print a figure without the spread it came with.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

from commitbench.loop import describe_baseline
from commitbench.measure import BYTES_WINDOW, Figures
from keelgate.core.state import HISTORY_WINDOW, OUTPUT_CAP


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def report(all_figures: Sequence[Figures], *, rounds: int, load: tuple[str, str]) -> str:
    lines = [
        f"machine: {os.cpu_count()} cores, shared with other work; load average "
        f"{load[0]} at start, {load[1]} at end",
    ]
    for f in all_figures:
        assert f.payload is not None
        lines.append(f"[{f.backend}] {f.settings}")
        lines.append(
            f"  {rounds} alternating rounds of {f.iterations} iterations each; "
            "median (min-max over rounds)"
        )
        if not f.joint:
            lines.append(
                "  note: this store has no save_with_events, so each checkpoint and its audit "
                "events are two commits"
            )
    lines.append("")
    header = (
        f"{'store':<9}{'loop ms/iter':>20}{'raw ms/iter':>20}{'ratio':>20}"
        f"{'added ms/iter':>21}{'commits/iter: loop':>20}{'raw':>10}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for f in all_figures:
        ratio = f.ratios
        lines.append(
            f"{f.backend:<9}{spread(f.loop_ms):>20}{spread(f.raw_ms):>20}"
            f"{spread(ratio) + 'x':>20}{spread(f.overheads):>21}"
            f"{_commits(f.loop_commits):>20}{_commits(f.raw_commits):>10}"
        )
    lines.append("")
    lines.append("client CPU time per iteration, this process only (the server's is not counted):")
    for f in all_figures:
        lines.append(
            f"  {f.backend:<9} loop {spread(f.loop_cpu_ms)} ms   raw {spread(f.raw_cpu_ms)} ms"
        )
    lines.append("")
    payload = all_figures[0].payload
    assert payload is not None
    lines.append("raw baseline, per iteration: 4 transactions, each one durable commit:")
    lines.extend(describe_baseline(payload))
    lines.append(
        f"  with the loop's own JSON and audit rows: {payload.checkpoint_bytes} checkpoint bytes "
        f"per iteration ({', '.join(str(len(c)) for c in payload.checkpoints)} per phase)."
    )
    for f in all_figures:
        if not f.growth:
            continue
        lines.append("")
        lines.append(
            f"[{f.backend}] growth: iterations at..at+{BYTES_WINDOW - 1} "
            f"(history window {HISTORY_WINDOW} entries, outputs capped at {OUTPUT_CAP} chars)"
        )
        lines.append(
            f"{'iteration':>10}{'checkpoint bytes (max)':>24}{'(mean)':>10}"
            f"{'written/iter (median)':>24}{'(mean)':>10}{'ms/iter (median)':>18}"
        )
        for row in f.growth:
            lines.append(
                f"{row['at']:>10}{row['checkpoint_max']:>24}{row['checkpoint_mean']:>10.0f}"
                f"{row['written_median']:>24.0f}{row['written_mean']:>10.0f}"
                f"{row['ms_median']:>18.2f}"
            )
        lines.append(f"  written = {f.written_label}")
    for f in all_figures:
        if f.profile:
            lines.append("")
            lines.append(f"[{f.backend}] profile of {f.iterations} loop iterations (cProfile)")
            lines.append(f.profile.rstrip())
    return "\n".join(lines)


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _commits(counts: Sequence[int]) -> str:
    """The median over the steady state (past the run's start), and the range when it varies.

    PostgreSQL counts are server-wide: an autovacuum or analyze that writes in the window adds
    its transaction id, so a rare iteration shows more; the median is the loop's own figure.
    """
    steady = counts[len(counts) // 3 :]
    median = statistics.median(steady)
    text = f"{median:g}"
    low, high = min(steady), max(steady)
    return text if low == high else f"{text} ({low}-{high})"
