"""Storage backends, one module each, all implementing the protocols of ``keelgate.core``.

``open_stores(url)`` picks the backend from a store URL. Drivers are imported only when their
backend is asked for, so the default (SQLite, stdlib) needs no extra installed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from keelgate.core.protocols import Stores
from keelgate.errors import InputError

DEFAULT_URL = "sqlite:///./.keelgate/keelgate.db"


def redacted(url: str) -> str:
    """A store URL fit for an error message: any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def sqlite_path(url: str) -> str:
    """``sqlite:///relative/path`` or ``sqlite:////absolute/path`` to a filesystem path."""
    rest = url.split("://", 1)[1]
    if not rest.startswith("/") or rest == "/":
        raise InputError("--store", f"{url!r}: a SQLite URL is sqlite:///PATH")
    return rest[1:]


def _needs_extra(scheme: str, extra: str, missing: ImportError) -> InputError:
    return InputError(
        "--store",
        f"{scheme}:// stores need the {extra} extra: pip install 'keelgate[{extra}]' "
        f"({missing.name or 'a module'} is not installed)",
    )


def open_stores(url: str = DEFAULT_URL) -> Stores:
    """Open the stores a URL names: ``sqlite:///PATH``, ``postgresql://...``, ``memory://``,
    or ``langgraph+sqlite:///PATH`` (checkpoints through a LangGraph saver)."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from keelgate.stores.sqlite import SQLiteStore

        store = SQLiteStore(sqlite_path(url))
        return Stores(store, store, store, store)
    if scheme in ("postgresql", "postgres"):
        try:
            from keelgate.stores.postgres import PostgresStore
        except ImportError as missing:
            raise _needs_extra(scheme, "postgres", missing) from None

        pg = PostgresStore(url)
        return Stores(pg, pg, pg, pg)
    if scheme == "memory":
        from keelgate.stores.memory import MemoryStore

        memory = MemoryStore()
        return Stores(memory, memory, memory, memory)
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
        return Stores(checkpoints, companion, companion, companion)
    raise InputError(
        "--store", f"{redacted(url)!r}: unknown store (use sqlite:///PATH or postgresql://...)"
    )


SCHEMES = ("sqlite", "postgresql", "postgres", "memory", "langgraph+sqlite")


def check_store_url(url: str) -> None:
    """Refuse a malformed store URL without touching anything (no file, no connection)."""
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise InputError(
            "--store", f"{redacted(url)!r}: unknown store (use sqlite:///PATH or postgresql://...)"
        )
    if scheme in ("sqlite", "langgraph+sqlite"):
        sqlite_path(url)
