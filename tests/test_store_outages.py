"""A store hiccup pages nobody: restarts, ended sessions, lost acknowledgements, locked files.

Why it exists: a PostgreSQL restart or failover, a session the server ended while idle, or a
commit whose acknowledgement never arrived must not leave a WRITE that succeeded in flight (a
person would be paged to settle what the process knew had happened), must not fail a run once
for nothing, and must not make a repeat of the same write count twice. SQLite waits for another
process's lock and then says so. These tests use a PostgreSQL server of their own, which they
restart, crash and tune, and count every effect. SQLite's commit of a WRITE's result rides out a
full disk (SQLite's own size limit, as a full disk answers) and a lock held past its busy timeout,
and a long-lived process never calls its own key "in flight in another live process".
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.cli import main
from keelgate.core.audit import AuditDraft
from keelgate.core.loop import Loop
from keelgate.core.protocols import Completion, Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyState, SideEffect, StopReason, idempotency_key
from keelgate.errors import StoreUnavailable
from keelgate.stores import open_stores, sqlite
from keelgate.stores.postgres import PostgresStore
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing.pgserver import PgServer, start_postgres


@pytest.fixture(scope="module")
def own_server() -> Iterator[PgServer]:
    """A PostgreSQL server of this module's own: these tests restart and crash it."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def url(own_server: PgServer) -> Iterator[str]:
    made = own_server.create_database()
    try:
        yield made
    finally:
        own_server.drop_database(made.rsplit("/", 1)[1])


def _end_sessions(url: str) -> int:
    """End every other session on the database, as a restart or pg_terminate_backend does."""
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


