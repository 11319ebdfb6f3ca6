"""The counting behind every figure of the scale bench, as pure functions (unit-tested in
``tests/test_scale_bench_counting.py``).

Why it exists: a figure is only as good as its count. What is a hand-off (a pod's end seen to
the next pod of its run seen created), which pods fall in the measured window, which audit
events are the operator's and of which verb, what a WRITE counted once means: each is decided
here once, on plain values, so a test can hold it to a known answer. Nothing here talks to a
cluster, a process or a clock.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

POD_NAME = re.compile(r"^(?P<run>.+)-s(?P<step>\d+)-a(?P<attempt>\d+)$")


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0.0 for none."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def step_pods_by_run(names: Iterable[str]) -> dict[str, list[str]]:
    """Step pod names grouped by run, each run's in order of (step, attempt)."""
    runs: dict[str, list[tuple[int, int, str]]] = {}
    for name in names:
        match = POD_NAME.match(name)
        if match:
            runs.setdefault(match["run"], []).append(
                (int(match["step"]), int(match["attempt"]), name)
            )
    return {run: [name for *_, name in sorted(pods)] for run, pods in runs.items()}


def handoffs(
    created: Mapping[str, float], ended: Mapping[str, float], start: float, end: float
) -> list[float]:
    """Seconds from each step pod's end (seen in ``[start, end)``) to the creation of its run's
    next step pod (seen at any time): one sample per pod that has a next pod. A pod whose end
    was not seen, or that is its run's last, gives none."""
    out: list[float] = []
    for pods in step_pods_by_run(created).values():
        for this, following in itertools.pairwise(pods):
            at = ended.get(this)
            if at is None or not start <= at < end:
                continue
            out.append(max(0.0, created[following] - at))
    return out


def waiting_handoffs(created: Mapping[str, float], ended: Mapping[str, float]) -> int:
    """How many runs have their newest step pod ended with no next pod yet, a last step (a
    run's third, which ends it) not counted: the hand-offs still to make."""
    waiting = 0
    for pods in step_pods_by_run(created).values():
        newest = pods[-1]
        match = POD_NAME.match(newest)
        if newest in ended and match is not None and int(match["step"]) < LAST_STEP:
            waiting += 1
    return waiting


#: The step that ends a bench run (read, order, done).
LAST_STEP = 3


def first_pods(
    runs_created: Mapping[str, float], created: Mapping[str, float], start: float, end: float
) -> list[float]:
    """Seconds from each run's creation (in ``[start, end)``) to its first step pod seen
    created; runs whose first pod was never seen give none."""
    out: list[float] = []
    for run, at in runs_created.items():
        if not start <= at < end:
            continue
        first = created.get(f"{run}-s1-a1")
        if first is not None:
            out.append(max(0.0, first - at))
    return out


def in_window(times: Iterable[float], start: float, end: float) -> int:
    """How many of ``times`` fall in ``[start, end)``."""
    return sum(1 for t in times if start <= t < end)


def audit_requests(
    lines: Iterable[str], user: str, start: float, end: float
) -> Counter[tuple[str, str]]:
    """The API requests ``user`` made in ``[start, end)`` (Unix seconds, by the request's
    receipt), from the API server's audit log (JSON lines, one event per request at its
    ``ResponseComplete`` stage), counted by (verb, resource[/subresource]). A watch counts once,
    when it ends; lines that are not such events are skipped."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("stage") != "ResponseComplete":
            continue
        if (event.get("user") or {}).get("username") != user:
            continue
        received = _unix(str(event.get("requestReceivedTimestamp") or ""))
        if received is None or not start <= received < end:
            continue
        ref = event.get("objectRef") or {}
        resource = str(ref.get("resource") or event.get("requestURI", "?"))
        if ref.get("subresource"):
            resource = f"{resource}/{ref['subresource']}"
        counts[(str(event.get("verb", "?")), resource)] += 1
    return counts


def _unix(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def by_verb(counts: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """Requests summed by verb."""
    out: Counter[str] = Counter()
    for (verb, _), n in counts.items():
        out[verb] += n
    return dict(out)


def writes(counts: Mapping[tuple[str, str], int]) -> int:
    """How many of the requests changed something (create, update, patch, delete)."""
    return sum(n for (verb, _), n in counts.items() if verb in WRITE_VERBS)


def per_step(value: float, steps: int) -> float:
    """``value`` divided over ``steps`` (0 when there were none)."""
    return value / steps if steps else 0.0


def writes_once(orders: Iterable[Mapping[str, Any]], succeeded: Iterable[str]) -> JSONish:
    """What the shop received, held to the promise: each Idempotency-Key at most once, and each
    run that succeeded with exactly one order of its own (the order's ``sku`` is the run's name).
    Returns the counts and the runs that break it (empty lists when none does)."""
    keys: Counter[str] = Counter()
    skus: Counter[str] = Counter()
    for order in orders:
        keys[str(order.get("key", ""))] += 1
        body = order.get("body") or {}
        skus[str(body.get("sku", "")) if isinstance(body, Mapping) else ""] += 1
    twice = sorted(k for k, n in keys.items() if n > 1 or not k)
    done = list(succeeded)
    wrong = sorted(run for run in done if skus.get(run, 0) != 1)
    return {
        "orders": sum(keys.values()),
        "keys_twice_or_missing": twice,
        "succeeded_runs": len(done),
        "succeeded_runs_without_exactly_one_order": wrong,
        "ok": not twice and not wrong,
    }


JSONish = dict[str, Any]


def cpu_seconds_of(stat_line: str, ticks: int) -> float:
    """A process's CPU seconds from its ``/proc/PID/stat`` line: its own user and system time
    plus that of its children it has waited for (so a tree summed over its live processes
    counts each exited process once, in its parent)."""
    fields = stat_line.rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime + cutime + cstime) / ticks


def parent_of(stat_line: str) -> int:
    """The parent pid in a ``/proc/PID/stat`` line."""
    return int(stat_line.rsplit(")", 1)[1].split()[1])


def collapsed_top(lines: Iterable[str], *, top: int = 15) -> dict[str, list[tuple[str, float]]]:
    """py-spy's collapsed stacks ("frame;frame;... count" lines) summed three ways: by the
    innermost frame (where the CPU was spent: ``self``), by every frame a stack passes
    (``total``, a frame counted once per stack), and by the innermost frame of Keelgate's own
    code (``keelgate``: which of its functions the time is spent under); each as a share of all
    samples, top first."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    samples = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
        inner = [f for f in frames if "keelgate/" in f]
        ours[inner[-1] if inner else "(outside keelgate: kopf, asyncio, the client)"] += n
    if not samples:
        return {"self": [], "total": [], "keelgate": []}
    return {
        "self": [(f, round(n / samples, 3)) for f, n in own.most_common(top)],
        "total": [(f, round(n / samples, 3)) for f, n in total.most_common(top)],
        "keelgate": [(f, round(n / samples, 3)) for f, n in ours.most_common(top)],
    }
