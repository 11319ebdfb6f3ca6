"""The store contract: one set of tests every backend must pass (core/protocols.py docstrings).

Checkpoint tests run over every CheckpointStore (memory, SQLite, Postgres, LangGraph over SQLite
and over an in-memory saver); idempotency and audit tests over every backend with its own
idempotency store and audit log (memory, SQLite, Postgres). Each "restart" opens new store
objects over the same file or database, as a new process would.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keelgate.core.audit import AuditDraft, verify
from keelgate.core.protocols import (
    AuditLog,
    CheckpointLog,
    CheckpointStore,
    IdempotencyStore,
    RunLock,
    RunRef,
    SpecStore,
)
from keelgate.core.types import KeyState
from keelgate.errors import InputError, SettleError, StaleCheckpoint, StoreError
from keelgate.stores import open_stores
from support.stores import CHECKPOINT_BACKENDS, StoreFactory, make_factory, store_fixture

checkpoint_factory = store_fixture(*CHECKPOINT_BACKENDS, "langgraph-memory")

# JSON that trips up lossy encodings: key order, int vs float, big and tiny numbers, NUL and
# non-ASCII text, escapes, empty containers, nesting.
AWKWARD_STATE: dict[str, Any] = {
    "zeta": 1,
    "alpha": 1.0,
    "big": 2**62 + 1,
    "tiny": 1e-300,
    "neg": -0.5,
    "text": 'nul:\u0000 tab:\t quote:" emoji:\U0001f680 accents:éå',
    "empty": {"list": [], "dict": {}, "str": ""},
    "nested": [[1, [2, [3, {"deep": None}]]], True, False],
    "plan": {"actions": [{"id": "a1", "tool": "ship", "args": {"qty": 3}}]},
}


def canonical(value: Any) -> str:
    """Equal JSON texts, not just equal dicts: 1 and 1.0 differ here, key order does not."""
    return json.dumps(value, sort_keys=True, allow_nan=False)


def checkpoints(factory: StoreFactory) -> CheckpointStore:
    return factory().checkpoints


# CheckpointStore


def test_a_saved_state_loads_back_identical_after_a_restart(
    checkpoint_factory: StoreFactory,
) -> None:
    """Whatever JSON a run saves, a new process loads exactly that JSON back at that seq."""
    first = checkpoints(checkpoint_factory)
    first.save("acme", "order-1", 1, AWKWARD_STATE)
    first.close()
    loaded = checkpoints(checkpoint_factory).load("acme", "order-1")
    assert loaded is not None
    assert (loaded.tenant, loaded.run, loaded.seq) == ("acme", "order-1", 1)
    assert canonical(loaded.state) == canonical(AWKWARD_STATE)
    assert list(loaded.state) == list(AWKWARD_STATE)


def test_an_unknown_run_loads_as_none(checkpoint_factory: StoreFactory) -> None:
    """Loading a run nobody saved says "no such run" (None), in any tenant."""
    store = checkpoints(checkpoint_factory)
    store.save("acme", "order-1", 1, {"x": 1})
    assert store.load("acme", "order-2") is None
    assert store.load("other", "order-1") is None


def test_runs_lists_each_run_at_its_latest_seq_and_filters_by_tenant(
    checkpoint_factory: StoreFactory,
) -> None:
    """``runs`` names every run once at its latest seq, in order, optionally one tenant's."""
    store = checkpoints(checkpoint_factory)
    store.save("beta", "b", 1, {})
    for seq in (1, 2, 3):
        store.save("acme", "z-run", seq, {"seq": seq})
    store.save("acme", "a-run", 7, {})
    store.save("acme", "with/slash and space", 1, {})
    reopened = checkpoints(checkpoint_factory)
    assert reopened.runs() == [
        RunRef("acme", "a-run", 7),
        RunRef("acme", "with/slash and space", 1),
        RunRef("acme", "z-run", 3),
        RunRef("beta", "b", 1),
    ]
    assert reopened.runs("beta") == [RunRef("beta", "b", 1)]
    assert reopened.runs("nobody") == []


