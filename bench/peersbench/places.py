"""Where the systems store: one SQLite directory (one disk) and one PostgreSQL server (fsync on).

Why it exists: the comparison is only fair if every system meets the same disk and the same
server with durable settings. Each system gets a database of its own there (a file, or a
database on the server), so that its commits and bytes can be counted alone. It must never
weaken durability: a server that does not flush every commit is refused.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commitbench.backends import flushing_postgres, process_bytes_written
from peersbench.counting import (
    postgres_stored_bytes,
    postgres_xids,
    sqlite_commits,
    sqlite_stored_bytes,
)


@dataclass(frozen=True)
class Database:
    """One system's database: how to reach it, count its commits and size it."""

    store: str  # "sqlite" or "postgres"
    target: str  # a file path (SQLite) or a URL (PostgreSQL)
    commits: Callable[[], int]
    stored_bytes: Callable[[], int]
    # Bytes that reached the storage layer so far: this process's write(2) bytes (SQLite), the
    # WAL the server generated (PostgreSQL). Not per database: read only while one system runs.
    written: Callable[[], int] = lambda: 0


class SQLitePlace:
    name = "sqlite"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.settings = (
            f"SQLite {sqlite3.sqlite_version}, each system's own file in {directory} "
            "(one disk), each with its own defaults"
        )

    def database(self, name: str) -> Database:
        path = self.directory / f"{name}.db"
        return Database(
            "sqlite",
            str(path),
            sqlite_commits(path),
            lambda: sqlite_stored_bytes(path),
            process_bytes_written,
        )

    def close(self) -> None:
        pass


class PostgresPlace:
    """A PostgreSQL server of our own (fsync on); each system gets a database on it."""

    name = "postgres"

    def __init__(self, server: Any) -> None:
        import psycopg

        self.server = server
        self.monitor = psycopg.connect(server.database_url("postgres"), autocommit=True)
        shown = {
            name: self._show(name)
            for name in ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")
        }
        self.version = self._show("server_version")
        self.settings = (
            f"PostgreSQL {self.version}, "
            + ", ".join(f"{k}={v}" for k, v in shown.items())
            + ", loopback TCP, a server of its own, each system its own database"
        )
        if shown["fsync"] != "on" or shown["synchronous_commit"] != "on":
            raise SystemExit(f"bench: the server must flush every commit ({self.settings})")
        self.xids = postgres_xids(self.monitor)

    def _show(self, name: str) -> str:
        row = self.monitor.execute(f"SHOW {name}").fetchone()
        return str(row[0]) if row else "?"

    def database(self, name: str) -> Database:
        url: str = self.server.create_database(name)
        return Database(
            "postgres", url, self.xids, lambda: postgres_stored_bytes(url), self.wal_bytes
        )

    def wal_bytes(self) -> int:
        row = self.monitor.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        self.monitor.close()


Place = SQLitePlace | PostgresPlace


@contextlib.contextmanager
def started_postgres() -> Iterator[PostgresPlace]:
    with flushing_postgres() as server:
        place = PostgresPlace(server)
        try:
            yield place
        finally:
            place.close()
