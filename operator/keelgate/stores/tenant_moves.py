"""Copying one tenant's rows from one Keelgate database to another on the same server, and a
digest that says whether two databases hold the same rows of a tenant.

Why it exists: a tenant of an install from before shares the home database with the others
(``keelgate tenant move`` gives it a database of its own, ``TenantStore.move``). Its runs must
arrive whole, with their keys in flight or unknown, their audit chains and writers byte for byte,
or a WRITE could run twice or a chain stop verifying. PostgreSQL cannot copy between databases in
one transaction, so the copy is read from one snapshot of the source, written in one transaction
of the destination, and proved by a digest of every row, computed the same way on both sides;
the caller deletes the source rows only in a transaction that finds the same digest there.

This module must never write to the source database, and never leave a destination transaction
with the audit trigger off (it is turned off and on again inside the copy's own transaction).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from keelgate.errors import StoreError
from keelgate.stores._isolation_ddl import TENANT_TABLES

Conn = psycopg.Connection[tuple[Any, ...]]

# Each tenant table's primary key: rows are digested in this order, bytewise (COLLATE "C"), so
# that two databases with different collations digest the same rows alike.
_KEYS = {
    "keelgate_checkpoints": ("tenant", "run"),
    "keelgate_keys": ("tenant", "key"),
    "keelgate_audit": ("tenant", "run", "seq"),
    "keelgate_specs": ("tenant", "run"),
}
assert tuple(_KEYS) == TENANT_TABLES


def _columns(conn: Conn, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND table_schema = (SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = 'keelgate_schema'::regclass) "
        "ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [str(row[0]) for row in rows]


def _order(table: str) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.SQL('{} COLLATE "C"').format(sql.Identifier(c)) if c != "seq" else sql.Identifier(c)
        for c in _KEYS[table]
    )


def digest(conn: Conn, tenant: str) -> tuple[str, ...]:
    """Per tenant table: how many rows of ``tenant`` and an md5 of them all, in key order."""
    found = []
    for table in TENANT_TABLES:
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in _columns(conn, table))
        row = conn.execute(
            sql.SQL(
                "SELECT count(*), COALESCE(md5(string_agg(md5(ROW({})::text), '' ORDER BY {})), "
                "'') FROM {} WHERE tenant = %s"
            ).format(columns, _order(table), sql.Identifier(table)),
            (tenant,),
        ).fetchone()
        assert row is not None
        found.append(f"{table}:{row[0]}:{row[1]}")
    return tuple(found)


def copy_tenant(source: Conn, destination: Conn, tenant: str) -> tuple[str, ...]:
    """Copy every row of ``tenant`` from ``source`` into ``destination`` (its rows there
    replaced), from one snapshot of the source and in one transaction of the destination, and
    return their digest, which the destination is checked to hold before it commits. Both are
    the administrator's autocommit sessions (the owner of the tables: it writes each audit
    event's recorded writer as it stands)."""
    with source.transaction():
        source.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        copied = digest(source, tenant)
        with destination.transaction():
            # Each event keeps the writer it was written by: the trigger would name the
            # administrator instead. Off only inside this transaction.
            destination.execute("ALTER TABLE keelgate_audit DISABLE TRIGGER keelgate_audit_writer")
            for table in TENANT_TABLES:
                names = _columns(source, table)
                if _columns(destination, table) != names:
                    raise StoreError(f"{table} differs between the two databases' schemas")
                columns = sql.SQL(", ").join(sql.Identifier(c) for c in names)
                target = sql.Identifier(table)
                destination.execute(
                    sql.SQL("DELETE FROM {} WHERE tenant = %s").format(target), (tenant,)
                )
                out = sql.SQL("COPY (SELECT {} FROM {} WHERE tenant = {}) TO STDOUT").format(
                    columns, target, sql.Literal(tenant)
                )
                into = sql.SQL("COPY {} ({}) FROM STDIN").format(target, columns)
                with (
                    source.cursor().copy(out) as reading,
                    destination.cursor().copy(into) as writing,
                ):
                    for data in reading:
                        writing.write(data)
            destination.execute("ALTER TABLE keelgate_audit ENABLE TRIGGER keelgate_audit_writer")
            if digest(destination, tenant) != copied:
                raise StoreError(f"tenant {tenant}'s rows differ after their copy")
    return copied
