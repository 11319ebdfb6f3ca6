"""The audit chain tells what happened even when the process died in the middle of a WRITE:
the WRITE's start is on the chain before the call, and the chain never holds its arguments (nor
the values of a spec edited between resumes). What it tells cannot be rewritten unnoticed: every
stored column of an event is sealed, and an edited, removed or cut-off event is found. It stays
one chain when a resume repeats nothing and when processes race to write it."""

from __future__ import annotations

import json
import multiprocessing
import re
import shutil
import sqlite3
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from crashkit import World
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core import failpoints
from keelgate.core.audit import AuditDraft, verify
from keelgate.core.loop import Loop
from keelgate.core.protocols import CheckpointLog, Stores, Tool
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect, StopReason
from keelgate.errors import SimulatedCrash, StaleCheckpoint
from keelgate.stores import open_stores
from keelgate.stores.memory import MemoryStore
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing import failpoint
from keelgate.testing.deadlines import pass_deadlines
from support.ledger import REVIEW_SPEC, scripted
from support.restock import RESTOCK, Recorder, loop_over, loop_with_look_and_order, spec
from support.stores import StoreFactory, store_fixture

durable_factory = store_fixture("sqlite", "postgres")
SPAWN = multiprocessing.get_context("spawn")  # no fork: the parent has pool threads running

SCRIPT: list[dict[str, Any]] = [
    {"actions": [{"tool": "place_order", "args": {"sku": "SECRET-SKU", "qty": 7}}]},
    {"done": True, "answer": "ok"},
]


