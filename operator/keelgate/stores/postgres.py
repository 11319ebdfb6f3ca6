"""PostgreSQL stores: checkpoints, idempotency keys and the audit chain in one database, shared by
any number of processes on any number of hosts (psycopg 3, pooled).

It holds exactly the JSON the SQLite store holds (states and results as JSON text), so a run can
move between the two: the SQL and the stores' logic are ``keelgate.stores._sql``'s, shared with
SQLite. This module keeps the connections (the owner session, and a pool for the statements of
threads that find it busy), the schema lock (a transaction-level advisory lock, so many
processes may open a fresh database at once) and owner liveness.

Owner liveness, the heart of OUTCOME_UNKNOWN. Each store instance takes an owner id with
``keelgate_owner_take()`` (schema migration 4: a function of the tables' owner that draws a fresh
id from ``keelgate_owner_seq`` and holds a session-level advisory lock on it in the caller's
session), on a dedicated connection outside the pool, for as long as it is open. Keys are claimed
on that same connection and record the owner id. A store judges an in-flight key's owner gone if
and only if ``keelgate_owner_alive(id)``, asked in the key's own SELECT, says no session holds
that id's lock: a transaction-level shared lock on it is tried (it ends with the statement's
transaction, so no cancel can leave it held; the owner's own session, where it would be granted
too, knows its id). It reads no lock table, whose every read
copies every lock on the server. Why this is sound:

- A live owner is never read as gone. The lock is taken before the first claim, and every claim
  runs on the session holding it, so a key can only exist while its owner's lock is held. A
  session advisory lock is released only by the end of that session or by an explicit unlock,
  which only ``close`` issues; while it is held no other session is granted a shared lock on it.
  Owner ids come from a sequence no role may draw from but through the take, which locks only
  the id it draws, so (once the raw advisory-lock functions are revoked from PUBLIC, as
  ``keelgate tenant add`` does with a superuser's URL) no other session ever holds one.
- A dead owner is read as gone. A process that dies (``os._exit``, SIGKILL, OOM) has its socket
  closed by its kernel; the server ends the session and releases the lock at once. A host that
  vanishes sends nothing: TCP keepalives set on the owner session (both on the server side and in
  libpq) end it within about 25 seconds, and until then its keys read as in flight, which only
  delays (``RunBusy``), never duplicates.
- The one misjudgement possible: the owner session ends while its process lives (a network cut,
  a server restart, ``pg_terminate_backend``). Its keys then read ``outcome_unknown`` elsewhere,
  and an unknown outcome is a stop, never a retry. The orphaned owner can start nothing new (its
  next claim needs a new owner session), and the WRITE it is running finishes through
  ``complete``, a compare-and-set on owner and state: it lands if nobody settled the key meanwhile
  and changes nothing if somebody did. No WRITE runs twice either way.

Tenants sharing the database cannot delay each other through these locks: every lock is taken
through the owner's functions, which scope it (a run lock only for the caller's own tenant, in
that tenant's key space, up to its lock limit), and a tenant's role may call no advisory-lock
function itself.

Session advisory locks need a real session: the owner connection must not go through a
transaction-pooling proxy (pgbouncer in transaction mode); connect directly or in session mode.
This module must never settle, retry or delete a key on its own, and never put a password in an
error message.

Why one module past 500 lines: the connections and the liveness argument above are one story,
read with the code that keeps it; the statements are ``_sql``'s.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from keelgate.errors import InputError, RunBusy, StoreBusy, StoreError, StoreUnavailable
from keelgate.stores import _migrations
from keelgate.stores._dialect import Connection, Dialect
from keelgate.stores._migrations import migrate
from keelgate.stores._sql import PATIENCE, SQLStore
from keelgate.stores.url import StoreUrl, read_store_url

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

T = TypeVar("T")

# Advisory-lock keys (``_migrations``: the migration that makes the lock functions names them too).
# The two-int4 form keeps Keelgate's locks apart from another application's single-bigint ones;
# owner ids are single bigints from OWNER_BASE on, far above any such application's numbers.
OWNER_SPACE = _migrations.LEGACY_OWNER_SPACE  # owner ids drawn before migration 4: (space, id)
SCHEMA_SPACE = _migrations.SCHEMA_SPACE
DRIVER_SPACE = _migrations.DRIVER_SPACE  # a run's driver (RunLock), for a tenant without a role
OWNER_BASE = _migrations.OWNER_BASE

# ``PostgresStore._claimer`` once two threads have claimed: no thread id is ever this.
_MANY = -1

# The server ends a silent owner session after idle + count * interval seconds.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3

#: Seconds a store's statement waits for a lock another session holds (``lock_timeout``), and
#: seconds any of its statements may run (``statement_timeout``), before it is given up with
#: ``StoreBusy`` naming what waited. Keelgate's own statements hold a row for milliseconds (every
#: write is one autocommit statement or a short transaction), so a longer wait is someone
#: holding a lock on purpose or by mistake: an open transaction, ``LOCK TABLE``, a migration.
#: Set on every session a store opens; a role that changes them in its own sessions changes
#: only how long its own statements wait.
LOCK_TIMEOUT = 5.0
STATEMENT_TIMEOUT = 30.0
#: A migration's bound on waiting for a lock: every statement on the table queues behind a
#: waiting ``ALTER TABLE``, so the wait is kept short and tried again, MIGRATION_TRIES times
#: over about 8 s, before the open fails with ``StoreBusy``. Its statements may run longer
#: (a large table rewritten), up to MIGRATION_STATEMENT_TIMEOUT.
MIGRATION_LOCK_TIMEOUT = 1.0
MIGRATION_STATEMENT_TIMEOUT = 600.0
MIGRATION_TRIES = 5

POSTGRES = Dialect(
    name="postgresql",
    placeholder="%s",
    bigint="bigint",
    owner_type="integer",
    real="double precision",
    # clock_timestamp(), not now(): the moment of the statement, not of its transaction's start.
    clock="extract(epoch from clock_timestamp())",
    owner_setup="CREATE SEQUENCE IF NOT EXISTS keelgate_owner_seq AS integer;",
    # A store's keys may carry any owner id it has had (a new one after its session was lost).
    mine="owner = ANY(?)",
    same="IS NOT DISTINCT FROM",
    byte_order=' COLLATE "C"',  # as SQLite and Python sort, whatever the database's collation
    # In the key's own SELECT: whether an in-flight key's owner session still lives, read from
    # the lock table by a function of the tables' owner (a tenant's role need not read it). It
    # takes no lock, so it says the same on every session, the owner's own included.
    liveness=(
        "CASE WHEN state <> 'in_flight' OR owner IS NULL THEN false "
        "ELSE keelgate_owner_alive(owner) END"
    ),
    schema_name=(
        "SELECT quote_ident(n.nspname) FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = 'keelgate_schema'::regclass"
    ),
    schema_table_exists="SELECT to_regclass('keelgate_schema') IS NOT NULL",
    one_statement_writes=True,
)

Conn = psycopg.Connection[tuple[Any, ...]]

# What each kind of registered role (``keelgate_tenants.kind``) may do, table by table; the
# row-level security of migration 3 narrows it to rows. A tenant's role (a step pod, or a person
# with the tenant's URL) reads the schema version and its own rows, checkpoints, claims,
# completes, settles and forgets its keys, appends to (never rewrites) its audit chains, and
# reads the specs the operator recorded for it. The operator's role reads every tenant and
# writes what the operator writes: the spec it records before each step pod, a checkpoint with
# an approval decision, the settlement of an unknown outcome, their audit events. The operator
# never claims, completes or forgets a key, so it may change only a key's settlement columns.
# Anything not granted here is refused by PostgreSQL itself (no UPDATE or DELETE of audit events
# for anyone; no writes to the version table or the role lookup but by their owner).
PRIVILEGES: dict[str, dict[str, str]] = {
    "tenant": {
        "keelgate_schema": "SELECT",
        "keelgate_tenants": "SELECT",
        "keelgate_checkpoints": "SELECT, INSERT, UPDATE",
        "keelgate_keys": "SELECT, INSERT, UPDATE, DELETE",
        "keelgate_audit": "SELECT, INSERT",
        "keelgate_specs": "SELECT",
        "keelgate_databases": "SELECT",
        "keelgate_owners": "SELECT, INSERT, UPDATE (holder, epoch, expires)",
    },
    "operator": {
        "keelgate_schema": "SELECT",
        "keelgate_tenants": "SELECT",
        "keelgate_checkpoints": "SELECT, INSERT, UPDATE (seq, state)",
        "keelgate_keys": "SELECT, UPDATE (state, owner, settled_by, source)",
        "keelgate_audit": "SELECT, INSERT",
        "keelgate_specs": "SELECT, INSERT, UPDATE (source, generation, spec)",
        "keelgate_databases": "SELECT",
        "keelgate_owners": "SELECT, INSERT, UPDATE (holder, epoch, expires)",
    },
}
KINDS = tuple(PRIVILEGES)
TABLES = tuple(PRIVILEGES["tenant"])
assert all(tuple(tables) == TABLES for tables in PRIVILEGES.values())
# Nobody but its owner uses the owner sequence (migration 4): ids are drawn by
# ``keelgate_owner_take``, one at a time per session, never by a role itself.
OWNER_SEQUENCE = "keelgate_owner_seq"
# The lock functions (migration 4) each kind may call, and no raw advisory-lock function: a
# tenant's role takes an owner id, judges owners and drives its own tenant's runs; the
# operator's role takes an owner id and judges owners (it drives no run).
LOCK_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "tenant": (
        "keelgate_owner_take()",
        "keelgate_owner_alive(bigint)",
        "keelgate_lock_run(text, text)",
        "keelgate_unlock_run(integer, integer)",
        "keelgate_unlock_all()",
    ),
    "operator": (
        "keelgate_owner_take()",
        "keelgate_owner_alive(bigint)",
        "keelgate_unlock_all()",
    ),
}
FUNCTIONS = LOCK_FUNCTIONS["tenant"]


def grant(conn: Connection, role: str, kind: str) -> None:
    """Give ``role`` exactly the rights of its ``kind`` on this database's Keelgate tables (what
    it had before is revoked first, in the same transaction, so nothing else stays)."""
    from psycopg import sql

    who = sql.Identifier(role)
    schema, database = _schema_and_database(conn)
    tables = sql.SQL(", ").join(sql.Identifier(t) for t in TABLES)
    functions = sql.SQL(", ").join(sql.SQL(f) for f in FUNCTIONS)  # constants, never input
    statements = [
        sql.SQL("REVOKE ALL ON {} FROM {}").format(tables, who),
        sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}").format(sql.Identifier(OWNER_SEQUENCE), who),
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), who),
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), who),
        sql.SQL("REVOKE ALL ON FUNCTION {} FROM {}").format(functions, who),
        sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
            sql.SQL(", ").join(sql.SQL(f) for f in LOCK_FUNCTIONS[kind]), who
        ),
    ]
    for table, privileges in PRIVILEGES[kind].items():
        # The privilege lists are this module's constants, never input.
        statements.append(
            sql.SQL("GRANT {} ON {} TO {}").format(sql.SQL(privileges), sql.Identifier(table), who)
        )
    for statement in statements:
        conn.execute(statement.as_string(None))


def revoke(conn: Connection, role: str) -> None:
    """Take back every right ``grant`` gave ``role`` on this database."""
    from psycopg import sql

    who = sql.Identifier(role)
    schema, database = _schema_and_database(conn)
    tables = sql.SQL(", ").join(sql.Identifier(t) for t in TABLES)
    functions = sql.SQL(", ").join(sql.SQL(f) for f in FUNCTIONS)
    for statement in (
        sql.SQL("REVOKE ALL ON {} FROM {}").format(tables, who),
        sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}").format(sql.Identifier(OWNER_SEQUENCE), who),
        sql.SQL("REVOKE ALL ON FUNCTION {} FROM {}").format(functions, who),
        sql.SQL("REVOKE USAGE ON SCHEMA {} FROM {}").format(sql.Identifier(schema), who),
        sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(sql.Identifier(database), who),
    ):
        conn.execute(statement.as_string(None))


def regrant(conn: Connection) -> None:
    """Grant every registered role its kind's rights again: run in the transaction of any
    migration, so a table or column a migration adds is usable by the roles at once."""
    if not conn.execute("SELECT to_regclass('keelgate_tenants') IS NOT NULL").fetchone()[0]:
        return
    rows = conn.execute(
        "SELECT t.role, t.kind FROM keelgate_tenants t JOIN pg_roles r ON r.rolname = t.role "
        "ORDER BY t.role"
    ).fetchall()
    for role, kind in rows:
        grant(conn, str(role), str(kind))


def _schema_and_database(conn: Connection) -> tuple[str, str]:
    """The schema Keelgate's tables live in, and the database's name."""
    row = conn.execute(
        "SELECT n.nspname, current_database() FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = 'keelgate_schema'::regclass"
    ).fetchone()
    return str(row[0]), str(row[1])


def migrated(conn: Conn, target: str, *, tries: int = MIGRATION_TRIES) -> int:
    """Bring the database behind ``conn`` (autocommit) to today's schema, under the schema lock;
    returns the version it had. A role that may not migrate a database that needs it is told
    what to do in one line, not the server's "permission denied".

    Each try waits at most MIGRATION_LOCK_TIMEOUT for a lock (an open transaction that read a
    table holds off its ``ALTER TABLE``, and every statement on that table would queue behind
    the waiting migration): it is rolled back and tried again, ``tries`` times in all, then
    given up with ``StoreBusy`` naming the migration. Nothing of a failed try stays."""

    @contextmanager
    def schema_lock() -> Iterator[Connection]:
        with conn.transaction():
            conn.execute(
                "SELECT set_config('lock_timeout', %s, true), "
                "set_config('statement_timeout', %s, true)",
                (_ms(MIGRATION_LOCK_TIMEOUT), _ms(MIGRATION_STATEMENT_TIMEOUT)),
            )
            # CREATE ... IF NOT EXISTS is not safe when two sessions run it at once, and a
            # migration must run once: every opener takes this lock before changing anything.
            conn.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_SPACE}, 0)")
            yield conn

    where = f"PostgreSQL store {target}"
    pause = 0.5
    for attempt in range(1, tries + 1):
        try:
            return migrate(conn, POSTGRES, schema_lock, where=where, after=regrant)
        except psycopg.errors.InsufficientPrivilege:
            raise StoreError(
                f"{where}: its schema is older than this Keelgate's (version "
                f"{len(_migrations.MIGRATIONS)}) and role {conn.info.user} may not migrate it; "
                "open it once with the database owner's URL (e.g. `keelgate tenant list --store "
                "ADMIN_URL`)"
            ) from None
        except psycopg.Error as error:
            waited = _waited(error)
            if waited is None:
                raise
            if attempt == tries:
                seconds = (
                    MIGRATION_LOCK_TIMEOUT
                    if waited == "lock_timeout"
                    else MIGRATION_STATEMENT_TIMEOUT
                )
                what = f"migrating its schema to version {len(_migrations.MIGRATIONS)}"
                raise StoreBusy(
                    where, f"{what} ({tries} tries)", waited=waited, seconds=seconds
                ) from None
            time.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable")


def _ms(seconds: float) -> str:
    """A PostgreSQL duration setting, in whole milliseconds."""
    return f"{max(1, round(seconds * 1000))}ms"


def _waited(error: BaseException) -> str | None:
    """Which bound a statement was given up at: ``lock_timeout``, ``statement_timeout``, or
    None for any other error (a cancel asked for by someone, a lock refused without waiting)."""
    text = str(error)
    if isinstance(error, psycopg.errors.LockNotAvailable) and "lock timeout" in text:
        return "lock_timeout"
    if isinstance(error, psycopg.errors.QueryCanceled) and "statement timeout" in text:
        return "statement_timeout"
    return None


def holds_store(url: StoreUrl, *, connect_timeout: int = 10) -> None:
    """Refuse (``InputError`` for ``--store``) a database that holds no Keelgate store, by
    reading the catalogue only: unlike opening a ``PostgresStore``, it creates no schema."""
    target, secret, params = url.target, url.password, url.params
    # The user's URL wins, as for the store itself.
    timeout: dict[str, Any] = (
        {} if "connect_timeout" in params else {"connect_timeout": connect_timeout}
    )
    try:
        with psycopg.connect(autocommit=True, **params, **timeout) as conn:
            row = conn.execute("SELECT to_regclass('keelgate_checkpoints') IS NOT NULL").fetchone()
    except psycopg.Error as error:
        raise StoreUnavailable(f"PostgreSQL store {target}: {_one_line(error, secret)}") from None
    if row is None or not row[0]:
        raise InputError(
            "--store", f"no Keelgate store in {target} (runs are saved where `run` ran)"
        )


def _one_line(error: BaseException, secret: str) -> str:
    """A driver error as one line, the password (if the server quoted it) masked."""
    text = str(error).strip()
    line = text.splitlines()[0].strip() if text else type(error).__name__
    return line.replace(secret, "***") if secret else line


class PostgresStore(SQLStore):
    """Checkpoint, idempotency and audit store over one PostgreSQL database.

    The thread that claims keys (a loop) runs its other statements on the owner session too,
    when it is free, so a loop talks to the server on one session; every other thread, and
    the claiming one when that session is busy or unfit, uses the pool (``pooled=True``), as do
    all once a second thread has claimed: a claim waits behind no other thread's statement (but
    a second claiming thread's first claim, which may wait for the first one's statement).
    ``pooled=False`` has no pool: every statement waits its turn on the owner session, one
    server session instead of two, for a short-lived process with one thread of work (a step
    pod, which starts and stops for every step of every run).
    """

    dialect = POSTGRES

    def __init__(
        self,
        url: str | StoreUrl,
        *,
        pooled: bool = True,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout: int = 10,
        patience: float = PATIENCE,
        lock_timeout: float = LOCK_TIMEOUT,
        statement_timeout: float = STATEMENT_TIMEOUT,
    ) -> None:
        super().__init__()
        self.url = read_store_url(url)
        params = self.url.params
        self.lock_timeout = lock_timeout
        self.statement_timeout = statement_timeout
        # Every operation rides out a restart, a failover or an ended session (``_durably``).
        self.patience = self.result_patience = patience
        self.target, self._secret = self.url.target, self.url.password
        # Detect a dead server or a vanished network from our side too; the user's URL wins.
        defaults: dict[str, Any] = {
            "connect_timeout": connect_timeout,
            "keepalives": 1,
            "keepalives_idle": KEEPALIVE_IDLE,
            "keepalives_interval": KEEPALIVE_INTERVAL,
            "keepalives_count": KEEPALIVE_COUNT,
        }
        self._kwargs = {k: v for k, v in defaults.items() if k not in params}
        self._owner_lock = threading.Lock()
        self._owner_conn: Conn | None = None
        # The one thread that claims keys or drives runs (threading.get_ident), or _MANY.
        self._claimer: int | None = None
        self._owner_ids: list[int] = []
        self._driven: set[tuple[str, str]] = set()  # runs this store drives (lock_run)
        self._pool: ConnectionPool[Conn] | None = None
        self._open = False
        self.routes_tenants = False
        try:
            self._open_owner_session()
            self._open = True
            if not pooled:
                return
            from psycopg_pool import ConnectionPool  # here: a step pod never needs it

            self._pool = ConnectionPool(
                kwargs={"autocommit": True, **params, **self._kwargs},
                min_size=min_size,
                max_size=max_size,
                open=False,
                name=f"keelgate-{self.owner}",
                num_workers=2,
                configure=self._configure,
                # A pooled session the server has ended meanwhile (a restart, a failover,
                # idle_session_timeout) is found out before it is lent, not by the statement.
                check=ConnectionPool.check_connection,
            )
            self._pool.open(wait=True, timeout=float(connect_timeout))
        except psycopg.Error as error:
            self.close()
            # Whatever went wrong, the store could not be opened: nothing was read or written.
            failed = self._error(error, StoreUnavailable)
            raise failed.doing("opening it") if isinstance(failed, StoreBusy) else failed from None
        except BaseException:
            self.close()
            raise

    @property
    def owner(self) -> int:
        """This store's current owner id (a new one after its owner session was lost)."""
        return self._owner_ids[-1]

    def _configure(self, conn: Conn) -> None:
        """What every session of this store is set to: durable commits, and the bounds of its
        waits (``StoreBusy`` past them)."""
        _durable_commits(conn)
        conn.execute(
            "SELECT set_config('lock_timeout', %s, false), "
            "set_config('statement_timeout', %s, false)",
            (_ms(self.lock_timeout), _ms(self.statement_timeout)),
        )

    def _error(self, error: BaseException, kind: type[StoreError] | None = None) -> StoreError:
        waited = _waited(error)
        if waited is not None:
            seconds = self.lock_timeout if waited == "lock_timeout" else self.statement_timeout
            return StoreBusy(f"PostgreSQL store {self.target}", "", waited=waited, seconds=seconds)
        line = _one_line(error, self._secret)
        if kind is None:
            # A lost connection or a server gone away: the store cannot be reached.
            unreachable = isinstance(error, psycopg.OperationalError)
            kind = StoreUnavailable if unreachable else StoreError
        return kind(f"PostgreSQL store {self.target}: {line}")

    def _open_owner_session(self) -> None:
        conn: Conn = psycopg.connect(autocommit=True, **self.url.params, **self._kwargs)
        try:
            self._configure(conn)
            migrated(conn, self.target)
            # The server ends this session (releasing our lock) soon after the host goes silent,
            # and must never end it for being idle.
            conn.execute(f"SET tcp_keepalives_idle = {KEEPALIVE_IDLE}")
            conn.execute(f"SET tcp_keepalives_interval = {KEEPALIVE_INTERVAL}")
            conn.execute(f"SET tcp_keepalives_count = {KEEPALIVE_COUNT}")
            if conn.info.server_version >= 140000:
                conn.execute("SET idle_session_timeout = 0")
            owner = _take_owner_id(conn)
            # Every role sees every session's application_name: it names no owner id.
            conn.execute("SET application_name = keelgate")
            self._writer, self.routes_tenants = _identity(conn)
        except BaseException:
            conn.close()
            raise
        self._owner_conn = conn
        self._owner_ids.append(owner)

    def _close_now(self) -> None:
        self._open = False
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        with self._owner_lock:
            if self._owner_conn is not None:
                # Unlock first: ending a session is asynchronous on the server, and a closed
                # store's keys must read unknown from the moment close() returns.
                with suppress(psycopg.Error):
                    self._owner_conn.execute("SELECT keelgate_unlock_all()")
                self._owner_conn.close()
                self._owner_conn = None

    # Connections and transactions: the owner session whenever it is free, else the pool.

    @contextmanager
    def _statement(self) -> Iterator[Connection]:
        if self._pool is None:
            with self._one_session() as conn:
                yield conn
            return
        # A loop's commits alternate between a claim (on the owner session) and a checkpoint:
        # spread over two sessions they cost about a fifth more wall time and a third more
        # client CPU than on one. Only the claiming thread shares the owner session, so that a
        # claim never waits behind another thread's statement.
        if self._claimer == threading.get_ident() and self._owner_lock.acquire(blocking=False):
            try:
                owner = self._owner_conn
                if self._open and owner is not None and _idle_and_quiet(owner):
                    try:
                        yield owner
                    except psycopg.Error as error:
                        raise self._error(error) from None
                    return
            finally:
                self._owner_lock.release()
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as error:
            raise self._error(error) from None

    @contextmanager
    def _one_session(self) -> Iterator[Conn]:
        """The owner session for a statement of an unpooled store, held for its duration."""
        with self._owner_lock:
            try:
                yield self._live_owner_session()
            except psycopg.Error as error:
                raise self._error(error) from None

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self._statement() as conn:
            assert isinstance(conn, psycopg.Connection)
            with conn.transaction():
                yield conn

    def _note_claimer(self) -> None:
        """Remember the thread claiming now (the caller holds ``_owner_lock``). Once a second
        thread claims, nobody's other statements share the owner session any more: one claimer's
        statement held up on the server would make the other's claims wait."""
        me = threading.get_ident()
        if self._claimer is None:
            self._claimer = me
        elif self._claimer != me:
            self._claimer = _MANY

    def _live_owner_session(self) -> Conn:
        """The owner session, or a new one (a new owner id) if it was lost or the server has
        ended it (found out here, before a statement fails on it). The caller holds
        ``_owner_lock``; a closed store has none."""
        if not self._open:
            raise StoreError(f"PostgreSQL store {self.target}: the store is closed")
        if self._owner_conn is not None and _ended_by_server(self._owner_conn):
            with suppress(psycopg.Error):
                self._owner_conn.close()
            self._owner_conn = None
        if self._owner_conn is None:
            self._open_owner_session()
        assert self._owner_conn is not None
        return self._owner_conn

    def _on_owner_session(self, work: Callable[[Connection], T], *, atomic: bool) -> T:
        """Run ``work`` on the owner session, in a transaction if ``atomic`` (else its one
        statement is its own): a key is only ever recorded while its owner lock is held.

        If the session is lost meanwhile, the error is raised (the store cannot be reached) and
        the session is dropped: the caller's repeat (``_durably``) opens a new one, with a new
        owner id, and recognises a claim of its own that landed (``claim``).
        """
        with self._owner_lock:
            self._note_claimer()
            try:
                conn = self._live_owner_session()
                if not atomic:
                    return work(conn)  # one autocommit statement: its own transaction
                with conn.transaction():
                    return work(conn)
            except psycopg.Error as error:
                lost = self._owner_conn
                if lost is not None and (lost.broken or lost.closed):
                    with suppress(psycopg.Error):
                        lost.close()
                    self._owner_conn = None
                raise self._error(error) from None

    def _may_repeat(self) -> bool:
        return self._open

    def _one_statement(self, conn: Connection, sql: str, params: Sequence[Any]) -> Any:
        try:
            return conn.execute(sql, params).fetchone()
        except psycopg.errors.UniqueViolation:
            # The statement failed as a whole and, autocommit, took nothing with it.
            return None

    # Tenants with databases of their own (``keelgate.stores.tenant_databases`` serves them)

    def tenant_database(self, tenant: str) -> str:
        """The database of its own ``tenant`` keeps its rows in, on this server ("": this
        one), as ``keelgate_databases`` tells this role."""
        row = self._durably(
            lambda again: self._one(
                "SELECT database FROM keelgate_databases WHERE tenant = %s", (tenant,)
            ),
            what=f"looking up tenant {tenant}'s database",
        )
        return "" if row is None else str(row[0])

    def tenant_databases(self) -> dict[str, str]:
        """Every tenant with a database of its own that this role may see, and that database."""

        def attempt(again: bool) -> list[Any]:
            with self._statement() as conn:
                return conn.execute("SELECT tenant, database FROM keelgate_databases").fetchall()

        rows = self._durably(attempt, what="looking up the tenants' databases")
        return {str(tenant): str(database) for tenant, database in rows}

    def on_database(self, database: str, *, pooled: bool) -> PostgresStore:
        """A store on another ``database`` of this server, with this store's credentials and
        settings (its bounds, its patience)."""
        return PostgresStore(
            self.url.on_database(database),
            pooled=pooled,
            connect_timeout=int(self._kwargs.get("connect_timeout", 10)),
            patience=self.patience,
            lock_timeout=self.lock_timeout,
            statement_timeout=self.statement_timeout,
        )

    # RunLock

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        """A session advisory lock on the run, taken on the owner session and held by the driver.

        The lock is taken by ``keelgate_lock_run`` (migration 4), which locks only runs of the
        caller's own tenant, in that tenant's own key space: no other tenant's role can hold it.
        The server drops it when that session ends, so a dead driver's run is free again as
        soon as its owner keys read unknown. Two runs of one tenant whose 32-bit digests collide
        cannot be driven at the same moment: a RunBusy, never a second driver. Session locks are
        re-entrant, so this store refuses a second driver of its own as well. A tenant whose
        sessions already drive its lock limit of runs is refused with RunBusy saying so.
        """

        def attempt(again: bool) -> tuple[Conn, int, int] | None:
            with self._owner_lock:
                self._note_claimer()  # the driver: its statements join its claims
                if (tenant, run) in self._driven:
                    return None
                try:
                    conn = self._live_owner_session()
                    row = conn.execute("SELECT keelgate_lock_run(%s, %s)", (tenant, run)).fetchone()
                except psycopg.errors.ProgramLimitExceeded as error:
                    raise RunBusy(tenant, run, _one_line(error, self._secret)) from None
                except psycopg.Error as error:
                    raise self._error(error) from None
                if row is None or row[0] is None:
                    return None
                self._driven.add((tenant, run))
                space, key = row[0]
                return conn, int(space), int(key)

        held = self._durably(attempt, what=f"locking run {run!r}")
        if held is None:
            return None
        conn, space, key = held

        def release() -> None:
            with self._owner_lock:
                self._driven.discard((tenant, run))
                # On a session lost meanwhile the lock went with it: nothing to release.
                if self._owner_conn is conn and not conn.closed:
                    with suppress(psycopg.Error):
                        conn.execute("SELECT keelgate_unlock_run(%s, %s)", (space, key))

        return release

    # Owner liveness

    def _owner_id(self) -> int:
        return self.owner

    def _owned(self) -> list[int]:
        return self._owner_ids

    def _alive(self, owner: Any, judged: Any) -> bool:
        return bool(judged)  # judged by the server in the key's own SELECT (Dialect.liveness)


