"""Big runs stay flat: an iteration late in a long run does the same database work as one early
in it, every statement the loop runs finds its rows through an index, and `keelgate audit
--verify` reads a long chain in pages and still finds what was tampered with.

Why it exists: a run's audit chain and key table grow with every iteration, so a statement that
scans them, or anything read in full per step, makes each iteration dearer as the run goes on;
a user sees that only after thousands of iterations. These runs are a few hundred iterations
long, enough for a scan to show in the counts (``bench/big_run.py`` measures 10,000). Database
work is counted by the databases themselves: SQLite's trace callback and virtual-machine steps
on the store's connection, and PostgreSQL's ``auto_explain`` writing the plan of every statement
of the run's database to the server's log.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from keelgate.adapters.tools.python import PythonTool
from keelgate.cli import main
from keelgate.core.audit import verify
from keelgate.core.loop import Loop
from keelgate.core.model import ModelReply, ModelRequest, PlannedCall
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect
from keelgate.stores import open_existing
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing.pgserver import PgServer

TENANT = "big"
RUN = "long"
EARLY, LATE, WINDOW = 10, 300, 5  # iterations counted: [10, 15) and [300, 305)


class MarkingModel:
    """A zero-latency model planning one WRITE per call and accepting every verification; at
    the start of planning call n (iteration n) it runs ``marks[n]``, if any."""

    def __init__(self, marks: Mapping[int, Callable[[], None]]) -> None:
        self.name = "marking"
        self.marks = marks
        self.plans = 0

    def call(self, request: ModelRequest) -> ModelReply:
        if request.phase == "verify":
            return ModelReply(verdict="accept")
        self.plans += 1
        mark = self.marks.get(self.plans)
        if mark is not None:
            mark()
        return ModelReply(actions=(PlannedCall("write", {"n": request.call}),))


def _write(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
    return {"ok": True}


def drive(store: Any, iterations: int, marks: Mapping[int, Callable[[], None]]) -> None:
    tool = PythonTool("write", _write, SideEffect.WRITE, description="returns at once")
    loop = Loop(stores=Stores.of(store), model=MarkingModel(marks), tools=[tool])
    spec = LoopSpec(TENANT, RUN, "a long run", budget=Budget(max_iterations=iterations))
    assert loop.run_or_resume(spec).iteration == iterations


@dataclass
class SQLiteWork:
    """Statements and virtual-machine steps of the store's connection, per counting window."""

    statements: dict[str, int] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    distinct: set[str] = field(default_factory=set)


def sqlite_run(path: Path) -> SQLiteWork:
    """A run of LATE + WINDOW iterations on SQLite, counted in both windows."""
    store = SQLiteStore(path)
    db: sqlite3.Connection = store._db  # its one connection: reached into to count its work
    work = SQLiteWork()
    seen: list[str] = []
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    def open_window() -> None:
        seen.clear()
        steps[0] = 0
        db.set_trace_callback(seen.append)
        db.set_progress_handler(step, 1)

    def close_window(name: str) -> Callable[[], None]:
        def close() -> None:
            db.set_trace_callback(None)
            db.set_progress_handler(None, 1)
            work.statements[name] = len(seen)
            work.steps[name] = steps[0]
            work.distinct.update(seen)

        return close

    marks = {
        EARLY: open_window,
        EARLY + WINDOW: close_window("early"),
        LATE: open_window,
        LATE + WINDOW: close_window("late"),
    }
    try:
        drive(store, LATE + WINDOW, marks)
    finally:
        store.close()
    return work


def test_an_iteration_at_300_runs_the_same_statements_as_at_10_on_sqlite(tmp_path: Path) -> None:
    """On SQLite, the loop runs as many statements per iteration at iteration 300 as at
    iteration 10, and they take as many virtual-machine steps (a statement reading a growing
    table would take more), so a long run is no slower per iteration."""
    work = sqlite_run(tmp_path / "keelgate.db")
    assert work.statements["early"] > 0
    assert work.statements["late"] == work.statements["early"]
    # Equal in practice; a little room for a B-tree that grew a level, none for a scan, which
    # would add hundreds of steps per statement at 1,200 audit rows.
    assert work.steps["late"] <= work.steps["early"] * 1.05


