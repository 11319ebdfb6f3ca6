"""Tenants of a PostgreSQL server: one database role per tenant (namespace), or for the operator,
and for each tenant a database of its own on the server, created, granted, listed, moved and
removed with an administrator's URL.

Why it exists: tenants must not be able to read or change each other's runs, nor delay each other.
PostgreSQL enforces both, not Keelgate. A tenant added here gets a database of its own on the server
(``<home>_<namespace>``, its name in the home database's ``keelgate_databases``): row locks, table
locks (``LOCK TABLE``), advisory locks, migrations and vacuum are then that tenant's alone, and only
its role and the operator's may connect to it. Within any Keelgate database, migration 3
(``_migrations.py``) puts row-level security on every table, keyed by the role a session logged in
as, through ``keelgate_tenants``; this module writes that table, creates the roles and makes their
grants (``postgres.PRIVILEGES``). A tenant of an install from before (registered in the home
database, or with runs there) stays there until ``move`` copies it into a database of its own.
``keelgate tenant add|move|remove|list`` is the command line, which also writes the namespace's
Secret. What the server still shares (sessions, the lock table, connections before authentication)
``add`` bounds where it can: each role gets a connection limit and a lock limit, and ``secure``
closes in each database what its URL may (the raw advisory-lock functions, the views of other
sessions, temporary tables, CONNECT for PUBLIC); ``open_ways`` and ``unbounded`` say, one line each,
what is left open.

A role's password is generated here, sent to the server only as a SCRAM-SHA-256 verifier (so no
server log can hold it), and handed back once, inside the URL the caller puts in the Secret.
This module must never put a password in a message, never touch a role that may bypass
row-level security or administer others, and never delete a tenant's data (``move`` deletes
a tenant's rows from the home database only once they are committed, checked, in its own).

Why one module past 500 lines: it is one administrator's session (``TenantStore``), and what
one step grants another revokes or checks (``add`` grants what ``secure`` and ``remove`` take
back, ``open_ways`` reports what neither could close); read apart, a grant and what undoes it
would be in two places. What can stand alone already does: the copy a ``move`` makes
(``tenant_moves``), the operator's sessions on tenants' databases (``tenant_databases``), the
row-level security DDL (``_isolation_ddl``), the URL a role is given (``url``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import astuple, dataclass
from typing import Any

import psycopg
from psycopg import sql

from keelgate.core.audit import utc_now
from keelgate.errors import InputError, KeelgateError, StoreBusy, StoreError, StoreUnavailable
from keelgate.stores._isolation_ddl import TENANT_TABLES
from keelgate.stores._migrations import DEFAULT_LOCK_LIMIT, TENANT_SPACES
from keelgate.stores.postgres import (
    KINDS,
    LOCK_TIMEOUT,
    MIGRATION_LOCK_TIMEOUT,
    MIGRATION_TRIES,
    _ms,
    _one_line,
    _waited,
    grant,
    migrated,
    revoke,
)
from keelgate.stores.tenant_moves import copy_tenant, digest
from keelgate.stores.url import StoreUrl, read_store_url

# A namespace's name, as Kubernetes allows it (an RFC 1123 label).
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# PostgreSQL keeps 63 bytes of a name and would cut a longer one silently.
ROLE_MAX = 63
ROLE_PREFIX = "keelgate-"
OPERATOR_ROLE = "keelgate-operator"
#: Sessions a role may hold at once on the server (``ALTER ROLE ... CONNECTION LIMIT``), unless
#: ``add`` is told otherwise: a tenant's step pods hold one each (the operator's --max-step-pods
#: is 20 by default); the operator holds, per replica, a pool of up to 9 on the home database
#: and one session on each tenant's database it has used in the last minute, up to 20
#: (``tenant_databases.MOST_OPEN``): 29, and a standby replica as many.
DEFAULT_CONNECTION_LIMITS = {"tenant": 20, "operator": 64}
#: Runs a tenant's sessions may drive at once (its run locks), unless told otherwise.
LOCK_LIMIT = DEFAULT_LOCK_LIMIT
LIMIT_MAX = 10_000
#: Locks a session holds beside those on relations: its owner id, its virtual transaction id,
#: its transaction id, and a margin.
SESSION_LOCKS = 8
#: Seconds an administrator's statement may run (counting a large tenant's rows, a copy).
ADMIN_STATEMENT_TIMEOUT = 300.0

# The pg_catalog functions through which a session takes, or looks at, what every database role
# shares: the advisory-lock family (each overload its own function) and what shows other
# sessions and the locks they hold (pg_stat_activity and pg_locks are views over them). The
# administrator revokes them from PUBLIC in this database (a superuser's right: they belong to
# the bootstrap superuser), and grants them back to the tables' owner, whose functions
# (migration 4) take and judge Keelgate's locks on every role's behalf.
_LOCK_FUNCTIONS = "p.proname ~ '^pg_(try_)?advisory_'"
_SESSION_FUNCTIONS = (
    "p.proname IN ('pg_stat_get_activity', 'pg_lock_status', 'pg_blocking_pids', "
    "'pg_safe_snapshot_blocking_pids', 'pg_stat_get_progress_info') "
    "OR p.proname ~ '^pg_stat_get_backend_'"
)
_CATALOG_FUNCTIONS = (
    "SELECT p.oid::regprocedure::text FROM pg_proc p "
    "WHERE p.pronamespace = 'pg_catalog'::regnamespace AND ({which}) ORDER BY 1"
)


@dataclass(frozen=True)
class Tenant:
    """One registered role: which tenant it is (for the operator, the namespace its Secret is
    in), its kind (``tenant`` or ``operator``), when it was added, the sessions it may hold at
    once (-1: no limit), the runs it may drive at once, and the database of its own a tenant
    keeps its rows in ("": the home database, shared with the tenants left there)."""

    role: str
    tenant: str
    kind: str
    added_at: str
    connection_limit: int = -1
    lock_limit: int = LOCK_LIMIT
    database: str = ""


@dataclass(frozen=True)
class Added:
    """What ``add`` did. ``url`` holds the role's password only when one was set (``password``
    is then True); otherwise the caller keeps the URL it has."""

    tenant: Tenant
    created: bool  # the role was created (False: it existed)
    password: bool  # a new password was set, and ``url`` carries it
    url: str
    # Ways the role could still delay or deny another tenant here, one line each (what the
    # administrator could not close with this URL, or must close on the server itself).
    open: tuple[str, ...] = ()
    # What PostgreSQL cannot bound per role on this server, and the settings that close it.
    unbounded: tuple[str, ...] = ()


@dataclass(frozen=True)
class Kept:
    """A tenant's rows, which ``remove`` leaves in the store."""

    runs: int
    keys: int
    events: int
    specs: int

    def words(self) -> str:
        return (
            f"{self.runs} run(s), {self.keys} idempotency key(s), {self.events} audit event(s) "
            f"and {self.specs} recorded spec(s)"
        )


