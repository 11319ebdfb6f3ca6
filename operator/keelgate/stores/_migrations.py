"""The schema of the SQL stores: every numbered migration's DDL, and how a database is brought to
the newest.

Why it exists: a schema step is written once for every backend and runs exactly once per
database, in order, under the backend's schema lock and in one transaction with its version row;
its DDL is long (row-level security, the lock functions a tenant's role goes through, the audit
writer's trigger) and is read step by step, apart from the statements that use the tables
(``keelgate.stores._sql``). The advisory-lock spaces are here because the functions of migration
4 take them. A released migration must never change: a later one adds a step (and a fixture saved
by the release before it, under ``tests/data/``). This module must never write a row other than
a migration's version row, and never open a connection of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from keelgate.core.audit import utc_now
from keelgate.errors import StoreError
from keelgate.stores._dialect import Connection, Dialect
from keelgate.stores._isolation_ddl import isolation_ddl, kept_here

# Schema migrations. The version table records each migration applied, in order.
#
# Migration 1 is the schema every release before versions created (release 8b37f73 lacked only
# keelgate_specs). It is written with IF NOT EXISTS so it also adopts such a database: it adds
# what the database lacks and records version 1. It must never change. Every later migration runs
# exactly once per database, under the backend's schema lock, in one transaction with its version
# row; write it as plain DDL (and a data step if needed) and test it on a fixture saved by the
# release before it (tests/data/). A migration that concerns one backend only names it in
# ``backends``; the others record its version without running anything, so versions mean the same
# schema step everywhere.
#
# On PostgreSQL every Keelgate table has row-level security (migration 3). A migration that adds
# a table enables it there, gives it policies keyed by tenant as migration 3 does, and adds the
# table to ``keelgate.stores.postgres.PRIVILEGES``, whose grants are made again to every
# registered role in the transaction of any migration (a tenant's role then needs nothing new).

VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS keelgate_schema (version INTEGER PRIMARY KEY, "
    "description TEXT NOT NULL, applied_at TEXT NOT NULL)"
)

_SCHEMA_1 = """
{owner_setup}
CREATE TABLE IF NOT EXISTS keelgate_checkpoints (
    tenant TEXT NOT NULL, run TEXT NOT NULL, seq {bigint} NOT NULL, state TEXT NOT NULL,
    PRIMARY KEY (tenant, run));
CREATE TABLE IF NOT EXISTS keelgate_keys (
    tenant TEXT NOT NULL, key TEXT NOT NULL, run TEXT NOT NULL, action TEXT NOT NULL,
    tool TEXT NOT NULL, state TEXT NOT NULL, owner {owner}, result TEXT,
    settled_by TEXT NOT NULL DEFAULT '', source TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (tenant, key));
CREATE TABLE IF NOT EXISTS keelgate_audit (
    tenant TEXT NOT NULL, run TEXT NOT NULL, seq {bigint} NOT NULL, type TEXT NOT NULL,
    actor TEXT NOT NULL, at TEXT NOT NULL, data TEXT NOT NULL, key TEXT,
    prev TEXT NOT NULL, hash TEXT NOT NULL,
    PRIMARY KEY (tenant, run, seq));
CREATE UNIQUE INDEX IF NOT EXISTS keelgate_audit_key ON keelgate_audit (tenant, run, key)
    WHERE key IS NOT NULL;
CREATE TABLE IF NOT EXISTS keelgate_specs (
    tenant TEXT NOT NULL, run TEXT NOT NULL, source TEXT NOT NULL, generation {bigint} NOT NULL,
    spec TEXT NOT NULL, PRIMARY KEY (tenant, run));
