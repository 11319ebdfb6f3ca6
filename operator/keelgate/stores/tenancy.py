"""Tenants of a shared PostgreSQL store: one database role per tenant (namespace), or for the
operator, created, granted, listed and removed with an administrator's URL.

Why it exists: tenants that share a database must not be able to read or change each other's
runs. PostgreSQL enforces that, not Keelgate: migration 3 (``_sql.py``) puts row-level security
on every table, keyed by the role a session logged in as, through ``keelgate_tenants``; this
module writes that table, creates the roles and makes their grants (``postgres.PRIVILEGES``).
``keelgate tenant add|remove|list`` is its command line, which also writes the namespace's
Secret. Tenants must not delay or deny each other either, through what the server shares: ``add``
gives each role a connection limit and a lock limit, and closes in the database what its URL may
(``secure``: the raw advisory-lock functions, the views of other sessions and temporary tables,
revoked from PUBLIC); ``open_ways`` says, one line each, what is left open.

A role's password is generated here, sent to the server only as a SCRAM-SHA-256 verifier (so no
server log can hold it), and handed back once, inside the URL the caller puts in the Secret.
This module must never put a password in a message, never touch a role that may bypass
row-level security or administer others, and never delete a tenant's data.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from keelgate.core.audit import utc_now
from keelgate.errors import InputError, StoreError, StoreUnavailable
from keelgate.stores._sql import DEFAULT_LOCK_LIMIT, TENANT_SPACES
from keelgate.stores.postgres import KINDS, _one_line, _safe_target, grant, migrated, revoke

# A namespace's name, as Kubernetes allows it (an RFC 1123 label).
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# PostgreSQL keeps 63 bytes of a name and would cut a longer one silently.
ROLE_MAX = 63
ROLE_PREFIX = "keelgate-"
OPERATOR_ROLE = "keelgate-operator"
# URL settings that would put another user or password beside the role's own.
_CREDENTIAL_SETTINGS = frozenset({"user", "password", "passfile"})
#: Sessions a role may hold at once on the server (``ALTER ROLE ... CONNECTION LIMIT``), unless
#: ``add`` is told otherwise: a tenant's step pods hold one each (the operator's --max-step-pods
#: is 20 by default); the operator holds a pool of up to 9 per replica.
DEFAULT_CONNECTION_LIMITS = {"tenant": 20, "operator": 32}
#: Runs a tenant's sessions may drive at once (its run locks), unless told otherwise.
LOCK_LIMIT = DEFAULT_LOCK_LIMIT
LIMIT_MAX = 10_000
#: Locks a session holds beside those on relations: its owner id, its virtual transaction id,
#: its transaction id, and a margin.
SESSION_LOCKS = 8

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
    once (-1: no limit) and the runs it may drive at once."""

    role: str
    tenant: str
    kind: str
    added_at: str
    connection_limit: int = -1
    lock_limit: int = LOCK_LIMIT


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
    sessions: int  # its sessions on this database that were ended
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


def role_url(admin_url: str, role: str, password: str, *, host: str = "") -> str:
    """The administrator's URL with ``role`` and ``password`` as its user and password (and
    ``host``, ``HOST`` or ``HOST:PORT``, in place of its host where given): same database,
    same settings, no other credential."""
    parts = urlsplit(admin_url)
    where = host or parts.netloc.rpartition("@")[2]
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in _CREDENTIAL_SETTINGS]
    userinfo = f"{quote(role, safe='')}:{quote(password, safe='')}"
    return urlunsplit((parts.scheme, f"{userinfo}@{where}", parts.path, urlencode(query), ""))


def check_limit(value: int | None, field: str) -> None:
    """``--connection-limit`` and ``--lock-limit``: a count from 1 to LIMIT_MAX."""
    if value is not None and not 1 <= value <= LIMIT_MAX:
        raise InputError(field, f"must be a number from 1 to {LIMIT_MAX}")


def check_host(host: str) -> None:
    """``--host``: a host name or address, with an optional port; nothing else."""
    if host and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?", host):
        raise InputError("--host", "must be HOST or HOST:PORT")


