"""The peers bench counts right: what ``bench/peers.py`` prints as durable commits per iteration
and as side effects after a crash is what really happened.

Why it exists: the bench compares Keelgate with DBOS Transact and LangGraph by counting from
below (statements SQLite runs on each file, transaction ids a PostgreSQL server hands out), so
the counters are proven here on transactions whose number is known, then on Keelgate's own
iteration (4 commits with one WRITE, the figure docs/design.md argues for) and its crash check
(one side effect, OUTCOME_UNKNOWN). None of that needs the peers: it runs without the ``bench``
extra. The tests that drive a peer are skipped, saying so, when the extra is not installed.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from peersbench.counting import (  # noqa: E402
    install_sqlite_counter,
    postgres_stored_bytes,
    postgres_xids,
    sqlite_commits,
    sqlite_stored_bytes,
)
from peersbench.crash import check  # noqa: E402
from peersbench.keelgate_peer import KeelgatePeer  # noqa: E402
from peersbench.places import Database, SQLitePlace  # noqa: E402


def _peers_installed() -> bool:
    try:
        import dbos  # noqa: F401
        import langgraph.graph  # noqa: F401
    except ImportError:
        return False
    return True


PEERS = _peers_installed()
needs_peers = pytest.mark.skipif(
    not PEERS, reason="the bench extra (dbos, langgraph) is not installed: `make bench-peers`"
)


@pytest.fixture
def counting() -> Iterator[None]:
    with install_sqlite_counter():
        yield


def _sqlite(path: Path) -> Database:
    return Database("sqlite", str(path), sqlite_commits(path), lambda: sqlite_stored_bytes(path))


@pytest.fixture
def pg_database(pg_url: str) -> Iterator[Database]:
    with psycopg.connect(pg_url, autocommit=True) as monitor:
        yield Database(
            "postgres", pg_url, postgres_xids(monitor), lambda: postgres_stored_bytes(pg_url)
        )


def _per_iteration(peer: object, database: Database, iterations: int = 8) -> list[int]:
    marks: list[int] = []
    peer.run("counted", iterations + 1, lambda: marks.append(database.commits()))  # type: ignore[attr-defined]
    return [b - a for a, b in itertools.pairwise(marks)]


def test_sqlite_counter_counts_each_transaction_that_wrote_and_no_other(
    counting: None, tmp_path: Path
) -> None:
    """A commit is counted for every transaction that wrote, however it was opened (Python's
    implicit BEGIN, an explicit BEGIN, a lone statement, a savepoint), and none for reads or
    rolled-back work; another file's commits are not counted."""
    path = tmp_path / "a.db"
    commits = sqlite_commits(path)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x INTEGER)")  # DDL outside a transaction: 1
    for n in range(5):  # implicit BEGIN ... COMMIT: 5
        db.execute("INSERT INTO t VALUES (?)", (n,))
        db.commit()
    db.execute("SELECT count(*) FROM t").fetchone()
    db.commit()  # a read: 0
    db.execute("INSERT INTO t VALUES (9)")
    db.rollback()  # rolled back: 0
    db.isolation_level = None
    db.execute("BEGIN IMMEDIATE")
    db.executemany("INSERT INTO t VALUES (?)", [(1,), (2,), (3,)])
    db.execute("COMMIT")  # three rows, one transaction: 1
    db.execute("UPDATE t SET x = x + 1")  # a lone statement: 1
    db.execute("SAVEPOINT s")
    db.execute("DELETE FROM t WHERE x = 1")
    db.execute("RELEASE s")  # a savepoint's transaction: 1
    other = sqlite3.connect(tmp_path / "b.db")
    other.execute("CREATE TABLE u (y)")
    other.close()
    db.close()
    assert commits() == 9


