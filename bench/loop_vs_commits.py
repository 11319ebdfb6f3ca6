"""How much a Keelgate loop iteration costs over the durable commits it cannot avoid.

One iteration with one WRITE is measured side by side with the raw commits that iteration needs,
issued directly with sqlite3 / psycopg on the same file or server with the same durability
settings and the same payloads. The raw baseline per iteration is the design's minimum:

  1. write-ahead plan: the checkpoint holding the planned action, with its audit event;
  2. claim: the idempotency key recorded in flight before the tool runs, with the action's
     start event (as the loop commits it since a WRITE's start rides with its claim);
  3. completion: the key recorded completed, with its result, after the tool returns;
  4. the action checkpoint (its completed event);
  5. the observe checkpoint;
  6. the verify checkpoint (its verdict event).

Each is one transaction, i.e. one durable commit (an fsync of SQLite's WAL with
synchronous=FULL; a WAL flush in PostgreSQL with fsync=on and synchronous_commit=on). The rows
and JSON documents the baseline writes are the ones a calibration run of the loop produced, so
payload sizes match byte for byte.

Measurements alternate (loop then raw, raw then loop, ...) so that load from other work on the
machine affects both alike; the report gives medians and the spread over rounds. Commits are
counted in separate, untimed passes: SQLite through the connection's trace callback, PostgreSQL
through the transaction ids the server assigned (only a transaction that writes gets one, and
every such commit is flushed). A third pass records checkpoint sizes and bytes written at
iterations ~10, ~200 and ~1000, to show that an iteration's cost does not grow with the run.

This script must never weaken durability to look fast: it uses each store's default settings and
gives the baseline exactly the same ones.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))

from keelgate.adapters.tools.python import PythonTool  # noqa: E402
from keelgate.core.audit import AuditDraft, seal  # noqa: E402
from keelgate.core.loop import Loop  # noqa: E402
from keelgate.core.model import ModelReply, ModelRequest, PlannedCall  # noqa: E402
from keelgate.core.protocols import Stores  # noqa: E402
from keelgate.core.spec import Budget, LoopSpec  # noqa: E402
from keelgate.core.state import HISTORY_WINDOW, OUTPUT_CAP  # noqa: E402
from keelgate.core.types import KeyRecord, SideEffect  # noqa: E402
from keelgate.errors import RunNotFound  # noqa: E402
from keelgate.stores._sql import schema_ddl  # noqa: E402
from keelgate.stores.memory import MemoryStore  # noqa: E402
from keelgate.stores.sqlite import SQLITE  # noqa: E402

TENANT = "bench"
TOOL = "write"
BYTES_AT = (10, 200, 1000)
BYTES_WINDOW = 20


# The loop under test


class StampedModel:
    """A zero-latency model planning one WRITE per call; it notes when each plan is asked for.

    The time between two planning calls is one whole iteration (plan checkpoint, claim, tool,
    completion, action, observe and verify checkpoints, the verify call), free of the run's
    start and stop, so per-iteration figures exclude them.
    """

    def __init__(self, probe: Callable[[], None] | None = None) -> None:
        self.name = "bench"
        self.stamps: list[float] = []
        self.cpu: list[float] = []
        self.probe = probe

    def call(self, request: ModelRequest) -> ModelReply:
        if request.phase == "plan":
            if self.probe is not None:
                self.probe()
            self.stamps.append(time.perf_counter())
            self.cpu.append(time.process_time())
        if request.phase == "verify":
            return ModelReply(verdict="accept")
        # Arguments (and so idempotency keys) differ every iteration, as real WRITEs would.
        return ModelReply(actions=(PlannedCall(TOOL, {"n": request.call}),))


def do_nothing(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
    return {"ok": True}


def write_tool() -> PythonTool:
    return PythonTool(TOOL, do_nothing, SideEffect.WRITE, description="returns at once")


def drive(store: Any, run: str, iterations: int, model: StampedModel) -> None:
    """Run (or resume) ``run`` until it has done ``iterations`` more iterations."""
    loop = Loop(stores=Stores.of(store), model=model, tools=[write_tool()])
    done = 0
    with contextlib.suppress(RunNotFound):
        done = loop.state(TENANT, run).iteration
    spec = LoopSpec(TENANT, run, "benchmark", budget=Budget(max_iterations=done + iterations))
    outcome = loop.run_or_resume(spec)
    if outcome.iteration != done + iterations:
        raise SystemExit(f"bench: the loop stopped early: {outcome.to_json()}")


def per_iteration(stamps: Sequence[float]) -> float:
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


# The baseline's payloads, taken from a real iteration


@dataclass(frozen=True)
class Payload:
    """What one steady-state loop iteration writes, as the stores receive it."""

    checkpoints: tuple[str, str, str, str]  # plan, action, observe, verify: compact JSON
    events: tuple[tuple[Mapping[str, Any], ...], ...]  # audit rows per checkpoint
    claim_events: tuple[Mapping[str, Any], ...]  # audit rows committed with the key claim
    result: str  # the completed key's stored result

    @property
    def checkpoint_bytes(self) -> int:
        return sum(len(c.encode()) for c in self.checkpoints)


class _Recorder(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.saves: list[tuple[dict[str, Any], tuple[AuditDraft, ...]]] = []
        self.claims: list[AuditDraft | None] = []
        self.results: list[Any] = []

    def claim(
        self,
        tenant: str,
        key: str,
        *,
        run: str,
        action: str,
        tool: str,
        event: AuditDraft | None = None,
    ) -> KeyRecord | None:
        self.claims.append(event)
        return super().claim(tenant, key, run=run, action=action, tool=tool, event=event)

    def save_with_events(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
    ) -> None:
        self.saves.append((dict(state), tuple(drafts)))
        super().save_with_events(tenant, run, seq, state, drafts)

    def complete(self, tenant: str, key: str, result: Any) -> bool:
        self.results.append(result)
        return super().complete(tenant, key, result)


def calibrate(warm: int = 40) -> Payload:
    """Run the loop past its history window in memory and keep the last iteration's writes."""
    recorder = _Recorder()
    drive(recorder, "calibrate", warm, StampedModel())
    # The run's last iteration: plan, action, observe, verify, then the max_iterations stop.
    last = recorder.saves[-5:-1]
    steps = [state["step"] for state, _ in last]
    if steps != ["act", "observe", "verify", "plan"]:
        raise SystemExit(f"bench: unexpected checkpoint sequence {steps}")
    head = None

    def sealed(drafts: Sequence[AuditDraft]) -> tuple[Mapping[str, Any], ...]:
        nonlocal head
        rows = []
        for draft in drafts:
            head = seal(TENANT, "raw", head, draft)
            # Serialised here, once: the baseline's timed loop only issues statements.
            rows.append({**head.to_json(), "data_text": json.dumps(dict(head.data))})
        return tuple(rows)

    # In commit order: the plan checkpoint, the claim, then the other checkpoints.
    plan_events = sealed(last[0][1])
    claimed = recorder.claims[-1]
    claim_events = sealed([claimed] if claimed is not None else [])
    events = (plan_events, *(sealed(drafts) for _, drafts in last[1:]))
    texts = tuple(json.dumps(s, separators=(",", ":")) for s, _ in last)
    return Payload(
        (texts[0], texts[1], texts[2], texts[3]),
        events,
        claim_events,
        json.dumps(recorder.results[-1]),
    )


