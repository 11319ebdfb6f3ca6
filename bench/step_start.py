"""How long a step pod's program takes to start: ``keelgate step`` from exec to its checkpoint.

Every step of every run on Kubernetes is a new process (issue 12 part 4: target < 0.4 s from
exec to the checkpoint loaded). This script starts the real ``keelgate`` executable of this
environment as a subprocess, as a step pod's container does (``keelgate step -n NS --run RUN``,
the store from ``KEELGATE_STORE``), on a SQLite file and on a PostgreSQL server it starts itself
(``keelgate.testing.pgserver``, fsync on), and times two things per store:

- **finished run**: exec to exit for a run whose checkpoint says its goal is met. The step opens
  the store, reads and validates the recorded spec and the checkpoint, prints the outcome line
  and exits: nothing is built. This is an upper bound on "exec to checkpoint loaded" (it adds
  the outcome line and the interpreter's exit) and the figure the target is judged on;
- **running run**: exec to the model's first call for a run whose checkpoint is mid-way: the
  checkpoint read, then the manifest validated, the model and tools built, the run locked and
  its state rebuilt, up to the plan call. The model (``bench/kg_step_model.py``) writes the
  machine-wide monotonic clock to a file there and ends the process before anything is saved, so
  every start meets the same checkpoint.

Beside them, in the same rounds: ``python -c pass``, ``python -c "import keelgate"`` (the facade
is lazy, so this is close to bare Python), and the imports no step can avoid: pydantic's
``TypeAdapter`` (the spec and the checkpoint are validated through it) and, for PostgreSQL,
``psycopg`` and its pool. Rounds rotate the order so load from other work falls on all alike.
The report gives p50, p95 and min of the wall clock and the CPU time (user + system) of each,
the machine's load average, and an import-time breakdown (``python -X importtime``, the least
of 5 starts per module) of one step per store by top-level package.

Keelgate's modules are byte-compiled first (``compileall``), as an installed wheel is: with
``PYTHONDONTWRITEBYTECODE=1`` (as in the image and the step pods) an editable install would
otherwise compile its sources at every start. This script must never write outside its
temporary directory and Keelgate's own ``__pycache__``, and never leave a server behind.

    .venv/bin/python bench/step_start.py               # 20 starts of each, both stores
    .venv/bin/python bench/step_start.py --starts 50 --store sqlite
    .venv/bin/python bench/step_start.py --before /tmp/old/operator   # beside an older tree
    .venv/bin/python bench/step_start.py --tracing    # also traced, to a real Jaeger (e2e/bin)

With ``--tracing`` each store's two kinds are also timed with tracing on, as a step pod of a
traced operator runs: ``OTEL_EXPORTER_OTLP_ENDPOINT`` naming a Jaeger this script starts
(``e2e/bin/jaeger``, built by ``make e2e-build``), and the pod's ``TRACEPARENT`` and
``TRACESTATE``; each span is sent as it ends.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "operator"))

from keelgate.core.spec import LoopSpec  # noqa: E402
from keelgate.manifest import load_agentrun  # noqa: E402
from keelgate.runners.step import StepRunner  # noqa: E402
from keelgate.stores import open_stores  # noqa: E402

TENANT = "bench"
FINISHED = "finished"
# The running runs are cycled through, so that no start meets a run whose previous driver's
# session the server may not have ended yet (a step waits for the run's lock then).
RUNNING = tuple(f"running-{n}" for n in range(4))
TARGET_S = 0.4
KEELGATE = Path(sys.executable).parent / "keelgate"


def spec_for(run: str) -> LoopSpec:
    """The run's spec as the operator records it: from an AgentRun manifest."""
    manifest = f"""
apiVersion: keelgate.dev/v1alpha1
kind: AgentRun
metadata: {{name: {run}, namespace: {TENANT}}}
spec:
  goal: "start-up benchmark"
  model: {{provider: python, name: bench, callable: "kg_step_model:plan"}}
  tools:
    - name: write
      sideEffect: WRITE
      inputSchema: {{type: object, properties: {{n: {{type: integer}}}}, required: [n]}}
      python: {{callable: "kg_step_model:write"}}
  budget: {{maxIterations: 5}}
"""
    return load_agentrun(manifest).to_loop_spec()


def prepare(store: str) -> None:
    """Record each run's spec as the operator does, then drive it where the bench needs it:
    the finished run to its goal, each running run through one iteration (its WRITE)."""
    stores = open_stores(store)
    try:
        assert stores.specs is not None
        for run in (FINISHED, *RUNNING):
            spec = spec_for(run)
            stores.specs.record_spec(TENANT, run, spec.to_json(), source="bench", generation=1)
    finally:
        stores.close()
    sys.path.insert(0, str(BENCH))
    runner = StepRunner(store=store)
    for _ in range(3):  # plan and WRITE, then the goal met
        finished = runner.step(TENANT, FINISHED)
    assert finished.phase.value == "Succeeded", finished
    for run in RUNNING:
        outcome = runner.step(TENANT, run)
        assert outcome.phase.value == "Running", outcome


