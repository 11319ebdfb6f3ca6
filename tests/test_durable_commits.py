"""How many durable commits an iteration costs: 2k+2 for k WRITEs, k+2 for k READs.

Why it exists: each durable commit is an fsync a user pays for on every iteration
(docs/design.md, "Durable commits per iteration"). The commits with nothing outside the process
between them (a WRITE's completion, its action checkpoint and the observation) are one; the ones
that follow a model call or precede a tool call stay apart. These tests count the commits the real
stores perform (SQLite's statements as the connection reports them, PostgreSQL's transaction ids
as the server hands them out), never what the code says it does; the crash suites prove that
nothing was lost by grouping them. On PostgreSQL each commit is also one round trip, counted on
the wire.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from crashkit import Journal, World
from keelgate.core.protocols import Stores
from keelgate.core.types import StopReason
from keelgate.stores import open_stores
from support.restock import PLACE, READ_A1, Recorder, loop_over, spec

LOOK_B2: dict[str, Any] = {"tool": "get_inventory", "args": {"sku": "B2"}}
PLACE_B2: dict[str, Any] = {"tool": "place_order", "args": {"sku": "B2", "qty": 5}}

# One READ, one WRITE, two WRITEs, two READs, then done.
SCRIPT: list[dict[str, Any]] = [
    {"actions": [READ_A1]},
    {"actions": [PLACE]},
    {"actions": [{**PLACE, "args": {"sku": "C3", "qty": 1}}, PLACE_B2]},
    {"actions": [READ_A1, LOOK_B2]},
    {"done": True, "answer": "restocked"},
]
# Per iteration: the plan, then per READ its checkpoint and per WRITE its claim and its
# checkpoint (the last one also the observation), then the verdict. The last iteration plans
# "done" and stops goal_met: the plan and the stop.
EXPECTED = [1 + 1 + 1, 1 + 2 + 1, 1 + 4 + 1, 1 + 2 + 1, 1 + 1]


def _sqlite_commits(stores: Stores) -> Callable[[], int]:
    """Commits on the store's connection: every COMMIT, and every write run outside a
    transaction (its own commit)."""
    db: sqlite3.Connection = stores.checkpoints._db  # type: ignore[attr-defined]
    count = [0]

    def trace(sql: str) -> None:
        word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if word == "COMMIT" or (
            word in ("INSERT", "UPDATE", "DELETE", "REPLACE") and not db.in_transaction
        ):
            count[0] += 1

    db.set_trace_callback(trace)
    return lambda: count[0]


def _postgres_commits(url: str) -> tuple[Callable[[], int], Callable[[], None]]:
    """Transaction ids the server handed out: one per transaction that wrote (a read-only
    statement gets none, nor does this counter's own query)."""
    import psycopg

    monitor = psycopg.connect(url, autocommit=True)

    def xids() -> int:
        row = monitor.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0])

    return xids, monitor.close


def _per_iteration(
    stores: Stores, counter: Callable[[], int], tmp_path: Path
) -> tuple[list[int], int]:
    """Drive the script; the commits between one planning call and the next, and the WRITEs
    that reached downstream."""
    marks: list[int] = []

    def on_call(request: Mapping[str, Any]) -> None:
        if request["phase"] == "plan":
            marks.append(counter())

    world = World(Journal(tmp_path / "world.jsonl"))
    loop = loop_over(stores, Recorder(SCRIPT, on_call=on_call), world.tools())
    outcome = loop.run_or_resume(spec(max_iterations=10))
    assert outcome.stop.reason is StopReason.GOAL_MET
    marks.append(counter())
    return [b - a for a, b in itertools.pairwise(marks)], sum(world.effects().values())


def test_sqlite_an_iteration_costs_two_commits_per_write_plus_two(tmp_path: Path) -> None:
    """On SQLite an iteration with one WRITE is 4 durable commits (it was 6), two WRITEs 6, a
    READ 3; every WRITE reaches downstream once."""
    stores = open_stores(f"sqlite:///{tmp_path}/k.db")
    try:
        per_iteration, effects = _per_iteration(stores, _sqlite_commits(stores), tmp_path)
    finally:
        stores.close()
    assert per_iteration == EXPECTED
    assert effects == 3