def test_a_seq_that_is_not_newer_is_refused_and_the_state_is_unchanged(
    checkpoint_factory: StoreFactory,
) -> None:
    """A stale writer (equal or older seq, from this or another process) gets StaleCheckpoint
    naming the stored seq, and the stored checkpoint stays exactly as it was."""
    writer = checkpoints(checkpoint_factory)
    writer.save("acme", "r", 1, {"v": "one"})
    writer.save("acme", "r", 3, {"v": "three"})
    stale = checkpoints(checkpoint_factory)
    for seq in (3, 2, 1):
        with pytest.raises(StaleCheckpoint) as refused:
            stale.save("acme", "r", seq, {"v": "stale"})
        assert (refused.value.seq, refused.value.stored_seq) == (seq, 3)
    loaded = writer.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (3, {"v": "three"})
    stale.save("acme", "r", 4, {"v": "four"})
    loaded = writer.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (4, {"v": "four"})


def test_every_checkpoint_store_speaks_the_protocol(checkpoint_factory: StoreFactory) -> None:
    """Each backend is a CheckpointStore as the loop sees it (runtime protocol check)."""
    assert isinstance(checkpoints(checkpoint_factory), CheckpointStore)


@pytest.mark.postgres
def test_a_run_moved_between_stores_is_identical(
    checkpoint_factory: StoreFactory, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A run saved in one store and carried to any other loads identically there, and the new
    store keeps guarding it (the next seq saves, the same seq is refused)."""
    source = checkpoints(checkpoint_factory)
    source.save("acme", "moving", 5, AWKWARD_STATE)
    carried = source.load("acme", "moving")
    assert carried is not None
    for backend in CHECKPOINT_BACKENDS:
        if backend == checkpoint_factory.backend:
            continue
        (tmp_path / backend).mkdir()
        target = make_factory(
            backend, tmp_path / backend, lambda: str(request.getfixturevalue("pg_url"))
        )
        try:
            dest = checkpoints(target)
            dest.save(carried.tenant, carried.run, carried.seq, carried.state)
            arrived = checkpoints(target).load("acme", "moving")
            assert arrived is not None, backend
            assert arrived.seq == 5, backend
            assert canonical(arrived.state) == canonical(AWKWARD_STATE), backend
            with pytest.raises(StaleCheckpoint):
                dest.save("acme", "moving", 5, {})
            dest.save("acme", "moving", 6, {"moved": backend})
        finally:
            target.close_all()


# SpecStore


def specs(factory: StoreFactory) -> SpecStore:
    store = factory().specs
    assert isinstance(store, SpecStore)
    return store


def test_a_recorded_spec_reads_back_and_an_older_generation_cannot_replace_it(
    key_store_factory: StoreFactory,
) -> None:
    """What the operator records before creating a step pod, the pod reads back in another
    process; a stale writer (an older generation of the same object) cannot take it back, while
    a new object of the same name (another source) replaces it."""
    writer = specs(key_store_factory)
    assert writer.recorded_spec("acme", "r") is None
    assert writer.record_spec("acme", "r", AWKWARD_STATE, source="uid-1", generation=2) is True
    reader = specs(key_store_factory)
    got = reader.recorded_spec("acme", "r")
    assert got is not None
    assert (got.source, got.generation, canonical(got.spec)) == (
        "uid-1",
        2,
        canonical(AWKWARD_STATE),
    )
    assert writer.record_spec("acme", "r", {"old": True}, source="uid-1", generation=1) is False
    assert writer.record_spec("acme", "r", {"same": True}, source="uid-1", generation=2) is True
    assert writer.record_spec("acme", "r", {"new": True}, source="uid-2", generation=1) is True
    again = reader.recorded_spec("acme", "r")
    assert again is not None and (again.source, again.generation, dict(again.spec)) == (
        "uid-2",
        1,
        {"new": True},
    )
    assert reader.recorded_spec("other", "r") is None


# IdempotencyStore


def keys(factory: StoreFactory) -> IdempotencyStore:
    store = factory().idempotency
    assert isinstance(store, IdempotencyStore)
    return store


def claim(store: IdempotencyStore, key: str = "kg-1") -> Any:
    return store.claim("acme", key, run="r", action="a1", tool="ship")


def test_a_new_key_is_claimed_once_and_reads_in_flight_while_its_owner_lives(
    key_store_factory: StoreFactory,
) -> None:
    """The first claim wins (None); every later claim, by the owner or another process, gets
    the record back as in_flight, with its run, action and tool, and runs nothing."""
    owner, other = keys(key_store_factory), keys(key_store_factory)
    assert claim(owner) is None
    for store in (owner, other):
        record = claim(store)
        assert record is not None
        assert (record.state, record.run, record.action, record.tool) == (
            KeyState.IN_FLIGHT,
            "r",
            "a1",
            "ship",
        )
        got = store.get("acme", "kg-1")
        assert got is not None and got.state is KeyState.IN_FLIGHT
    assert other.get("acme", "kg-unknown") is None
    assert other.get("other-tenant", "kg-1") is None


def test_a_completed_key_replays_its_result_after_a_restart(
    key_store_factory: StoreFactory,
) -> None:
    """A key recorded completed hands its stored result to whoever claims it next, in a new
    process too, instead of letting the action run again."""
    owner = keys(key_store_factory)
    assert claim(owner) is None
    result = {"status": "ok", "output": {"order": 42, "note": "é\u0000"}}
    owner.complete("acme", "kg-1", result)
    owner.close()
    again = claim(keys(key_store_factory))
    assert again is not None
    assert again.state is KeyState.COMPLETED
    assert again.result == result


def test_closing_the_owner_makes_its_in_flight_keys_unknown(
    key_store_factory: StoreFactory,
) -> None:
    """Closing a store is what a process death does: its in-flight key reads outcome_unknown
    from the moment close returns, never in_flight and never claimable again."""
    owner, other = keys(key_store_factory), keys(key_store_factory)
    assert claim(owner) is None
    owner.close()
    record = claim(other)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    got = other.get("acme", "kg-1")
    assert got is not None and got.state is KeyState.OUTCOME_UNKNOWN


def test_a_held_owner_outlives_close_until_its_running_call_has_ended(
    key_store_factory: StoreFactory,
) -> None:
    """A call this store started may still run (a timed-out WRITE on its worker): while it is
    held, closing the store keeps its key live (nobody can judge or settle it) and its end can
    still be recorded; the close happens when the hold is released."""
    owner, other = keys(key_store_factory), keys(key_store_factory)
    assert claim(owner) is None
    release = owner.hold()
    owner.close()
    got = other.get("acme", "kg-1")
    assert got is not None and got.state is KeyState.IN_FLIGHT
    with pytest.raises(SettleError):
        other.settle("acme", "kg-1", executed=False, by="ops", source="human")
    assert owner.complete("acme", "kg-1", {"status": "ok", "output": 1}) is True
    assert claim(owner, "kg-2") is None  # still open: a second key is held by the same owner
    release()
    release()  # a second release changes nothing
    got = other.get("acme", "kg-2")
    assert got is not None and got.state is KeyState.OUTCOME_UNKNOWN  # closed for real now
    done = other.get("acme", "kg-1")
    assert done is not None and done.state is KeyState.COMPLETED


def test_release_turns_an_in_flight_key_into_an_unknown_outcome(
    key_store_factory: StoreFactory,
) -> None:
    """A released key (a timed-out WRITE) is outcome_unknown for everyone, its live owner too."""
    owner, other = keys(key_store_factory), keys(key_store_factory)
    assert claim(owner) is None
    owner.release("acme", "kg-1")
    for store in (owner, other):
        got = store.get("acme", "kg-1")
        assert got is not None and got.state is KeyState.OUTCOME_UNKNOWN


def test_forget_drops_only_its_own_in_flight_key_so_the_call_can_be_made_again(
    key_store_factory: StoreFactory,
) -> None:
    """A definitely refused call leaves no key: its owner's forget drops it and the same key can
    be claimed again; another store's forget, or forgetting a completed key, changes nothing."""
    owner, other = keys(key_store_factory), keys(key_store_factory)
    assert claim(owner) is None
    other.forget("acme", "kg-1")
    live = other.get("acme", "kg-1")
    assert live is not None and live.state is KeyState.IN_FLIGHT
    owner.forget("acme", "kg-1")
    assert other.get("acme", "kg-1") is None
    assert claim(other) is None
    other.complete("acme", "kg-1", {"status": "ok"})
    other.forget("acme", "kg-1")
    done = owner.get("acme", "kg-1")
    assert done is not None and done.state is KeyState.COMPLETED


@pytest.mark.parametrize("executed", [True, False], ids=["executed", "not-executed"])
def test_settle_applies_only_to_an_unknown_outcome_and_only_once(
    key_store_factory: StoreFactory, executed: bool
) -> None:
    """Only an outcome_unknown key can be settled: executed makes it completed, not executed
    abandoned, attributed to who and from where; a live, completed, missing or already settled
    key is refused, so a decision can never be changed."""
    owner, judge = keys(key_store_factory), keys(key_store_factory)
    assert claim(owner, "kg-live") is None
    with pytest.raises(SettleError):
        judge.settle("acme", "kg-live", executed=executed, by="ann", source="human")
    assert claim(owner, "kg-done") is None
    owner.complete("acme", "kg-done", {"status": "ok"})
    with pytest.raises(SettleError):
        judge.settle("acme", "kg-done", executed=executed, by="ann", source="human")
    with pytest.raises(SettleError):
        judge.settle("acme", "kg-missing", executed=executed, by="ann", source="human")

    assert claim(owner) is None
    owner.release("acme", "kg-1")
    settled = judge.settle("acme", "kg-1", executed=executed, by="ann", source="human")
    expected = KeyState.COMPLETED if executed else KeyState.ABANDONED
    assert (settled.state, settled.settled_by, settled.source) == (expected, "ann", "human")
    with pytest.raises(SettleError):
        judge.settle("acme", "kg-1", executed=not executed, by="bob", source="confirmer")
    after = keys(key_store_factory).get("acme", "kg-1")
    assert after is not None
    assert (after.state, after.settled_by, after.source) == (expected, "ann", "human")


@pytest.mark.parametrize("executed", [True, False], ids=["executed", "not-executed"])
def test_a_settled_key_is_refused_again_in_plain_words_naming_who_settled_it(
    key_store_factory: StoreFactory, executed: bool
) -> None:
    """The settle rule itself, on every store (not only the memory store, where nothing else
    stands behind it): once a person settled an unknown outcome, settling it again, either
    way, by a person or a confirmer, through the store that settled it or one opened later, is
    refused saying it is already settled, how and by whom; the first decision stays."""
    owner, judge = keys(key_store_factory), keys(key_store_factory)
    assert claim(owner) is None
    owner.close()  # the owner died: the key reads outcome_unknown
    judge.settle("acme", "kg-1", executed=executed, by="ann", source="human")
    how = "executed" if executed else "not executed"
    for store in (judge, keys(key_store_factory)):
        for again, source in ((executed, "human"), (not executed, "confirmer")):
            with pytest.raises(SettleError) as refused:
                store.settle("acme", "kg-1", executed=again, by="bob", source=source)
            assert f"already settled as {how} by ann" in str(refused.value)
    after = keys(key_store_factory).get("acme", "kg-1")
    assert after is not None
    expected = KeyState.COMPLETED if executed else KeyState.ABANDONED
    assert (after.state, after.settled_by, after.source) == (expected, "ann", "human")


def test_a_late_owner_cannot_overwrite_a_settlement(key_store_factory: StoreFactory) -> None:
    """complete is a compare-and-set on owner and state: an owner that finishes after its key
    was judged unknown and settled changes nothing (the record keeps the person's decision)."""
    owner, judge = keys(key_store_factory), keys(key_store_factory)
    assert claim(owner) is None
    owner.release("acme", "kg-1")
    judge.settle("acme", "kg-1", executed=False, by="ann", source="human")
    owner.complete("acme", "kg-1", {"status": "ok", "output": "late"})
    record = judge.get("acme", "kg-1")
    assert record is not None
    assert (record.state, record.result) == (KeyState.ABANDONED, None)


def test_a_run_has_one_driver_at_a_time(key_store_factory: StoreFactory) -> None:
    """lock_run: while one store drives a run, no other store (nor the same one again) may,
    at once, not after a wait; other runs and tenants are free; once released the run can be
    driven again, by anyone."""
    first, second = keys(key_store_factory), keys(key_store_factory)
    assert isinstance(first, RunLock) and isinstance(second, RunLock)
    release = first.lock_run("acme", "r")
    assert release is not None
    assert second.lock_run("acme", "r") is None
    assert first.lock_run("acme", "r") is None
    others = [second.lock_run("acme", "other"), second.lock_run("globex", "r")]
    assert all(other is not None for other in others)
    release()
    again = second.lock_run("acme", "r")
    assert again is not None
    assert first.lock_run("acme", "r") is None
    for done in (again, *others):
        assert done is not None
        done()
    assert first.lock_run("acme", "r") is not None


def test_racing_claims_on_one_key_have_exactly_one_winner(
    key_store_factory: StoreFactory,
) -> None:
    """Several stores claiming one key at the same instant: exactly one claim wins."""
    stores = [keys(key_store_factory) for _ in range(6)]
    results = race([lambda s=s: claim(s) for s in stores])  # type: ignore[misc]
    assert sum(r is None for r in results) == 1
    assert all(r is None or r.state is KeyState.IN_FLIGHT for r in results)


def test_racing_settlements_have_exactly_one_winner(key_store_factory: StoreFactory) -> None:
    """Several people settling one unknown outcome at once: exactly one decision is recorded,
    every other is refused."""
    owner = keys(key_store_factory)
    assert claim(owner) is None
    owner.close()
    judges = [keys(key_store_factory) for _ in range(6)]

    def settle(store: IdempotencyStore, who: str) -> Any:
        try:
            return store.settle("acme", "kg-1", executed=True, by=who, source="human")
        except SettleError as refused:
            return refused

    results = race([lambda s=s, i=i: settle(s, f"p{i}") for i, s in enumerate(judges)])  # type: ignore[misc]
    winners = [r for r in results if not isinstance(r, SettleError)]
    assert len(winners) == 1
    record = judges[0].get("acme", "kg-1")
    assert record is not None and record.settled_by == winners[0].settled_by


def race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run calls in threads released together; their results in order (re-raising any error)."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


# AuditLog


def audit(factory: StoreFactory) -> AuditLog:
    log = factory().audit
    assert isinstance(log, AuditLog)
    return log


def test_audit_append_skips_known_keys_and_the_chain_verifies(
    key_store_factory: StoreFactory,
) -> None:
    """Re-appending an event whose key is already on the chain (a crash retry) adds nothing;
    keyless events always append; after a restart the chain continues and verifies."""
    log = audit(key_store_factory)
    log.append("acme", "r", [AuditDraft("loop.started", {"kind": "task"}, key="started")])
    log.append(
        "acme",
        "r",
        [
            AuditDraft("loop.started", {"kind": "task"}, key="started"),
            AuditDraft("action.started", {"tool": "ship"}, key="a1"),
            AuditDraft("note", {"n": 1}),
            AuditDraft("action.started", {"tool": "ship"}, key="a1"),
        ],
    )
    log.close()
    reopened = audit(key_store_factory)
    reopened.append("acme", "r", [AuditDraft("note", {"n": 2}), AuditDraft("x", {}, key="a1")])
    events = reopened.events("acme", "r")
    assert [(e.seq, e.type, e.key) for e in events] == [
        (1, "loop.started", "started"),
        (2, "action.started", "a1"),
        (3, "note", None),
        (4, "note", None),
    ]
    assert verify("acme", "r", events).ok
    assert reopened.events("acme", "other-run") == []


def test_each_run_has_its_own_chain(key_store_factory: StoreFactory) -> None:
    """Runs (and tenants) do not share a chain: each starts at 1 and verifies on its own, and
    the same event key may appear once in each."""
    log = audit(key_store_factory)
    for tenant, run in (("acme", "a"), ("acme", "b"), ("beta", "a")):
        log.append(tenant, run, [AuditDraft("loop.started", {}, key="started")])
        log.append(tenant, run, [AuditDraft("note", {"run": run})])
    for tenant, run in (("acme", "a"), ("acme", "b"), ("beta", "a")):
        events = log.events(tenant, run)
        assert [e.seq for e in events] == [1, 2]
        assert verify(tenant, run, events).ok


def test_concurrent_appenders_keep_one_unbroken_chain(key_store_factory: StoreFactory) -> None:
    """Several processes appending to one run at once never fork or break its chain."""
    logs = [audit(key_store_factory) for _ in range(4)]

    def append_many(log: AuditLog, who: int) -> None:
        for i in range(8):
            log.append("acme", "r", [AuditDraft("note", {"who": who, "i": i}, key=f"{who}-{i}")])

    race([lambda log=log, i=i: append_many(log, i) for i, log in enumerate(logs)])  # type: ignore[misc]
    events = logs[0].events("acme", "r")
    assert [e.seq for e in events] == list(range(1, 33))
    assert verify("acme", "r", events).ok


def test_appenders_taking_turns_each_with_an_old_view_of_the_head_keep_one_chain(
    key_store_factory: StoreFactory,
) -> None:
    """Two stores append to one run in turns, each having last seen the chain before the
    other's event: none is lost or forked, keyed events are not doubled, and the chain
    verifies."""
    first, second = audit(key_store_factory), audit(key_store_factory)
    for i in range(5):
        first.append("acme", "turns", [AuditDraft("note", {"by": 1, "i": i}, key=f"a{i}")])
        second.append("acme", "turns", [AuditDraft("note", {"by": 2, "i": i})])
        second.append("acme", "turns", [AuditDraft("note", {"by": 2, "i": i}, key=f"a{i}")])
    events = first.events("acme", "turns")
    assert [e.seq for e in events] == list(range(1, 11))
    assert [e.data["by"] for e in events] == [1, 2] * 5
    assert verify("acme", "turns", events).ok


def test_a_checkpoint_and_its_events_commit_together(key_store_factory: StoreFactory) -> None:
    """save_with_events writes the checkpoint and its audit events as one: a stale save appends
    none of its events, a good one appends them all (skipping keys already on the chain)."""
    store = key_store_factory().checkpoints
    assert isinstance(store, CheckpointLog)
    store.save_with_events("acme", "r", 1, {"s": 1}, [AuditDraft("loop.started", {}, key="st")])
    with pytest.raises(StaleCheckpoint):
        store.save_with_events("acme", "r", 1, {"s": "stale"}, [AuditDraft("stale", {}, key="x")])
    store.save_with_events(
        "acme", "r", 2, {"s": 2}, [AuditDraft("loop.started", {}, key="st"), AuditDraft("n", {})]
    )
    reopened = key_store_factory()
    loaded = reopened.checkpoints.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (2, {"s": 2})
    events = reopened.audit.events("acme", "r")
    assert [e.type for e in events] == ["loop.started", "n"]
    assert verify("acme", "r", events).ok


# Store URLs and errors


def test_store_urls_open_the_backend_they_name(tmp_path: Path) -> None:
    """Each documented URL form opens its backend; an unknown scheme is one InputError line
    naming --store."""
    from keelgate.stores.langgraph import LangGraphCheckpointStore
    from keelgate.stores.memory import MemoryStore
    from keelgate.stores.sqlite import SQLiteStore

    expected = {
        "memory://": (MemoryStore, MemoryStore),
        f"sqlite:///{tmp_path}/a.db": (SQLiteStore, SQLiteStore),
        f"langgraph+sqlite:///{tmp_path}/b.db": (LangGraphCheckpointStore, SQLiteStore),
    }
    for url, (checkpoint_type, key_type) in expected.items():
        stores = open_stores(url)
        try:
            assert isinstance(stores.checkpoints, checkpoint_type), url
            assert isinstance(stores.idempotency, key_type), url
            assert isinstance(stores.audit, key_type), url
        finally:
            stores.close()
    with pytest.raises(InputError) as bad:
        open_stores("mysql://db/x")
    assert bad.value.field == "--store"
    assert "\n" not in str(bad.value)


@pytest.mark.postgres
def test_a_postgres_url_opens_the_postgres_store(pg_url: str) -> None:
    """postgresql:// (and postgres://) URLs open one PostgresStore serving all three roles."""
    from keelgate.stores.postgres import PostgresStore

    for url in (pg_url, pg_url.replace("postgresql://", "postgres://", 1)):
        stores = open_stores(url)
        try:
            assert isinstance(stores.checkpoints, PostgresStore)
            roles: list[object] = [stores.checkpoints, stores.idempotency, stores.audit]
            assert all(role is roles[0] for role in roles)
        finally:
            stores.close()


@pytest.mark.parametrize(
    ("url", "driver", "module", "extra"),
    [
        ("postgresql://db.example/keelgate", "psycopg", "keelgate.stores.postgres", "postgres"),
        ("langgraph+sqlite:///x.db", "langgraph", "keelgate.stores.langgraph", "langgraph"),
    ],
    ids=["postgres", "langgraph"],
)
def test_a_store_whose_extra_is_not_installed_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, driver: str, module: str, extra: str
) -> None:
    """Without its driver installed, a store URL is one InputError line naming --store and the
    pip extra to install, not an ImportError traceback."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in sys.modules if n == driver or n.startswith(f"{driver}.")]:
        monkeypatch.setitem(sys.modules, name, None)  # what an absent package looks like
    monkeypatch.setitem(sys.modules, driver, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(InputError) as missing:
        open_stores(url)
    assert missing.value.field == "--store"
    assert f"keelgate[{extra}]" in str(missing.value)
    assert "\n" not in str(missing.value)


def test_an_unreachable_postgres_is_one_line_without_the_password() -> None:
    """A server that cannot be reached is a StoreError of one line that names where it tried
    and never shows the password from the URL."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(StoreError) as failed:
            open_stores(f"postgresql://keel:s3cr3t-pw@127.0.0.1:{port}/keelgate")
    message = str(failed.value)
    assert "\n" not in message
    assert "s3cr3t-pw" not in message
    assert f"127.0.0.1:{port}/keelgate" in message