"""


# Migration 3: tenants that share a PostgreSQL database cannot see or change each other's rows.
# ``keelgate_tenants`` maps a database role to the tenant (namespace) it is, or marks it as the
# operator's; only its owner writes it (``keelgate tenant add``, with the admin's URL), and a role
# reads only its own row. Every policy compares a row's tenant with that lookup, keyed by
# ``current_user``, which a session cannot choose: not a setting the session could forge. The
# lookup is written inline, not behind a function, because a policy's table references are bound
# when it is created, while a function's body is resolved at each call through the caller's
# search_path, where a temporary table of the same name would come first. Roles the table does
# not name (and the owner, and superusers, who bypass row-level security) are unchanged: a
# database used through one shared URL, as before, works as before. What each kind of role may
# do at all is its grants (``keelgate.stores.postgres.PRIVILEGES``); the policies say on which
# rows: a tenant's role its own tenant's rows; the operator's role every tenant's rows, for
# what the operator writes (recorded specs, approval decisions on checkpoints, settlements,
# audit events), and never a claim, a completion or a deletion.
_MINE = (
    "tenant IN (SELECT t.tenant FROM keelgate_tenants t "
    "WHERE t.role = current_user AND t.kind = 'tenant')"
)
_OPERATOR = (
    "EXISTS (SELECT 1 FROM keelgate_tenants t WHERE t.role = current_user AND t.kind = 'operator')"
)
_EITHER = f"({_MINE}) OR ({_OPERATOR})"
_ROW_SECURITY_3 = f"""
CREATE TABLE keelgate_tenants (
    role TEXT PRIMARY KEY, tenant TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('tenant', 'operator')), added_at TEXT NOT NULL);
ALTER TABLE keelgate_tenants ENABLE ROW LEVEL SECURITY;
CREATE POLICY keelgate_tenants_own ON keelgate_tenants FOR SELECT USING (role = current_user);
ALTER TABLE keelgate_schema ENABLE ROW LEVEL SECURITY;
CREATE POLICY keelgate_schema_read ON keelgate_schema FOR SELECT USING (true);
ALTER TABLE keelgate_checkpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY keelgate_checkpoints_read ON keelgate_checkpoints FOR SELECT USING ({_EITHER});
CREATE POLICY keelgate_checkpoints_insert ON keelgate_checkpoints FOR INSERT
    WITH CHECK ({_EITHER});
CREATE POLICY keelgate_checkpoints_update ON keelgate_checkpoints FOR UPDATE
    USING ({_EITHER}) WITH CHECK ({_EITHER});
ALTER TABLE keelgate_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY keelgate_keys_read ON keelgate_keys FOR SELECT USING ({_EITHER});
CREATE POLICY keelgate_keys_claim ON keelgate_keys FOR INSERT WITH CHECK ({_MINE});
CREATE POLICY keelgate_keys_update ON keelgate_keys FOR UPDATE
    USING ({_EITHER}) WITH CHECK ({_EITHER});
CREATE POLICY keelgate_keys_forget ON keelgate_keys FOR DELETE USING ({_MINE});
ALTER TABLE keelgate_audit ENABLE ROW LEVEL SECURITY;
CREATE POLICY keelgate_audit_read ON keelgate_audit FOR SELECT USING ({_EITHER});
CREATE POLICY keelgate_audit_append ON keelgate_audit FOR INSERT WITH CHECK ({_EITHER});
ALTER TABLE keelgate_specs ENABLE ROW LEVEL SECURITY;
CREATE POLICY keelgate_specs_read ON keelgate_specs FOR SELECT USING ({_EITHER});
CREATE POLICY keelgate_specs_record ON keelgate_specs FOR INSERT WITH CHECK ({_OPERATOR});
CREATE POLICY keelgate_specs_update ON keelgate_specs FOR UPDATE
    USING ({_OPERATOR}) WITH CHECK ({_OPERATOR});
