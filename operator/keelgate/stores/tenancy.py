"""Tenants of a shared PostgreSQL store: one database role per tenant (namespace), or for the
operator, created, granted, listed and removed with an administrator's URL.

Why it exists: tenants that share a database must not be able to read or change each other's
runs. PostgreSQL enforces that, not Keelgate: migration 3 (``_sql.py``) puts row-level security
on every table, keyed by the role a session logged in as, through ``keelgate_tenants``; this
module writes that table, creates the roles and makes their grants (``postgres.PRIVILEGES``).
``keelgate tenant add|remove|list`` is its command line, which also writes the namespace's
Secret.

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
from keelgate.stores.postgres import KINDS, _one_line, _safe_target, grant, migrated, revoke

# A namespace's name, as Kubernetes allows it (an RFC 1123 label).
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# PostgreSQL keeps 63 bytes of a name and would cut a longer one silently.
ROLE_MAX = 63
ROLE_PREFIX = "keelgate-"
OPERATOR_ROLE = "keelgate-operator"
# URL settings that would put another user or password beside the role's own.
_CREDENTIAL_SETTINGS = frozenset({"user", "password", "passfile"})


@dataclass(frozen=True)
class Tenant:
    """One registered role: which tenant it is (for the operator, the namespace its Secret is
    in), its kind (``tenant`` or ``operator``), and when it was added."""

    role: str
    tenant: str
    kind: str
    added_at: str


@dataclass(frozen=True)
class Added:
    """What ``add`` did. ``url`` holds the role's password only when one was set (``password``
    is then True); otherwise the caller keeps the URL it has."""

    tenant: Tenant
    created: bool  # the role was created (False: it existed)
    password: bool  # a new password was set, and ``url`` carries it
    url: str


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
            "SELECT role, tenant, kind, added_at FROM keelgate_tenants "
            'ORDER BY tenant COLLATE "C", role COLLATE "C"'
        )
        return [Tenant(*(str(v) for v in row)) for row in rows]

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
    ) -> Added:
        """Make ``role`` (default ``default_role``) the role of ``tenant``, with exactly its
        kind's rights. Idempotent: an existing role keeps its password when
        ``working_password`` logs in as it (the URL the caller already holds) and ``rotate``
        is not asked; otherwise it gets a new one, and the result's URL carries it.
        ``new_url`` asks for a URL with a password (``--print``): for a role that exists, that
        needs ``rotate``, since its password cannot be read back."""
        check_namespace(tenant)
        if kind not in KINDS:
            raise InputError("--kind", f"must be one of {', '.join(KINDS)}")
        role = role or default_role(tenant, kind)
        check_role(role)
        check_host(host)
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
            conn.execute(
                "INSERT INTO keelgate_tenants (role, tenant, kind, added_at) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (role) DO NOTHING",
                (role, tenant, kind, added_at),
            )
            grant(conn, role, kind)
        url = role_url(self.url, role, password, host=host) if password else ""
        return Added(Tenant(role, tenant, kind, added_at), not exists, bool(password), url)

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
            "SELECT role, tenant, kind, added_at FROM keelgate_tenants WHERE role = %s", (role,)
        )
        return Tenant(*(str(v) for v in rows[0])) if rows else None

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


def _kind_words(tenant: Tenant) -> str:
    if tenant.kind == "operator":
        return f"the operator's (its Secret in {tenant.tenant})"
    return f"tenant {tenant.tenant}'s"
