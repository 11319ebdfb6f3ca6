"""Big runs stay flat: one run of 10,000 iterations, its cost per iteration early and late, and
how long `keelgate audit --verify` of it takes.

Why it exists: a run's audit chain and key table grow with every iteration (four events and one
key each), so anything the loop reads in full, or scans instead of looking up, makes an
iteration dearer as the run grows; and verifying a long chain must stay quick. This script drives
one run (the core ``Loop``, a zero-latency model planning one WRITE per call, an accepting
verify: the iteration of ``loop_vs_commits.py``) on SQLite and on PostgreSQL, and measures at
iteration ~10 and at the run's end:

- time per iteration, over a window of ``--window`` iterations (between two planning calls);
- database work per iteration, counted over the next ``--count`` iterations: on SQLite the
  statements the store's connection runs (its trace callback) and the virtual-machine steps
  they take (a progress handler called on every step: rows read show up there), plus
  ``EXPLAIN QUERY PLAN`` of every distinct statement, which must SEARCH through an index and
  never SCAN a table; on PostgreSQL the deltas of ``pg_stat_user_tables`` (sequential scans and
  the rows they read, index scans) and of committed transactions, read after the server has
  flushed its statistics (a backend reports them within ``PGSTAT_IDLE_INTERVAL``, 10 s, of
  going idle, so the loop waits that long at both ends of the window);

and prints the ratio late / early. It then times the real CLI, ``keelgate audit RUN --verify``,
as a subprocess against the store (target: under 2 s).

It must never weaken durability to look fast: each store keeps its defaults, the PostgreSQL
server flushes every commit, and the counting passes are separate from the timed ones.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commitbench.backends import flushing_postgres
from commitbench.loop import TENANT, StampedModel, drive
from commitbench.report import load_average
from keelgate.core.model import ModelReply, ModelRequest
from keelgate.stores._json import dumps

RUN = "big"
FLUSH_WAIT = 11.0  # seconds: PostgreSQL's PGSTAT_IDLE_INTERVAL (10 s) and a margin


@dataclass
class Window:
    """Figures for one point of the run: time per iteration and counted work per iteration."""

    at: int  # the first iteration of the timed window
    ms: float = 0.0
    cpu_ms: float = 0.0  # this process's CPU time per iteration: less moved by other work
    checkpoint_bytes: int = 0  # the run's checkpoint as stored, after the counting window
    work: dict[str, float] = field(default_factory=dict)


@dataclass
class Result:
    store: str
    settings: str
    iterations: int
    run_seconds: float
    early: Window
    late: Window
    scans: list[str]  # statements whose plan reads a table in full (SQLite)
    statements: int  # distinct statements checked with EXPLAIN QUERY PLAN (SQLite)
    events: int
    verify_seconds: list[float]
    verify_cpu: list[float]
    verify_exit: int
    verify_tail: str


class Probe:
    """Counts database work between ``start`` and ``stop`` (totals; the caller divides them)."""

    def start(self) -> None: ...

    def stop(self) -> dict[str, float]:
        return {}


class SQLiteProbe(Probe):
    """The store's one connection, reached into on purpose, to count what it really runs."""

    def __init__(self, store: Any) -> None:
        self.db: sqlite3.Connection = store._db
        self.statements: Counter[str] = Counter()
        self.distinct: set[str] = set()
        self.steps = 0

    def _trace(self, sql: str) -> None:
        self.statements[sql.split(None, 1)[0].upper()] += 1
        self.distinct.add(sql)

    def _step(self) -> int:
        self.steps += 1
        return 0  # go on

    def start(self) -> None:
        self.statements.clear()
        self.steps = 0
        self.db.set_trace_callback(self._trace)
        self.db.set_progress_handler(self._step, 1)

    def stop(self) -> dict[str, float]:
        self.db.set_trace_callback(None)
        self.db.set_progress_handler(None, 1)
        counted: dict[str, float] = {"statements": float(sum(self.statements.values()))}
        counted["VM steps"] = float(self.steps)
        return counted

    def scans(self, path: Path) -> tuple[list[str], int]:
        """Every distinct statement seen whose query plan SCANs a keelgate table."""
        checker = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        found: list[str] = []
        checked = 0
        try:
            for sql in sorted(self.distinct):
                word = sql.split(None, 1)[0].upper()
                if word not in ("SELECT", "INSERT", "UPDATE", "DELETE"):
                    continue  # BEGIN, COMMIT, SAVEPOINT, PRAGMA: no plan
                checked += 1
                plan = checker.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
                for row in plan:
                    detail = str(row[-1])
                    if detail.startswith("SCAN") and "keelgate_" in detail:
                        found.append(f"{detail}: {sql[:160]}")
        finally:
            checker.close()
        return found, checked


