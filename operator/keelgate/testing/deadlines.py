"""Write deadlines passed on demand: what a test does instead of waiting for them.

A claim's write deadline is set and judged on the store's own clock (``keelgate.core.fence``), and
a settlement "not executed" is refused until it has passed. A test that settles such a key right
after a simulated death would have to sleep through the tool's time limit; ``pass_deadlines``
moves the deadlines into the past instead, exactly as the store's clock would have moved past
them. It touches nothing else (owners, states, results), and it must never be used outside tests.
"""

from __future__ import annotations

from typing import Any


def pass_deadlines(store: Any, tenant: str | None = None) -> int:
    """Make the write deadline of every in-flight key of ``store`` (a SQL store: SQLite,
    PostgreSQL, memory; or ``Stores`` holding one) a second in the past on the store's clock,
    for ``tenant`` or all. Returns how many keys it moved."""
    from keelgate.stores._sql import SQLStore

    target = getattr(store, "idempotency", store)
    if not isinstance(target, SQLStore):
        raise TypeError(f"pass_deadlines needs a SQL store, not {type(target).__name__}")
    dialect = target.dialect
    clock = f"CAST({dialect.clock} AS {dialect.real})"
    sql = (
        f"UPDATE keelgate_keys SET deadline = {clock} - 1 WHERE state = 'in_flight' "
        f"AND deadline > {clock} - 1 AND (CAST(? AS TEXT) IS NULL OR tenant = ?)"
    ).replace("?", dialect.placeholder)
    with target._statement() as conn:
        return int(conn.execute(sql, (tenant, tenant)).rowcount)