def describe_baseline(payload: Payload) -> list[str]:
    """The baseline's transactions, one line each, with the audit rows each carries."""

    def rows(events: Sequence[Mapping[str, Any]]) -> str:
        return " + " + ", ".join(str(e["type"]) for e in events) + " row(s)" if events else ""

    steps = [
        f"write-ahead plan: checkpoint upsert{rows(payload.events[0])}",
        f"claim: key insert (in flight){rows(payload.claim_events)}",
        "completion: key update (completed, with its result)",
        f"action checkpoint: checkpoint upsert{rows(payload.events[1])}",
        f"observe checkpoint: checkpoint upsert{rows(payload.events[2])}",
        f"verify checkpoint: checkpoint upsert{rows(payload.events[3])}",
    ]
    return [f"  ({n}) {step}" for n, step in enumerate(steps, start=1)]


# Backends


class Backend(Protocol):
    name: str
    settings: str

    def open_store(self) -> Any: ...

    def raw(self, payload: Payload) -> RawSession: ...

    def commit_counter(self, store: Any) -> Callable[[], int]: ...

    def written_counter(self, store: Any) -> tuple[str, Callable[[], int]]: ...

    def close(self) -> None: ...


class RawSession(Protocol):
    def iterate(self, iterations: int) -> tuple[float, float]: ...

    def count(self, iterations: int, counter: Callable[[], int]) -> list[int]: ...

    def counter(self) -> Callable[[], int]: ...

    def close(self) -> None: ...


