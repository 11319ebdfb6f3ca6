"""SQLite stores (the default): checkpoints, idempotency keys and the audit chain in one file.

The SQL and the stores' logic are ``keelgate.stores._sql``'s, shared with PostgreSQL; this module
keeps the connection (one, serialised by a lock; WAL, ``synchronous=FULL``), its transactions
(``BEGIN IMMEDIATE``, which also serialises schema migrations between processes) and owner
liveness.

Owner liveness, the heart of OUTCOME_UNKNOWN: every store instance creates a lock file
``<db>.owners/<owner>.lock`` and holds an exclusive ``flock`` on it for as long as it is open. An
in-flight key records its owner. To judge an in-flight key, another store tries to take that
owner's lock without blocking: it gets it only if no open file description holds it, which the
kernel guarantees once the owner process is dead (``os._exit``, SIGKILL, OOM: the kernel closes
every descriptor) or the owner store was closed. While the owner lives the lock is refused, so a
live owner is never read as gone. ``flock`` locks belong to open file descriptions, so this also
holds between two stores in one process, which is what in-process restart tests rely on.
It is sound on one host, the only place an SQLite file may be shared (SQLite over a network
filesystem is unsupported). Multi-host deployments use the Postgres store.

This module must never settle, retry or delete a key on its own: only ``settle`` changes an
unknown outcome, on a person's or a confirmer's word.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from keelgate.core import clocks
from keelgate.errors import StoreUnavailable
from keelgate.stores._dialect import Connection, Dialect
from keelgate.stores._migrations import migrate
from keelgate.stores._sql import SQLStore

T = TypeVar("T")

SQLITE = Dialect()  # the defaults are SQLite's

#: Seconds a statement waits for another connection's lock on the file before it gives up.
BUSY_TIMEOUT = 30.0


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[Connection]:
    """One write transaction on an autocommit connection, rolled back on any exception.
    IMMEDIATE: the write lock is taken at BEGIN, so nobody can move the chain's head (or the
    schema) between our read and our write."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