class PostgresProbe(Probe):
    """Server-side counters of the run's database, read after the server flushed them."""

    COLUMNS = ("seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch")

    def __init__(self, monitor: Any, flush_wait: float) -> None:
        self.monitor = monitor
        self.flush_wait = flush_wait
        self.before: dict[str, float] = {}

    def _snapshot(self) -> dict[str, float]:
        time.sleep(self.flush_wait)  # every backend of the loop idle long enough to report
        figures: dict[str, float] = {}
        rows = self.monitor.execute(
            "SELECT relname, " + ", ".join(f"COALESCE({c}, 0)" for c in self.COLUMNS) + " "
            "FROM pg_stat_user_tables WHERE relname LIKE 'keelgate%'"
        ).fetchall()
        for relname, *values in rows:
            table = str(relname).removeprefix("keelgate_")
            for column, value in zip(self.COLUMNS, values, strict=True):
                figures[f"{column} {table}"] = float(value)
                figures[f"{column} (all)"] = figures.get(f"{column} (all)", 0.0) + float(value)
        # Buffer pages touched (found in shared buffers or read): what a dead-tuple or index
        # bloat would cost, which the scan counts above do not show.
        rows = self.monitor.execute(
            "SELECT relname, COALESCE(heap_blks_hit, 0) + COALESCE(heap_blks_read, 0), "
            "COALESCE(idx_blks_hit, 0) + COALESCE(idx_blks_read, 0) "
            "FROM pg_statio_user_tables WHERE relname LIKE 'keelgate%'"
        ).fetchall()
        for relname, heap, index in rows:
            table = str(relname).removeprefix("keelgate_")
            figures[f"heap pages {table}"] = float(heap)
            figures[f"index pages {table}"] = float(index)
            figures["pages touched (all)"] = figures.get("pages touched (all)", 0.0) + heap + index
        row = self.monitor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        figures["transactions"] = float(row[0])
        return figures

    def start(self) -> None:
        self.before = self._snapshot()

    def stop(self) -> dict[str, float]:
        after = self._snapshot()
        return {name: after[name] - self.before.get(name, 0.0) for name in after}


class WindowModel(StampedModel):
    """The benchmark's model, which also opens and closes the counting windows between plans.

    A window opens or closes after the planning call's time stamp is taken, so its work (and
    PostgreSQL's flush wait) falls in a counted iteration, never in a timed one.
    """

    def __init__(self, marks: Mapping[int, Callable[[], None]]) -> None:
        super().__init__()
        self.marks = marks

    def call(self, request: ModelRequest) -> ModelReply:
        reply = super().call(request)
        if request.phase == "plan":
            action = self.marks.get(len(self.stamps))  # planning call n starts iteration n
            if action is not None:
                action()
        return reply


