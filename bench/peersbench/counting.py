"""Counting what a system makes durable: commits and stored bytes, the same way for every system.

Why it exists: the peers open their own database connections (DBOS through SQLAlchemy, LangGraph
through sqlite3, aiosqlite or psycopg), which the benchmark cannot ask for commits. So it counts
from below, uniformly:

* SQLite: every ``sqlite3`` connection the process opens is made with a connection class that
  traces the statements SQLite runs (``set_trace_callback``), while ``install_sqlite_counter`` is
  in force. A transaction that wrote (INSERT, UPDATE, DELETE, REPLACE or DDL between BEGIN and
  COMMIT, or such a statement on its own outside a transaction) is one durable commit; a
  transaction that only read is none. Counts are kept per database file, so each system, with a
  file of its own, is counted alone even while another's background threads run.
* PostgreSQL: the transaction ids the server handed out (only a transaction that writes gets
  one), read on an otherwise idle server; per-iteration figures are medians, so a rare autovacuum
  does not count.
* Stored bytes: SQLite pages in use (page_count - freelist_count, times page_size, read through a
  fresh connection that sees the WAL); PostgreSQL ``pg_total_relation_size`` (heap, indexes,
  TOAST) of every table of the system's own database.

It must never change what a system does: it only observes statements and sizes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER"})

_lock = threading.Lock()
_commits: Counter[str] = Counter()
_original_connect = sqlite3.connect


def _key(database: Any) -> str:
    text = os.fspath(database) if isinstance(database, (str, os.PathLike)) else str(database)
    if text.startswith("file:"):
        text = text[5:].split("?", 1)[0]
    return os.path.realpath(text) if text != ":memory:" else text


class CountingConnection(sqlite3.Connection):
    """A sqlite3 connection that counts its durable commits (transactions that wrote)."""

    def __init__(self, database: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(database, *args, **kwargs)
        self._counted_as = _key(database)
        self._open = False  # inside BEGIN ... COMMIT/ROLLBACK, as SQLite ran them
        self._dirty = False  # that transaction has written
        self._savepoints = 0  # depth, when a SAVEPOINT opened the transaction
        self.set_trace_callback(self._trace)

    def _trace(self, sql: str) -> None:
        words = sql.lstrip().split(None, 2)
        if not words:
            return
        word = words[0].upper()
        if word == "BEGIN":
            self._open, self._dirty, self._savepoints = True, False, 0
        elif word == "SAVEPOINT":
            if not self._open:  # a savepoint outside a transaction opens one
                self._open, self._dirty, self._savepoints = True, False, 1
            elif self._savepoints:
                self._savepoints += 1
        elif word == "RELEASE" and self._savepoints:
            self._savepoints -= 1
            if not self._savepoints:  # the outermost savepoint released: the commit
                self._end(commit=True)
        elif word in ("COMMIT", "END"):
            self._end(commit=True)
        elif word == "ROLLBACK" and not (len(words) > 1 and words[1].upper() == "TO"):
            self._end(commit=False)
        elif word in WRITES:
            if self._open:
                self._dirty = True
            else:
                self._count()  # autocommit: the statement is its own transaction

    def _end(self, *, commit: bool) -> None:
        if commit and self._open and self._dirty:
            self._count()
        self._open = self._dirty = False
        self._savepoints = 0

    def _count(self) -> None:
        with _lock:
            _commits[self._counted_as] += 1


def _counting_connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
    if len(args) < 5 and "factory" not in kwargs:  # factory is connect's 6th parameter
        kwargs["factory"] = CountingConnection
    connection: sqlite3.Connection = _original_connect(database, *args, **kwargs)
    return connection


@contextlib.contextmanager
def install_sqlite_counter() -> Iterator[None]:
    """Count the commits of every sqlite3 connection opened while this is in force."""
    sqlite3.connect = _counting_connect  # type: ignore[assignment]
    sqlite3.dbapi2.connect = _counting_connect  # type: ignore[assignment]  # SQLAlchemy's path
    try:
        yield
    finally:
        sqlite3.connect = _original_connect
        sqlite3.dbapi2.connect = _original_connect


def sqlite_commits(path: Any) -> Callable[[], int]:
    """Commits counted so far on the database file ``path``."""
    key = _key(path)
    return lambda: _commits[key]


def sqlite_stored_bytes(path: Any) -> int:
    """Bytes of the pages in use in ``path`` (committed WAL content included)."""
    db = _original_connect(path, timeout=30.0)
    try:
        (page_count,) = db.execute("PRAGMA page_count").fetchone()
        (free,) = db.execute("PRAGMA freelist_count").fetchone()
        (size,) = db.execute("PRAGMA page_size").fetchone()
        return int((page_count - free) * size)
    finally:
        db.close()


def postgres_xids(monitor: Any) -> Callable[[], int]:
    """Transaction ids the server has handed out so far (one per transaction that wrote).

    ``monitor`` is an autocommit psycopg connection that only reads: it takes no id itself.
    """

    def xids() -> int:
        row = monitor.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        ).fetchone()
        return int(row[0])

    return xids


TABLE_BYTES = (
    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind IN ('r', 'm', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
    "AND n.nspname NOT LIKE 'pg_toast%'"
)


def postgres_stored_bytes(url: str) -> int:
    """Bytes of every table of the database at ``url`` (heap, indexes, TOAST)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(TABLE_BYTES).fetchone()
        assert row is not None
        return int(row[0])