def test_every_statement_the_loop_runs_on_sqlite_searches_an_index(tmp_path: Path) -> None:
    """Every statement the loop runs in an iteration, as it ran it (values in place), is
    planned by SQLite as a SEARCH through an index, never a SCAN of a Keelgate table: nothing
    is read in full per step, however long the run."""
    path = tmp_path / "keelgate.db"
    work = sqlite_run(path)
    checker = sqlite3.connect(path)
    try:
        plans = {
            statement: [row[-1] for row in checker.execute(f"EXPLAIN QUERY PLAN {statement}")]
            for statement in sorted(work.distinct)
            if statement.split(None, 1)[0].upper() in ("SELECT", "INSERT", "UPDATE", "DELETE")
        }
    finally:
        checker.close()
    # A plain INSERT reads nothing and has no plan; every statement that reads rows has one.
    reading = {s: p for s, p in plans.items() if not s.upper().startswith("INSERT")}
    assert reading, "the loop ran no statement that reads"
    assert all(any(step.startswith("SEARCH") for step in plan) for plan in reading.values())
    scanning = {s: plan for s, plan in plans.items() if any("SCAN keelgate_" in p for p in plan)}
    assert scanning == {}


@contextlib.contextmanager
def explained(pg_server: PgServer, url: str) -> Iterator[Callable[[], str]]:
    """Every statement of new sessions on the database of ``url`` has its plan written to the
    server's log (``auto_explain``); yields a reader of what the log gained since."""
    import psycopg
    from psycopg import sql

    log = pg_server.base_dir / "postgres.log"
    start = log.stat().st_size
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as admin:
        for setting, value in (
            ("session_preload_libraries", "auto_explain"),
            ("auto_explain.log_min_duration", "0"),
        ):
            admin.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(name), sql.SQL(setting), sql.Literal(value)
                )
            )

    def read() -> str:
        with log.open("rb") as text:
            text.seek(start)
            return text.read().decode(errors="replace")

    yield read


@pytest.mark.postgres
def test_an_iteration_at_300_runs_the_same_statements_as_at_10_on_postgres(
    pg_server: PgServer, pg_url: str
) -> None:
    """On PostgreSQL, the loop runs as many statements per iteration at iteration 300 as at
    iteration 10, and the server plans none of them as a sequential scan of a Keelgate table:
    every row the loop reads is found through an index, however long the run."""
    import psycopg
    from psycopg import sql

    from keelgate.stores.postgres import PostgresStore

    with explained(pg_server, pg_url) as log:
        monitor = psycopg.connect(pg_url, autocommit=True)

        def mark(text: str) -> Callable[[], None]:
            return lambda: monitor.execute(sql.SQL("SELECT {}").format(sql.Literal(text)))

        marks = {
            EARLY: mark("kg-window-early"),
            EARLY + WINDOW: mark("kg-window-end"),
            LATE: mark("kg-window-late"),
            LATE + WINDOW: mark("kg-window-end"),
        }
        store = PostgresStore(pg_url)
        try:
            drive(store, LATE + WINDOW, marks)
        finally:
            store.close()
            monitor.close()
        text = log()
    # One log entry per statement executed: "duration: ... plan:" then the query and its plan.
    entries = re.split(r"LOG:\s+duration: [0-9.]+ ms\s+plan:", text)[1:]
    windows: dict[str, list[str]] = {}
    current: list[str] | None = None
    for entry in entries:
        found = re.search(r"'kg-window-(\w+)'", entry.split("\n", 2)[1] if "\n" in entry else "")
        if found:
            current = None if found[1] == "end" else windows.setdefault(found[1], [])
        elif current is not None:
            current.append(entry)
    assert set(windows) == {"early", "late"}, "the log holds no plans of the loop's statements"
    assert len(windows["early"]) > 0
    assert len(windows["late"]) == len(windows["early"])
    scans = [e for w in windows.values() for e in w if "Seq Scan on keelgate_" in e]
    assert scans == []


def long_run(path: Path, iterations: int = 300) -> str:
    """A finished run of ``iterations`` on a SQLite store; its URL."""
    store = SQLiteStore(path)
    try:
        drive(store, iterations, {})
    finally:
        store.close()
    return f"sqlite:///{path}"


def audit_cli(url: str, *more: str) -> list[str]:
    return ["audit", RUN, "-n", TENANT, "--store", url, *more]