@dataclass(frozen=True)
class Removed:
    """What ``remove`` did for one role."""

    tenant: Tenant
    dropped: bool  # the role is gone (False: it has rights elsewhere, and was only revoked here)
    sessions: int  # its sessions on its database that were ended
    kept: Kept


@dataclass(frozen=True)
class Moved:
    """What ``move`` did: the tenant's rows, copied into its database of its own and checked
    there, then deleted from the home database."""

    tenant: str
    database: str
    kept: Kept


def check_namespace(namespace: str, *, field: str = "NAMESPACE") -> None:
    """A tenant is a namespace: refuse a name Kubernetes would not accept."""
    if not _NAMESPACE.fullmatch(namespace):
        raise InputError(
            field,
            "must be a namespace name: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit",
        )


def default_role(namespace: str, kind: str) -> str:
    """``keelgate-<namespace>`` for a tenant (a long name is shortened with a digest of it, so
    it stays unique and within PostgreSQL's 63 bytes); ``keelgate-operator`` for the operator."""
    if kind == "operator":
        return OPERATOR_ROLE
    role = ROLE_PREFIX + namespace
    if len(role) <= ROLE_MAX:
        return role
    digest = hashlib.sha256(namespace.encode()).hexdigest()[:8]
    return f"{role[: ROLE_MAX - 9]}-{digest}"


def check_role(role: str) -> None:
    if not role or len(role.encode()) > ROLE_MAX:
        raise InputError("--role", f"must be 1 to {ROLE_MAX} bytes long")
    if role.startswith("pg_") or any(ord(c) < 32 or ord(c) == 127 for c in role):
        raise InputError("--role", "must not start with pg_ or hold control characters")


def new_password() -> str:
    """A password to put in a URL as it is: 256 random bits in URL-safe characters."""
    return secrets.token_urlsafe(32)


