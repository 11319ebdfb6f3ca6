"""The baseline: the durable commits one loop iteration needs, issued directly with sqlite3 or
psycopg on the same file or server, with the same settings, tables and payloads.

Why it exists: the loop's cost is measured against the least the design could do, four
transactions per iteration, each one durable commit. It must never commit less durably than the
store it is compared with, nor write other bytes than the loop wrote.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from commitbench.loop import TENANT, TOOL, Payload, do_nothing
from keelgate.core import fence
from keelgate.stores._dialect import Dialect
from keelgate.stores._migrations import schema_ddl
from keelgate.stores.sqlite import SQLITE

DEADLINE_IN = fence.DEFAULT_CALL_SECONDS + fence.MARGIN

# The baseline's tables are the stores' own, under other names: same columns, keys and index, so
# the two sides pay for the same B-trees and cannot drift apart.
RAW_SCHEMA = schema_ddl(SQLITE).replace("keelgate_", "raw_")

UPSERT = (
    "INSERT INTO raw_checkpoints (tenant, run, seq, state) VALUES ({p}, {p}, {p}, {p}) "
    "ON CONFLICT (tenant, run) DO UPDATE SET seq = excluded.seq, state = excluded.state "
    "WHERE raw_checkpoints.seq < excluded.seq"
)
EVENT_INTO = "INSERT INTO raw_audit (tenant, run, seq, type, actor, at, data, key, prev, hash)"
EVENT = EVENT_INTO + " VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
# A claim records its write deadline on the store's clock and its own id, as the stores' does.
CLAIM = (
    "INSERT INTO raw_keys (tenant, key, run, action, tool, state, owner, deadline, claim_id) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, 'in_flight', {p}, "
    "CAST({clock} AS {real}) + CAST({p} AS {real}), {p}) ON CONFLICT DO NOTHING"
)
COMPLETE = (
    "UPDATE raw_keys SET state = 'completed', result = {p}, owner = NULL "
    "WHERE tenant = {p} AND key = {p} AND state = 'in_flight' AND owner = {p}"
)


class _RawPlan:
    """The statements of one baseline iteration, grouped by transaction, with fresh values."""

    def __init__(self, payload: Payload, run: str) -> None:
        self.payload = payload
        self.run = run
        self.seq = 0
        self.event_seq = 0
        self.iteration = 0

    def _events(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        out = []
        for row in rows:
            self.event_seq += 1
            key = row["key"]
            out.append(
                (
                    TENANT,
                    self.run,
                    self.event_seq,
                    row["type"],
                    row["actor"],
                    row["at"],
                    row["data_text"],
                    None if key is None else f"{key}#{self.event_seq}",
                    row["prev"],
                    row["hash"],
                )
            )
        return out

    def claim_events(self) -> list[tuple[Any, ...]]:
        return self._events(self.payload.claim_events)

    def checkpoint(self, phase: int) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
        self.seq += 1
        state = (TENANT, self.run, self.seq, self.payload.checkpoints[phase])
        return state, self._events(self.payload.events[phase])

    def key(self) -> str:
        self.iteration += 1
        return f"kg-{self.run}-{self.iteration:08d}"


def _sql(template: str, placeholder: str, dialect: Dialect = SQLITE) -> str:
    return template.format(p=placeholder, clock=dialect.clock, real=dialect.real)


Rows = list[tuple[Any, ...]]


class RawSession:
    """The baseline's four transactions per iteration over one connection. A backend gives
    ``execute`` (one statement, its own transaction), ``together`` (a statement and a batch of
    rows in one transaction) and ``counter`` (its commits so far)."""

    placeholder = "?"
    dialect: Dialect = SQLITE
    owner: Any
    execute: Callable[[str, tuple[Any, ...]], Any]

    def __init__(self, payload: Payload) -> None:
        self.plan = _RawPlan(payload, "raw")
        self.upsert = _sql(UPSERT, self.placeholder)
        self.event = _sql(EVENT, self.placeholder)
        self.claim = _sql(CLAIM, self.placeholder, self.dialect)
        self.complete = _sql(COMPLETE, self.placeholder)

    def together(
        self,
        statement: str,
        values: tuple[Any, ...],
        batch: str,
        rows: Rows,
        *,
        then: tuple[str, tuple[Any, ...]] | None = None,
    ) -> None:
        """``statement``, then ``then`` if given, then the batch, in one transaction."""
        raise NotImplementedError

    def counter(self) -> Callable[[], int]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _checkpoint(self, phase: int) -> None:
        state, events = self.plan.checkpoint(phase)
        if events:
            self.together(self.upsert, state, self.event, events)
        else:
            self.execute(self.upsert, state)  # a single statement: its own transaction

    def one(self) -> None:
        self._checkpoint(0)  # write-ahead plan
        key = self.plan.key()
        # The loop's WRITE has no time limit of its own: the default one, plus the margin.
        claim = (TENANT, key, "raw", "1:0", TOOL, self.owner, DEADLINE_IN, uuid.uuid4().hex)
        events = self.plan.claim_events()
        if events:
            self.together(self.claim, claim, self.event, events)
        else:
            self.execute(self.claim, claim)
        do_nothing({}, idempotency_key=key)
        # The completion, the action's checkpoint and its observation: one transaction.
        state, events = self.plan.checkpoint(1)
        completed = (self.plan.payload.result, TENANT, key, self.owner)
        self.together(self.complete, completed, self.event, events, then=(self.upsert, state))
        self._checkpoint(2)  # verify checkpoint

    def iterate(self, iterations: int) -> tuple[float, float]:
        """Seconds per iteration: wall clock, and this process's CPU time."""
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(iterations):
            self.one()
        return (
            (time.perf_counter() - start) / iterations,
            (time.process_time() - cpu) / iterations,
        )

    def count(self, iterations: int, counter: Callable[[], int]) -> list[int]:
        counts = []
        for _ in range(iterations):
            before = counter()
            self.one()
            counts.append(counter() - before)
        return counts