def _loop(store: Any, sent: list[str]) -> Loop:
    def place(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        sent.append(str(idempotency_key))
        failpoint("mid_tool")
        return {"placed": True}

    return Loop(
        stores=Stores.of(store),
        model=ScriptedModel(SCRIPT),
        tools=[PythonTool("place_order", place, SideEffect.WRITE)],
    )


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_a_write_cut_off_mid_call_is_on_the_chain_as_started(backend: str, tmp_path: Path) -> None:
    """Death inside the tool: after restart the chain shows the WRITE started (with its key),
    then the unknown-outcome stop, and no event holds the arguments."""
    sent: list[str] = []
    memory = MemoryStore()
    first = SQLiteStore(tmp_path / "k.db") if backend == "sqlite" else memory
    spec = LoopSpec("shop", "restock", "restock")
    with failpoints.armed({"mid_tool": 1}), pytest.raises(SimulatedCrash):
        _loop(first, sent).run_or_resume(spec)
    first.close()
    second = SQLiteStore(tmp_path / "k.db") if backend == "sqlite" else memory.reopen()
    try:
        loop = _loop(second, sent)
        outcome = loop.run_or_resume(spec)
        assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN
        events = loop.audit("shop", "restock")
        types = [e.type for e in events]
        started = [e for e in events if e.type == "loop.action_started"]
        assert len(started) == 1 and started[0].data["idempotencyKey"] == sent[0]
        assert types.index("loop.action_started") < types.index("loop.stopped")
        assert loop.verify_audit("shop", "restock").ok
        assert "SECRET-SKU" not in json.dumps([e.to_json() for e in events])
        assert len(sent) == 1
    finally:
        second.close()


def test_a_write_that_ran_after_its_key_was_settled_is_noted_and_the_settlement_stands() -> None:
    """The owner's session is lost mid-call (here: the memory backend forgets it is alive), so
    others read the key unknown; the call outlasts its write deadline (a slow server), and a
    person, finding nothing downstream yet, abandons it; then the call returns success. The
    person's record stands (never overwritten, never retried) and the chain says what came."""
    memory = MemoryStore()
    judge = memory.reopen()

    def place(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        memory.backend.live_owners.discard(memory.owner)  # the owner's session is cut
        assert idempotency_key is not None
        pass_deadlines(judge)  # the request left in time; its answer comes after the deadline
        judge.settle("shop", idempotency_key, executed=False, by="alice", source="human")
        return {"placed": True}

    loop = Loop(
        stores=Stores.of(memory),
        model=ScriptedModel(SCRIPT),
        tools=[PythonTool("place_order", place, SideEffect.WRITE)],
    )
    outcome = loop.run_or_resume(LoopSpec("shop", "late", "restock"))
    assert outcome.stop.reason is StopReason.GOAL_MET
    (late,) = [e for e in loop.audit("shop", "late") if e.type == "loop.late_result"]
    assert (late.data["recorded"], late.data["settledBy"]) == ("abandoned", "alice")
    key = late.data["idempotencyKey"]
    record = judge.get("shop", key)
    assert record is not None and record.state.value == "abandoned"
    # The run remembers it too, for whoever shows the run (status, the operator's condition).
    (remembered,) = outcome.late_results
    assert (remembered.status, remembered.recorded, remembered.settled_by) == (
        "ok",
        "abandoned",
        "alice",
    )
    assert outcome.to_json()["lateResults"][0]["idempotencyKey"] == key
    assert loop.verify_audit("shop", "late").ok


#: Every column an audit event is stored in, and how a forger would rewrite it (given the row).
TAMPERINGS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "seq": lambda row: 1000,
    "type": lambda row: "loop.approved",
    "actor": lambda row: "mallory",
    "at": lambda row: "2020-01-01T00:00:00.000Z",
    "data": lambda row: json.dumps({**json.loads(row["data"]), "forged": True}),
    "key": lambda row: "forged-key",
    "prev": lambda row: row["first_hash"],  # a real hash, only not the one before it
    "hash": lambda row: "f" * 64,
}
COLUMNS = tuple(TAMPERINGS)
ALTERED = 3  # a middle event: neither the first nor the anchor at the end


def _tamper(url: str, column: str) -> None:
    """Rewrite one column of event 3 of shop/restock straight in the database, as someone with
    write access to it (not through Keelgate) would."""
    listed = ", ".join(f'"{c}"' for c in COLUMNS)
    where = "tenant = 'shop' AND run = 'restock' AND seq = {}"
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as lite:
            found = lite.execute(
                f"SELECT {listed} FROM keelgate_audit WHERE {where.format('?')}", (ALTERED,)
            ).fetchone()
            row = dict(zip(COLUMNS, found, strict=True))
            (row["first_hash"],) = lite.execute(
                f"SELECT hash FROM keelgate_audit WHERE {where.format(1)}"
            ).fetchone()
            lite.execute(
                f'UPDATE keelgate_audit SET "{column}" = ? WHERE {where.format("?")}',
                (TAMPERINGS[column](row), ALTERED),
            )
        return
    with psycopg.connect(url, autocommit=True) as pg:
        fetched = pg.execute(
            f"SELECT {listed} FROM keelgate_audit WHERE {where.format('%s')}", (ALTERED,)
        ).fetchone()
        first = pg.execute(f"SELECT hash FROM keelgate_audit WHERE {where.format(1)}").fetchone()
        assert fetched is not None and first is not None
        row = {**dict(zip(COLUMNS, fetched, strict=True)), "first_hash": first[0]}
        pg.execute(
            f'UPDATE keelgate_audit SET "{column}" = %s WHERE {where.format("%s")}',
            (TAMPERINGS[column](row), ALTERED),
        )


@pytest.mark.parametrize("column", COLUMNS)
def test_an_edit_of_any_stored_column_of_an_event_is_named_by_verify(
    durable_factory: StoreFactory, column: str
) -> None:
    """Every column an audit event is stored in is sealed: rewriting an event's type, actor,
    time, data, key, link to the previous event, hash or sequence number straight in the
    SQLite file or the PostgreSQL database makes verify fail and name that event."""
    assert durable_factory.url is not None
    stores = durable_factory()
    loop = Loop(
        stores=stores,
        model=ScriptedModel(SCRIPT),
        tools=[PythonTool("place_order", lambda args, *, idempotency_key: {}, SideEffect.WRITE)],
    )
    assert loop.run_or_resume(LoopSpec("shop", "restock", "restock")).stop.reason is (
        StopReason.GOAL_MET
    )
    stores.close()
    before = Loop(stores=durable_factory()).verify_audit("shop", "restock")
    assert before.ok and before.events > ALTERED, before.problems

    _tamper(durable_factory.url, column)
    report = Loop(stores=durable_factory()).verify_audit("shop", "restock")
    assert not report.ok, f"an edited {column} still verifies"
    named = re.compile(rf"\bevent {ALTERED}\b")
    assert any(named.search(p) for p in report.problems), report.problems


def _finished_run(db: Path, world: World) -> None:
    stores = open_stores(f"sqlite:///{db}")
    try:
        outcome = loop_over(stores, Recorder(RESTOCK), world.tools()).run_or_resume(spec())
        assert outcome.stop.reason is StopReason.GOAL_MET
    finally:
        stores.close()


def _chain(db: Path) -> tuple[bool, tuple[str, ...]]:
    store = SQLiteStore(db)
    try:
        report = Loop(stores=Stores.of(store)).verify_audit("shop", "restock")
    finally:
        store.close()
    return report.ok, report.problems


def test_the_audit_chain_detects_an_edited_event(db: Path, world: World, tmp_path: Path) -> None:
    """Editing any stored event (here: rewriting who settled what in the SQLite file directly)
    breaks the chain, and verify names the altered event."""
    _finished_run(db, world)
    assert _chain(db) == (True, ())
    with sqlite3.connect(db) as raw:
        (data,) = raw.execute(
            "SELECT data FROM keelgate_audit WHERE tenant='shop' AND run='restock' AND seq=3"
        ).fetchone()
        edited = json.dumps({**json.loads(data), "forged": True})
        raw.execute(
            "UPDATE keelgate_audit SET data=? WHERE tenant='shop' AND run='restock' AND seq=3",
            (edited,),
        )
    ok, problems = _chain(db)
    assert not ok
    assert any("event 3" in p and "altered" in p for p in problems)


def test_the_audit_chain_detects_a_removed_event(db: Path, world: World, tmp_path: Path) -> None:
    """Deleting an event from the SQLite file (the last one, or one in the middle) breaks the
    chain and verify says which is missing."""
    _finished_run(db, world)
    middle = tmp_path / "middle.db"
    shutil.copy(db, middle)
    with sqlite3.connect(middle) as raw:
        raw.execute("DELETE FROM keelgate_audit WHERE tenant='shop' AND run='restock' AND seq=4")
    ok, problems = _chain(middle)
    assert not ok
    assert any("event 4 is missing" in p for p in problems)


def test_the_audit_chain_detects_its_newest_event_removed(db: Path, world: World) -> None:
    """Deleting the newest event (the run's final stop) must be detected too: the contract says
    verify detects any removed event."""
    _finished_run(db, world)
    with sqlite3.connect(db) as raw:
        raw.execute(
            "DELETE FROM keelgate_audit WHERE tenant='shop' AND run='restock' AND seq="
            "(SELECT MAX(seq) FROM keelgate_audit WHERE tenant='shop' AND run='restock')"
        )
    ok, _ = _chain(db)
    assert not ok


def test_an_edited_spec_is_recorded_on_the_chain_by_field_without_its_values(
    stores: Stores,
) -> None:
    """Resuming with a different budget and goal goes on: the chain says which fields changed,
    and the new values (here a goal with a secret in it) do not appear in the event."""
    loop = loop_with_look_and_order(
        stores, [{"actions": [{"tool": "look", "args": {}}]}, {"done": True}]
    )
    first = LoopSpec("shop", "edges", "restock", budget=Budget(max_iterations=1))
    assert loop.run_or_resume(first).stop.reason is StopReason.MAX_ITERATIONS
    edited = LoopSpec("shop", "edges", "restock SECRET-42", budget=Budget(max_iterations=5))
    assert loop.run_or_resume(edited).stop.reason is StopReason.GOAL_MET
    (changed,) = [e for e in loop.audit("shop", "edges") if e.type == "loop.spec_changed"]
    assert changed.data["fields"] == ["budget.maxIterations", "goal"]
    assert "SECRET-42" not in json.dumps(changed.to_json())


def test_a_resume_over_the_langgraph_store_does_not_repeat_audit_events(tmp_path: Path) -> None:
    """A READ runs, its checkpoint is written, the process dies. After the resume the chain
    must show that READ started once, as it did."""
    url = f"langgraph+sqlite:///{tmp_path / 'kg.db'}"
    reads: list[str] = []

    def stock(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        reads.append("stock")
        return {"count": 3}

    tools: list[Tool] = [PythonTool("stock", stock)]
    plans = [{"actions": [{"tool": "stock", "args": {"sku": "A1"}}]}, {"done": True}]
    stores = open_stores(url)
    try:
        loop = Loop(stores=stores, model=scripted(plans), tools=tools)
        with failpoints.armed({"after_action_checkpoint": 1}), pytest.raises(SimulatedCrash):
            loop.run_or_resume(REVIEW_SPEC)
    finally:
        stores.close()
    stores = open_stores(url)
    try:
        loop = Loop(stores=stores, model=scripted(plans), tools=tools)
        assert loop.run_or_resume(REVIEW_SPEC).stop.reason is StopReason.GOAL_MET
        loop.run_or_resume(REVIEW_SPEC)  # asking a finished run again changes nothing
        started = [e for e in loop.audit("shop", "review") if e.type == "loop.action_started"]
        assert len(reads) == 1
        assert len(started) == 1, f"the chain shows {len(started)} starts of one READ"
    finally:
        stores.close()


def _chain_racer(url: str, who: int, rounds: int, start: Any, out: Any) -> None:
    """One process driving the same run as the others: checkpoint saves with events (most lose
    with StaleCheckpoint), claims with their start event (one wins per key), re-appends of the
    same keyed events (as outboxes re-appended after a crash) and keyless notes."""
    stores = open_stores(url)
    joint = cast(CheckpointLog, stores.checkpoints)
    saved: list[str] = []
    claimed: list[str] = []
    try:
        start.wait(30)
        for r in range(rounds):
            try:
                joint.save_with_events(
                    "acme",
                    "race",
                    r + 1,
                    {"r": r, "by": who},
                    [AuditDraft("save", {}, key=f"s{r}:{who}")],
                )
                saved.append(f"s{r}:{who}")
            except StaleCheckpoint:
                pass
            won = stores.idempotency.claim(
                "acme",
                f"k{r}",
                run="race",
                action=f"{r}:0",
                tool="ship",
                event=AuditDraft("started", {"by": who}, key=f"started:{r}:{who}"),
            )
            if won is None:
                claimed.append(f"started:{r}:{who}")
            stores.audit.append(
                "acme",
                "race",
                [
                    AuditDraft("shared", {"r": r}, key=f"shared:{r}"),
                    AuditDraft("note", {"by": who}),
                ],
            )
        out.put((who, saved, claimed, None))
    except BaseException as error:  # reported to the parent, which fails the test with it
        out.put((who, saved, claimed, repr(error)))
    finally:
        stores.close()


def test_processes_racing_saves_claims_and_shared_keys_keep_one_chain_of_committed_events(
    durable_factory: StoreFactory,
) -> None:
    """Three processes drive one run at once. The chain stays one unbroken, verifying chain;
    it holds exactly the events of saves and claims that committed (none from a save refused
    as stale or a claim that lost), each shared key once, and every keyless note."""
    assert durable_factory.url is not None
    durable_factory().close()  # create the schema before the race
    processes, rounds = 3, 12
    start, out = SPAWN.Event(), SPAWN.Queue()
    workers = [
        SPAWN.Process(target=_chain_racer, args=(durable_factory.url, i, rounds, start, out))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        start.set()
        reports = [out.get(timeout=120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
    assert [r[3] for r in reports] == [None] * processes
    saved = {key for r in reports for key in r[1]}
    claimed = {key for r in reports for key in r[2]}
    assert len(claimed) == rounds  # one winner per key
    events = durable_factory().audit.events("acme", "race")
    assert verify("acme", "race", events).ok
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    by_type = Counter(e.type for e in events)
    assert {e.key for e in events if e.type == "save"} == saved
    assert {e.key for e in events if e.type == "started"} == claimed
    assert by_type["shared"] == rounds
    assert by_type["note"] == rounds * processes
    assert len(events) == len(saved) + len(claimed) + rounds + rounds * processes
