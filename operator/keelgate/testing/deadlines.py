"""Write deadlines passed on demand: what a test does instead of waiting for them.

A claim's write deadline is set and judged on the store's own clock (``keelgate.core.fence``), and
a settlement "not executed" is refused until it has passed. A test that settles such a key right
after a simulated death would have to sleep through the tool's time limit; ``pass_deadlines``
moves the deadlines into the past instead, exactly as the store's clock would have moved past
them. It touches nothing else (owners, states, results), and it must never be used outside tests.
``pass_leases`` does the same for the leases of run ownership. ``within_a_call`` runs a tool
directly as the gateway runs it, under a write deadline.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from keelgate.core.fence import Invocation, WriteDeadline, invoking


def pass_deadlines(store: Any, tenant: str | None = None) -> int:
    """Make the write deadline of every in-flight key of ``store`` (a SQL store: SQLite,
    PostgreSQL, memory; or ``Stores`` holding one) a minute in the past on the store's clock,
    for ``tenant`` or all: long enough ago that a person's write now is plainly after it (the
    operator takes a "not executed" written within ``CLOCK_SKEW`` of it as early). Returns how
    many keys it moved."""
    return _a_second_ago(
        store,
        "idempotency",
        "UPDATE keelgate_keys SET deadline = {ago} WHERE state = 'in_flight' AND deadline > {ago}",
        tenant,
        seconds=60,
    )


def pass_leases(store: Any, tenant: str | None = None) -> int:
    """Make every live lease of run ownership (``SQLStore.take``) of ``store`` lapse a second
    ago on the store's clock, for ``tenant`` or all: what a holder paused past its lease, or
    dead without letting go, looks like once the lease has run out. Returns how many it moved."""
    return _a_second_ago(
        store,
        "checkpoints",
        "UPDATE keelgate_owners SET expires = {ago} WHERE expires > {ago}",
        tenant,
    )


def _a_second_ago(
    store: Any, role: str, update: str, tenant: str | None, *, seconds: int = 1
) -> int:
    """Run ``update`` (``{ago}``: ``seconds`` ago on the store's clock, a second unless told)
    on the SQL store in ``store``'s ``role`` (or ``store`` itself), for ``tenant``'s rows or
    all; rows changed."""
    from keelgate.stores._sql import SQLStore

    target = getattr(store, role, store)
    if not isinstance(target, SQLStore):
        raise TypeError(f"moving moments needs a SQL store, not {type(target).__name__}")
    dialect = target.dialect
    ago = f"CAST({dialect.clock} AS {dialect.real}) - {int(seconds)}"
    sql = (update.format(ago=ago) + " AND (CAST(? AS TEXT) IS NULL OR tenant = ?)").replace(
        "?", dialect.placeholder
    )
    with target._statement() as conn:
        return int(conn.execute(sql, (tenant, tenant)).rowcount)


@contextmanager
def within_a_call(key: str, seconds: float = 30.0) -> Iterator[Invocation]:
    """Run the block as the gateway runs a WRITE's or PROPOSE's tool: under the call's write
    deadline ``seconds`` from now, its requests recorded as the call's (``Invocation.sent``).
    For tests that call a tool directly, as the gateway would."""
    call = Invocation(WriteDeadline.starting_now(key, seconds))
    with invoking(call):
        yield call
    call.end()