def _take_owner_id(conn: Conn) -> int:
    """A fresh owner id, its session advisory lock held on ``conn``.

    ``keelgate_owner_take`` (migration 4) draws it and locks it in this session: a bigint from
    a sequence no role but its owner may use, so no tenant can exhaust the ids, nor (once the
    raw advisory-lock functions are revoked from PUBLIC) hold one before it is drawn. It tries
    the lock, never waits for it: an id someone holds anyway is passed over (up to 100), so a
    store never hangs on opening behind a lock it cannot see the end of."""
    row = conn.execute("SELECT keelgate_owner_take()").fetchone()
    assert row is not None
    return int(row[0])


def _identity(conn: Conn) -> tuple[tuple[str, str], bool]:
    """Who the database records as the writer of this store's audit events (migration 6): the
    role, and its kind in the lookup (``administrator`` for a role it does not name), sealed
    into each event's hash, so an event's writer is as fixed as the rest of it; and whether
    this role serves tenants that may have databases of their own (``keelgate_databases``,
    migration 7): the operator's role always (a tenant added while it runs gets one), another
    role where the database names one it may see (the administrator sees every one, a tenant's
    role none)."""
    row = conn.execute(
        "SELECT current_user, COALESCE((SELECT kind FROM keelgate_tenants "
        "WHERE role = current_user), 'administrator'), "
        "EXISTS (SELECT 1 FROM keelgate_databases)"
    ).fetchone()
    assert row is not None
    kind = str(row[1])
    return (str(row[0]), kind), kind == "operator" or bool(row[2])