"""


@dataclass(frozen=True)
class Migration:
    """One numbered schema step: ``ddl`` is ``;``-separated statements, or a tuple of whole
    statements (a function's body holds semicolons of its own), with ``{bigint}``, ``{owner}``,
    ``{owner_setup}`` and ``{real}`` taken from the dialect and ``{schema}`` the schema
    Keelgate's tables are in (a quoted name). ``backends`` (dialect names) limits it to those
    backends; empty, it applies to every one."""

    version: int
    description: str
    ddl: str | tuple[str, ...]
    backends: tuple[str, ...] = ()

    def statements(self, dialect: Dialect, *, schema: str = "public") -> list[str]:
        if self.backends and dialect.name not in self.backends:
            return []  # recorded as applied: the step has nothing to do on this backend
        values = {
            "bigint": dialect.bigint,
            "owner": dialect.owner_type,
            "owner_setup": dialect.owner_setup,
            "real": dialect.real,
            "schema": schema,
        }
        if isinstance(self.ddl, tuple):
            return [s.format(**values).strip() for s in self.ddl]
        text = self.ddl.format(**values)
        return [s.strip() for s in text.split(";") if s.strip()]


# Migration 2: a claim's write deadline, on the store's clock (``keelgate.core.fence``), and
# the claim's own random id, by which a claim repeated after its acknowledgement was lost knows
# itself. A key claimed before it has neither, and may be settled as it could before.
_SCHEMA_2 = """
ALTER TABLE keelgate_keys ADD COLUMN deadline {real};
ALTER TABLE keelgate_keys ADD COLUMN claim_id TEXT
"""

# PostgreSQL advisory-lock keys. The two-int4 form (space, key) and the one-bigint form never
# meet (pg_locks tells them apart by objsubid: 2 and 1).
LEGACY_OWNER_SPACE = 0x4B470001  # (space, id): owner ids drawn before migration 4 ("KG")
SCHEMA_SPACE = 0x4B470003  # (space, 0): migrations, one database at a time
DRIVER_SPACE = 0x4B470004  # (space, digest): a run of a tenant without a role of its own
TENANT_SPACES = 0x4B480000  # (TENANT_SPACES + n, digest): the runs of registered tenant n
OWNER_BASE = 0x4B47 << 48  # the first owner id from migration 4 on, a bigint key of its own
DEFAULT_LOCK_LIMIT = 64  # runs a tenant's sessions may drive at once, unless set otherwise

# Migration 4: tenants sharing a PostgreSQL database cannot delay or deny each other through
# what the database shares. Advisory locks belong to no one in PostgreSQL, so every lock
# Keelgate takes goes through a function owned by the tables' owner (SECURITY DEFINER, its
# search_path fixed so a caller's objects cannot stand in for Keelgate's) that scopes it:
#
# - ``keelgate_owner_take()`` draws a fresh owner id and locks it in the caller's session, one
#   at a time per session. Ids are bigints from OWNER_BASE (about 3.8e18 of them): no tenant can
#   exhaust them, and none can lock one before it is drawn once the raw advisory-lock functions
#   are revoked from PUBLIC (``keelgate tenant add``, as a superuser). Ids drawn before stay
#   judged by their old (two-int4) locks, so processes of the release before keep theirs.
# - ``keelgate_owner_alive(id)`` judges an owner without reading the lock table (which a
#   tenant's role need not see, and whose every read costs time in proportion to all the locks
#   on the server, another tenant's included): a shared lock on the id is granted at once
#   unless the owner's session holds it, and is given back at once (migration 7 replaces the
#   two statements with a transaction-level lock: a cancel between them left it held). The
#   owner's own session,
#   where it would be granted as well, knows its id (a setting the take makes: a session that
#   changes it misjudges only what it reads itself).
# - ``keelgate_lock_run(tenant, run)`` takes a run's driver lock only for the caller's own tenant
#   (a tenant's role; the administrator for any), in that tenant's own space, and refuses once
#   the tenant's sessions hold ``lock_limit`` run locks. A tenant without a role keeps the old
#   space, so a run driven through a shared URL is locked as before.
#
# The owner sequence is no longer usable by any role but its owner.
_OWNER_ID_FUNCTIONS_4 = (
    "ALTER SEQUENCE keelgate_owner_seq AS bigint",
    f"ALTER SEQUENCE keelgate_owner_seq RESTART WITH {OWNER_BASE}",
    "REVOKE ALL ON SEQUENCE keelgate_owner_seq FROM PUBLIC",
    "ALTER TABLE keelgate_keys ALTER COLUMN owner TYPE bigint",
    "ALTER TABLE keelgate_tenants ADD COLUMN space integer UNIQUE",
    "ALTER TABLE keelgate_tenants ADD COLUMN lock_limit integer NOT NULL "
    f"DEFAULT {DEFAULT_LOCK_LIMIT} CHECK (lock_limit > 0)",
    f"""UPDATE keelgate_tenants t SET space = {TENANT_SPACES} + n.n FROM (
        SELECT role, row_number() OVER (ORDER BY role COLLATE "C") AS n FROM keelgate_tenants
        WHERE kind = 'tenant') n WHERE t.role = n.role""",
    f"""CREATE FUNCTION keelgate_owner_take() RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, {{schema}}, pg_temp AS $$
DECLARE
    drawn bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'
               AND objsubid = 1 AND classid >= {OWNER_BASE >> 32}::bigint::oid) THEN
        RAISE EXCEPTION 'this session holds an owner id already'
            USING ERRCODE = 'lock_not_available';
    END IF;
    FOR attempt IN 1..100 LOOP
        drawn := nextval('keelgate_owner_seq');
        IF pg_try_advisory_lock(drawn) THEN
            PERFORM set_config('keelgate.owner', drawn::text, false);
            RETURN drawn;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'no free owner id after 100 tries: other sessions hold their locks'
        USING ERRCODE = 'lock_not_available';