class Ledger:
    """The system of record: every effect a WRITE had, by idempotency key."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.lock = threading.Lock()

    def tool(self, name: str, *, pause: float = 0.0, after: Any = None) -> PythonTool:
        def write(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
            assert idempotency_key is not None
            if pause:
                time.sleep(pause)
            with self.lock:
                self.effects[idempotency_key] += 1
            if after is not None:
                after()
            return {"done": args}

        return PythonTool(name, write, SideEffect.WRITE)


def _orders(n: int) -> list[dict[str, Any]]:
    plans: list[dict[str, Any]] = [
        {"actions": [{"tool": "order", "args": {"item": i}}]} for i in range(n)
    ]
    return [*plans, {"done": True, "answer": "ordered"}]


def test_a_write_whose_completion_meets_ended_sessions_is_recorded_not_paged(url: str) -> None:
    """The order succeeds, and every session of the store is ended before its completion is
    committed (a restart's effect): the completion is made again on a fresh session, the run
    goes on to goal_met, nobody is paged, and the order counts once."""
    ledger = Ledger()
    tool = ledger.tool("order", after=lambda: _end_sessions(url))
    stores = open_stores(url, pooled=False)
    try:
        loop = Loop(stores=stores, model=ScriptedModel(_orders(2)), tools=[tool])
        done = loop.run_or_resume(LoopSpec("shop", "r", "order", budget=Budget(max_iterations=5)))
        assert done.stop.reason is StopReason.GOAL_MET, done.to_json()
        assert sorted(ledger.effects.values()) == [1, 1]
        for key in ledger.effects:
            record = stores.idempotency.get("shop", key)
            assert record is not None and record.state is KeyState.COMPLETED
    finally:
        stores.close()


def test_a_run_after_the_server_ended_its_idle_sessions_does_not_fail(url: str) -> None:
    """A long-lived process (an operator, a CLI between commands) whose sessions the server
    ended while it was idle (idle_session_timeout, pg_terminate_backend, a restart) drives its
    next run at once: the ended owner session is replaced before use, not found out by a
    failing statement."""
    stores = open_stores(url)  # pooled, as an operator's
    ledger = Ledger()
    try:
        loop = Loop(stores=stores, model=ScriptedModel(_orders(1)), tools=[ledger.tool("order")])
        assert _end_sessions(url) >= 2
        time.sleep(0.2)  # the server's goodbye reaches the sockets
        done = loop.run_or_resume(LoopSpec("shop", "r", "order"))
        assert done.stop.reason is StopReason.GOAL_MET
        assert list(ledger.effects.values()) == [1]
    finally:
        stores.close()


def test_a_server_with_idle_session_timeout_pages_nobody(own_server: PgServer, url: str) -> None:
    """With no fault injected at all, on a server that ends idle sessions after 1 s, a pooled
    store left idle between runs drives every run to goal_met, each WRITE once."""
    with psycopg.connect(url, autocommit=True) as admin:
        name = url.rsplit("/", 1)[1]
        admin.execute(f'ALTER DATABASE "{name}" SET idle_session_timeout = 1000')
    stores = open_stores(url)
    ledger = Ledger()
    try:
        for n in range(3):
            loop = Loop(
                stores=stores, model=ScriptedModel(_orders(1)), tools=[ledger.tool("order")]
            )
            time.sleep(1.5)  # idle past the server's timeout
            done = loop.run_or_resume(LoopSpec("shop", f"r{n}", "order"))
            assert done.stop.reason is StopReason.GOAL_MET, done.to_json()
        assert sorted(ledger.effects.values()) == [1, 1, 1]
    finally:
        stores.close()


def test_postgres_restarted_at_random_moments_in_fifty_runs_pages_nobody(
    own_server: PgServer, url: str
) -> None:
    """50 runs with two WRITEs each, driven one after another by a worker, while PostgreSQL is
    restarted (fast shutdown, then started again) at random moments: every run meets its goal,
    none stops with outcome_unknown, every WRITE took effect exactly once, and each run's audit
    chain verifies."""
    ledger = Ledger()
    tool = ledger.tool("order", pause=0.02)
    outcomes: list[Any] = []
    errors: list[BaseException] = []

    reopened = Counter[str]()

    def step(n: int) -> Any:
        """What a step pod does: open the store, drive the run, close. A store that cannot
        be opened (the server is down) ends the pod with exit 5, and the operator starts it
        again: nothing was read or written."""
        while True:
            try:
                stores = open_stores(url, pooled=False)
            except StoreUnavailable:
                reopened["open"] += 1
                time.sleep(0.2)
                continue
            try:
                loop = Loop(stores=stores, model=ScriptedModel(_orders(2)), tools=[tool])
                spec = LoopSpec("shop", f"run-{n}", "order", budget=Budget(max_iterations=5))
                return loop.run_or_resume(spec)
            finally:
                stores.close()

    def drive() -> None:
        try:
            for n in range(50):
                outcomes.append(step(n))
        except BaseException as error:  # reported below, with the restarts stopped
            errors.append(error)

    chance = random.Random(23)
    worker = threading.Thread(target=drive)
    worker.start()
    restarts = 0
    # Restarted from this thread: the server dies with the thread that starts it.
    while worker.is_alive():
        time.sleep(chance.uniform(0.1, 0.6))
        if worker.is_alive():
            own_server.restart(down_for=chance.uniform(0.0, 0.3))
            restarts += 1
    worker.join()
    assert not errors, errors
    assert restarts >= 5
    reasons = Counter(o.stop.reason.value for o in outcomes)
    assert reasons == {"goal_met": 50}, reasons
    expected = {
        idempotency_key("shop", f"run-{n}", "order", {"item": i}) for n in range(50) for i in (0, 1)
    }
    assert set(ledger.effects) == expected
    assert set(ledger.effects.values()) == {1}
    stores = open_stores(url)
    try:
        for n in range(50):
            assert Loop(stores=stores).verify_audit("shop", f"run-{n}").ok
    finally:
        stores.close()


class LosesAcknowledgements(PostgresStore):
    """A store whose next write commits and then, before the answer arrives, loses its session
    (the server's answer never comes): the write landed, the store does not know it."""

    def __init__(self, url: str) -> None:
        super().__init__(url, pooled=False)
        self.lose = 0

    def _one_statement(self, conn: Any, sql: str, params: Sequence[Any]) -> Any:
        row = super()._one_statement(conn, sql, params)
        return self._maybe_lose(conn, row)

    def _maybe_lose(self, conn: Any, result: Any) -> Any:
        if self.lose:
            self.lose -= 1
            conn.close()  # the answer is lost with the session
            raise StoreUnavailable("PostgreSQL store: the server closed the connection")
        return result


def test_writes_whose_acknowledgement_was_lost_are_recognised_when_repeated(url: str) -> None:
    """A claim, a checkpoint with its completion and a settlement each commit and lose their
    answer: repeated on a fresh session, each recognises its own write. The claim is still
    ours and live (no outcome_unknown), the completion is not mistaken for someone else's
    settlement, the settlement is not refused as settled by someone else, and nothing is
    written twice."""
    store = LosesAcknowledgements(url)
    judge = open_stores(url, pooled=False)
    try:
        stores = Stores.of(store)
        draft = AuditDraft("loop.action_started", {"action": "1:0"}, key="started:1")
        stores.audit.append("shop", "r", [AuditDraft("loop.started", {}, key="started")])
        store.lose = 1
        assert store.claim("shop", "kg-1", run="r", action="1:0", tool="t", event=draft) is None
        live = judge.idempotency.get("shop", "kg-1")
        assert live is not None and live.state is KeyState.IN_FLIGHT  # not unknown
        store.lose = 1
        missed = store.save_completing(
            "shop",
            "r",
            1,
            {"n": 1},
            [AuditDraft("loop.action_completed", {"action": "1:0"}, key="completed:1")],
            [Completion("kg-1", {"status": "ok"})],
        )
        assert missed == ()
        done = judge.idempotency.get("shop", "kg-1")
        assert done is not None and done.state is KeyState.COMPLETED and not done.source
        checkpoint = judge.checkpoints.load("shop", "r")
        assert checkpoint is not None and checkpoint.seq == 1
        assert Loop(stores=judge).verify_audit("shop", "r").ok
        keys = [e.key for e in judge.audit.events("shop", "r")]
        assert keys == ["started", "started:1", "completed:1"]
    finally:
        store.close()
        judge.close()


def test_every_session_commits_synchronously_whatever_the_server_says(tmp_path: Path) -> None:
    """On a server tuned with synchronous_commit = off, the store's sessions (owner and pool)
    commit synchronously; crashed right after (immediate shutdown: nothing flushed), the server
    comes back with every commit the store was told had landed."""
    server = start_postgres(settings={"synchronous_commit": "off", "wal_writer_delay": "10000"})
    try:
        url = server.create_database()
        store = PostgresStore(url)
        try:
            with store._statement() as conn:
                assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
            for n in range(40):
                assert store.claim("shop", f"kg-{n}", run="r", action=f"{n}:0", tool="t") is None
                assert store.complete("shop", f"kg-{n}", {"n": n})
        finally:
            store.close()
        server.restart(crash=True)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM keelgate_keys WHERE state = 'completed'"
            ).fetchone()
        assert row == (40,)
    finally:
        server.stop()


def test_a_sqlite_store_locked_past_its_wait_is_a_clear_exit_5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another process holds the SQLite file's write lock past the busy timeout: `run`,
    `resume` and `reconcile` of a run stopped with an unknown outcome end with exit 5 and one
    line naming the lock, never an internal error, and nothing is written: once the lock is
    gone, the same reconcile settles it."""
    import sqlite3

    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT", 0.3)
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "support_tools"))
    monkeypatch.setenv("KG_RUNNER_LEDGER", str(tmp_path / "ledger.jsonl"))
    db = tmp_path / "kg.db"
    store = f"sqlite:///{db}"
    manifest = tmp_path / "run.yaml"
    manifest.write_text(
        "apiVersion: keelgate.dev/v1alpha1\nkind: AgentRun\n"
        "metadata: {name: r, namespace: shop}\n"
        "spec:\n  goal: g\n  model: {provider: scripted, name: demo, script: "
        "[{actions: [{tool: w, args: {n: 1}}]}, {done: true}]}\n"
        "  tools: [{name: w, sideEffect: WRITE,\n"
        "           python: {callable: 'kg_runner_tools:lost_write'}}]\n"
    )
    assert main(["run", "-f", str(manifest), "--store", store]) == 3  # outcome_unknown
    capsys.readouterr()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    reconcile = ["reconcile", "r", "1:0", "--executed", "--by", "al", "--store", store]
    try:
        for argv in (
            ["run", "-f", str(manifest), "--store", store],
            ["resume", "r", "--store", store],
            reconcile,
        ):
            assert main(argv) == 5, argv
            err = capsys.readouterr().err
            assert "locked by another process" in err and "internal error" not in err, err
            assert len(err.strip().splitlines()) == 1, err
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    stores = open_stores(store)
    try:
        record = stores.idempotency.get("shop", idempotency_key("shop", "r", "w", {"n": 1}))
        assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    finally:
        stores.close()
    assert main(reconcile) == 0


def test_a_fresh_sqlite_file_whose_first_opener_is_mid_transaction_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process opening the same new file holds its first write transaction (as its
    migration does) while this one opens it: the open waits for it, as for any lock, and then
    opens the store (SQLite refuses the journal-mode switch under such a lock at once, without
    its busy wait: several step processes starting together on a store not made yet failed one
    open in eight); a lock held past the wait still ends in the clear "locked" refusal."""
    import sqlite3

    db = tmp_path / "kg.db"
    first = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    first.execute("BEGIN IMMEDIATE")
    threading.Timer(0.5, first.execute, ("COMMIT",)).start()
    started = time.monotonic()
    store = SQLiteStore(db)
    try:
        assert time.monotonic() - started >= 0.4
        assert store.runs() == []
    finally:
        store.close()
        first.close()
    held = sqlite3.connect(tmp_path / "held.db", isolation_level=None)
    held.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT", 0.3)
    try:
        with pytest.raises(StoreUnavailable, match=r"held\.db: database is locked"):
            SQLiteStore(tmp_path / "held.db")
    finally:
        held.close()


# SQLite: the commit that records a WRITE's result rides out a full disk or a held lock


class DiskFillsUp:
    """The SQLite file's disk fills up: SQLite's own limit on the file's size (``max_page_count``)
    is set to the pages it has, so every write that needs another page fails with SQLITE_FULL,
    exactly as on a full disk. ``free`` gives the room back."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def fill(self) -> None:
        with self.store._lock:
            pages = self.store._db.execute("PRAGMA page_count").fetchone()[0]
            self.store._db.execute(f"PRAGMA max_page_count = {pages}")

    def free(self) -> None:
        with self.store._lock:
            self.store._db.execute("PRAGMA max_page_count = 1073741823")

    def free_after(self, seconds: float) -> None:
        threading.Timer(seconds, self.free).start()


def _receipt_tool(ledger: Ledger, after: Any) -> PythonTool:
    """An order whose answer is a long receipt: recording it needs new pages in the file."""

    def order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        assert idempotency_key is not None
        with ledger.lock:
            ledger.effects[idempotency_key] += 1
        after()
        return {"receipt": "r" * 200_000}

    return PythonTool("order", order, SideEffect.WRITE)


def test_sqlite_a_write_whose_completion_meets_a_full_disk_is_recorded_not_paged(
    tmp_path: Path,
) -> None:
    """The order succeeds, and the disk is full when its result is to be committed (SQLITE_FULL)
    until half a second later: the process that holds the result repeats the commit, as a
    PostgreSQL store does, and the run goes on to goal_met, the key completed, nobody paged,
    the order counted once."""
    store = SQLiteStore(tmp_path / "kg.db")
    disk = DiskFillsUp(store)
    ledger = Ledger()

    def fill_for_a_while() -> None:
        disk.fill()
        disk.free_after(0.5)

    try:
        loop = Loop(
            stores=Stores.of(store),
            model=ScriptedModel(_orders(1)),
            tools=[_receipt_tool(ledger, fill_for_a_while)],
        )
        done = loop.run_or_resume(LoopSpec("shop", "r", "order"))
        assert done.stop.reason is StopReason.GOAL_MET, done.to_json()
        assert list(ledger.effects.values()) == [1]
        (key,) = ledger.effects
        record = store.get("shop", key)
        assert record is not None and record.state is KeyState.COMPLETED and not record.source
    finally:
        store.close()


def test_sqlite_a_write_whose_completion_meets_a_held_lock_is_recorded_not_paged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another connection holds the file's write lock past the busy timeout just as the order's
    result is to be committed (SQLITE_BUSY): the commit is repeated until the lock is gone, and
    the run meets its goal with the order counted once."""
    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT", 0.2)
    db = tmp_path / "kg.db"
    store = SQLiteStore(db)
    ledger = Ledger()
    holders: list[Any] = []

    def hold_the_lock_for_a_while() -> None:
        import sqlite3 as driver

        holder = driver.connect(db, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        holders.append(holder)

        def let_go() -> None:
            holder.execute("ROLLBACK")
            holder.close()

        threading.Timer(0.8, let_go).start()

    try:
        loop = Loop(
            stores=Stores.of(store),
            model=ScriptedModel(_orders(1)),
            tools=[_receipt_tool(ledger, hold_the_lock_for_a_while)],
        )
        done = loop.run_or_resume(LoopSpec("shop", "r", "order"))
        assert done.stop.reason is StopReason.GOAL_MET, done.to_json()
        assert holders and list(ledger.effects.values()) == [1]
    finally:
        store.close()


def test_sqlite_a_long_lived_process_that_gave_up_a_completion_settles_its_own_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk stays full past the store's patience: the run fails (the store cannot be
    written) with the order's key left in flight. The process lives on (the Python API, one
    store kept open). Once the disk is freed, its own resume stops outcome_unknown naming the
    order (never "in flight in another live process": it is this one), another process reads
    the key unknown too, the same process's reconcile settles it, and the run ends goal_met
    with the order counted once."""
    monkeypatch.setattr(SQLiteStore, "result_patience", 0.3)
    store = SQLiteStore(tmp_path / "kg.db")
    disk = DiskFillsUp(store)
    ledger = Ledger()
    spec = LoopSpec("shop", "r", "order", budget=Budget(max_iterations=5))
    try:
        loop = Loop(
            stores=Stores.of(store),
            model=ScriptedModel(_orders(1)),
            tools=[_receipt_tool(ledger, disk.fill)],
            busy_wait=0.3,
        )
        with pytest.raises(StoreUnavailable, match="cannot be written"):
            loop.run_or_resume(spec)
        disk.free()
        (key,) = ledger.effects
        stopped = loop.run_or_resume(spec)
        assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN, stopped.to_json()
        assert [u.idempotency_key for u in stopped.unknown_actions] == [key]
        other = SQLiteStore(tmp_path / "kg.db")  # another process's view of the file
        try:
            record = other.get("shop", key)
            assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
        finally:
            other.close()
        loop.reconcile("shop", "r", stopped.unknown_actions[0].action, executed=True, by="al")
        done = loop.run_or_resume(spec)
        assert done.stop.reason is StopReason.GOAL_MET, done.to_json()
        assert list(ledger.effects.values()) == [1]
    finally:
        disk.free()
        store.close()