# The baseline's tables are the stores' own, under other names: same columns, keys and index, so
# the two sides pay for the same B-trees and cannot drift apart.
RAW_SCHEMA = schema_ddl(SQLITE).replace("keelgate_", "raw_")

UPSERT = (
    "INSERT INTO raw_checkpoints (tenant, run, seq, state) VALUES ({p}, {p}, {p}, {p}) "
    "ON CONFLICT (tenant, run) DO UPDATE SET seq = excluded.seq, state = excluded.state "
    "WHERE raw_checkpoints.seq < excluded.seq"
)
EVENT = (
    "INSERT INTO raw_audit (tenant, run, seq, type, actor, at, data, key, prev, hash) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
)
CLAIM = (
    "INSERT INTO raw_keys (tenant, key, run, action, tool, state, owner) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, 'in_flight', {p}) ON CONFLICT DO NOTHING"
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


def _sql(template: str, placeholder: str) -> str:
    return template.format(p=placeholder)


class SQLiteRaw:
    """The baseline on SQLite: one connection, WAL, the store's synchronous setting."""

    def __init__(self, path: Path, synchronous: str, payload: Payload) -> None:
        import sqlite3

        self.db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.executescript(RAW_SCHEMA)
        self.plan = _RawPlan(payload, "raw")
        self.owner = "raw-owner"
        self.upsert = _sql(UPSERT, "?")
        self.event = _sql(EVENT, "?")
        self.claim = _sql(CLAIM, "?")
        self.complete = _sql(COMPLETE, "?")

    def _checkpoint(self, phase: int) -> None:
        state, events = self.plan.checkpoint(phase)
        db = self.db
        if not events:
            db.execute(self.upsert, state)  # a single statement: its own transaction
            return
        db.execute("BEGIN IMMEDIATE")
        db.execute(self.upsert, state)
        db.executemany(self.event, events)
        db.execute("COMMIT")

    def one(self) -> None:
        db = self.db
        self._checkpoint(0)  # write-ahead plan
        key = self.plan.key()
        claim = (TENANT, key, "raw", "1:0", TOOL, self.owner)
        events = self.plan.claim_events()
        if events:
            db.execute("BEGIN IMMEDIATE")
            db.execute(self.claim, claim)
            db.executemany(self.event, events)
            db.execute("COMMIT")
        else:
            db.execute(self.claim, claim)
        do_nothing({}, idempotency_key=key)
        db.execute(self.complete, (self.plan.payload.result, TENANT, key, self.owner))
        self._checkpoint(1)  # action checkpoint
        self._checkpoint(2)  # observe checkpoint
        self._checkpoint(3)  # verify checkpoint

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

    def counter(self) -> Callable[[], int]:
        return sqlite_commit_counter(self.db)

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


def process_bytes_written() -> int:
    """Bytes this process has passed to write(2) so far (Linux /proc/self/io ``wchar``)."""
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


class SQLiteBackend:
    name = "sqlite"

    def __init__(self, workdir: Path) -> None:
        import inspect
        import sqlite3

        from keelgate.stores.sqlite import SQLiteStore

        self.path = workdir / "keelgate.db"
        self.store_class = SQLiteStore
        default = inspect.signature(SQLiteStore.__init__).parameters["synchronous"].default
        self.synchronous = str(default)
        self.settings = (
            f"SQLite {sqlite3.sqlite_version}, journal_mode=WAL, synchronous={self.synchronous} "
            f"(SQLiteStore's default), file {self.path}"
        )
        self.stores: list[Any] = []

    def open_store(self) -> Any:
        store = self.store_class(self.path)
        self.stores.append(store)
        return store

    def raw(self, payload: Payload) -> SQLiteRaw:
        return SQLiteRaw(self.path, self.synchronous, payload)

    def commit_counter(self, store: Any) -> Callable[[], int]:
        # The store's one connection: reached into on purpose, to count what it really does.
        return sqlite_commit_counter(store._db)

    def written_counter(self, store: Any) -> tuple[str, Callable[[], int]]:
        return "bytes written by the process (write(2))", process_bytes_written

    def close(self) -> None:
        for store in self.stores:
            store.close()


class PostgresRaw:
    """The baseline on PostgreSQL: one autocommit connection to the same server and database."""

    def __init__(self, url: str, payload: Payload, counter: Callable[[], int]) -> None:
        import psycopg

        from keelgate.stores.postgres import POSTGRES

        self.db = psycopg.connect(url, autocommit=True)
        with self.db.transaction():
            self.db.execute(schema_ddl(POSTGRES).replace("keelgate_", "raw_"))
        self.plan = _RawPlan(payload, "raw")
        self.owner = 1
        self.upsert = _sql(UPSERT, "%s")
        self.event = _sql(EVENT, "%s")
        self.claim = _sql(CLAIM, "%s")
        self.complete = _sql(COMPLETE, "%s")
        self._counter = counter

    def _checkpoint(self, phase: int) -> None:
        state, events = self.plan.checkpoint(phase)
        db = self.db
        if not events:
            db.execute(self.upsert, state)  # autocommit: its own transaction
            return
        with db.transaction(), db.cursor() as cursor:
            cursor.execute(self.upsert, state)
            cursor.executemany(self.event, events)

    def one(self) -> None:
        self._checkpoint(0)
        key = self.plan.key()
        claim = (TENANT, key, "raw", "1:0", TOOL, self.owner)
        events = self.plan.claim_events()
        if events:
            with self.db.transaction(), self.db.cursor() as cursor:
                cursor.execute(self.claim, claim)
                cursor.executemany(self.event, events)
        else:
            self.db.execute(self.claim, claim)
        do_nothing({}, idempotency_key=key)
        self.db.execute(self.complete, (self.plan.payload.result, TENANT, key, self.owner))
        self._checkpoint(1)
        self._checkpoint(2)
        self._checkpoint(3)

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

    def counter(self) -> Callable[[], int]:
        return self._counter

    def close(self) -> None:
        self.db.close()


def _load_pgserver() -> Any:
    """tests/support/pgserver.py, the project's throw-away real server, loaded by path."""
    import importlib.util

    path = ROOT / "tests" / "support" / "pgserver.py"
    spec = importlib.util.spec_from_file_location("keelgate_bench_pgserver", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


class PostgresBackend:
    """A PostgreSQL server of our own (fsync on), one database for the loop and the baseline."""

    name = "postgres"

    def __init__(self, server: Any) -> None:
        import psycopg

        from keelgate.stores.postgres import PostgresStore

        self.server = server
        self.url: str = server.create_database("keelgate_bench")
        self.store_class = PostgresStore
        # Reads only: a transaction that reads is given no transaction id and flushes nothing.
        self.monitor = psycopg.connect(self.url, autocommit=True)
        shown = {
            name: self._show(name)
            for name in ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")
        }
        version = self._show("server_version")
        self.settings = f"PostgreSQL {version}, " + ", ".join(f"{k}={v}" for k, v in shown.items())
        if shown["fsync"] != "on" or shown["synchronous_commit"] != "on":
            raise SystemExit(f"bench: the server must flush every commit ({self.settings})")
        self.settings += ", loopback TCP, a server of its own"
        self.stores: list[Any] = []

    def _show(self, name: str) -> str:
        row = self.monitor.execute(f"SHOW {name}").fetchone()
        return str(row[0]) if row else "?"

    @classmethod
    @contextlib.contextmanager
    def started(cls) -> Iterator[PostgresBackend]:
        try:
            import psycopg  # noqa: F401  (the postgres extra)
        except ImportError:
            raise SystemExit("bench: PostgreSQL needs the postgres extra (psycopg)") from None
        pgserver = _load_pgserver()
        try:
            server = pgserver.start_postgres(fsync=True)
        except pgserver.PostgresUnavailable as error:
            raise SystemExit(f"bench: no PostgreSQL server: {error}") from None
        try:
            yield cls(server)
        finally:
            server.stop()

    def open_store(self) -> Any:
        store = self.store_class(self.url)
        self.stores.append(store)
        return store

    def xids(self) -> int:
        """Transaction ids the server has handed out: one per transaction that wrote."""
        row = self.monitor.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def wal_bytes(self) -> int:
        row = self.monitor.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def raw(self, payload: Payload) -> PostgresRaw:
        return PostgresRaw(self.url, payload, self.xids)

    def commit_counter(self, store: Any) -> Callable[[], int]:
        return self.xids

    def written_counter(self, store: Any) -> tuple[str, Callable[[], int]]:
        return "WAL bytes the server wrote", self.wal_bytes

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.stores.clear()
        self.monitor.close()


# Measuring


@dataclass
class Figures:
    backend: str
    settings: str
    iterations: int
    loop_ms: list[float] = field(default_factory=list)
    raw_ms: list[float] = field(default_factory=list)
    loop_cpu_ms: list[float] = field(default_factory=list)
    raw_cpu_ms: list[float] = field(default_factory=list)
    loop_commits: list[int] = field(default_factory=list)
    raw_commits: list[int] = field(default_factory=list)
    payload: Payload | None = None
    joint: bool = False
    growth: list[dict[str, Any]] = field(default_factory=list)
    written_label: str = ""
    profile: str = ""

    @property
    def ratios(self) -> list[float]:
        return [loop / raw for loop, raw in zip(self.loop_ms, self.raw_ms, strict=True)]

    @property
    def overheads(self) -> list[float]:
        """What the loop adds over the raw commits, in ms per iteration, round by round."""
        return [loop - raw for loop, raw in zip(self.loop_ms, self.raw_ms, strict=True)]


def measure(
    backend: Backend, *, iterations: int, rounds: int, growth: Sequence[int], profile: bool
) -> Figures:
    payload = calibrate()
    figures = Figures(backend.name, backend.settings, iterations, payload=payload)
    store = backend.open_store()
    figures.joint = hasattr(store, "save_with_events")
    raw = backend.raw(payload)
    try:
        # Warm both up (caches, prepared statements, the history window filling up).
        drive(store, "timed", HISTORY_WINDOW + 5, StampedModel())
        raw.iterate(HISTORY_WINDOW + 5)
        for number in range(rounds):
            order = ("loop", "raw") if number % 2 == 0 else ("raw", "loop")
            for which in order:
                if which == "loop":
                    model = StampedModel()
                    drive(store, "timed", iterations + 1, model)
                    figures.loop_ms.append(per_iteration(model.stamps) * 1000)
                    figures.loop_cpu_ms.append(per_iteration(model.cpu) * 1000)
                else:
                    wall, cpu = raw.iterate(iterations)
                    figures.raw_ms.append(wall * 1000)
                    figures.raw_cpu_ms.append(cpu * 1000)
        # Untimed: count commits per iteration, the loop's and the baseline's.
        counter = backend.commit_counter(store)
        marks: list[int] = []
        drive(store, "counted", 30, StampedModel(probe=lambda: marks.append(counter())))
        figures.loop_commits = [b - a for a, b in itertools.pairwise(marks)]
        figures.raw_commits = raw.count(30, raw.counter())
        if growth:
            figures.growth = grow(backend, figures, growth)
        if profile:
            figures.profile = profiled(backend.open_store(), iterations)
    finally:
        raw.close()
        backend.close()
    return figures


def grow(backend: Backend, figures: Figures, at: Sequence[int]) -> list[dict[str, Any]]:
    """Checkpoint sizes, bytes written and time per iteration at iterations ``at`` (one run).

    Time here includes the size recording and the written-bytes probe, the same at every
    iteration: it is for comparing one point of the run with another, not with the baseline.
    """
    store = backend.open_store()
    label, written = backend.written_counter(store)
    figures.written_label = label
    sizes: list[tuple[int, int]] = []  # (iteration about to be planned, checkpoint bytes)

    def record(method: Callable[..., None]) -> Callable[..., None]:
        def saving(tenant: str, run: str, seq: int, state: Mapping[str, Any], *a: Any) -> None:
            sizes.append((int(state["iteration"]), len(json.dumps(state, separators=(",", ":")))))
            method(tenant, run, seq, state, *a)

        return saving

    for name in ("save", "save_with_events"):
        if hasattr(store, name):
            setattr(store, name, record(getattr(store, name)))
    marks: list[int] = []

    def probe() -> None:
        marks.append(written())

    last = max(at) + BYTES_WINDOW + 1
    model = StampedModel(probe=probe)
    drive(store, "growth", last, model)
    rows = []
    for point in at:
        # marks[i] is taken as iteration i + 1 is planned; iteration i + 1 spans marks[i..i+1].
        window = range(point - 1, point - 1 + BYTES_WINDOW)
        per = [marks[i + 1] - marks[i] for i in window]
        times = [(model.stamps[i + 1] - model.stamps[i]) * 1000 for i in window]
        checkpoint = [
            size for iteration, size in sizes if point <= iteration < point + BYTES_WINDOW
        ]
        rows.append(
            {
                "at": point,
                "ms_median": statistics.median(times),
                "checkpoint_max": max(checkpoint),
                "checkpoint_mean": statistics.mean(checkpoint),
                "written_median": statistics.median(per),
                "written_mean": statistics.mean(per),
            }
        )
    return rows


def profiled(store: Any, iterations: int) -> str:
    """Where a loop iteration's time goes: cProfile over a run, the top functions by own time."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    drive(store, "profiled", iterations, StampedModel())
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats(os.environ.get("BENCH_SORT", "tottime")).print_stats(
        int(os.environ.get("BENCH_ROWS", "20"))
    )
    return out.getvalue()


# Reporting


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def report(all_figures: Sequence[Figures], *, rounds: int, load: tuple[str, str]) -> str:
    lines = [
        f"machine: {os.cpu_count()} cores, shared with other work; load average "
        f"{load[0]} at start, {load[1]} at end",
    ]
    for f in all_figures:
        assert f.payload is not None
        lines.append(f"[{f.backend}] {f.settings}")
        lines.append(
            f"  {rounds} alternating rounds of {f.iterations} iterations each; "
            "median (min-max over rounds)"
        )
        if not f.joint:
            lines.append(
                "  note: this store has no save_with_events, so each checkpoint and its audit "
                "events are two commits"
            )
    lines.append("")
    header = (
        f"{'store':<9}{'loop ms/iter':>20}{'raw ms/iter':>20}{'ratio':>20}"
        f"{'added ms/iter':>21}{'commits/iter: loop':>20}{'raw':>10}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for f in all_figures:
        ratio = f.ratios
        lines.append(
            f"{f.backend:<9}{spread(f.loop_ms):>20}{spread(f.raw_ms):>20}"
            f"{spread(ratio) + 'x':>20}{spread(f.overheads):>21}"
            f"{_commits(f.loop_commits):>20}{_commits(f.raw_commits):>10}"
        )
    lines.append("")
    lines.append("client CPU time per iteration, this process only (the server's is not counted):")
    for f in all_figures:
        lines.append(
            f"  {f.backend:<9} loop {spread(f.loop_cpu_ms)} ms   raw {spread(f.raw_cpu_ms)} ms"
        )
    lines.append("")
    payload = all_figures[0].payload
    assert payload is not None
    lines.append("raw baseline, per iteration: 6 transactions, each one durable commit:")
    lines.extend(describe_baseline(payload))
    lines.append(
        f"  with the loop's own JSON and audit rows: {payload.checkpoint_bytes} checkpoint bytes "
        f"per iteration ({', '.join(str(len(c)) for c in payload.checkpoints)} per phase)."
    )
    for f in all_figures:
        if not f.growth:
            continue
        lines.append("")
        lines.append(
            f"[{f.backend}] growth: iterations at..at+{BYTES_WINDOW - 1} "
            f"(history window {HISTORY_WINDOW} entries, outputs capped at {OUTPUT_CAP} chars)"
        )
        lines.append(
            f"{'iteration':>10}{'checkpoint bytes (max)':>24}{'(mean)':>10}"
            f"{'written/iter (median)':>24}{'(mean)':>10}{'ms/iter (median)':>18}"
        )
        for row in f.growth:
            lines.append(
                f"{row['at']:>10}{row['checkpoint_max']:>24}{row['checkpoint_mean']:>10.0f}"
                f"{row['written_median']:>24.0f}{row['written_mean']:>10.0f}"
                f"{row['ms_median']:>18.2f}"
            )
        lines.append(f"  written = {f.written_label}")
    for f in all_figures:
        if f.profile:
            lines.append("")
            lines.append(f"[{f.backend}] profile of {f.iterations} loop iterations (cProfile)")
            lines.append(f.profile.rstrip())
    return "\n".join(lines)


def _load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _commits(counts: Sequence[int]) -> str:
    """The median over the steady state (past the run's start), and the range when it varies.

    PostgreSQL counts are server-wide: an autovacuum or analyze that writes in the window adds
    its transaction id, so a rare iteration shows more; the median is the loop's own figure.
    """
    steady = counts[len(counts) // 3 :]
    median = statistics.median(steady)
    text = f"{median:g}"
    low, high = min(steady), max(steady)
    return text if low == high else f"{text} ({low}-{high})"


# Main


@contextlib.contextmanager
def backends(names: Sequence[str], workdir: Path) -> Iterator[list[Backend]]:
    opened: list[Backend] = []
    with contextlib.ExitStack() as stack:
        for name in names:
            if name == "sqlite":
                opened.append(SQLiteBackend(workdir / "sqlite"))
                (workdir / "sqlite").mkdir()
            elif name == "postgres":
                opened.append(stack.enter_context(PostgresBackend.started()))
        yield opened


def main(argv: Sequence[str] | None = None) -> int:
    # Each round raises the budget of one long run; that is on the audit chain, not the console.
    logging.getLogger("keelgate").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--iterations", type=int, default=100, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds per store")
    parser.add_argument(
        "--no-growth", action="store_true", help="skip the bytes-per-iteration pass"
    )
    parser.add_argument(
        "--growth-at",
        default=",".join(str(n) for n in BYTES_AT),
        help="iterations at which to measure checkpoint bytes (comma-separated)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of loop iterations"
    )
    args = parser.parse_args(argv)
    if args.iterations < 2 or args.rounds < 1:
        parser.error("--iterations must be at least 2 and --rounds at least 1")
    try:
        growth_at = sorted({int(n) for n in args.growth_at.split(",") if n.strip()})
    except ValueError:
        parser.error("--growth-at takes whole numbers separated by commas, e.g. 10,200,1000")
    if not growth_at or growth_at[0] < 1:
        parser.error("--growth-at takes iterations of at least 1")
    names = ("sqlite", "postgres") if args.store == "all" else (args.store,)
    results = []
    start_load = _load_average()
    with tempfile.TemporaryDirectory(prefix="keelgate-bench-") as tmp:
        os.chmod(tmp, 0o755)
        with backends(names, Path(tmp)) as opened:
            for backend in opened:
                print(f"measuring {backend.name} ...", file=sys.stderr, flush=True)
                results.append(
                    measure(
                        backend,
                        iterations=args.iterations,
                        rounds=args.rounds,
                        growth=() if args.no_growth else growth_at,
                        profile=args.profile,
                    )
                )
    print(report(results, rounds=args.rounds, load=(start_load, _load_average())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