def environment(store: str, workdir: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("KEELGATE_", "PYTHON", "KG_"))
    }
    env.update(
        KEELGATE_STORE=store,
        PYTHONPATH=str(BENCH),
        PYTHONDONTWRITEBYTECODE="1",  # as in the image and the step pods
        HOME=str(workdir),
    )
    return env


def step_command(run: str) -> list[str]:
    return [str(KEELGATE), "step", "-n", TENANT, "--run", run]


@dataclass(frozen=True)
class Start:
    """One process start: seconds of wall clock to the measured point, and the CPU seconds
    (user + system) the whole process used, which load from other work changes far less."""

    wall: float
    cpu: float


def started(
    command: list[str], env: dict[str, str], cwd: Path, *, mark: Path | None = None
) -> Start:
    """Start ``command``; wall time to its exit, or to the mark it writes if ``mark`` is given.
    A start that fails is no figure: it raises."""
    if mark is not None:
        mark.unlink(missing_ok=True)
        env = {**env, "KG_STEP_MARK": str(mark)}
    start = time.monotonic_ns()
    process = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    ended = time.monotonic_ns()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0 or (mark is not None and not mark.is_file()):
        raise RuntimeError(f"{command[-3:]} exited {process.returncode}: {errors.decode()}")
    reached = int(mark.read_text()) if mark is not None else ended
    return Start((reached - start) / 1e9, usage.ru_utime + usage.ru_stime)


def finished_start(env: dict[str, str], cwd: Path) -> Callable[[], Start]:
    return lambda: started(step_command(FINISHED), env, cwd)


def running_start(env: dict[str, str], cwd: Path) -> Callable[[], Start]:
    starts = iter(range(10**9))
    return lambda: started(
        step_command(RUNNING[next(starts) % len(RUNNING)]), env, cwd, mark=cwd / "mark"
    )


def python_start(code: str, env: dict[str, str], cwd: Path) -> Callable[[], Start]:
    return lambda: started([sys.executable, "-c", code], env, cwd)


@contextmanager
def stores(which: str, workdir: Path) -> Iterator[dict[str, str]]:
    urls: dict[str, str] = {}
    server = None
    if which in ("sqlite", "both"):
        urls["SQLite"] = f"sqlite:///{workdir / 'kg.db'}"
    if which in ("postgres", "both"):
        from keelgate.testing.pgserver import start_postgres

        server = start_postgres(fsync=True)
        urls["PostgreSQL"] = server.create_database()
    try:
        yield urls
    finally:
        if server is not None:
            server.stop()


@contextmanager
def collector(wanted: bool, workdir: Path) -> Iterator[dict[str, str]]:
    """The variables of a traced step pod, with a Jaeger of e2e/bin taking its spans (nothing
    when not ``wanted``)."""
    if not wanted:
        yield {}
        return
    sys.path.insert(0, str(ROOT / "e2e"))
    from keelgate_e2e.jaeger import Jaeger

    jaeger = Jaeger(workdir / "jaeger").start()
    try:
        trace, pod, run = "5" * 32, "6" * 16, "7" * 16
        yield {
            "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
            "OTEL_SERVICE_NAME": "keelgate-step",
            "TRACEPARENT": f"00-{trace}-{pod}-01",
            "TRACESTATE": f"keelgate={run}@2026-12-04T10:00:00Z",
        }
    finally:
        jaeger.stop()