END
$$""",
    f"""CREATE FUNCTION keelgate_owner_alive(owner bigint) RETURNS boolean LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    free boolean;
BEGIN
    IF owner = NULLIF(current_setting('keelgate.owner', true), '')::bigint THEN
        RETURN true;  -- this session's own id (``keelgate_owner_take`` noted it)
    ELSIF owner < 2147483648 THEN  -- drawn before migration 4: locked as two int4 keys
        free := pg_try_advisory_lock_shared({LEGACY_OWNER_SPACE}, owner::integer);
        IF free THEN
            PERFORM pg_advisory_unlock_shared({LEGACY_OWNER_SPACE}, owner::integer);
        END IF;
    ELSE
        free := pg_try_advisory_lock_shared(owner);
        IF free THEN
            PERFORM pg_advisory_unlock_shared(owner);
        END IF;
    END IF;
    RETURN NOT free;
END
$$""",
    f"""CREATE FUNCTION keelgate_lock_run(p_tenant text, p_run text) RETURNS integer[]
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, {{schema}}, pg_temp AS $$
DECLARE
    caller_kind text;
    caller_tenant text;
    v_space integer;
    most integer;
    digest integer := ('x' || encode(substr(sha256(convert_to(p_tenant, 'UTF8')
        || '\\x00'::bytea || convert_to(p_run, 'UTF8')), 1, 4), 'hex'))::bit(32)::integer;
