"""The measurements: alternating timed rounds, untimed commit counts, growth over a long run and
a profile.

Why it exists: load from other work on a shared machine must fall on both sides alike, so the
loop and the baseline alternate round by round, and what is counted (commits, bytes) is counted
in passes that are not timed. It must never time one side under conditions the other escapes.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from commitbench.backends import Backend
from commitbench.loop import Payload, StampedModel, calibrate, drive, per_iteration
from keelgate.core.state import HISTORY_WINDOW

BYTES_AT = (10, 200, 1000)
BYTES_WINDOW = 20


@dataclass
class Figures:
    backend: str
    settings: str
    iterations: int
    loop_ms: list[float] = field(default_factory=list)
    raw_ms: list[float] = field(default_factory=list)
    loop_cpu_ms: list[float] = field(default_factory=list)
    raw_cpu_ms: list[float] = field(default_factory=list)
    loop_commits: list[int] = field(default_factory=list)
    raw_commits: list[int] = field(default_factory=list)
    payload: Payload | None = None
    joint: bool = False
    growth: list[dict[str, Any]] = field(default_factory=list)
    written_label: str = ""
    profile: str = ""

    @property
    def ratios(self) -> list[float]:
        return [loop / raw for loop, raw in zip(self.loop_ms, self.raw_ms, strict=True)]

    @property
    def overheads(self) -> list[float]:
        """What the loop adds over the raw commits, in ms per iteration, round by round."""
        return [loop - raw for loop, raw in zip(self.loop_ms, self.raw_ms, strict=True)]


def measure(
    backend: Backend, *, iterations: int, rounds: int, growth: Sequence[int], profile: bool
) -> Figures:
    payload = calibrate()
    figures = Figures(backend.name, backend.settings, iterations, payload=payload)
    store = backend.open_store()
    figures.joint = hasattr(store, "save_with_events")
    raw = backend.raw(payload)
    try:
        # Warm both up (caches, prepared statements, the history window filling up).
        drive(store, "timed", HISTORY_WINDOW + 5, StampedModel())
        raw.iterate(HISTORY_WINDOW + 5)
        for number in range(rounds):
            order = ("loop", "raw") if number % 2 == 0 else ("raw", "loop")
            for which in order:
                if which == "loop":
                    model = StampedModel()
                    drive(store, "timed", iterations + 1, model)
                    figures.loop_ms.append(per_iteration(model.stamps) * 1000)
                    figures.loop_cpu_ms.append(per_iteration(model.cpu) * 1000)
                else:
                    wall, cpu = raw.iterate(iterations)
                    figures.raw_ms.append(wall * 1000)
                    figures.raw_cpu_ms.append(cpu * 1000)
        # Untimed: count commits per iteration, the loop's and the baseline's.
        counter = backend.commit_counter(store)
        marks: list[int] = []
        drive(store, "counted", 30, StampedModel(probe=lambda: marks.append(counter())))
        figures.loop_commits = [b - a for a, b in itertools.pairwise(marks)]
        figures.raw_commits = raw.count(30, raw.counter())
        if growth:
            figures.growth = grow(backend, figures, growth)
        if profile:
            figures.profile = profiled(backend.open_store(), iterations)
    finally:
        raw.close()
        backend.close()
    return figures


def grow(backend: Backend, figures: Figures, at: Sequence[int]) -> list[dict[str, Any]]:
    """Checkpoint sizes, bytes written and time per iteration at iterations ``at`` (one run).

    Time here includes the size recording and the written-bytes probe, the same at every
    iteration: it is for comparing one point of the run with another, not with the baseline.
    """
    store = backend.open_store()
    label, written = backend.written_counter(store)
    figures.written_label = label
    sizes: list[tuple[int, int]] = []  # (iteration about to be planned, checkpoint bytes)

    def record(method: Callable[..., None]) -> Callable[..., None]:
        def saving(tenant: str, run: str, seq: int, state: Mapping[str, Any], *a: Any) -> None:
            sizes.append((int(state["iteration"]), len(json.dumps(state, separators=(",", ":")))))
            method(tenant, run, seq, state, *a)

        return saving

    for name in ("save", "save_with_events"):
        if hasattr(store, name):
            setattr(store, name, record(getattr(store, name)))
    marks: list[int] = []

    def probe() -> None:
        marks.append(written())

    last = max(at) + BYTES_WINDOW + 1
    model = StampedModel(probe=probe)
    drive(store, "growth", last, model)
    rows = []
    for point in at:
        # marks[i] is taken as iteration i + 1 is planned; iteration i + 1 spans marks[i..i+1].
        window = range(point - 1, point - 1 + BYTES_WINDOW)
        per = [marks[i + 1] - marks[i] for i in window]
        times = [(model.stamps[i + 1] - model.stamps[i]) * 1000 for i in window]
        checkpoint = [
            size for iteration, size in sizes if point <= iteration < point + BYTES_WINDOW
        ]
        rows.append(
            {
                "at": point,
                "ms_median": statistics.median(times),
                "checkpoint_max": max(checkpoint),
                "checkpoint_mean": statistics.mean(checkpoint),
                "written_median": statistics.median(per),
                "written_mean": statistics.mean(per),
            }
        )
    return rows


def profiled(store: Any, iterations: int) -> str:
    """Where a loop iteration's time goes: cProfile over a run, the top functions by own time."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    drive(store, "profiled", iterations, StampedModel())
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats(os.environ.get("BENCH_SORT", "tottime")).print_stats(
        int(os.environ.get("BENCH_ROWS", "20"))
    )
    return out.getvalue()
