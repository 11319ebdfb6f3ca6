"""The scale bench's report: a table on stdout and a plot (PNG) of hand-off and throughput
against concurrent runs, for docs/performance.md.

Why it exists: the figures are read by people choosing a platform's settings; the plot shows the
shape (does hand-off grow with the runs? does throughput hold?) at a glance. matplotlib comes
from the ``bench-scale`` extra, imported only here, and only when a plot is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def table(phases: Sequence[dict[str, Any]]) -> str:
    """One line per phase: the figures the issue names."""
    head = (
        "runs | replicas | pods/s | hand-off p50 / p99 s | first pod p99 s | op CPU ms/step | "
        "op RSS MB | API writes/step | PG sessions, tx/step | WRITEs once"
    )
    lines = [head, "-" * len(head)]
    for p in phases:
        lines.append(
            f"{p['runs']:>5} | {p.get('replicas', 1):>8} | {p['step_pods_per_second']:6.2f} | "
            f"{p['handoff_p50_s']:.3f} / {p['handoff_p99_s']:.3f} | "
            f"{p['first_pod_p99_s']:.3f} | {p['operator_cpu_ms_per_step']:.1f} | "
            f"{p['operator_rss_peak_mb']:.0f} | {p['api_writes_per_step']:.2f} | "
            f"{p['pg_sessions_per_step']:.2f}, {p['pg_transactions_per_step']:.1f} | "
            f"{p.get('writes_once', '-')}"
        )
    return "\n".join(lines)


def side_by_side(phases: Sequence[dict[str, Any]]) -> str:
    """Each number of runs measured with several replicas, against the same number with one:
    the ratios the sharding target is judged by (hand-off p99 and the operator's CPU a step,
    summed over the replicas: no higher than one replica's), measured in the same run."""
    ones = {p["runs"]: p for p in phases if p.get("replicas", 1) == 1}
    lines = [
        "runs | replicas (shards) | hand-off p99 s (x one) | op CPU ms/step (x one) | "
        "pods/s (x one)"
    ]
    for p in phases:
        one = ones.get(p["runs"])
        if p.get("replicas", 1) == 1 or one is None:
            continue
        lines.append(
            f"{p['runs']:>5} | {p['replicas']} ({p.get('shards', 0)}) | "
            f"{p['handoff_p99_s']:.3f} ({_ratio(p['handoff_p99_s'], one['handoff_p99_s'])}) | "
            f"{p['operator_cpu_ms_per_step']:.1f} "
            f"({_ratio(p['operator_cpu_ms_per_step'], one['operator_cpu_ms_per_step'])}) | "
            f"{p['step_pods_per_second']:.2f} "
            f"({_ratio(p['step_pods_per_second'], one['step_pods_per_second'])})"
        )
    return "\n".join(lines)


def _ratio(value: float, base: float) -> str:
    return f"x{value / base:.2f}" if base else "-"


def plot(phases: Sequence[dict[str, Any]], out: Path, *, title: str) -> Path:
    """Hand-off p50 and p99 (left axis, seconds) and step pods a second (right axis) against
    the number of runs under way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [p["runs"] for p in phases]
    fig, left = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    left.plot(
        runs, [p["handoff_p50_s"] for p in phases], "o-", color="tab:blue", label="hand-off p50"
    )
    left.plot(
        runs, [p["handoff_p99_s"] for p in phases], "s--", color="tab:blue", label="hand-off p99"
    )
    left.axhline(1.0, color="tab:blue", alpha=0.3, linewidth=1)
    left.set_xlabel("AgentRuns under way at once")
    left.set_ylabel("hand-off, seconds (pod end seen to next pod seen)", color="tab:blue")
    left.set_xscale("log")
    left.set_xticks(runs, [f"{r:,}" for r in runs])
    left.minorticks_off()
    right = left.twinx()
    right.plot(
        runs,
        [p["step_pods_per_second"] for p in phases],
        "^-",
        color="tab:orange",
        label="step pods / s",
    )
    for phase in phases:
        if phase.get("label"):  # which code a point was measured on, say
            right.annotate(
                str(phase["label"]),
                (phase["runs"], phase["step_pods_per_second"]),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=7,
                color="tab:orange",
            )
    right.axhline(10.0, color="tab:orange", alpha=0.3, linewidth=1)
    right.set_ylabel("step pods done a second (measured window)", color="tab:orange")
    right.set_ylim(bottom=0)
    # Hand-offs span milliseconds to minutes (a backlog): a log scale shows both, and the 1 s line.
    left.set_yscale("log")
    left.set_ylim(0.01, max(10.0, 2 * max(p["handoff_p99_s"] for p in phases)))
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = left.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    left.legend(handles, labels, loc="upper left", fontsize=8)
    left.set_title(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