def import_breakdown(
    command: list[str], env: dict[str, str], cwd: Path, *, runs: int = 5, top: int = 8
) -> dict[str, Any]:
    """``runs`` starts under ``-X importtime``; each module's least time over them (load from
    other work only ever adds), summed by top-level package, and the modules that take the most
    (cumulative, their own imports included)."""
    own: dict[str, int] = {}
    cumulative: dict[str, int] = {}
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "keelgate", *command[1:]],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
        )
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, cumulative_us, name = line[len("import time:") :].split("|")
            module = name.strip()
            own[module] = min(own.get(module, 10**12), int(self_us))
            cumulative[module] = min(cumulative.get(module, 10**12), int(cumulative_us))
    by_package: dict[str, int] = {}
    for module, us in own.items():
        by_package[module.split(".")[0]] = by_package.get(module.split(".")[0], 0) + us
    biggest = sorted(by_package.items(), key=lambda item: -item[1])
    return {
        "total_ms": round(sum(by_package.values()) / 1000, 1),
        "by_package_ms": {name: round(us / 1000, 1) for name, us in biggest},  # all, largest first
        "top": top,
        "modules_ms": {
            module: round(us / 1000, 1)
            for module, us in sorted(cumulative.items(), key=lambda item: -item[1])[:top]
        },
    }


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(starts: list[Start]) -> dict[str, float]:
    wall = [s.wall for s in starts]
    cpu = [s.cpu for s in starts]
    return {
        "p50": round(statistics.median(wall), 3),
        "p95": round(quantile(wall, 0.95), 3),
        "min": round(min(wall), 3),
        "cpu_p50": round(statistics.median(cpu), 3),
        "cpu_min": round(min(cpu), 3),
        "n": len(starts),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=20, help="starts of each kind (20)")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--json", action="store_true", help="print the report as JSON too")
    parser.add_argument(
        "--tracing", action="store_true", help="also time each kind traced, to a real Jaeger"
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="the 'operator' folder of another Keelgate tree (e.g. `git archive REV operator` "
        "unpacked): its step is timed on the finished run too, in the same rounds",
    )
    args = parser.parse_args(argv)

    compileall.compile_dir(str(ROOT / "operator" / "keelgate"), quiet=1)
    if args.before is not None:
        compileall.compile_dir(str(args.before / "keelgate"), quiet=1)
    load_before = os.getloadavg()
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="kg-step-start-") as tmp:
        workdir = Path(tmp)
        with stores(args.store, workdir) as urls, collector(args.tracing, workdir) as traced:
            for url in urls.values():
                prepare(url)
            base_env = environment("", workdir)
            # Bare Python; the facade; and what no step avoids: pydantic's validation (the spec
            # and the checkpoint are read through TypeAdapters) and, on PostgreSQL, the driver.
            baselines = ["pass", "import keelgate", "from pydantic import TypeAdapter"]
            if "PostgreSQL" in urls:
                baselines.append("import psycopg, psycopg_pool")
            kinds: dict[str, Callable[[], Start]] = {
                f"python -c '{code}'": python_start(code, base_env, workdir) for code in baselines
            }
            for label, url in urls.items():
                env = environment(url, workdir)
                kinds[f"{label}: finished run, exec to exit"] = finished_start(env, workdir)
                if args.before is not None:
                    # The same executable; its package found first on PYTHONPATH.
                    older = {**env, "PYTHONPATH": f"{args.before}{os.pathsep}{BENCH}"}
                    kinds[f"{label}: finished run, the --before tree"] = finished_start(
                        older, workdir
                    )
                kinds[f"{label}: running run, exec to the model's first call"] = running_start(
                    env, workdir
                )
                if traced:
                    on = {**env, **traced}
                    kinds[f"{label}: finished run, traced"] = finished_start(on, workdir)
                    kinds[f"{label}: running run, traced"] = running_start(on, workdir)
            times: dict[str, list[Start]] = {kind: [] for kind in kinds}
            order = list(kinds)
            for round_ in range(args.starts):
                shift = round_ % len(order)
                for kind in order[shift:] + order[:shift]:
                    times[kind].append(kinds[kind]())
            breakdown = {
                label: import_breakdown(step_command(FINISHED), environment(url, workdir), workdir)
                for label, url in urls.items()
            }
    load_after = os.getloadavg()
    report = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "python": sys.version.split()[0],
        "starts": args.starts,
        "seconds": {kind: summary(values) for kind, values in times.items()},
        "imports": breakdown,
    }
    print_report(report)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


def print_report(report: dict[str, Any]) -> None:
    print(f"\nkeelgate step start-up, {report['date']}, Python {report['python']}")
    print(
        f"load average {report['load_average_before']} before, "
        f"{report['load_average_after']} after; {report['starts']} starts of each, rotated"
    )
    print(f"\n{'wall clock, s':54} {'p50':>6} {'p95':>6} {'min':>6}   {'CPU p50':>7} {'min':>6}")
    for kind, f in report["seconds"].items():
        print(
            f"{kind:54} {f['p50']:6.3f} {f['p95']:6.3f} {f['min']:6.3f}   "
            f"{f['cpu_p50']:7.3f} {f['cpu_min']:6.3f}"
        )
    print(f"\ntarget: exec to checkpoint loaded < {TARGET_S} s (judged on the finished run's p50)")
    for kind, figures in report["seconds"].items():
        if kind.endswith("finished run, exec to exit"):
            met = "met" if figures["p50"] < TARGET_S else "NOT met"
            print(f"  {kind.split(':')[0]}: p50 {figures['p50']:.3f} s: {met}")
    for label, found in report["imports"].items():
        print(
            f"\nimports of one step on {label} (-X importtime, least of 5 starts; "
            f"total {found['total_ms']} ms), by package:"
        )
        packages = list(found["by_package_ms"].items())
        for name, ms in packages[: found["top"]]:
            print(f"  {name:44} {ms:7.1f} ms")
        rest = sum(ms for _, ms in packages[found["top"] :])
        print(f"  {'(the rest)':44} {rest:7.1f} ms")
        print("  the modules that take the most, their imports included:")
        for name, ms in found["modules_ms"].items():
            print(f"  {name:44} {ms:7.1f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