def measure(
    store: Any,
    probe: Probe,
    *,
    iterations: int,
    window: int,
    count: int,
) -> tuple[Window, Window, float]:
    early = Window(10)
    late = Window(iterations - window - count)
    counted: dict[int, dict[str, float]] = {}
    sizes: dict[int, int] = {}

    def opener() -> None:
        probe.start()

    def closer(at: int) -> Callable[[], None]:
        def close() -> None:
            counted[at] = probe.stop()
            saved = store.load(TENANT, RUN)
            sizes[at] = 0 if saved is None else len(dumps(saved.state).encode())

        return close

    e_count, l_count = early.at + window, late.at + window
    marks = {
        e_count: opener,
        e_count + count: closer(early.at),
        l_count: opener,
        # At the start of iteration N, the last: the window holds iterations N - count to N - 1.
        l_count + count: closer(late.at),
    }
    model = WindowModel(marks)
    started = time.perf_counter()
    drive(store, RUN, iterations, model)
    elapsed = time.perf_counter() - started
    stamps = model.stamps
    for point in (early, late):
        # stamps[i] is planning call i + 1: iteration a starts at stamps[a - 1].
        point.ms = (stamps[point.at - 1 + window] - stamps[point.at - 1]) / window * 1000
        cpu = model.cpu
        point.cpu_ms = (cpu[point.at - 1 + window] - cpu[point.at - 1]) / window * 1000
        point.work = {k: v / count for k, v in counted.get(point.at, {}).items()}
        point.checkpoint_bytes = sizes.get(point.at, 0)
    return early, late, elapsed


def verify_cli(url: str, *, repeats: int) -> tuple[list[float], list[float], int, str]:
    """Time ``keelgate audit RUN --verify`` as a user runs it: a new process, output read.
    Returns wall seconds and CPU seconds (the process's user and system time) of each."""
    command = [sys.executable, "-m", "keelgate", "audit", RUN, "--verify", "-n", TENANT]
    command += ["--store", url]
    seconds: list[float] = []
    cpu: list[float] = []
    code = 0
    tail = ""
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        code = done.returncode
        out = done.stdout.strip().splitlines()
        tail = (out[-1] if out else done.stderr.strip()[-300:]).strip()
    return seconds, cpu, code, tail


def audit_events(url: str) -> int:
    from keelgate.stores import open_existing

    stores = open_existing(url)
    try:
        return sum(1 for _ in stores.audit.events(TENANT, RUN))
    finally:
        stores.close()


@contextlib.contextmanager
def sqlite_store(workdir: Path) -> Iterator[tuple[Any, Probe, str, str, Path]]:
    from keelgate.stores.sqlite import SQLiteStore

    path = workdir / "big.db"
    store = SQLiteStore(path)
    try:
        settings = f"SQLite {sqlite3.sqlite_version}, SQLiteStore's defaults, file {path}"
        yield store, SQLiteProbe(store), f"sqlite:///{path}", settings, path
    finally:
        store.close()


@contextlib.contextmanager
def postgres_store(flush_wait: float) -> Iterator[tuple[Any, Probe, str, str, Path]]:
    import psycopg

    from keelgate.stores.postgres import PostgresStore

    with flushing_postgres() as server:
        url = server.create_database("keelgate_big")
        monitor = psycopg.connect(url, autocommit=True)
        version = monitor.execute("SHOW server_version").fetchone()
        settings = f"PostgreSQL {version[0] if version else '?'}, fsync on, loopback TCP"
        store = PostgresStore(url)
        try:
            yield store, PostgresProbe(monitor, flush_wait), url, settings, Path()
        finally:
            store.close()
            monitor.close()


def run_one(name: str, workdir: Path, args: argparse.Namespace) -> Result:
    opened = sqlite_store(workdir) if name == "sqlite" else postgres_store(args.flush_wait)
    with opened as (store, probe, url, settings, path):
        print(f"{name}: driving one run of {args.iterations} iterations ...", file=sys.stderr)
        early, late, elapsed = measure(
            store, probe, iterations=args.iterations, window=args.window, count=args.count
        )
        scans: list[str] = []
        checked = 0
        if isinstance(probe, SQLiteProbe):
            scans, checked = probe.scans(path)
        store.close()  # as after `keelgate run`: the CLI opens the store afresh
        events = audit_events(url)
        print(f"{name}: keelgate audit --verify of {events} events ...", file=sys.stderr)
        seconds, cpu, code, tail = verify_cli(url, repeats=args.verify_repeats)
    return Result(
        name,
        settings,
        args.iterations,
        elapsed,
        early,
        late,
        scans,
        checked,
        events,
        seconds,
        cpu,
        code,
        tail,
    )