def scram_verifier(password: str, *, iterations: int = 4096) -> str:
    """What PostgreSQL stores for a SCRAM-SHA-256 password (RFC 5802/7677, as libpq's
    ``PQencryptPasswordConn`` makes it): the server is sent this, never the password."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def tenant_database(home: str, namespace: str) -> str:
    """The database of a tenant's own beside the home database ``home``: ``<home>_<namespace>``
    (a long one shortened with a digest of the namespace, unique within PostgreSQL's 63 bytes),
    so that two Keelgate installations on one server never share one."""
    name = f"{home}_{namespace}"
    if len(name.encode()) <= ROLE_MAX:
        return name
    digest = hashlib.sha256(namespace.encode()).hexdigest()[:8]
    keep = ROLE_MAX - 10
    return f"{name.encode()[:keep].decode(errors='ignore')}_{digest}"


def check_limit(value: int | None, field: str) -> None:
    """``--connection-limit`` and ``--lock-limit``: a count from 1 to LIMIT_MAX."""
    if value is not None and not 1 <= value <= LIMIT_MAX:
        raise InputError(field, f"must be a number from 1 to {LIMIT_MAX}")


def check_host(host: str) -> None:
    """``--host``: a host name or address, with an optional port; nothing else."""
    if host and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?", host):
        raise InputError("--host", "must be HOST or HOST:PORT")


class TenantStore:
    """The administrator's session on a Keelgate home database: migrates it on opening (as any
    store does), then adds, moves, removes and lists the roles of its tenants and their
    databases, each of which it opens (and migrates) as it needs it.

    The administrator must be able to create roles (``CREATEROLE``, or a superuser) and
    databases (``CREATEDB``) and own the Keelgate tables (it grants rights on them); the
    database's owner, who created them, does.
    """

    def __init__(self, url: str | StoreUrl, *, connect_timeout: int = 10) -> None:
        self.url = read_store_url(url)
        params = self.url.params
        self.target, self._secret = self.url.target, self.url.password
        self._timeout: dict[str, Any] = (
            {} if "connect_timeout" in params else {"connect_timeout": connect_timeout}
        )
        # The administrator's sessions on tenants' databases, opened (and migrated) when needed.
        self._elsewhere: dict[str, psycopg.Connection[tuple[Any, ...]]] = {}
        self.conn = self._connect(self.url)
        self.home = str(self.conn.info.dbname)
        try:
            migrated(self.conn, self.target)
            self._check_administrator()
        except psycopg.Error as error:
            self.conn.close()
            raise StoreError(self._words(error)) from None
        except BaseException:
            self.conn.close()
            raise

    def _connect(self, url: StoreUrl) -> psycopg.Connection[tuple[Any, ...]]:
        try:
            conn: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(
                autocommit=True, **url.params, **self._timeout
            )
        except psycopg.Error as error:
            raise StoreUnavailable(self._words(error)) from None
        try:
            # The administrator's waits are bounded as every store session's are.
            conn.execute(
                "SELECT set_config('lock_timeout', %s, false), "
                "set_config('statement_timeout', %s, false)",
                (_ms(LOCK_TIMEOUT), _ms(ADMIN_STATEMENT_TIMEOUT)),
            )
        except psycopg.Error as error:
            conn.close()
            raise StoreError(self._words(error)) from None
        return conn

    def close(self) -> None:
        for conn in self._elsewhere.values():
            conn.close()
        self._elsewhere.clear()
        self.conn.close()

    def __enter__(self) -> TenantStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _words(self, error: BaseException) -> str:
        return f"PostgreSQL store {self.target}: {_one_line(error, self._secret)}"

    def _check_administrator(self) -> None:
        row = self.conn.execute(
            "SELECT r.rolsuper OR r.rolcreaterole, "
            "r.rolsuper OR pg_has_role(c.relowner, 'USAGE') FROM pg_roles r, pg_class c "
            "WHERE r.rolname = current_user AND c.oid = 'keelgate_tenants'::regclass"
        ).fetchone()
        user = self.conn.info.user
        if row is None or not row[0]:
            raise InputError(
                "--store",
                f"role {user} may not create roles (CREATEROLE): give the URL of the "
                "database's owner or another administrator",
            )
        if not row[1]:
            raise InputError(
                "--store",
                f"role {user} does not own Keelgate's tables: give the URL of the role that "
                "created them (the database's owner)",
            )

    @contextmanager
    def _transaction(
        self, conn: psycopg.Connection[tuple[Any, ...]] | None = None
    ) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        conn = conn or self.conn
        try:
            with conn.transaction():
                yield conn
        except psycopg.Error as error:
            raise self._failed(error) from None

    def _failed(self, error: psycopg.Error) -> StoreError:
        waited = _waited(error)
        if waited is not None:
            seconds = LOCK_TIMEOUT if waited == "lock_timeout" else ADMIN_STATEMENT_TIMEOUT
            return StoreBusy(f"PostgreSQL store {self.target}", "", waited=waited, seconds=seconds)
        return StoreError(self._words(error))

    # The tenants' own databases

    def database_url(self, database: str) -> StoreUrl:
        """The administrator's URL, on ``database`` of the same server."""
        return self.url.on_database(database)

    def on(
        self, database: str, *, tries: int = MIGRATION_TRIES
    ) -> psycopg.Connection[tuple[Any, ...]]:
        """The administrator's session on ``database`` (the home one, or a tenant's), opened
        and brought to today's schema (its migration tried ``tries`` times) the first time it
        is asked for."""
        if not database or database == self.home:
            return self.conn
        conn = self._elsewhere.get(database)
        if conn is None:
            conn = self._connect(self.database_url(database))
            try:
                migrated(conn, f"{self.target.rsplit('/', 1)[0]}/{database}", tries=tries)
            except BaseException:
                conn.close()
                raise
            self._elsewhere[database] = conn
        return conn

    def migrate_tenants(self) -> list[str]:
        """Bring every tenant's database to today's schema (the home one is, since this store
        opened), each with a migration's bounded waits; one line for each that could not be
        (a tenant's open transaction holding off its migration), the others migrated all the
        same: a tenant can hold up only its own. Each is tried once first, and those held up
        are tried again after, so that no tenant's migration waits behind another's tries."""
        held: dict[str, str] = {}
        for tenant, database in self.routes().items():
            try:
                self.on(database, tries=1)
            except StoreBusy:
                held[tenant] = database
        problems = []
        for tenant, database in held.items():
            try:
                self.on(database)
            except KeelgateError as error:
                problems.append(f"tenant {tenant}'s database {database}: {error}")
        return problems

    def routes(self) -> dict[str, str]:
        """Each tenant with a database of its own, and that database."""
        rows = self._rows("SELECT tenant, database FROM keelgate_databases ORDER BY 1")
        return {str(tenant): str(database) for tenant, database in rows}

    def database_of(self, tenant: str) -> str:
        """The database ``tenant``'s rows are in: its own, or "" for the home database."""
        rows = self._rows("SELECT database FROM keelgate_databases WHERE tenant = %s", (tenant,))
        return str(rows[0][0]) if rows else ""

    def _create_database(self, database: str) -> None:
        """Create ``database`` for a tenant (if it is not there: an ``add`` cut short left it),
        open to nobody but those granted CONNECT, and bring it to today's schema."""
        may = self._rows(
            "SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user"
        )
        exists = self._rows("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        if not exists:
            if not (may and may[0][0]):
                raise InputError(
                    "--store",
                    f"role {self.conn.info.user} may not create databases (CREATEDB), and each "
                    "tenant gets a database of its own: give it CREATEDB, or keep the tenant in "
                    "the home database with --shared-database (tenants there can delay each "
                    "other)",
                )
            try:
                self.conn.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)).as_string(None)
                )
            except psycopg.errors.DuplicateDatabase:
                pass  # another administrator's add, at the same moment
            except psycopg.Error as error:
                raise self._failed(error) from None
        try:
            self.conn.execute(
                sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC")
                .format(sql.Identifier(database))
                .as_string(None)
            )
        except psycopg.Error as error:
            raise self._failed(error) from None
        there = self.on(database)
        found = there.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = current_schema() "
            "AND c.relname NOT LIKE 'keelgate\\_%%'"
        ).fetchone()
        if found is not None and found[0]:
            raise InputError(
                "NAMESPACE",
                f"database {database} on the server holds tables that are not Keelgate's: it "
                "is someone else's; remove or rename it first",
            )

    def _register_there(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        registered: Tenant,
    ) -> None:
        """Register ``registered`` in the database behind ``conn`` (a tenant's own), with the
        rights of its kind there; the caller's transaction."""
        conn.execute(
            "INSERT INTO keelgate_tenants (role, tenant, kind, added_at, space, lock_limit) "
            "SELECT %s, %s, %s, %s, CASE WHEN %s = 'tenant' THEN "
            "COALESCE((SELECT max(space) FROM keelgate_tenants), %s) + 1 END, %s "
            "ON CONFLICT (role) DO UPDATE SET lock_limit = excluded.lock_limit",
            (
                registered.role,
                registered.tenant,
                registered.kind,
                registered.added_at,
                registered.kind,
                TENANT_SPACES,
                registered.lock_limit,
            ),
        )
        grant(conn, registered.role, registered.kind)

    def _furnish(self, database: str, tenant: str) -> None:
        """Make ``database`` ready for ``tenant``: its role and every operator's role
        registered and granted there, and what the server shares closed there as far as this
        URL may. Idempotent."""
        there = self.on(database)
        roles = [
            t
            for t in self.tenants()
            if t.kind == "operator" or (t.tenant, t.database) == (tenant, database)
        ]
        with self._transaction(there) as conn:
            conn.execute("LOCK TABLE keelgate_tenants IN SHARE ROW EXCLUSIVE MODE")
            for registered in roles:
                if self.role_exists(registered.role):
                    self._register_there(conn, registered)
            self.secure(conn)

    # Reading

    def _rows(
        self,
        query: str | sql.Composed,
        params: tuple[Any, ...] = (),
        *,
        on: psycopg.Connection[tuple[Any, ...]] | None = None,
    ) -> list[Any]:
        try:
            return (on or self.conn).execute(query, params).fetchall()
        except psycopg.Error as error:
            raise self._failed(error) from None

    def tenants(self) -> list[Tenant]:
        """Every registered role, by tenant then role."""
        rows = self._rows(
            f"SELECT {_TENANT_COLUMNS} FROM keelgate_tenants t "
            "LEFT JOIN pg_roles r ON r.rolname = t.role "
            "LEFT JOIN keelgate_databases d ON d.tenant = t.tenant AND t.kind = 'tenant' "
            'ORDER BY t.tenant COLLATE "C", t.role COLLATE "C"'
        )
        return [_tenant(row) for row in rows]

    def unregistered(self) -> list[str]:
        """Tenants with runs in the home database but no role: reachable only through a
        shared URL."""
        rows = self._rows(
            "SELECT tenant FROM keelgate_checkpoints WHERE tenant NOT IN "
            "(SELECT tenant FROM keelgate_tenants WHERE kind = 'tenant') "
            'GROUP BY tenant ORDER BY tenant COLLATE "C"'
        )
        return [str(row[0]) for row in rows]

    def kept(self, tenant: str, *, database: str | None = None) -> Kept:
        """How many rows of each kind ``tenant`` has in its database (or in ``database``)."""
        where = self.on(self.database_of(tenant) if database is None else database)
        counts = [
            int(
                self._rows(
                    sql.SQL("SELECT count(*) FROM {} WHERE tenant = %s").format(
                        sql.Identifier(table)
                    ),
                    (tenant,),
                    on=where,
                )[0][0]
            )
            for table in TENANT_TABLES
        ]
        return Kept(*counts)

    def password_works(self, role: str, password: str, *, database: str = "") -> bool:
        """Whether ``role`` logs in with ``password`` here (through the administrator's host),
        on ``database`` (default: the home database)."""
        url = self.database_url(database) if database else self.url
        try:
            conn = psycopg.connect(
                **{**url.params, "user": role, "password": password, "connect_timeout": "10"}
            )
        except psycopg.Error:
            return False
        with conn:
            row = conn.execute("SELECT current_user = %s", (role,)).fetchone()
        return row is not None and bool(row[0])

    # Changing

    def add(
        self,
        tenant: str,
        *,
        kind: str = "tenant",
        role: str = "",
        working_password: str = "",
        rotate: bool = False,
        host: str = "",
        new_url: bool = False,
        connection_limit: int | None = None,
        lock_limit: int | None = None,
        shared: bool = False,
    ) -> Added:
        """Make ``role`` (default ``default_role``) the role of ``tenant``, with exactly its
        kind's rights. Idempotent: an existing role keeps its password when
        ``working_password`` logs in as it (the URL the caller already holds) and ``rotate``
        is not asked; otherwise it gets a new one, and the result's URL carries it.
        ``new_url`` asks for a URL with a password (``--print``): for a role that exists, that
        needs ``rotate``, since its password cannot be read back.

        A tenant new to this store gets a database of its own (``tenant_database``), which only
        its role and the operator's may use; ``shared`` keeps it in the home database instead,
        as does a tenant registered there before or with rows there (``move`` moves it). The
        operator's role is registered in every tenant's database.

        ``connection_limit`` (sessions at once, on the whole server) and ``lock_limit`` (runs
        driven at once) bound what the role can take; left out, a role keeps the limits it has
        (a new one, or one without a connection limit, gets the defaults). Every ``add`` also
        closes, as far as this URL may, the ways one role could delay another through what the
        server shares (``secure``); ``Added.open`` says what it could not close, and
        ``Added.unbounded`` what PostgreSQL cannot bound."""
        role = _role_to_add(tenant, kind, role, host, connection_limit, lock_limit)
        database = self._placement(tenant, shared=shared) if kind == "tenant" else ""
        if database:
            self._create_database(database)
        with self._transaction() as conn:
            # One administrator at a time: two adds of one tenant must not both create.
            conn.execute("LOCK TABLE keelgate_tenants IN SHARE ROW EXCLUSIVE MODE")
            registered = self._registered(role)
            self._refuse_rebinding(role, tenant, kind, registered)
            exists = self._check_existing(role)
            if exists and new_url and not rotate:
                raise InputError(
                    "--rotate",
                    f"role {role} exists and its password cannot be read back: --rotate sets a "
                    "new one (URLs holding the old one then stop working)",
                )
            password = ""
            if (
                not exists
                or rotate
                or not (
                    working_password
                    and self.password_works(role, working_password, database=database)
                )
            ):
                password = new_password()
            _log_in_with(conn, role, password, exists=exists)
            self._limit_connections(conn, role, kind, connection_limit)
            self._register(conn, role, tenant, kind, database, registered, lock_limit)
            self.secure(conn)
        if database:
            self._furnish(database, tenant)
        elif kind == "operator":
            for tenant_of, routed in self.routes().items():
                self._furnish(routed, tenant_of)
        url = self.url.with_login(role, password, host=host, database=database) if password else ""
        registered = self._registered(role)
        assert registered is not None
        return Added(
            registered,
            not exists,
            bool(password),
            url,
            tuple(self.open_ways(role)),
            tuple(self.unbounded()),
        )

    def _refuse_rebinding(
        self, role: str, tenant: str, kind: str, registered: Tenant | None
    ) -> None:
        """Refuse to make ``role`` the role of ``tenant`` when it is registered as someone
        else's, or when the tenant has another role already."""
        if registered is not None and (registered.tenant, registered.kind) != (tenant, kind):
            raise InputError(
                "--role",
                f"role {role} is registered as {_kind_words(registered)}; "
                f"remove that first (`keelgate tenant remove {registered.tenant}`)",
            )
        if kind == "tenant":
            other = self._role_of(tenant)
            if other is not None and other != role:
                raise InputError(
                    "--role",
                    f"tenant {tenant} has role {other} already: give --role {other}, or "
                    f"remove it first (`keelgate tenant remove {tenant}`)",
                )

    def _limit_connections(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        role: str,
        kind: str,
        connection_limit: int | None,
    ) -> None:
        """``role``'s sessions bounded by ``connection_limit``; left out, the limit it has, or
        its kind's default when it has none."""
        connections = connection_limit
        if connections is None:
            current = self._rows("SELECT rolconnlimit FROM pg_roles WHERE rolname = %s", (role,))
            kept = int(current[0][0]) if current else -1
            connections = kept if kept > 0 else DEFAULT_CONNECTION_LIMITS[kind]
        conn.execute(
            sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}")
            .format(sql.Identifier(role), sql.Literal(connections))
            .as_string(conn)
        )

    def _register(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        role: str,
        tenant: str,
        kind: str,
        database: str,
        registered: Tenant | None,
        lock_limit: int | None,
    ) -> None:
        """``role`` registered as ``tenant``'s (its run locks' key space, its lock limit, its
        database), with exactly its kind's rights here."""
        added_at = registered.added_at if registered is not None else utc_now()
        locks = lock_limit or (registered.lock_limit if registered is not None else LOCK_LIMIT)
        # A tenant's run locks are taken in a key space of its own (migration 4).
        conn.execute(
            "INSERT INTO keelgate_tenants (role, tenant, kind, added_at, space, lock_limit) "
            "SELECT %s, %s, %s, %s, CASE WHEN %s = 'tenant' THEN "
            "COALESCE((SELECT max(space) FROM keelgate_tenants), %s) + 1 END, %s "
            "ON CONFLICT (role) DO UPDATE SET lock_limit = excluded.lock_limit",
            (role, tenant, kind, added_at, kind, TENANT_SPACES, locks),
        )
        if database:
            # Its rows are in its own database from now on; here it may do nothing.
            revoke(conn, role)
            conn.execute(
                "INSERT INTO keelgate_databases (tenant, database) VALUES (%s, %s) "
                "ON CONFLICT (tenant) DO NOTHING",
                (tenant, database),
            )
        else:
            grant(conn, role, kind)

    def _placement(self, tenant: str, *, shared: bool) -> str:
        """Where ``tenant``'s rows go: the database of its own it has, or a new one, or ""
        (the home database) when asked, or when it is registered here already or has rows
        here (an install from before: ``move`` moves it)."""
        routed = self.database_of(tenant)
        if routed or shared:
            return routed
        if self._role_of(tenant) is not None or any(astuple(self.kept(tenant, database=""))):
            return ""
        return tenant_database(self.home, tenant)

    # What the server shares

    def _superuser(self) -> bool:
        row = self._rows("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        return bool(row and row[0][0])

    def secure(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Close, in the database behind ``conn``, what this administrator may of the ways one
        role could delay or deny another through what every role shares (idempotent):

        - the raw advisory-lock functions and the views of other sessions and their locks are
          revoked from PUBLIC, and granted to the tables' owner, whose functions take and judge
          Keelgate's locks (a superuser's right: they belong to the bootstrap superuser);
        - temporary tables are refused to PUBLIC (each holds a lock in the server's shared lock
          table until its transaction ends; the database's owner or a superuser may);
        - so is CONNECT: a role reaches a Keelgate database only where ``grant`` let it.

        What it cannot do is reported by ``open_ways``."""
        owner = self._rows(
            "SELECT c.relowner::regrole::text, r.rolsuper FROM pg_class c "
            "JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = 'keelgate_tenants'::regclass",
            on=conn,
        )[0]
        owner_role, owner_is_superuser = str(owner[0]), bool(owner[1])
        if self._superuser():
            which = f"{_LOCK_FUNCTIONS} OR {_SESSION_FUNCTIONS}"
            for (function,) in self._rows(_CATALOG_FUNCTIONS.format(which=which), on=conn):
                # A regprocedure's text is a quoted, qualified signature: never input.
                conn.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
                if not owner_is_superuser:
                    conn.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {owner_role}")
        may = self._rows(
            "SELECT r.rolsuper OR pg_has_role(d.datdba, 'USAGE') FROM pg_roles r, pg_database d "
            "WHERE r.rolname = current_user AND d.datname = current_database()",
            on=conn,
        )
        if may and may[0][0]:
            database = sql.Identifier(str(conn.info.dbname))
            conn.execute(
                sql.SQL("REVOKE TEMPORARY, CONNECT ON DATABASE {} FROM PUBLIC")
                .format(database)
                .as_string(conn)
            )

    def open_ways(self, role: str) -> list[str]:
        """The ways ``role`` could still delay or deny another tenant through what the server
        shares, one line each; [] when none is left that Keelgate can see."""
        registered = self._registered(role)
        database = registered.database if registered is not None else ""
        there = self.on(database)
        ways: list[str] = []
        if registered is not None and registered.kind == "tenant" and not database:
            ways.append(
                f"tenant {registered.tenant} keeps its rows in database {self.home}, shared "
                "with the other tenants there: their sessions can delay its statements (LOCK "
                f"TABLE, open transactions before a migration), each wait ending after "
                f"{LOCK_TIMEOUT:g} s with an error; `keelgate tenant move {registered.tenant}` "
                "gives it a database of its own"
            )
        ways += self._function_ways(role, there)
        ways += self._database_ways(role, there)
        ways += self._budget_ways()
        return ways

    def _function_ways(self, role: str, there: psycopg.Connection[tuple[Any, ...]]) -> list[str]:
        """The functions every role may call unless revoked that reach other sessions: the
        advisory locks, the views of every session and lock."""

        def functions(which: str) -> list[str]:
            query = _CATALOG_FUNCTIONS.format(
                which=f"({which}) AND has_function_privilege(%s, p.oid, 'EXECUTE')"
            )
            return [str(row[0]).split("(", 1)[0] for row in self._rows(query, (role,), on=there)]

        ways: list[str] = []
        locks = sorted(set(functions(_LOCK_FUNCTIONS)))
        if locks:
            ways.append(
                f"role {role} may call the advisory-lock functions ({', '.join(locks)}): it can "
                "hold another tenant's locks; revoke them from PUBLIC with a superuser's URL "
                "(`keelgate tenant add` does)"
            )
        if functions(_SESSION_FUNCTIONS):
            ways.append(
                f"role {role} sees every session and lock on the server (pg_stat_activity, "
                "pg_locks); revoke them from PUBLIC with a superuser's URL (`keelgate tenant "
                "add` does)"
            )
        return ways

    def _database_ways(self, role: str, there: psycopg.Connection[tuple[Any, ...]]) -> list[str]:
        """What ``role`` may do in its database and beyond that takes from what others share:
        temporary tables, objects in a schema, other databases, sessions without a limit,
        prepared transactions."""
        ways: list[str] = []
        facts = self._rows(
            "SELECT has_database_privilege(%s, current_database(), 'TEMPORARY'), r.rolconnlimit, "
            "current_setting('max_prepared_transactions')::integer FROM pg_roles r "
            "WHERE r.rolname = %s",
            (role, role),
            on=there,
        )
        temporary, connections, prepared = facts[0] if facts else (False, -1, 0)
        if temporary:
            ways.append(
                f"role {role} may create temporary tables here, each a lock in the server's "
                "shared lock table: `REVOKE TEMPORARY ON DATABASE ... FROM PUBLIC` as the "
                "database's owner (`keelgate tenant add` does)"
            )
        schemas = [
            str(row[0])
            for row in self._rows(
                "SELECT nspname FROM pg_namespace WHERE has_schema_privilege(%s, oid, 'CREATE') "
                "ORDER BY 1",
                (role,),
                on=there,
            )
        ]
        if schemas:
            ways.append(
                f"role {role} may create objects in schema {', '.join(schemas)}: revoke CREATE "
                "there from PUBLIC"
            )
        databases = [
            str(row[0])
            for row in self._rows(
                "SELECT datname FROM pg_database WHERE datallowconn "
                "AND datname <> current_database() "
                "AND has_database_privilege(%s, datname, 'CONNECT') ORDER BY 1",
                (role,),
                on=there,
            )
        ]
        if databases:
            ways.append(
                f"role {role} may connect to database(s) {', '.join(databases)}, where it can "
                "fill the lock table every database shares (unless `keelgate tenant add` secured "
                "it too): `REVOKE CONNECT ON DATABASE ... FROM PUBLIC` there as a superuser, or "
                "refuse it in pg_hba.conf"
            )
        if int(connections) < 0:
            ways.append(f"role {role} has no connection limit: give it --connection-limit")
        if int(prepared) > 0:
            ways.append(
                f"the server allows prepared transactions (max_prepared_transactions = "
                f"{prepared}): a role can keep locks after its sessions end; set it to 0"
            )
        return ways

    def _budget_ways(self) -> list[str]:
        """Whether the registered roles' limits together fit the server: its sessions, its
        lock table."""
        ways: list[str] = []
        sums = self._rows(
            "SELECT COALESCE(sum(r.rolconnlimit), 0), bool_or(r.rolconnlimit < 0), "
            "current_setting('max_connections')::integer "
            "- current_setting('superuser_reserved_connections')::integer "
            "FROM keelgate_tenants t JOIN pg_roles r ON r.rolname = t.role"
        )
        total, unlimited, room = sums[0]
        if not unlimited and int(total) > int(room):
            ways.append(
                f"the registered roles may hold {total} sessions together, more than the "
                f"{room} the server has for them (max_connections): together they can crowd "
                "each other out; lower their --connection-limit or raise max_connections"
            )
        if not unlimited:
            held, slots, per_transaction = self.lock_budget()
            if held > slots:
                ways.append(
                    f"the tenants' sessions may hold {held} locks together, more than the "
                    f"server's lock table ({slots}): set max_locks_per_transaction to at least "
                    f"{per_transaction}, or lower their --connection-limit"
                )
        return ways

    def unbounded(self) -> list[str]:
        """What PostgreSQL cannot bound per role on this server, one line each with the
        settings that close it: connections that have not logged in yet count against
        ``max_connections`` for everyone, whoever opened them."""
        version, authentication = self._rows(
            "SELECT current_setting('server_version_num')::integer, "
            "current_setting('authentication_timeout')"
        )[0]
        before = (
            "a client that can reach the server can hold every connection slot before it logs "
            "in (no per-role limit applies then), each for authentication_timeout "
            f"({authentication}): put a pooler that authenticates first in front (PgBouncer's "
            "max_client_conn), keep the server off untrusted networks, lower "
            "authentication_timeout"
        )
        if int(version) < 160000:
            return [
                f"{before}; PostgreSQL 16+ can also keep slots for the operator "
                "(reserved_connections, pg_use_reserved_connections)"
            ]
        reserved, unreserved = self._rows(
            "SELECT current_setting('reserved_connections')::integer, EXISTS (SELECT 1 FROM "
            "keelgate_tenants t JOIN pg_roles r ON r.rolname = t.role WHERE t.kind = 'operator' "
            "AND NOT pg_has_role(r.oid, 'pg_use_reserved_connections', 'USAGE'))"
        )[0]
        if int(reserved) == 0 or unreserved:
            return [
                f"{before}; and keep slots for the operator: set reserved_connections and "
                "GRANT pg_use_reserved_connections TO its role"
            ]
        return []

    def lock_bound(self, role: str) -> int:
        """The most locks ``role``'s sessions can hold at once in the server's shared lock
        table: per session, one on each relation it may read (with their indexes and TOAST
        tables) in its database, its owner id and a few of its own; and its run locks (its
        lock limit)."""
        registered = self._registered(role)
        there = self.on(registered.database if registered is not None else "")
        rows = self._rows(
            "SELECT r.rolconnlimit, COALESCE(t.lock_limit, 0), "
            "(SELECT count(*) FROM pg_class c WHERE has_table_privilege(r.rolname, c.oid, "
            "'SELECT')) + (SELECT count(*) FROM pg_index i WHERE has_table_privilege(r.rolname, "
            "i.indrelid, 'SELECT')) + (SELECT count(*) FROM pg_class c WHERE c.reltoastrelid <> 0 "
            "AND has_table_privilege(r.rolname, c.oid, 'SELECT')) "
            "FROM pg_roles r LEFT JOIN keelgate_tenants t ON t.role = r.rolname "
            "AND t.kind = 'tenant' WHERE r.rolname = %s",
            (role,),
            on=there,
        )
        if not rows:
            return 0
        connections, runs, relations = (int(v) for v in rows[0])
        return max(connections, 0) * (relations + SESSION_LOCKS) + runs

    def lock_budget(self) -> tuple[int, int, int]:
        """What the tenants' roles' sessions may hold in the shared lock table together
        (``lock_bound`` of each: what their code could take if it tried), its size, and the
        ``max_locks_per_transaction`` that would make it large enough. The operator's role
        runs Keelgate's own code, and is not counted at its worst. Tenants with databases of
        their own have the same relations in each: one of them is counted for all."""
        roles = [t for t in self.tenants() if t.kind == "tenant" and t.connection_limit >= 0]
        held = 0
        per_session_own: int | None = None
        for tenant in roles:
            if not tenant.database:
                held += self.lock_bound(tenant.role)
                continue
            if per_session_own is None:
                bound = self.lock_bound(tenant.role) - tenant.lock_limit
                per_session_own = bound // max(tenant.connection_limit, 1)
            held += tenant.connection_limit * per_session_own + tenant.lock_limit
        row = self._rows(
            "SELECT current_setting('max_locks_per_transaction')::integer, "
            "current_setting('max_connections')::integer "
            "+ current_setting('max_prepared_transactions')::integer"
        )[0]
        per_transaction, backends = int(row[0]), int(row[1])
        return held, per_transaction * backends, max(per_transaction, -(-held // backends))

    def remove(self, tenant: str) -> list[Removed]:
        """Take away every role registered for ``tenant``: its row in the lookups, its rights
        here and in its database, its sessions there, and the role itself unless it has rights
        elsewhere. The tenant's rows stay (``Removed.kept``), and so does its database: nothing
        is deleted."""
        check_namespace(tenant)
        database = self.database_of(tenant)
        done: list[Removed] = []
        with self._transaction() as conn:
            conn.execute("LOCK TABLE keelgate_tenants IN SHARE ROW EXCLUSIVE MODE")
            gone = [t for t in self.tenants() if t.tenant == tenant]
            for registered in gone:
                conn.execute("DELETE FROM keelgate_tenants WHERE role = %s", (registered.role,))
                if self.role_exists(registered.role):
                    revoke(conn, registered.role)
        # The tenant's database; for an operator's role, every tenant's it was registered in.
        elsewhere = [database] if database else []
        if any(registered.kind == "operator" for registered in gone):
            elsewhere = sorted(set(self.routes().values()))
        for where in elsewhere if gone else []:
            with self._transaction(self.on(where)) as there:
                for registered in gone:
                    there.execute(
                        "DELETE FROM keelgate_tenants WHERE role = %s", (registered.role,)
                    )
                    if self.role_exists(registered.role):
                        revoke(there, registered.role)
        kept = self.kept(tenant)
        for registered in gone:
            sessions = sum(
                self._end_sessions(registered.role, where)
                for where in dict.fromkeys([database or self.home, *elsewhere])
            )
            dropped = self._drop(registered.role)
            done.append(Removed(registered, dropped, sessions, kept))
        return done

    def move(self, tenant: str, *, patience: float = 30.0) -> Moved:
        """Move ``tenant``'s rows from the home database into a database of its own (created
        as ``add`` creates it), for an install from before: copied, checked row for row, then
        deleted here in the transaction that routes the tenant to its database. Refused while
        a session of the tenant's role, of an operator's role or of the tables' owner (a shared
        URL) other than this one is on the home database: whatever they wrote meanwhile would
        be left behind. The tenant must be registered (``add``) first. Idempotent: a tenant
        moved already is left as it is."""
        check_namespace(tenant)
        role = self._role_of(tenant)
        if role is None:
            raise InputError(
                "NAMESPACE",
                f"tenant {tenant} has no role yet: `keelgate tenant add {tenant}` first",
            )
        routed = self.database_of(tenant)
        if routed:
            return Moved(tenant, routed, self.kept(tenant))
        self._refuse_writers(tenant)
        database = tenant_database(self.home, tenant)
        self._create_database(database)
        with self._transaction() as conn:
            # Its sessions here end, and it may open none: only the copy writes its rows now.
            revoke(conn, role)
        self._end_sessions(role, self.home)
        there = self.on(database)
        give_up = time.monotonic() + patience
        while True:
            copied = copy_tenant(self.conn, there, tenant)
            try:
                with self._transaction() as conn:
                    # Nobody writes these tables for the next milliseconds: the rows checked
                    # are the rows deleted. A wait for that is bounded like a migration's.
                    conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        (_ms(MIGRATION_LOCK_TIMEOUT),),
                    )
                    for table in TENANT_TABLES:
                        conn.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
                    if digest(conn, tenant) != copied:
                        raise _Changed()
                    conn.execute(
                        "INSERT INTO keelgate_databases (tenant, database) VALUES (%s, %s)",
                        (tenant, database),
                    )
                    for table in TENANT_TABLES:
                        conn.execute(f"DELETE FROM {table} WHERE tenant = %s", (tenant,))
                break
            except (_Changed, StoreBusy):
                if time.monotonic() > give_up:
                    raise StoreBusy(
                        f"PostgreSQL store {self.target}",
                        f"moving tenant {tenant} (its rows kept changing, or the tables stayed "
                        "locked)",
                        waited="lock_timeout",
                        seconds=patience,
                    ) from None
                time.sleep(0.5)
        self._furnish(database, tenant)
        return Moved(tenant, database, self.kept(tenant))

    def _refuse_writers(self, tenant: str) -> None:
        """Refuse a move while someone other than the tenant's own role (whose sessions the
        move ends) could be writing the tenant's rows here: the operator, a shared URL."""
        rows = self._rows(
            "SELECT a.usename, count(*) FROM pg_stat_activity a WHERE a.datname = "
            "current_database() AND a.pid <> pg_backend_pid() AND (a.usename IN (SELECT t.role "
            "FROM keelgate_tenants t WHERE t.kind = 'operator') OR a.usename = (SELECT "
            "c.relowner::regrole::text FROM pg_class c WHERE c.oid = "
            "'keelgate_tenants'::regclass)) GROUP BY 1 ORDER BY 1"
        )
        if rows:
            who = ", ".join(f"{count} of role {user}" for user, count in rows)
            raise InputError(
                "NAMESPACE",
                f"sessions that may write tenant {tenant}'s rows are on database {self.home} "
                f"({who}): stop the operator (scale it to 0) and the processes using a shared "
                "URL, then move it",
            )

    # Helpers

    def _registered(self, role: str) -> Tenant | None:
        rows = self._rows(
            f"SELECT {_TENANT_COLUMNS} FROM keelgate_tenants t "
            "LEFT JOIN pg_roles r ON r.rolname = t.role "
            "LEFT JOIN keelgate_databases d ON d.tenant = t.tenant AND t.kind = 'tenant' "
            "WHERE t.role = %s",
            (role,),
        )
        return _tenant(rows[0]) if rows else None

    def _role_of(self, tenant: str) -> str | None:
        rows = self._rows(
            "SELECT role FROM keelgate_tenants WHERE tenant = %s AND kind = 'tenant'", (tenant,)
        )
        return str(rows[0][0]) if rows else None

    def role_exists(self, role: str) -> bool:
        """Whether the server has a role of that name (roles belong to the server, not to one
        database)."""
        return bool(self._rows("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)))

    def _check_existing(self, role: str) -> bool:
        """Whether ``role`` exists; refuse one that row-level security would not hold, or that
        could act as someone else (a tenant's role must be a plain login role)."""
        rows = self._rows(
            "SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolreplication, "
            "rolcanlogin, EXISTS (SELECT 1 FROM pg_auth_members m WHERE m.member = r.oid) "
            "FROM pg_roles r WHERE rolname = %s",
            (role,),
        )
        if not rows:
            return False
        superuser, bypass, createrole, createdb, replication, login, member = rows[0]
        if role == self.conn.info.user or superuser or bypass:
            raise InputError(
                "--role", f"role {role} bypasses row-level security: it cannot be a tenant's"
            )
        if createrole or createdb or replication or member:
            raise InputError(
                "--role",
                f"role {role} may do more than a tenant's role (it may create roles or "
                "databases, replicate, or is a member of another role): choose another --role",
            )
        if not login:
            raise InputError("--role", f"role {role} cannot log in")
        return True

    def _end_sessions(self, role: str, database: str) -> int:
        """End the role's sessions on ``database`` (its rights are gone already; this makes a
        step pod that holds one notice now). Not every administrator may: then none are."""
        with suppress(psycopg.Error):
            rows = self.conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE usename = %s AND datname = %s",
                (role, database),
            ).fetchall()
            return sum(1 for row in rows if row[0])
        return 0

    def _drop(self, role: str) -> bool:
        """Drop the role, unless something elsewhere (another database's grants) still needs
        it: then it stays, without any right here."""
        if not self.role_exists(role):
            return True
        try:
            with self.conn.transaction():
                self.conn.execute(
                    sql.SQL("DROP ROLE {}").format(sql.Identifier(role)).as_string(None)
                )
        except psycopg.errors.DependentObjectsStillExist:
            return False
        except psycopg.Error as error:
            raise self._failed(error) from None
        return True


class _Changed(Exception):
    """The tenant's rows here changed between their copy and its check: copy again."""


_TENANT_COLUMNS = (
    "t.role, t.tenant, t.kind, t.added_at, COALESCE(r.rolconnlimit, -1), t.lock_limit, "
    "COALESCE(d.database, '')"
)


def _tenant(row: Any) -> Tenant:
    role, tenant, kind, added_at, connections, locks, database = row
    return Tenant(
        str(role),
        str(tenant),
        str(kind),
        str(added_at),
        int(connections),
        int(locks),
        str(database),
    )


def _kind_words(tenant: Tenant) -> str:
    if tenant.kind == "operator":
        return f"the operator's (its Secret in {tenant.tenant})"
    return f"tenant {tenant.tenant}'s"


def _role_to_add(
    tenant: str,
    kind: str,
    role: str,
    host: str,
    connection_limit: int | None,
    lock_limit: int | None,
) -> str:
    """The role ``add`` makes ``tenant``'s (given, or its kind's default), once every argument
    of it is checked."""
    check_namespace(tenant)
    if kind not in KINDS:
        raise InputError("--kind", f"must be one of {', '.join(KINDS)}")
    role = role or default_role(tenant, kind)
    check_role(role)
    check_host(host)
    check_limit(connection_limit, "--connection-limit")
    check_limit(lock_limit, "--lock-limit")
    return role


def _log_in_with(
    conn: psycopg.Connection[tuple[Any, ...]], role: str, password: str, *, exists: bool
) -> None:
    """``role`` made a plain login role with ``password`` (stored as its SCRAM verifier), or
    given ``password`` if it exists; an existing role with no new password keeps its own."""
    who = sql.Identifier(role)
    verifier = sql.Literal(scram_verifier(password)) if password else None
    if not exists:
        conn.execute(
            sql.SQL(
                "CREATE ROLE {} LOGIN NOINHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE "
                "NOREPLICATION NOBYPASSRLS PASSWORD {}"
            )
            .format(who, verifier)
            .as_string(conn)
        )
    elif password:
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(who, verifier).as_string(conn))
