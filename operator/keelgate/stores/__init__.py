"""Storage backends, one module each, all implementing the protocols of ``keelgate.core``.

``open_stores(url)`` picks the backend from a store URL. Drivers are imported only when their
backend is asked for, so the default (SQLite, stdlib) needs no extra installed.

A store URL may carry a password, and a mistyped one may carry it anywhere. So no message built
here quotes a URL as given: a URL is shown only rebuilt from parts that hold no password
(``redacted``), and one that cannot be read is described in fixed words, never echoed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from keelgate.core.protocols import Capabilities, Stores
from keelgate.errors import InputError, MissingExtra, StoreUnavailable

DEFAULT_URL = "sqlite:///./.keelgate/keelgate.db"

SCHEMES = ("sqlite", "postgresql", "postgres", "memory", "langgraph+sqlite")
_SQLITE_KINDS = ("sqlite", "langgraph+sqlite")
_POSTGRES_KINDS = ("postgresql", "postgres")
_USE = "use sqlite:///PATH or postgresql://USER@HOST/DB"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}")
# One HOST[:PORT] of a PostgreSQL URL (libpq allows a comma-separated list of them).
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.%]+\]|[^\[\]:/?#@,]*)(:[0-9]*)?")
UNREADABLE = "(a store URL that cannot be read)"


@dataclass(frozen=True)
class _StoreUrl:
    """The parts of a well-formed store URL; ``shown`` is the URL without its password."""

    kind: str
    rest: str  # everything after "KIND://"
    shown: str


def _parse(url: str) -> _StoreUrl:
    """Read a store URL or raise an InputError for ``--store`` that does not quote it."""
    if not url:
        raise InputError("--store", f"is empty ({_USE})")
    if "=" in url and "://" not in url:
        raise InputError(
            "--store", "a store is a URL such as postgresql://USER@HOST/DB, not key=value pairs"
        )
    if any(c.isspace() or not c.isprintable() for c in url):
        raise InputError("--store", f"a store URL holds no spaces or control characters ({_USE})")
    kind, separator, rest = url.partition("://")
    if not separator or not _SCHEME.fullmatch(kind):
        # The longest first: "postgres" is also the start of "postgresql".
        for known in sorted(SCHEMES, key=len, reverse=True):
            if url.lower().startswith(known):
                raise InputError("--store", f"a {known} store URL starts with {known}://")
        raise InputError("--store", f"not a store URL ({_USE})")
    kind = kind.lower()
    if kind not in SCHEMES:
        raise InputError("--store", f"unknown store kind {kind!r} ({_USE})")
    if kind in _SQLITE_KINDS:
        if not rest.startswith("/") or rest == "/":
            raise InputError(
                "--store", f"a SQLite URL is {kind}:///PATH (three slashes, then the path)"
            )
        return _StoreUrl(kind, rest, f"{kind}://{rest}")
    if kind == "memory":
        return _StoreUrl(kind, rest, "memory://")
    # PostgreSQL: userinfo@host[:port][,host[:port]...]/db?settings, read as libpq reads it: the
    # hosts end at the first '/' or '?' ('#' is nothing special to libpq), the userinfo at the
    # first '@' before any '/'. A raw '@' in a password moves that end, and libpq reads the rest
    # of the password as a host or a database name, which its messages quote: so the only raw
    # '@' taken before the settings is the one that ends the userinfo.
    cut = min((i for i in (rest.find(c) for c in "/?") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    misread = "@" not in authority and "@" in rest.split("/", 1)[0]  # host?password=a@b
    if authority.count("@") > 1 or "@" in tail.split("?", 1)[0] or misread:
        raise InputError(
            "--store",
            "an '@' in the user or password must be percent-encoded as %40 (and a '/' as %2F)",
        )
    userinfo, at, hosts = authority.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not all(_HOST_PORT.fullmatch(host) for host in hosts.split(",")):
        raise InputError(
            "--store",
            "the host of the URL is not HOST[:PORT] (a missing @, ] or port number?)",
        )
    path = tail.split("?", 1)[0].split("#", 1)[0]
    # The query may hold password=...: it is left out of what is shown, as the password is.
    login = f"{user}{':***' if colon else ''}@" if at else ""
    return _StoreUrl(kind, rest, f"{kind}://{login}{hosts}{path}")


def redacted(url: str) -> str:
    """A store URL fit for a message: rebuilt without its password or ``?`` settings, and a URL
    that cannot be read is not shown at all, however it is malformed."""
    try:
        return _parse(url).shown
    except InputError:
        return UNREADABLE


def sqlite_path(url: str) -> str:
    """``sqlite:///relative/path`` or ``sqlite:////absolute/path`` to a filesystem path."""
    parsed = _parse(url)
    if parsed.kind not in _SQLITE_KINDS:
        raise InputError("--store", "not a SQLite URL (sqlite:///PATH)")
    return parsed.rest[1:]


def _needs_extra(scheme: str, extra: str, missing: ImportError) -> InputError:
    what = f"a {scheme}:// store"
    return MissingExtra.of(missing, field="--store", what=what) or MissingExtra(
        extra, field="--store", what=what, module=missing.name or ""
    )


def open_stores(
    url: str = DEFAULT_URL, *, pooled: bool = True, tenant_sessions: int | None = None
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
    scheme = _parse(url).kind
    if scheme == "sqlite":
        from keelgate.stores.sqlite import SQLiteStore

        store = SQLiteStore(sqlite_path(url))
        return Stores.of(store)
    if scheme in ("postgresql", "postgres"):
        try:
            from keelgate.stores.postgres import PostgresStore
        except ImportError as missing:
            raise _needs_extra(scheme, "postgres", missing) from None

        pg = PostgresStore(url, pooled=pooled)
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

        path = sqlite_path(url)
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
    raise AssertionError(f"unhandled store kind {scheme}")  # _parse knows only SCHEMES


def open_existing(url: str, *, read_only: bool = False) -> Stores:
    """Open a store that must exist already, creating nothing on the way: every command but a
    run reads or settles saved runs, so a mistyped path or database is an ``InputError`` for
    ``--store`` ("no store at ..."), not a new empty store, a new file or new tables.

    ``read_only``: the caller only reads (``status``, ``runs``, ``audit``), so a SQLite store on
    media that cannot be written is opened to be read (``ReadOnlySQLiteStore``) rather than
    refused; one that can be written is opened as always."""
    parsed = _parse(url)
    if parsed.kind in _SQLITE_KINDS:
        path = Path(parsed.rest[1:])
        _probe_sqlite(path, "keelgate_checkpoints" if parsed.kind == "sqlite" else "keelgate_keys")
        if parsed.kind == "langgraph+sqlite":
            _probe_sqlite(Path(f"{path}.langgraph"), "checkpoints")
        elif read_only:
            from keelgate.stores.sqlite import ReadOnlySQLiteStore, writable

            if not writable(path):
                return Stores.of(ReadOnlySQLiteStore(path))
    elif parsed.kind in _POSTGRES_KINDS:
        try:
            from keelgate.stores.postgres import holds_store
        except ImportError:
            pass  # open_stores names the extra to install
        else:
            holds_store(url)
    return open_stores(url)


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


def check_store_url(url: str) -> None:
    """Refuse a malformed store URL without touching anything (no file, no connection)."""
    parsed = _parse(url)
    if parsed.kind in _POSTGRES_KINDS:
        try:
            from keelgate.stores.postgres import check_url
        except ImportError:
            return  # open_stores names the extra to install
        check_url(url)
