"""What differs between the SQL backends' text, and what a connection must offer.

Why it exists: the SQL store (``keelgate.stores._sql``) writes every statement once, with ``?``
placeholders and SQLite's types, and the migrations (``keelgate.stores._migrations``) write every
schema step once; a backend differs from SQLite only in what its ``Dialect`` says (placeholders,
column types, the store's clock, how a key's owner is judged in SQL). Apart from both, so that
neither the statements nor the migrations are where a reader learns what a backend may change.
This module holds values only: it must never run a statement or import a driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Cursor(Protocol):
    """What a statement's result must offer (sqlite3's and psycopg's cursors both do)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """A DB-API connection's ``execute`` shortcut (sqlite3 and psycopg 3 both have it)."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Cursor: ...


@dataclass(frozen=True)
class Dialect:
    """What differs in the SQL text of one backend; the statements are written with ``?``.

    The defaults are SQLite's, the default store's: its dialect is ``Dialect()``. Another
    backend overrides what differs in its SQL, and nothing else.
    """

    name: str = "sqlite"  # which backend's migrations apply (``Migration.backends``)
    placeholder: str = "?"  # what ``?`` becomes for the driver
    bigint: str = "INTEGER"  # column type of a sequence number or a generation
    owner_type: str = "TEXT"  # column type of an owner id
    real: str = "REAL"  # column type of a moment in seconds since the epoch
    # The store's own clock, in seconds since the epoch: write deadlines are set and judged on
    # it, never on a client's (SQLite: the host's, the only one sharing the file).
    clock: str = "((julianday('now') - 2440587.5) * 86400.0)"
    owner_setup: str = ""  # DDL the backend's owner liveness needs, in migration 1
    # A key is in flight under this store's owner (the parameter is ``SQLStore._owned()``).
    mine: str = "owner = ?"
    same: str = "IS"  # null-safe equality
    byte_order: str = ""  # appended to ORDER BY columns so text sorts by bytes, as Python sorts
    # The last column of a key's SELECT: the server's judgement of the owner's liveness, or
    # NULL where the backend judges it in Python (``SQLStore._alive``).
    liveness: str = "NULL"
    # The schema Keelgate's tables are in, as a quoted name (a migration's ``{schema}``), read
    # once the version table exists; SQLite has none.
    schema_name: str = ""
    schema_table_exists: str = (
        "SELECT EXISTS (SELECT 1 FROM sqlite_master "
        "WHERE type = 'table' AND name = 'keelgate_schema')"
    )
    # The backend runs several writes as one statement (data-modifying WITH), so a commit of a
    # checkpoint with its events, or of a claim with its event, is one statement and one round
    # trip instead of BEGIN, two or more statements and COMMIT (see ``SQLStore._one_statement``).
    # SQLite has no such statement, and no round trips to save.
    one_statement_writes: bool = False