class TenantStore:
    """The administrator's session on a Keelgate database: migrates it on opening (as any store
    does), then adds, removes and lists the roles of its tenants.

    The administrator must be able to create roles (``CREATEROLE``, or a superuser) and own the
    Keelgate tables (it grants rights on them); the database's owner, who created them, does.
    """

    def __init__(self, url: str, *, connect_timeout: int = 10) -> None:
        self.url = url
        self.target, params = _safe_target(url)
        self._secret = str(params.get("password") or "")
        timeout: dict[str, Any] = (
            {} if "connect_timeout" in params else {"connect_timeout": connect_timeout}
        )
        try:
            self.conn: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(
                url, autocommit=True, **timeout
            )
        except psycopg.Error as error:
            raise StoreUnavailable(self._words(error)) from None
        try:
            migrated(self.conn, self.target)
            self._check_administrator()
        except psycopg.Error as error:
            self.conn.close()
            raise StoreError(self._words(error)) from None
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
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
    def _transaction(self) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        try:
            with self.conn.transaction():
                yield self.conn
        except psycopg.Error as error:
            raise StoreError(self._words(error)) from None

    # Reading

    def _rows(self, query: str | sql.Composed, params: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self.conn.execute(query, params).fetchall()
        except psycopg.Error as error:
            raise StoreError(self._words(error)) from None

    def tenants(self) -> list[Tenant]:
        """Every registered role, by tenant then role."""
        rows = self._rows(
            f"SELECT {_TENANT_COLUMNS} FROM keelgate_tenants t "
            "LEFT JOIN pg_roles r ON r.rolname = t.role "
            'ORDER BY t.tenant COLLATE "C", t.role COLLATE "C"'
        )
        return [_tenant(row) for row in rows]

    def unregistered(self) -> list[str]:
        """Tenants with runs in the store but no role: reachable only through a shared URL."""
        rows = self._rows(
            "SELECT tenant FROM keelgate_checkpoints WHERE tenant NOT IN "
            "(SELECT tenant FROM keelgate_tenants WHERE kind = 'tenant') "
            'GROUP BY tenant ORDER BY tenant COLLATE "C"'
        )
        return [str(row[0]) for row in rows]

    def kept(self, tenant: str) -> Kept:
        """How many rows of each kind the store holds for ``tenant``."""
        counts = [
            int(
                self._rows(
                    sql.SQL("SELECT count(*) FROM {} WHERE tenant = %s").format(
                        sql.Identifier(table)
                    ),
                    (tenant,),
                )[0][0]
            )
            for table in (
                "keelgate_checkpoints",
                "keelgate_keys",
                "keelgate_audit",
                "keelgate_specs",
            )
        ]
        return Kept(*counts)

    def password_works(self, role: str, password: str) -> bool:
        """Whether ``role`` logs in with ``password`` here (through the administrator's host)."""
        try:
            conn = psycopg.connect(self.url, user=role, password=password, connect_timeout=10)
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
    ) -> Added:
        """Make ``role`` (default ``default_role``) the role of ``tenant``, with exactly its
        kind's rights. Idempotent: an existing role keeps its password when
        ``working_password`` logs in as it (the URL the caller already holds) and ``rotate``
        is not asked; otherwise it gets a new one, and the result's URL carries it.
        ``new_url`` asks for a URL with a password (``--print``): for a role that exists, that
        needs ``rotate``, since its password cannot be read back.

        ``connection_limit`` (sessions at once, on the whole server) and ``lock_limit`` (runs
        driven at once) bound what the role can take; left out, a role keeps the limits it has
        (a new one, or one without a connection limit, gets the defaults). Every ``add`` also
        closes, as far as this URL may, the ways one role could delay another through what the
        server shares (``secure``); ``Added.open`` says what it could not close."""
        check_namespace(tenant)
        if kind not in KINDS:
            raise InputError("--kind", f"must be one of {', '.join(KINDS)}")
        role = role or default_role(tenant, kind)
        check_role(role)
        check_host(host)
        check_limit(connection_limit, "--connection-limit")
        check_limit(lock_limit, "--lock-limit")
        with self._transaction() as conn:
            # One administrator at a time: two adds of one tenant must not both create.
            conn.execute("LOCK TABLE keelgate_tenants IN SHARE ROW EXCLUSIVE MODE")
            registered = self._registered(role)
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
                or not (working_password and self.password_works(role, working_password))
            ):
                password = new_password()
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
                conn.execute(
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(who, verifier).as_string(conn)
                )
            added_at = registered.added_at if registered is not None else utc_now()
            connections = connection_limit
            if connections is None:
                current = self._rows(
                    "SELECT rolconnlimit FROM pg_roles WHERE rolname = %s", (role,)
                )
                kept = int(current[0][0]) if current else -1
                connections = kept if kept > 0 else DEFAULT_CONNECTION_LIMITS[kind]
            conn.execute(
                sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}")
                .format(who, sql.Literal(connections))
                .as_string(conn)
            )
            locks = lock_limit or (registered.lock_limit if registered is not None else LOCK_LIMIT)
            # A tenant's run locks are taken in a key space of its own (migration 4).
            conn.execute(
                "INSERT INTO keelgate_tenants (role, tenant, kind, added_at, space, lock_limit) "
                "SELECT %s, %s, %s, %s, CASE WHEN %s = 'tenant' THEN "
                "COALESCE((SELECT max(space) FROM keelgate_tenants), %s) + 1 END, %s "
                "ON CONFLICT (role) DO UPDATE SET lock_limit = excluded.lock_limit",
                (role, tenant, kind, added_at, kind, TENANT_SPACES, locks),
            )
            grant(conn, role, kind)
            self.secure(conn)
        url = role_url(self.url, role, password, host=host) if password else ""
        registered = self._registered(role)
        assert registered is not None
        return Added(registered, not exists, bool(password), url, tuple(self.open_ways(role)))

    # What the server shares

    def _superuser(self) -> bool:
        row = self._rows("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        return bool(row and row[0][0])

    def secure(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Close, in this database, what this administrator may of the ways one role could
        delay or deny another through what every role shares (idempotent):

        - the raw advisory-lock functions and the views of other sessions and their locks are
          revoked from PUBLIC, and granted to the tables' owner, whose functions take and judge
          Keelgate's locks (a superuser's right: they belong to the bootstrap superuser);
        - temporary tables are refused to PUBLIC (each holds a lock in the server's shared lock
          table until its transaction ends; the database's owner or a superuser may).

        What it cannot do is reported by ``open_ways``."""
        owner = self._rows(
            "SELECT c.relowner::regrole::text, r.rolsuper FROM pg_class c "
            "JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = 'keelgate_tenants'::regclass"
        )[0]
        owner_role, owner_is_superuser = str(owner[0]), bool(owner[1])
        if self._superuser():
            which = f"{_LOCK_FUNCTIONS} OR {_SESSION_FUNCTIONS}"
            for (function,) in self._rows(_CATALOG_FUNCTIONS.format(which=which)):
                # A regprocedure's text is a quoted, qualified signature: never input.
                conn.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
                if not owner_is_superuser:
                    conn.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {owner_role}")
        may = self._rows(
            "SELECT r.rolsuper OR pg_has_role(d.datdba, 'USAGE') FROM pg_roles r, pg_database d "
            "WHERE r.rolname = current_user AND d.datname = current_database()"
        )
        if may and may[0][0]:
            database = sql.Identifier(self.conn.info.dbname)
            conn.execute(
                sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC")
                .format(database)
                .as_string(conn)
            )

    def open_ways(self, role: str) -> list[str]:
        """The ways ``role`` could still delay or deny another tenant through what the server
        shares, one line each; [] when none is left that Keelgate can see."""
        ways: list[str] = []

        def functions(which: str) -> list[str]:
            query = _CATALOG_FUNCTIONS.format(
                which=f"({which}) AND has_function_privilege(%s, p.oid, 'EXECUTE')"
            )
            return [str(row[0]).split("(", 1)[0] for row in self._rows(query, (role,))]

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
        facts = self._rows(
            "SELECT has_database_privilege(%s, current_database(), 'TEMPORARY'), r.rolconnlimit, "
            "current_setting('max_prepared_transactions')::integer FROM pg_roles r "
            "WHERE r.rolname = %s",
            (role, role),
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

    def lock_bound(self, role: str) -> int:
        """The most locks ``role``'s sessions can hold at once in the server's shared lock
        table: per session, one on each relation it may read (with their indexes and TOAST
        tables), its owner id and a few of its own; and its run locks (its lock limit)."""
        rows = self._rows(
            "SELECT r.rolconnlimit, COALESCE(t.lock_limit, 0), "
            "(SELECT count(*) FROM pg_class c WHERE has_table_privilege(r.rolname, c.oid, "
            "'SELECT')) + (SELECT count(*) FROM pg_index i WHERE has_table_privilege(r.rolname, "
            "i.indrelid, 'SELECT')) + (SELECT count(*) FROM pg_class c WHERE c.reltoastrelid <> 0 "
            "AND has_table_privilege(r.rolname, c.oid, 'SELECT')) "
            "FROM pg_roles r LEFT JOIN keelgate_tenants t ON t.role = r.rolname "
            "AND t.kind = 'tenant' WHERE r.rolname = %s",
            (role,),
        )
        if not rows:
            return 0
        connections, runs, relations = (int(v) for v in rows[0])
        return max(connections, 0) * (relations + SESSION_LOCKS) + runs

    def lock_budget(self) -> tuple[int, int, int]:
        """What the tenants' roles' sessions may hold in the shared lock table together
        (``lock_bound`` of each: what their code could take if it tried), its size, and the
        ``max_locks_per_transaction`` that would make it large enough. The operator's role
        runs Keelgate's own code, and is not counted at its worst."""
        roles = [t.role for t in self.tenants() if t.kind == "tenant" and t.connection_limit >= 0]
        held = sum(self.lock_bound(role) for role in roles)
        row = self._rows(
            "SELECT current_setting('max_locks_per_transaction')::integer, "
            "current_setting('max_connections')::integer "
            "+ current_setting('max_prepared_transactions')::integer"
        )[0]
        per_transaction, backends = int(row[0]), int(row[1])
        return held, per_transaction * backends, max(per_transaction, -(-held // backends))

    def remove(self, tenant: str) -> list[Removed]:
        """Take away every role registered for ``tenant``: its row in the lookup, its rights
        here, its sessions on this database, and the role itself unless it has rights
        elsewhere. The tenant's rows stay (``Removed.kept``); nothing is deleted."""
        check_namespace(tenant)
        done: list[Removed] = []
        with self._transaction() as conn:
            conn.execute("LOCK TABLE keelgate_tenants IN SHARE ROW EXCLUSIVE MODE")
            gone = [t for t in self.tenants() if t.tenant == tenant]
            for registered in gone:
                conn.execute("DELETE FROM keelgate_tenants WHERE role = %s", (registered.role,))
                if self.role_exists(registered.role):
                    revoke(conn, registered.role)
        kept = self.kept(tenant)
        for registered in gone:
            sessions = self._end_sessions(registered.role)
            dropped = self._drop(registered.role)
            done.append(Removed(registered, dropped, sessions, kept))
        return done

    # Helpers

    def _registered(self, role: str) -> Tenant | None:
        rows = self._rows(
            f"SELECT {_TENANT_COLUMNS} FROM keelgate_tenants t "
            "LEFT JOIN pg_roles r ON r.rolname = t.role WHERE t.role = %s",
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

    def _end_sessions(self, role: str) -> int:
        """End the role's sessions on this database (its rights are gone already; this makes a
        step pod that holds one notice now). Not every administrator may: then none are."""
        with suppress(psycopg.Error):
            rows = self.conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE usename = %s AND datname = current_database()",
                (role,),
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
            raise StoreError(self._words(error)) from None
        return True


_TENANT_COLUMNS = "t.role, t.tenant, t.kind, t.added_at, COALESCE(r.rolconnlimit, -1), t.lock_limit"


def _tenant(row: Any) -> Tenant:
    role, tenant, kind, added_at, connections, locks = row
    return Tenant(str(role), str(tenant), str(kind), str(added_at), int(connections), int(locks))


def _kind_words(tenant: Tenant) -> str:
    if tenant.kind == "operator":
        return f"the operator's (its Secret in {tenant.tenant})"
    return f"tenant {tenant.tenant}'s"