@pytest.mark.postgres
def test_postgres_an_iteration_costs_two_commits_per_write_plus_two(
    pg_url: str, tmp_path: Path
) -> None:
    """On PostgreSQL the same: 4 commits for an iteration with one WRITE, 6 with two, 3 with
    one READ, counted by the transaction ids the server hands out."""
    counter, close = _postgres_commits(pg_url)
    stores = open_stores(pg_url)
    try:
        per_iteration, effects = _per_iteration(stores, counter, tmp_path)
    finally:
        stores.close()
        close()
    assert per_iteration == EXPECTED
    assert effects == 3


def _re_recording(stores: Stores, counter: Callable[[], int]) -> list[int]:
    """Commits of: a first record, the same again (as before every step pod), a changed spec
    at the same generation, and a newer generation; each record's answer is checked."""
    specs = stores.specs
    assert specs is not None
    commits = []
    for spec_doc, generation in (({"goal": "a"}, 1), ({"goal": "a"}, 1), ({"goal": "b"}, 1)):
        before = counter()
        assert specs.record_spec("shop", "r", spec_doc, source="uid-1", generation=generation)
        commits.append(counter() - before)
    before = counter()
    assert specs.record_spec("shop", "r", {"goal": "b"}, source="uid-1", generation=2)
    commits.append(counter() - before)
    recorded = specs.recorded_spec("shop", "r")
    assert recorded is not None and (recorded.generation, dict(recorded.spec)) == (
        2,
        {"goal": "b"},
    )
    return commits


def test_sqlite_recording_the_same_spec_again_costs_no_commit(tmp_path: Path) -> None:
    """The operator records a run's spec before every step pod: on SQLite, a record identical
    to the stored one is accepted without a durable commit; a changed spec still is one."""
    stores = open_stores(f"sqlite:///{tmp_path}/k.db")
    try:
        assert _re_recording(stores, _sqlite_commits(stores)) == [1, 0, 1, 1]
    finally:
        stores.close()


@pytest.mark.postgres
def test_postgres_recording_the_same_spec_again_costs_no_commit(pg_url: str) -> None:
    """The same on PostgreSQL, counted by the transaction ids the server hands out."""
    counter, close = _postgres_commits(pg_url)
    stores = open_stores(pg_url)
    try:
        assert _re_recording(stores, counter) == [1, 0, 1, 1]
    finally:
        stores.close()
        close()


MARK = "SELECT 'keelgate test: a planning call'"


def _requests_between_marks(trace: str) -> list[int]:
    """Requests the client sent between two marks (simple queries starting with ``MARK``) in a
    libpq wire trace: each one a round trip (a ``Sync`` ends an extended-protocol request, a
    ``Query`` is a simple one, as psycopg sends BEGIN and COMMIT)."""
    counts: list[int] = []
    for line in trace.splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or fields[0] != "F":
            continue
        if fields[2] == "Query" and MARK in fields[3]:
            counts.append(0)
        elif fields[2] in ("Sync", "Query") and counts:
            counts[-1] += 1
    return counts[:-1]


@pytest.mark.postgres
@pytest.mark.parametrize("pooled", [False, True], ids=["as-a-step-opens-it", "pooled"])
def test_postgres_a_loop_sends_one_request_per_commit_on_one_session(
    pg_url: str, tmp_path: Path, pooled: bool
) -> None:
    """On PostgreSQL, each durable commit is one request to the server, one round trip: an
    iteration with one WRITE sends 4 (it sent 17: BEGIN, two or three statements and COMMIT for
    each commit), counted on the wire by libpq's trace; every WRITE still reaches downstream
    once. All of them go on the owner session, where the claims must go: opened as a step pod
    opens it (no pool), and also with a pool, which a loop on one thread leaves unused (its
    commits spread over two sessions cost more client and wall time)."""
    from psycopg import pq

    stores = open_stores(pg_url, pooled=pooled)
    conn = stores.checkpoints._owner_conn  # type: ignore[attr-defined]
    # Never prepared, so each request is counted alike (psycopg prepares a statement on its
    # fifth use, one more round trip once).
    conn.prepare_threshold = None
    marks = itertools.count()
    wire = tmp_path / "wire.trace"
    try:
        with wire.open("w") as out:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

            def mark() -> int:
                conn.execute(f"{MARK} || ' {next(marks)}'")  # a new text: never prepared
                return 0

            _, effects = _per_iteration(stores, mark, tmp_path)
            conn.pgconn.untrace()
    finally:
        stores.close()
    # The last: the stop's commit, then the run's lock released (a request, not a commit).
    assert _requests_between_marks(wire.read_text()) == [*EXPECTED[:-1], EXPECTED[-1] + 1]
    assert effects == 3