BEGIN
    SELECT t.kind, t.tenant INTO caller_kind, caller_tenant FROM keelgate_tenants t
        WHERE t.role = session_user;
    IF FOUND AND (caller_kind <> 'tenant' OR caller_tenant <> p_tenant) THEN
        RAISE EXCEPTION 'role % may not drive runs of tenant %', session_user, p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT t.space, t.lock_limit INTO v_space, most FROM keelgate_tenants t
        WHERE t.tenant = p_tenant AND t.kind = 'tenant';
    IF v_space IS NULL THEN
        v_space := {DRIVER_SPACE};
    ELSIF (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
           AND objsubid = 2 AND classid = v_space::bigint::oid
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
          >= most THEN
        RAISE EXCEPTION 'tenant % drives % runs at once, its lock limit', p_tenant, most
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF pg_try_advisory_lock(v_space, digest) THEN
        RETURN ARRAY[v_space, digest];
    END IF;
    RETURN NULL;
END
$$""",
    """CREATE FUNCTION keelgate_unlock_run(p_space integer, p_key integer) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_advisory_unlock(p_space, p_key)
$$""",
    """CREATE FUNCTION keelgate_unlock_all() RETURNS void LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_advisory_unlock_all()
$$""",
    "REVOKE ALL ON FUNCTION keelgate_owner_take(), keelgate_owner_alive(bigint), "
    "keelgate_lock_run(text, text), keelgate_unlock_run(integer, integer), keelgate_unlock_all() "
    "FROM PUBLIC",
)

# Migration 5: who wrote each audit event, as the database saw it. ``writer`` is the role and
# ``writer_kind`` what it is (``tenant``, ``operator``, or ``administrator`` for a role the lookup
# does not name: the tables' owner or a superuser). On PostgreSQL the database sets them
# (migration 6); a SQLite or memory store has one writer identity and records none (NULL).
_AUDIT_WRITER_5 = """
ALTER TABLE keelgate_audit ADD COLUMN writer TEXT;
ALTER TABLE keelgate_audit ADD COLUMN writer_kind TEXT
"""

# Migration 6: on PostgreSQL the writer is the database's word. A trigger (which a role that does
# not own the table cannot disable) compares what an insert names with ``current_user`` and its
# kind in the lookup, and refuses an insert that names anyone else; an insert that names nobody
# (a client of the release before, which seals events without it) is given the truth. The
# function reads the lookup as the writer (its own row), through a fixed search_path.
_AUDIT_WRITER_6 = (
    """CREATE FUNCTION keelgate_audit_writer() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, {schema}, pg_temp AS $$
DECLARE
    kind text := COALESCE((SELECT t.kind FROM keelgate_tenants t WHERE t.role = current_user),
                          'administrator');
BEGIN
    IF NEW.writer IS NULL AND NEW.writer_kind IS NULL THEN
        NEW.writer := current_user;
        NEW.writer_kind := kind;
    ELSIF NEW.writer IS DISTINCT FROM current_user::text
          OR NEW.writer_kind IS DISTINCT FROM kind THEN
        RAISE EXCEPTION 'an audit event names its writer: role % (%), not % (%)',
            current_user, kind, NEW.writer, NEW.writer_kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$""",
    "CREATE TRIGGER keelgate_audit_writer BEFORE INSERT ON keelgate_audit FOR EACH ROW "
    "EXECUTE FUNCTION keelgate_audit_writer()",
)

# Migration 8: one driver per run, recorded in the store (``SQLStore.take``): the holder, its
# epoch (1 for the run's first holder, one more at each take) and the moment its lease lapses on
# the store's clock; and the epoch each key was claimed under, by which a claim left in flight
# by a holder that lost the run reads as an unknown outcome, whether or not its owner lives. A
# key claimed before it has no epoch and is judged by its owner alone, as before.
_OWNERSHIP_8 = """
CREATE TABLE keelgate_owners (
    tenant TEXT NOT NULL, run TEXT NOT NULL, holder TEXT NOT NULL, epoch {bigint} NOT NULL,
    expires {real} NOT NULL, PRIMARY KEY (tenant, run));
ALTER TABLE keelgate_keys ADD COLUMN epoch {bigint}
"""

# Migration 9: on PostgreSQL the ownership rows are kept as every tenant table's rows are
# (migrations 3 and 7): a tenant's role and the operator's read and write its tenant's runs'
# (the operator's role takes runs over in the standby cluster), nobody else's; a tenant with a
# database of its own has none in the home database. A trigger keeps every epoch moving forward.
_OWNERSHIP_ROW_SECURITY_9 = (
    "ALTER TABLE keelgate_owners ENABLE ROW LEVEL SECURITY",
    f"CREATE POLICY keelgate_owners_read ON keelgate_owners FOR SELECT USING ({_EITHER})",
    f"CREATE POLICY keelgate_owners_take ON keelgate_owners FOR INSERT WITH CHECK ({_EITHER})",
    "CREATE POLICY keelgate_owners_renew ON keelgate_owners FOR UPDATE "
    f"USING ({_EITHER}) WITH CHECK ({_EITHER})",
    kept_here("keelgate_owners"),
    # Ownership only moves forward, whoever writes the row: a role that may write its runs'
    # ownership (a tenant's, whose step pods run the tenant's own code) cannot give an epoch
    # back to a holder that lost it, nor hand an epoch to another holder without a new one.
    """CREATE FUNCTION keelgate_owners_forward() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, {schema}, pg_temp AS $$
BEGIN
    IF NEW.tenant IS DISTINCT FROM OLD.tenant OR NEW.run IS DISTINCT FROM OLD.run
       OR NEW.epoch < OLD.epoch
       OR (NEW.epoch = OLD.epoch AND NEW.holder IS DISTINCT FROM OLD.holder) THEN
        RAISE EXCEPTION 'run ownership only moves forward: epoch % of %, not % of %',
            OLD.epoch, OLD.holder, NEW.epoch, NEW.holder
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$""",
    "CREATE TRIGGER keelgate_owners_forward BEFORE UPDATE ON keelgate_owners FOR EACH ROW "
    "EXECUTE FUNCTION keelgate_owners_forward()",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "checkpoints, idempotency keys, audit chain and recorded specs", _SCHEMA_1),
    Migration(2, "write deadlines and claim ids of claimed keys", _SCHEMA_2),
    Migration(
        3,
        "row-level security: a tenant's role sees and writes only its tenant's rows",
        _ROW_SECURITY_3,
        backends=("postgresql",),
    ),
    Migration(
        4,
        "tenants cannot delay each other: scoped lock functions, bigint owner ids",
        _OWNER_ID_FUNCTIONS_4,
        backends=("postgresql",),
    ),
    Migration(5, "audit events record the role that wrote them", _AUDIT_WRITER_5),
    Migration(
        6,
        "the database sets each audit event's writer",
        _AUDIT_WRITER_6,
        backends=("postgresql",),
    ),
    Migration(
        7,
        "lock functions that leave nothing held and tell nothing of others; tenant databases",
        isolation_ddl(
            legacy_owner_space=LEGACY_OWNER_SPACE, driver_space=DRIVER_SPACE, readers=_EITHER
        ),
        backends=("postgresql",),
    ),
    Migration(8, "one driver per run: holder, epoch and lease; each claim's epoch", _OWNERSHIP_8),
    Migration(
        9,
        "row-level security on run ownership; epochs only move forward",
        _OWNERSHIP_ROW_SECURITY_9,
        backends=("postgresql",),
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)  # the newest schema this code knows
assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


def schema_ddl(dialect: Dialect, *, schema: str = "public") -> str:
    """Every migration's DDL, as a script: the tables a fresh database ends up with (for tools
    that build look-alike tables, such as the benchmark's baseline)."""
    return "".join(f"{s};\n" for m in MIGRATIONS for s in m.statements(dialect, schema=schema))


def migrate(
    conn: Connection,
    dialect: Dialect,
    exclusive: Callable[[], AbstractContextManager[Connection]],
    *,
    where: str,
    after: Callable[[Connection], None] | None = None,
) -> int:
    """Bring the database to the newest schema this code knows; return the version it had
    (0: none recorded, a fresh database or one from before versions).

    ``conn`` reads the version; ``exclusive()`` is a transaction holding the backend's schema lock
    (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory transaction lock), in which the version
    is read again and every pending migration applied, so any number of processes may open one
    database at once and each migration runs once. A database already current is opened without
    the lock and without DDL (a role without CREATE rights can use it). A database newer than this
    code is refused before anything is written: this code cannot know what it must not do there.
    ``after`` runs in the same transaction once pending migrations were applied (PostgreSQL makes
    its grants to the registered roles again there).
    """
    migrations = MIGRATIONS  # read when called: a test may add one
    newest = len(migrations)
    found = _version(conn, dialect)
    if found == newest:
        return found
    if found > newest:
        raise _too_new(where, found, newest)
    with exclusive() as locked:
        locked.execute(VERSION_TABLE)
        found = _version(locked, dialect)
        if found > newest:
            raise _too_new(where, found, newest)
        insert = "INSERT INTO keelgate_schema (version, description, applied_at) VALUES (?, ?, ?)"
        schema = locked.execute(dialect.schema_name).fetchone()[0] if dialect.schema_name else ""
        for migration in migrations[found:]:
            for statement in migration.statements(dialect, schema=schema):
                locked.execute(statement)
            locked.execute(
                insert.replace("?", dialect.placeholder),
                (migration.version, migration.description, utc_now()),
            )
        if after is not None and found < newest:
            after(locked)
    return found


def _version(conn: Connection, dialect: Dialect) -> int:
    if not conn.execute(dialect.schema_table_exists).fetchone()[0]:
        return 0
    row = conn.execute("SELECT MAX(version) FROM keelgate_schema").fetchone()
    return 0 if row[0] is None else int(row[0])


def _too_new(where: str, found: int, newest: int) -> StoreError:
    return StoreError(
        f"{where}: its schema is version {found}, newer than this Keelgate knows ({newest}); "
        "open it with the newer Keelgate that wrote it"
    )
