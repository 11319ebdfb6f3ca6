"""The stores the benchmark runs on: SQLite (a file of its own) and PostgreSQL (a server of its
own, fsync on), each with its loop store, its baseline session and its commit counters.

Why it exists: both sides of a round must meet the same disk or server with the same settings.
It must never weaken durability to look fast: each store keeps its defaults, the baseline gets
exactly the same, and a PostgreSQL server that does not flush every commit is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from commitbench.loop import Payload
from commitbench.raw import PostgresRaw, RawSession, SQLiteRaw, sqlite_commit_counter
from keelgate.testing.pgserver import PostgresUnavailable, start_postgres


class Backend(Protocol):
    name: str
    settings: str

    def open_store(self) -> Any: ...

    def raw(self, payload: Payload) -> RawSession: ...

    def commit_counter(self, store: Any) -> Callable[[], int]: ...

    def written_counter(self, store: Any) -> tuple[str, Callable[[], int]]: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def flushing_postgres() -> Iterator[Any]:
    """A throw-away PostgreSQL server that flushes every commit, stopped on the way out.

    Every bench that compares commits starts its server here, so none of them can measure a
    server that skips its flushes; a missing driver or server ends the bench in one line.
    """
    try:
        import psycopg  # noqa: F401  (the postgres extra)
    except ImportError:
        raise SystemExit("bench: PostgreSQL needs the postgres extra (psycopg)") from None
    try:
        server = start_postgres(fsync=True)
    except PostgresUnavailable as error:
        raise SystemExit(f"bench: no PostgreSQL server: {error}") from None
    try:
        yield server
    finally:
        server.stop()


def process_bytes_written() -> int:
    """Bytes this process has passed to write(2) so far (Linux /proc/self/io ``wchar``)."""
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


class SQLiteBackend:
    name = "sqlite"

    def __init__(self, workdir: Path) -> None:
        import inspect
        import sqlite3

        from keelgate.stores.sqlite import SQLiteStore

        self.path = workdir / "keelgate.db"
        self.store_class = SQLiteStore
        default = inspect.signature(SQLiteStore.__init__).parameters["synchronous"].default
        self.synchronous = str(default)
        self.settings = (
            f"SQLite {sqlite3.sqlite_version}, journal_mode=WAL, synchronous={self.synchronous} "
            f"(SQLiteStore's default), file {self.path}"
        )
        self.stores: list[Any] = []

    def open_store(self) -> Any:
        store = self.store_class(self.path)
        self.stores.append(store)
        return store

    def raw(self, payload: Payload) -> SQLiteRaw:
        return SQLiteRaw(self.path, self.synchronous, payload)

    def commit_counter(self, store: Any) -> Callable[[], int]:
        # The store's one connection: reached into on purpose, to count what it really does.
        return sqlite_commit_counter(store._db)

    def written_counter(self, store: Any) -> tuple[str, Callable[[], int]]:
        return "bytes written by the process (write(2))", process_bytes_written

    def close(self) -> None:
        for store in self.stores:
            store.close()


class PostgresBackend:
    """A PostgreSQL server of our own (fsync on), one database for the loop and the baseline."""

    name = "postgres"

    def __init__(self, server: Any) -> None:
        import psycopg

        from keelgate.stores.postgres import PostgresStore

        self.server = server
        self.url: str = server.create_database("keelgate_bench")
        self.store_class = PostgresStore
        # Reads only: a transaction that reads is given no transaction id and flushes nothing.
        self.monitor = psycopg.connect(self.url, autocommit=True)
        shown = {
            name: self._show(name)
            for name in ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")
        }
        version = self._show("server_version")
        self.settings = f"PostgreSQL {version}, " + ", ".join(f"{k}={v}" for k, v in shown.items())
        if shown["fsync"] != "on" or shown["synchronous_commit"] != "on":
            raise SystemExit(f"bench: the server must flush every commit ({self.settings})")
        self.settings += ", loopback TCP, a server of its own"
        self.stores: list[Any] = []

    def _show(self, name: str) -> str:
        row = self.monitor.execute(f"SHOW {name}").fetchone()
        return str(row[0]) if row else "?"

    @classmethod
    @contextlib.contextmanager
    def started(cls) -> Iterator[PostgresBackend]:
        with flushing_postgres() as server:
            yield cls(server)

    def open_store(self) -> Any:
        store = self.store_class(self.url)
        self.stores.append(store)
        return store

    def xids(self) -> int:
        """Transaction ids the server has handed out: one per transaction that wrote."""
        row = self.monitor.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def wal_bytes(self) -> int:
        row = self.monitor.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def raw(self, payload: Payload) -> PostgresRaw:
        return PostgresRaw(self.url, payload, self.xids)

    def commit_counter(self, store: Any) -> Callable[[], int]:
        return self.xids

    def written_counter(self, store: Any) -> tuple[str, Callable[[], int]]:
        return "WAL bytes the server wrote", self.wal_bytes

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.stores.clear()
        self.monitor.close()


@contextlib.contextmanager
def opened(names: Sequence[str], workdir: Path) -> Iterator[list[Backend]]:
    opened: list[Backend] = []
    with contextlib.ExitStack() as stack:
        for name in names:
            if name == "sqlite":
                opened.append(SQLiteBackend(workdir / "sqlite"))
                (workdir / "sqlite").mkdir()
            elif name == "postgres":
                opened.append(stack.enter_context(PostgresBackend.started()))
        yield opened