class SQLiteRaw(RawSession):
    """The baseline on SQLite: one connection, WAL, the store's synchronous setting."""

    def __init__(self, path: Path, synchronous: str, payload: Payload) -> None:
        import sqlite3

        super().__init__(payload)
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.executescript(RAW_SCHEMA)
        self.owner = "raw-owner"
        self.execute = self.db.execute

    def together(
        self,
        statement: str,
        values: tuple[Any, ...],
        batch: str,
        rows: Rows,
        *,
        then: tuple[str, tuple[Any, ...]] | None = None,
    ) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute(statement, values)
        if then is not None:
            self.db.execute(*then)
        if rows:
            self.db.executemany(batch, rows)
        self.db.execute("COMMIT")

    def counter(self) -> Callable[[], int]:
        return sqlite_commit_counter(self.db)

    def close(self) -> None:
        self.db.close()


class PostgresRaw(RawSession):
    """The baseline on PostgreSQL: one autocommit connection to the same server and database."""

    placeholder = "%s"

    def __init__(self, url: str, payload: Payload, counter: Callable[[], int]) -> None:
        import psycopg

        from keelgate.stores.postgres import POSTGRES

        self.dialect = POSTGRES
        super().__init__(payload)
        self.db = psycopg.connect(url, autocommit=True)
        with self.db.transaction():
            self.db.execute(schema_ddl(POSTGRES).replace("keelgate_", "raw_"))
        self.owner = 1
        self.execute = self.db.execute  # autocommit: each its own transaction
        self._counter = counter

    def together(
        self,
        statement: str,
        values: tuple[Any, ...],
        batch: str,
        rows: Rows,
        *,
        then: tuple[str, tuple[Any, ...]] | None = None,
    ) -> None:
        # One statement, as the PostgreSQL store commits (``Statements.together``): every write
        # of the transaction in one data-modifying WITH, the events only if the row before
        # them was written; one round trip instead of BEGIN, the statements and COMMIT.
        parts, params = [f"first AS ({statement} RETURNING 1)"], list(values)
        joined = "first"
        if then is not None:
            parts.append(f"then_ AS ({then[0]} RETURNING 1)")
            params.extend(then[1])
            joined = "then_"
        if rows:
            one = "(%s, %s, CAST(%s AS bigint), %s, %s, %s, %s, %s, %s, %s)"
            parts.append(
                f"events AS ({EVENT_INTO} SELECT event.* FROM "
                f"(VALUES {', '.join([one] * len(rows))}) AS event, {joined} RETURNING 1)"
            )
            params.extend(value for row in rows for value in row)
        counted = ", ".join(f"(SELECT count(*) FROM {part})" for part in ("first", joined))
        row = self.db.execute(f"WITH {', '.join(parts)} SELECT {counted}", params).fetchone()
        if row is None or tuple(row) != (1, 1):
            raise SystemExit("bench: a baseline write found nothing to write")

    def counter(self) -> Callable[[], int]:
        return self._counter

    def close(self) -> None:
        self.db.close()


def sqlite_commit_counter(db: Any) -> Callable[[], int]:
    """Count the commits a connection performs, from the statements SQLite reports running.

    A COMMIT ends an explicit transaction; a write statement run outside one is its own
    transaction and commits on its own. Reads commit nothing durable and are not counted.
    """
    commits = [0]

    def trace(sql: str) -> None:
        word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if word == "COMMIT" or (
            word in ("INSERT", "UPDATE", "DELETE", "REPLACE") and not db.in_transaction
        ):
            commits[0] += 1

    db.set_trace_callback(trace)
    return lambda: commits[0]
