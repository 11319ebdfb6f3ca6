"""Schema migration 7 (PostgreSQL only): what tenants that share a server may still take from each
other through the lock functions, closed; and where a tenant with a database of its own keeps
its rows.

Why it exists apart from ``_migrations.py``: it is one idea (issue 47), and the migrations'
module is long enough. ``_migrations.MIGRATIONS`` lists it like every other step; it runs once
per database, under the schema lock, in one transaction with its version row.

- ``keelgate_owner_alive(id)`` judged an owner by taking a shared session lock on its id and
  giving it back in a second statement: a statement cancelled between the two (a tiny
  ``statement_timeout``) left the lock held for the rest of the session, walling off ids. It now
  tries a transaction-level shared lock, which ends with the statement's transaction whatever
  happens. And it answers a tenant's role only about owners of in-flight keys of its own tenant
  (the operator's and the administrator's roles read every tenant): it no longer tells one
  tenant which of another's ids are live, or when they close.
- ``keelgate_lock_run`` counted a tenant's run locks, then took one: sessions racing through the
  gap all passed the count (16 racing sessions took 6 run locks under a limit of 4). The count
  and the take are now serialised per tenant by a transaction-level lock on the tenant's space,
  held for the one statement.
- ``keelgate_databases`` says which tenants keep their rows in a database of their own on the
  same server (``keelgate tenant add``): the operator's role reads it to find them. A
  restrictive policy on every tenant table keeps such a tenant's rows out of this database for
  every registered role, so a writer that still thinks the tenant is here (an operator whose
  route is a moment old) is refused, never left writing where nobody reads.

Nothing here may take a lock in one statement and release it in another, or tell one tenant's
role anything about another tenant.
"""

from __future__ import annotations

#: (LIMIT_SPACE, space): held for one statement while a tenant's run locks are counted and one
#: is taken, so that racing sessions are counted one after the other.
LIMIT_SPACE = 0x4B470005

# The tables whose rows belong to a tenant (every one with a ``tenant`` column but the lookup).
TENANT_TABLES = ("keelgate_checkpoints", "keelgate_keys", "keelgate_audit", "keelgate_specs")

_ELSEWHERE = "tenant NOT IN (SELECT d.tenant FROM keelgate_databases d)"


def isolation_ddl(*, legacy_owner_space: int, driver_space: int, readers: str) -> tuple[str, ...]:
    """Migration 7's statements (``{schema}`` is filled in by ``Migration.statements``).
    ``readers`` (who may read a row: its tenant's role and the operator's) and the key spaces
    are the SQL store's own (one definition each)."""
    owner_alive = f"""CREATE OR REPLACE FUNCTION keelgate_owner_alive(owner bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, {{schema}}, pg_temp AS $$
DECLARE
    caller_kind text;
    caller_tenant text;
BEGIN
    IF owner = NULLIF(current_setting('keelgate.owner', true), '')::bigint THEN
        RETURN true;  -- this session's own id (``keelgate_owner_take`` noted it)
    END IF;
    SELECT t.kind, t.tenant INTO caller_kind, caller_tenant FROM keelgate_tenants t
        WHERE t.role = session_user;
    IF caller_kind = 'tenant' AND NOT EXISTS (
            SELECT 1 FROM keelgate_keys k WHERE k.owner = keelgate_owner_alive.owner
            AND k.state = 'in_flight' AND k.tenant = caller_tenant) THEN
        RETURN false;  -- owns no key this tenant may read: nothing to tell it
    END IF;
    -- A shared lock is granted only while no session holds the id's; it ends with this
    -- statement's transaction, so no cancel can leave it held.
    IF owner < 2147483648 THEN  -- drawn before migration 4: locked as two int4 keys
        RETURN NOT pg_try_advisory_xact_lock_shared({legacy_owner_space}, owner::integer);
    END IF;
    RETURN NOT pg_try_advisory_xact_lock_shared(owner);
END
$$"""
    lock_run = f"""CREATE OR REPLACE FUNCTION keelgate_lock_run(p_tenant text, p_run text)
    RETURNS integer[] LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, {{schema}}, pg_temp AS $$
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
        v_space := {driver_space};
    ELSE
        -- One counter at a time per tenant, until this statement's transaction ends: the count
        -- below and the lock taken after it are one step for racing sessions.
        PERFORM pg_advisory_xact_lock({LIMIT_SPACE}, v_space);
        IF (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
            AND objsubid = 2 AND classid = v_space::bigint::oid
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
           >= most THEN
            RAISE EXCEPTION 'tenant % drives % runs at once, its lock limit', p_tenant, most
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END IF;
    IF pg_try_advisory_lock(v_space, digest) THEN
        RETURN ARRAY[v_space, digest];
    END IF;
    RETURN NULL;
END
$$"""
    statements = [
        owner_alive,
        lock_run,
        # What keelgate_owner_alive looks up for a tenant's role: in-flight keys by owner.
        "CREATE INDEX keelgate_keys_in_flight ON keelgate_keys (owner) WHERE state = 'in_flight'",
        "CREATE TABLE keelgate_databases (tenant TEXT PRIMARY KEY, database TEXT NOT NULL UNIQUE)",
        "ALTER TABLE keelgate_databases ENABLE ROW LEVEL SECURITY",
        # Every role's statements on a tenant table read it (the restrictive policies below);
        # row-level security shows each only the rows it may see (none to a role not registered).
        "GRANT SELECT ON keelgate_databases TO PUBLIC",
        f"CREATE POLICY keelgate_databases_read ON keelgate_databases FOR SELECT USING ({readers})",
    ]
    statements.extend(kept_here(table) for table in TENANT_TABLES)
    return tuple(statements)


def kept_here(table: str) -> str:
    """The restrictive policy that keeps the rows of a tenant with a database of its own out
    of ``table`` in the home database (migration 7's tables, and later ones keyed by tenant)."""
    return (
        f"CREATE POLICY {table}_here ON {table} AS RESTRICTIVE FOR ALL "
        f"USING ({_ELSEWHERE}) WITH CHECK ({_ELSEWHERE})"
    )