@pytest.mark.postgres
def test_many_processes_may_open_a_fresh_postgres_database_at_once(pg_url: str) -> None:
    """Stores opened at the same instant on an empty database all open (the schema is created
    once, safely) and each gets its own owner id."""
    from keelgate.stores.postgres import PostgresStore

    opened = race([lambda: PostgresStore(pg_url) for _ in range(6)])
    try:
        assert len({store.owner for store in opened}) == 6
        opened[0].save("acme", "r", 1, {"ok": True})
        loaded = opened[5].load("acme", "r")
        assert loaded is not None and loaded.state == {"ok": True}
    finally:
        for store in opened:
            store.close()


# What stores can do together is declared


def test_what_stores_promise_together_is_declared_by_who_opens_them(tmp_path: Path) -> None:
    """open_stores declares each backend's promises: one SQL or memory backend commits a
    checkpoint with its events and a claim with its start event; a LangGraph saver commits
    alone, so only its companion's claim carries an event. One object in every role promises
    nothing unless it is declared, and a promise the checkpoint store cannot keep is refused."""
    from keelgate.core.protocols import Capabilities, Stores
    from keelgate.stores.sqlite import SQLiteStore

    both = Capabilities(checkpoint_with_events=True, claim_with_event=True)
    expected = {
        "memory://": both,
        f"sqlite:///{tmp_path}/a.db": both,
        f"langgraph+sqlite:///{tmp_path}/b.db": Capabilities(claim_with_event=True),
    }
    for url, capabilities in expected.items():
        stores = open_stores(url)
        try:
            assert stores.capabilities == capabilities, url
            assert (stores.joint is not None) == capabilities.checkpoint_with_events, url
        finally:
            stores.close()
    store = SQLiteStore(tmp_path / "c.db")
    try:
        undeclared = Stores(store, store, store)
        assert undeclared.capabilities == Capabilities() and undeclared.joint is None
        assert Stores.of(store).capabilities == both
        langgraph = open_stores(f"langgraph+sqlite:///{tmp_path}/d.db")
        try:
            with pytest.raises(TypeError):
                Stores(langgraph.checkpoints, store, store, None, both)
        finally:
            langgraph.close()
    finally:
        store.close()