def _durable_commits(conn: Conn) -> None:
    """Make the session's commits durable before they are acknowledged, whatever the server's
    default (``synchronous_commit = off`` is a common tuning): Keelgate acts on every commit it
    is told has landed, and a commit lost in a server crash after that could run a WRITE twice
    or lose its record. Only ``on`` (or stronger, set per server) waits for the flush."""
    row = conn.execute("SHOW synchronous_commit").fetchone()
    if row is None or row[0] == "off":  # local, on, remote_write, remote_apply all wait
        conn.execute("SET synchronous_commit = on")


def _ended_by_server(conn: Conn) -> bool:
    """Whether the server has ended this idle session (a restart, ``pg_terminate_backend``,
    ``idle_session_timeout``): it says so on the socket before it closes it. A look at the
    socket, and a round trip only if something is waiting there."""
    try:
        if conn.closed or conn.broken:
            return True
        pgconn = conn.pgconn
        if pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False  # in use: whoever uses it finds out
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN | select.POLLPRI)
        if not poller.poll(0):
            return False
        # Something came unasked for: most likely the server's goodbye. One probe says.
        conn.execute("SELECT 1")
        return False
    except (psycopg.Error, OSError, ValueError):
        return True


def _idle_and_quiet(conn: Conn) -> bool:
    """Whether a statement may be sent on ``conn`` without meeting a session the server has
    ended: open, outside a transaction, and with nothing unasked for waiting to be read. A
    session ended by the server (``pg_terminate_backend``, a restart) says so before it closes;
    a statement sent on it would fail where the pool's session would not. A look at the socket
    (``poll``: any descriptor number), no round trip; whatever goes wrong looking says no."""
    try:
        if conn.closed or conn.broken:
            return False
        pgconn = conn.pgconn
        if pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (psycopg.Error, OSError, ValueError):
        return False