# SQLite's answers that mean the file cannot take a write at all (read-only, no space, a
# failing disk or folder), rather than that this write was wrong.
_UNUSABLE = ("SQLITE_READONLY", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN")


# SQLite's answers that mean another connection held the database past the busy timeout.
_LOCKED = ("SQLITE_BUSY", "SQLITE_LOCKED")


def _refuse_if_unusable(store: object, error: sqlite3.OperationalError) -> None:
    """Raise the store that cannot be used (the CLI's exit 5) if SQLite refused a statement
    because of the file rather than the statement: it cannot take writes, or another process
    held its lock for longer than the busy timeout. The transaction was rolled back, so nothing
    of it was written (the same command may be run again); reads of a read-only file still
    work."""
    name = getattr(error, "sqlite_errorname", "")
    where = getattr(store, "path", "in memory")
    if name.startswith(_UNUSABLE):
        raise StoreUnavailable(f"SQLite store {where} cannot be written: {error}") from None
    if name.startswith(_LOCKED):
        raise StoreUnavailable(
            f"SQLite store {where} is locked by another process: waited {BUSY_TIMEOUT:.0f}s "
            "for it; nothing was written, try again when it is done"
        ) from None


class SQLiteConnected(SQLStore):
    """A SQL store over one sqlite3 connection, used by one thread at a time (``_lock``),
    whose owner is a text id (``owner``). Subclasses open ``_db`` and judge liveness."""

    dialect = SQLITE
    owner: str
    _db: sqlite3.Connection
    _lock: AbstractContextManager[object]

    # Every statement passes here, so the refusal is caught in these two generators rather
    # than by one more context manager around them.
    @contextmanager
    def _statement(self) -> Iterator[Connection]:
        with self._lock:
            try:
                yield self._db
            except sqlite3.OperationalError as error:
                _refuse_if_unusable(self, error)
                raise

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self._lock:
            try:
                with immediate(self._db) as db:
                    yield db
            except sqlite3.OperationalError as error:
                _refuse_if_unusable(self, error)
                raise

    def _on_owner_session(self, work: Callable[[Connection], T], *, atomic: bool) -> T:
        # Any connection of this store will do: its owner stays live for as long as the store
        # is open, before and after this call.
        with self._transaction() if atomic else self._statement() as db:
            return work(db)

    def _owner_id(self) -> str:
        return self.owner

    def _owned(self) -> str:
        return self.owner


class SQLiteStore(SQLiteConnected):
    """Checkpoint, idempotency and audit store over one SQLite file."""

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL") -> None:
        super().__init__()
        # The real file, not the path given: every opener must find the same owners folder.
        self.path = Path(path).resolve()
        self._owners = self.path.parent / f"{self.path.name}.owners"
        # A file that turns out not to be a database must not be left with a folder beside it.
        made_owners = not self._owners.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._owners.mkdir(exist_ok=True)
        except OSError as error:
            raise StoreUnavailable(f"cannot use {self.path}: {error.strerror}") from None
        self.owner = uuid.uuid4().hex
        # Held until close: while this descriptor is open, our in-flight keys read as live.
        try:
            self._owner_fd: int | None = os.open(
                self._owners / f"{self.owner}.lock", os.O_CREAT | os.O_RDWR, 0o600
            )
        except OSError as error:  # read-only media, a full disk, a folder not ours
            raise StoreUnavailable(f"cannot use {self.path}: {error.strerror}") from None
        fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                self.path, isolation_level=None, timeout=BUSY_TIMEOUT, check_same_thread=False
            )
            _write_ahead_logged(self._db)
            # FULL: a commit survives power loss, not just a process death.
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            migrate(self._db, SQLITE, self._transaction, where=f"SQLite store {self.path}")
        except sqlite3.Error as error:
            self.close()
            if made_owners:
                with suppress(OSError):
                    self._owners.rmdir()
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {error}") from None
        except BaseException:
            self.close()
            raise

    def _close_now(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
            self._db = None  # type: ignore[assignment]
        if self._owner_fd is not None:
            os.close(self._owner_fd)  # releases the flock: our in-flight keys now read unknown
            self._owner_fd = None
            with suppress(FileNotFoundError):
                (self._owners / f"{self.owner}.lock").unlink()

    def _may_repeat(self) -> bool:
        return getattr(self, "_db", None) is not None

    # RunLock

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        """An exclusive ``flock`` on ``<db>.owners/run-<digest>.lock``, held by the driver.

        As for owners, the kernel drops the lock when its holder dies, and a flock belongs to
        an open file description, so two stores in one process exclude each other too.
        """
        digest = hashlib.sha256(f"{tenant}\0{run}".encode()).hexdigest()[:32]
        path = self._owners / f"run-{digest}.lock"
        while True:
            try:
                fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            except OSError as error:
                raise StoreUnavailable(f"cannot use {path}: {error.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            # A driver releasing removes the file (below): the one we opened may be gone or
            # replaced since, and a lock on it would exclude nobody. Then lock the file there now.
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)

        def release() -> None:
            # Removed while still locked, so no file is left per run; a waiter that opened it
            # meanwhile sees it gone and starts again. A dead driver leaves the file, unlocked.
            with suppress(FileNotFoundError):
                path.unlink()
            os.close(fd)

        return release

    # Owner liveness

    def _alive(self, owner: Any, judged: Any) -> bool:
        if owner is None:
            return False
        if owner == self.owner:
            return True
        try:
            fd = os.open(self._owners / f"{owner}.lock", os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        else:
            # We hold the lock, so nobody does: the owner is gone for good. Tidy its file.
            with suppress(FileNotFoundError):
                (self._owners / f"{owner}.lock").unlink()
            return False
        finally:
            os.close(fd)


class ReadOnlySQLiteStore(SQLiteConnected):
    """A store on media that cannot be written (a read-only mount, a backup disc), opened only to
    be read: ``keelgate status``, ``runs`` and ``audit`` there. It takes no owner (that is a lock
    file beside the database) and changes nothing; a write is refused as the file that cannot be
    written it is (``StoreUnavailable``). A database older than this code's schema cannot be
    migrated here, and is refused as such."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path).resolve()
        self.owner = "read-only"
        self._lock = threading.Lock()
        self._db = connect_read_only(self.path)
        try:
            migrate(self._db, SQLITE, self._transaction, where=f"SQLite store {self.path}")
        except StoreUnavailable:
            self._db.close()
            raise StoreUnavailable(
                f"SQLite store {self.path} cannot be written, and its schema is older than this "
                "keelgate's: open it once where it can be written, then read it here"
            ) from None
        except BaseException:
            self._db.close()
            raise

    def _close_now(self) -> None:
        self._db.close()

    def _alive(self, owner: Any, judged: Any) -> bool:
        # Nothing runs on media nobody can write: a key in flight there is judged unknown.
        return False


def _write_ahead_logged(db: sqlite3.Connection) -> None:
    """Puts the file in WAL mode, waiting up to the busy timeout for another opener. SQLite
    refuses the switch with "database is locked" at once, without its busy wait, while another
    connection holds a write transaction on the file (a first opener migrating it): four
    processes opening one new file together failed about one open in eight. WAL is kept in the
    file, so an opener that finds it set is done. Waits on ``keelgate.core.clocks``, as the
    stores' other retries do."""
    give_up = clocks.boot() + BUSY_TIMEOUT
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or clocks.boot() >= give_up:
                raise
            clocks.sleep(0.02)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that can only read ``path``, on media that cannot be written too.

    ``mode=ro`` first: it sees the write-ahead log's commits too. A database in WAL mode needs
    its ``-shm`` file beside it, which nobody can create on read-only media; when it is not there,
    SQLite's ``immutable`` switch reads the file alone. That is sound only if no commit waits in
    a ``-wal`` file beside it (a database closed cleanly has none): if one does, the store is
    refused rather than shown without its last commits."""
    try:
        db = sqlite3.connect(
            f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return db
    except sqlite3.Error:
        with suppress(UnboundLocalError, sqlite3.Error):
            db.close()
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreUnavailable(
            f"cannot read SQLite store {path}: it cannot be written, and commits wait in "
            f"{wal.name} that only a writable copy can read"
        )
    try:
        db = sqlite3.connect(
            f"{path.as_uri()}?immutable=1", uri=True, isolation_level=None, check_same_thread=False
        )
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.Error as error:
        raise StoreUnavailable(f"cannot open SQLite store {path}: {error}") from None
    return db


def writable(path: Path) -> bool:
    """Whether a store at ``path`` can be opened for writing: the file and its folder (where the
    owner locks and SQLite's own files go) take writes. False on read-only media, root or not."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