@pytest.mark.postgres
def test_postgres_counter_counts_each_transaction_that_wrote_and_no_other(
    pg_database: Database,
) -> None:
    """On PostgreSQL each transaction that wrote takes one transaction id and a read takes none,
    so N write transactions count N. The count is server-wide, so an autovacuum could add one:
    the fewest of three attempts is the figure (a counter that counted reads, or missed a
    commit, would be off in all three)."""
    with psycopg.connect(pg_database.target, autocommit=True) as db:
        db.execute("CREATE TABLE t (x integer)")
        counted = []
        for _ in range(3):
            before = pg_database.commits()
            for n in range(7):
                db.execute("INSERT INTO t VALUES (%s)", (n,))
            with db.transaction():
                db.execute("INSERT INTO t VALUES (100)")
                db.execute("UPDATE t SET x = x + 1")
            for _ in range(5):
                db.execute("SELECT count(*) FROM t").fetchone()
            counted.append(pg_database.commits() - before)
        assert min(counted) == 8, counted
        assert pg_database.stored_bytes() > 0


def test_keelgate_iteration_counts_four_commits_on_sqlite(counting: None, tmp_path: Path) -> None:
    """Through the bench's counter, a Keelgate iteration with one WRITE is 4 durable commits on
    SQLite (write-ahead plan; claim; completion with action and observe; verify), and its WRITE's
    side effect happens once per iteration."""
    database = _sqlite(tmp_path / "keelgate.db")
    peer = KeelgatePeer(database)
    try:
        assert set(_per_iteration(peer, database)) == {4}
        assert peer.effects == 9
    finally:
        peer.close()


@pytest.mark.postgres
def test_keelgate_iteration_counts_four_commits_on_postgres(pg_database: Database) -> None:
    """The same on PostgreSQL, counted by transaction ids (the median: the server is shared with
    autovacuum)."""
    peer = KeelgatePeer(pg_database)
    try:
        counts = sorted(_per_iteration(peer, pg_database))
        assert counts[len(counts) // 2] == 4
    finally:
        peer.close()


def test_crash_check_shows_keelgate_writes_once_and_stops_unknown(tmp_path: Path) -> None:
    """Killed inside the WRITE after its side effect, then resumed in a new process, Keelgate does
    not run the WRITE again: one side effect, and the run stops with outcome_unknown."""
    (result,) = check(SQLitePlace(tmp_path / "sqlite"), tmp_path, ("keelgate",))
    assert result.effects == 1
    assert result.outcome.startswith("stopped: outcome_unknown")


@needs_peers
def test_peers_commits_per_iteration_on_sqlite(counting: None, tmp_path: Path) -> None:
    """The peers' figures come from the same counter: DBOS records each of its three steps in
    its own commit; LangGraph's saver commits a node's writes and then its checkpoint, for each
    of the three nodes. DBOS's background jobs commit now and then on the same file (they mark
    workflows enqueued or cancelled), so its figure, like the bench's, is the median, and no
    iteration has fewer than its three."""
    from peersbench.dbos_peer import DbosPeer
    from peersbench.langgraph_peer import LangGraphAsync, LangGraphSync

    expected = {DbosPeer: 3, LangGraphSync: 6, LangGraphAsync: 6}
    for kind, commits in expected.items():
        database = _sqlite(tmp_path / f"{kind.__name__}.db")
        peer = kind(database)
        try:
            counts = sorted(_per_iteration(peer, database))
            assert (counts[0], counts[len(counts) // 2]) == (commits, commits), kind.__name__
        finally:
            peer.close()


@needs_peers
def test_crash_check_shows_the_peers_run_the_write_again(tmp_path: Path) -> None:
    """Killed at the same point, DBOS and LangGraph re-run the step or node on recovery: the
    side effect happens twice and the run finishes as if nothing had happened."""
    results = check(SQLitePlace(tmp_path / "sqlite"), tmp_path, ("dbos", "langgraph sync"))
    assert [r.effects for r in results] == [2, 2], json.dumps([r.outcome for r in results])