def test_a_loop_over_stores_that_promise_nothing_keeps_a_whole_chain(tmp_path: Path) -> None:
    """Without declared promises the events ride in each checkpoint's outbox and are appended
    after it: the run finishes, its WRITE ran once, and its chain verifies."""
    from keelgate.adapters.models.scripted import ScriptedModel
    from keelgate.adapters.tools.python import PythonTool
    from keelgate.core.loop import Loop
    from keelgate.core.protocols import Stores
    from keelgate.core.spec import LoopSpec
    from keelgate.core.types import SideEffect, StopReason
    from keelgate.stores.sqlite import SQLiteStore

    sent: list[str | None] = []

    def place(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        sent.append(idempotency_key)
        return {"placed": True}

    store = SQLiteStore(tmp_path / "k.db")
    try:
        loop = Loop(
            stores=Stores(store, store, store),
            model=ScriptedModel(
                [{"actions": [{"tool": "place_order", "args": {"sku": "A1"}}]}, {"done": True}]
            ),
            tools=[PythonTool("place_order", place, SideEffect.WRITE)],
        )
        outcome = loop.run_or_resume(LoopSpec("shop", "plain", "order"))
        assert outcome.stop.reason is StopReason.GOAL_MET
        assert len(sent) == 1
        types = [e.type for e in loop.audit("shop", "plain")]
        assert "loop.action_started" in types and types[-1] == "loop.stopped"
        assert loop.verify_audit("shop", "plain").ok
    finally:
        store.close()