def ratio(late: float, early: float) -> str:
    if early == 0:
        return "same (0)" if late == 0 else f"from 0 to {late:.1f}"
    return f"{late / early:.2f}x"


def report(results: Sequence[Result], load: tuple[str, str], *, target: float) -> str:
    lines = [
        f"machine: {os.cpu_count()} cores, shared with other work; load average {load[0]} at "
        f"start, {load[1]} at end; {time.strftime('%Y-%m-%d %H:%M %Z')}",
    ]
    for r in results:
        lines.append(f"[{r.store}] {r.settings}")
        lines.append(
            f"  one run of {r.iterations} iterations in {r.run_seconds:.1f} s "
            "(counting windows' waits included)"
        )
        lines.append(
            f"  ms per iteration: {r.early.ms:.2f} at iteration {r.early.at}, "
            f"{r.late.ms:.2f} at {r.late.at}: late/early {ratio(r.late.ms, r.early.ms)}"
        )
        lines.append(
            f"  client CPU ms per iteration: {r.early.cpu_ms:.2f} early, {r.late.cpu_ms:.2f} "
            f"late: {ratio(r.late.cpu_ms, r.early.cpu_ms)}"
        )
        a, b = r.early.checkpoint_bytes, r.late.checkpoint_bytes
        lines.append(f"  checkpoint bytes: {a} early, {b} late: {ratio(b, a)}")
        names = [k for k in r.early.work if k in r.late.work]
        names.sort(
            key=lambda k: (
                "(all)" not in k and k not in ("statements", "VM steps", "transactions"),
                k,
            )
        )
        for name in names:
            a, b = r.early.work[name], r.late.work[name]
            if a == 0 and b == 0 and "(all)" not in name:
                continue
            lines.append(f"  {name} per iteration: {a:.1f} early, {b:.1f} late: {ratio(b, a)}")
        if r.statements:
            verdict = "none" if not r.scans else f"{len(r.scans)}"
            lines.append(
                f"  EXPLAIN QUERY PLAN of the {r.statements} distinct statements seen: "
                f"table scans: {verdict}"
            )
            lines.extend(f"    {s}" for s in r.scans)
        best = min(r.verify_seconds)
        med = statistics.median(r.verify_seconds)
        met = "met" if med < target else "NOT met"
        lines.append(
            f"  keelgate audit --verify of {r.events} events: median {med:.2f} s "
            f"(min {best:.2f} s over {len(r.verify_seconds)}; CPU median "
            f"{statistics.median(r.verify_cpu):.2f} s), exit {r.verify_exit}: "
            f"target < {target:g} s {met}"
        )
        lines.append(f"    last line: {r.verify_tail[:200]}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    logging.getLogger("keelgate").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=50, help="timed iterations per point")
    parser.add_argument("--count", type=int, default=10, help="counted iterations per point")
    parser.add_argument("--verify-repeats", type=int, default=3)
    parser.add_argument(
        "--flush-wait",
        type=float,
        default=FLUSH_WAIT,
        help="seconds to let PostgreSQL flush its statistics around a counting window",
    )
    args = parser.parse_args(argv)
    if args.window < 2 or args.count < 1 or args.verify_repeats < 1:
        parser.error("--window must be at least 2, --count and --verify-repeats at least 1")
    if args.iterations < 2 * (args.window + args.count) + 10:
        parser.error("--iterations must leave room for two windows apart")
    names = ("sqlite", "postgres") if args.store == "all" else (args.store,)
    start_load = load_average()
    results = []
    with tempfile.TemporaryDirectory(prefix="keelgate-big-") as tmp:
        for name in names:
            results.append(run_one(name, Path(tmp), args))
    print(report(results, (start_load, load_average()), target=2.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