def test_audit_verify_of_a_long_run_gives_the_verdict_of_the_whole_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`keelgate audit --verify` of a run of 1,202 events (more than one page of the chain)
    shows every event once, in order, and verifies them; with an event edited in the middle it
    exits 1 naming that event, exactly as verifying the whole chain read at once does."""
    url = long_run(tmp_path / "keelgate.db")
    assert main(audit_cli(url, "--verify")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "chain verified: 1202 events, every link intact"
    numbers = [int(line.split()[0]) for line in out[2:-1]]  # title, header, rows, verdict
    assert numbers == list(range(1, 1203))
    with sqlite3.connect(tmp_path / "keelgate.db") as db:
        db.execute("UPDATE keelgate_audit SET actor = 'mallory' WHERE seq = 601")
    assert main(audit_cli(url, "--verify", "-o", "json")) == 1
    streamed = capsys.readouterr().out.splitlines()[-1]
    stores = open_existing(url)
    try:
        whole = verify(TENANT, RUN, stores.audit.events(TENANT, RUN))
    finally:
        stores.close()
    assert not whole.ok and len(whole.problems) == 1 and "event 601" in whole.problems[0]
    assert f'"problems":["{whole.problems[0]}"]' in streamed
    assert main(audit_cli(url, "--verify")) == 1
    broken = [line for line in capsys.readouterr().out.splitlines() if "BROKEN" in line]
    assert broken == [f"chain BROKEN: run {RUN!r}: {whole.problems[0]}"]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_an_audit_event_whose_stored_data_is_not_json_is_a_one_line_verification_failure(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """An audit event whose stored data was overwritten with text that is not JSON makes
    `audit --verify` exit 1 with one line naming the run and the event's number (no
    traceback), and the chain after it is still checked: an event edited further on is named
    too. Without --verify, `audit` says in one line which event cannot be read, exit 1."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'keelgate.db'}"
        store: Any = SQLiteStore(tmp_path / "keelgate.db")
    else:
        from keelgate.stores.postgres import PostgresStore

        url = request.getfixturevalue("pg_url")
        store = PostgresStore(url)
    try:
        drive(store, 3, {})
    finally:
        store.close()
    edits = (
        "UPDATE keelgate_audit SET data = '{\"forged\": ' WHERE seq = 5",
        "UPDATE keelgate_audit SET actor = 'mallory' WHERE seq = 9",
    )
    if backend == "sqlite":
        with sqlite3.connect(tmp_path / "keelgate.db") as db:
            for edit in edits:
                db.execute(edit)
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            for edit in edits:
                pg.execute(edit)
    capsys.readouterr()
    assert main(audit_cli(url, "--verify")) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    broken = [line for line in captured.out.splitlines() if "BROKEN" in line]
    assert broken == [
        f"chain BROKEN: run {RUN!r}: event 5 (loop.verified) was altered: "
        "its data is not a JSON object",
        f"chain BROKEN: run {RUN!r}: event 9 (loop.verified) was altered",
    ]
    assert main(audit_cli(url)) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    (line,) = captured.err.strip().splitlines()
    assert f"audit event 5 (loop.verified) of run {RUN!r} cannot be read" in line


def test_a_run_asking_approval_at_every_write_keeps_its_checkpoint_bounded(tmp_path: Path) -> None:
    """A run whose every WRITE needs a person's approval, approved 45 times, runs each WRITE
    exactly once, after its approval; its checkpoint keeps the decisions of the last
    HISTORY_WINDOW iterations only (it does not grow with the run), every decision stays on the
    audit chain, and a decision dropped from the checkpoint cannot be made again."""
    from keelgate.core.state import HISTORY_WINDOW
    from keelgate.core.types import StopReason
    from keelgate.errors import SettleError

    calls: list[str | None] = []

    def write(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        calls.append(idempotency_key)
        return {"ok": True}

    tool = PythonTool("write", write, SideEffect.WRITE, requires_approval=True)
    store = SQLiteStore(tmp_path / "keelgate.db")
    try:
        loop = Loop(stores=Stores.of(store), model=MarkingModel({}), tools=[tool])
        spec = LoopSpec(TENANT, RUN, "approve all", budget=Budget(max_iterations=45))
        sizes = {}
        while True:
            outcome = loop.run_or_resume(spec)
            if outcome.stop is None or outcome.stop.reason is not StopReason.AWAITING_APPROVAL:
                break
            (waiting,) = outcome.pending_approvals
            assert len(calls) == outcome.iteration - 1  # nothing ran before its approval
            loop.approve(TENANT, RUN, waiting.action, approved=True, by="alice")
            saved = store.load(TENANT, RUN)
            assert saved is not None
            sizes[outcome.iteration] = len(saved.state["approvals"])
        assert outcome.stop is not None and outcome.stop.reason is StopReason.MAX_ITERATIONS
        assert len(calls) == 45 and len(set(calls)) == 45  # each WRITE once, none twice
        assert max(sizes.values()) == HISTORY_WINDOW + 1
        assert sizes[45] == sizes[30] == HISTORY_WINDOW + 1
        approved = [e for e in store.events(TENANT, RUN) if e.type == "loop.approved"]
        assert len(approved) == 45
        with pytest.raises(SettleError):
            loop.approve(TENANT, RUN, "1:0", approved=False, by="mallory")
    finally:
        store.close()
