"""Storage backends, one module each, all implementing the protocols of ``keelgate.core``.

``open_stores(url)`` picks the backend from a store URL, read once (``keelgate.stores.url``):
a caller that has read it passes the ``StoreUrl`` on, and nothing here reads its text again.
Drivers are imported only when their backend is asked for, so the default (SQLite, stdlib)
needs no extra installed. No message built here quotes a URL as given (see ``url``).
"""

from __future__ import annotations

from pathlib import Path

from keelgate.core.protocols import Capabilities, Stores
from keelgate.errors import InputError, MissingExtra, StoreUnavailable
from keelgate.stores.url import DEFAULT_URL, StoreUrl, read_store_url, redacted

__all__ = ["DEFAULT_URL", "StoreUrl", "open_existing", "open_stores", "read_store_url", "redacted"]


def _needs_extra(scheme: str, extra: str, missing: ImportError) -> InputError:
    what = f"a {scheme}:// store"
    return MissingExtra.of(missing, field="--store", what=what) or MissingExtra(
        extra, field="--store", what=what, module=missing.name or ""
    )


def open_stores(
    url: str | StoreUrl = DEFAULT_URL, *, pooled: bool = True, tenant_sessions: int | None = None
) -> Stores:
    """Open the stores a URL names: ``sqlite:///PATH``, ``postgresql://...``, ``memory://``,
    or ``langgraph+sqlite:///PATH`` (checkpoints through a LangGraph saver).

    ``pooled=False`` is for a short-lived process with one thread of work (a step pod): a
    PostgreSQL store then holds one server session, not a pool beside its owner session. The
    other stores have one connection either way. The operator's role on a PostgreSQL home
    database, and the administrator's where a tenant has a database of its own, serve each such
    tenant on its database (``TenantDatabases``), keeping at most
    ``tenant_sessions`` (default ``tenant_databases.MOST_OPEN``) of their sessions open beyond
    those in use."""
    read = read_store_url(url)
    scheme = read.scheme
    if scheme == "sqlite":
        from keelgate.stores.sqlite import SQLiteStore

        store = SQLiteStore(read.path)
        return Stores.of(store)
    if read.postgres:
        try:
            from keelgate.stores.postgres import PostgresStore
        except ImportError as missing:
            raise _needs_extra(scheme, "postgres", missing) from None

        pg = PostgresStore(read, pooled=pooled)
        if pg.routes_tenants:
            # Tenants with databases of their own (`keelgate tenant add`) are served there.
            from keelgate.stores.tenant_databases import MOST_OPEN, TenantDatabases

            return Stores.of(TenantDatabases(pg, most_open=tenant_sessions or MOST_OPEN))
        return Stores.of(pg)
    if scheme == "memory":
        from keelgate.stores.memory import MemoryStore

        memory = MemoryStore()
        return Stores.of(memory)
    if scheme == "langgraph+sqlite":
        try:
            from keelgate.stores.langgraph import LangGraphCheckpointStore
        except ImportError as missing:
            raise _needs_extra(scheme, "langgraph", missing) from None
        from keelgate.stores.sqlite import SQLiteStore

        path = read.path
        companion = SQLiteStore(path)
        try:
            checkpoints = LangGraphCheckpointStore.sqlite(path + ".langgraph")
        except BaseException:
            companion.close()
            raise
        # The saver commits alone; the companion holds keys and audit in one transaction.
        together = Capabilities(
            claim_with_event=companion.capabilities.claim_with_event,
            settle_with_event=companion.capabilities.settle_with_event,
        )
        return Stores(checkpoints, companion, companion, companion, together)
    raise AssertionError(f"unhandled store kind {scheme}")  # read_store_url knows only SCHEMES


def open_existing(url: str | StoreUrl, *, read_only: bool = False) -> Stores:
    """Open a store that must exist already, creating nothing on the way: every command but a
    run reads or settles saved runs, so a mistyped path or database is an ``InputError`` for
    ``--store`` ("no store at ..."), not a new empty store, a new file or new tables.

    ``read_only``: the caller only reads (``status``, ``runs``, ``audit``), so a SQLite store on
    media that cannot be written is opened to be read (``ReadOnlySQLiteStore``) rather than
    refused; one that can be written is opened as always."""
    read = read_store_url(url)
    if read.sqlite:
        path = Path(read.path)
        _probe_sqlite(path, "keelgate_checkpoints" if read.scheme == "sqlite" else "keelgate_keys")
        if read.scheme == "langgraph+sqlite":
            _probe_sqlite(Path(f"{path}.langgraph"), "checkpoints")
        elif read_only:
            from keelgate.stores.sqlite import ReadOnlySQLiteStore, writable

            if not writable(path):
                return Stores.of(ReadOnlySQLiteStore(path))
    elif read.postgres:
        try:
            from keelgate.stores.postgres import holds_store
        except ImportError:
            pass  # open_stores names the extra to install
        else:
            holds_store(read)
    return open_stores(read)


def _probe_sqlite(path: Path, table: str) -> None:
    """Refuse a path that holds no Keelgate store, without creating or changing any file."""
    if not path.is_file():
        raise InputError("--store", f"no store at {path} (runs are saved where `run` ran)")
    # Here, not at the top: a PostgreSQL step pod never loads the SQLite library.
    import sqlite3

    from keelgate.stores.sqlite import connect_read_only, writable

    try:
        if writable(path):
            # mode=rw: open, never create; only the schema is read.
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True)
        else:  # read-only media: as the store itself will be read there
            db = connect_read_only(path.resolve())
        try:
            found = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
        finally:
            db.close()
    except sqlite3.Error as error:
        raise StoreUnavailable(f"cannot open SQLite store {path}: {error}") from None
    if found is None:
        raise InputError("--store", f"no Keelgate store at {path} (a database of something else)")
