"""The audit chain tells what happened even when the process died in the middle of a WRITE:
the WRITE's start is on the chain before the call, and the chain never holds its arguments.
And what it tells cannot be rewritten unnoticed: every stored column of an event is sealed."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core import failpoints
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import LoopSpec
from keelgate.core.types import SideEffect, StopReason
from keelgate.errors import SimulatedCrash
from keelgate.stores.memory import MemoryStore
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing import failpoint
from support.stores import StoreFactory, store_fixture

durable_factory = store_fixture("sqlite", "postgres")

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
    others read the key unknown and a person abandons it; then the call returns success. The
    person's record stands (never overwritten, never retried) and the chain says what came."""
    memory = MemoryStore()
    judge = memory.reopen()

    def place(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        memory.backend.live_owners.discard(memory.owner)  # the owner's session is cut
        assert idempotency_key is not None
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
