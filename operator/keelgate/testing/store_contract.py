"""The store contract: the checks every Keelgate store backend must pass, for any backend.

Why it exists: Keelgate's promise (a WRITE never runs twice, never runs unapproved) rests on the
stores keeping the protocols of ``keelgate.core.protocols`` exactly, and a store written outside
this repository must be held to the same checks as Keelgate's own. Every backend here (memory,
SQLite, PostgreSQL, LangGraph) runs this suite in ``tests/test_store_contract.py``.

A check is a function of an *opener*: a callable that opens a NEW ``Stores`` over the same data
on each call, as a restarted process would (the same file, the same database). Closing one set of
stores must do what a process death does to its in-flight keys: they read unknown afterwards.
With pytest, in your store's test file::

    import pytest
    from keelgate.core.protocols import Stores
    from keelgate.testing import store_contract as contract

    @pytest.mark.parametrize("check", contract.checks(), ids=str)
    def test_my_store_keeps_the_contract(check, tmp_path):
        contract.run(check, lambda: Stores.of(MyStore(tmp_path / "data")))

``checks(...)`` selects by what a check needs: ``"checkpoints"`` (a ``CheckpointStore`` alone, such
as a saver-backed one), ``"specs"``, ``"keys"``, ``"audit"``, ``"run_lock"`` (a key store that is
a ``RunLock``), ``"revisions"`` (a checkpoint store that is ``RunRevisions``), ``"ownership"`` (a
checkpoint store that is ``RunOwners`` and the key store), and one name per
promise a backend may declare in ``Capabilities`` (``"checkpoint_with_events"``,
``"claim_with_event"``, ``"checkpoint_with_completion"``, ``"settle_with_event"``,
``"claim_after_checkpoint"``); with no names, every check, and ``run`` then passes over what
the stores do not have or declare.

This module must never import pytest or a store backend, and never weaken a check to suit a
backend: a store that fails one does not keep Keelgate's promise.

Why one module past 500 lines: a store's author reads every promise to keep in one place, check
after check.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Generic, TypeVar

from keelgate.core.audit import AuditDraft, verify
from keelgate.core.protocols import (
    AuditLog,
    Capabilities,
    CheckpointLog,
    CheckpointStore,
    CompletingLog,
    Completion,
    IdempotencyStore,
    RunLock,
    RunRef,
    RunRevisions,
    SpecStore,
    Stores,
)
from keelgate.core.types import KeyState
from keelgate.errors import (
    RunBusy,
    SettleError,
    SettleTooEarly,
    StaleCheckpoint,
    StaleClaim,
    StaleEpoch,
)

Opener = Callable[[], Stores]
E = TypeVar("E", bound=BaseException)

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


@dataclass(frozen=True)
class Check:
    """One property of the contract: ``function(opener)`` raises AssertionError if broken."""

    name: str
    needs: str
    function: Callable[[Opener], None]

    def __str__(self) -> str:
        return self.name

    def applies_to(self, stores: Stores) -> bool:
        if self.needs == "specs":
            return stores.specs is not None
        if self.needs == "run_lock":
            return isinstance(stores.idempotency, RunLock)
        if self.needs == "ownership":
            return stores.owners is not None
        if self.needs == "revisions":
            return isinstance(stores.checkpoints, RunRevisions)
        if self.needs in _PROMISES:
            return bool(getattr(stores.capabilities, self.needs))
        return True


_PROMISES = frozenset(f.name for f in fields(Capabilities))
_CHECKS: list[Check] = []


def _check(needs: str) -> Callable[[Callable[[Opener], None]], Callable[[Opener], None]]:
    def register(function: Callable[[Opener], None]) -> Callable[[Opener], None]:
        _CHECKS.append(Check(function.__name__, needs, function))
        return function

    return register


def checks(*needs: str) -> list[Check]:
    """The checks that need any of ``needs`` (see the module docstring); every one if none."""
    known = {
        "checkpoints",
        "specs",
        "keys",
        "audit",
        "run_lock",
        "revisions",
        "ownership",
        *_PROMISES,
    }
    unknown = set(needs) - known
    if unknown:
        raise ValueError(f"no checks need {sorted(unknown)}")
    return [c for c in _CHECKS if not needs or c.needs in needs]


def run(check: Check, open_stores: Opener) -> None:
    """Run ``check`` over stores from ``open_stores``, closing every set it opened afterwards.
    A check of something the stores do not have (a SpecStore, a RunLock, a declared promise)
    passes."""
    opened: list[Stores] = []

    def opener() -> Stores:
        stores = open_stores()
        opened.append(stores)
        return stores

    probe = open_stores()
    try:
        applies = check.applies_to(probe)
    finally:
        probe.close()
    try:
        if applies:
            check.function(opener)
    finally:
        for stores in reversed(opened):
            stores.close()


class Caught(Generic[E]):
    """What ``raises`` caught."""

    value: E


@contextmanager
def raises(kind: type[E]) -> Iterator[Caught[E]]:
    """Assert that the block raises ``kind`` (pytest.raises, without pytest)."""
    caught: Caught[E] = Caught()
    try:
        yield caught
    except kind as error:
        caught.value = error
        return
    raise AssertionError(f"{kind.__name__} was not raised")


def race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run calls in threads released together; their results in order (re-raising any error)."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


# CheckpointStore


def checkpoints(factory: Opener) -> CheckpointStore:
    return factory().checkpoints


@_check("checkpoints")
def a_saved_state_loads_back_identical_after_a_restart(factory: Opener) -> None:
    """Whatever JSON a run saves, a new process loads exactly that JSON back at that seq."""
    first = checkpoints(factory)
    first.save("acme", "order-1", 1, AWKWARD_STATE)
    first.close()
    loaded = checkpoints(factory).load("acme", "order-1")
    assert loaded is not None
    assert (loaded.tenant, loaded.run, loaded.seq) == ("acme", "order-1", 1)
    assert canonical(loaded.state) == canonical(AWKWARD_STATE)
    assert list(loaded.state) == list(AWKWARD_STATE)


@_check("checkpoints")
def an_unknown_run_loads_as_none(factory: Opener) -> None:
    """Loading a run nobody saved says "no such run" (None), in any tenant."""
    store = checkpoints(factory)
    store.save("acme", "order-1", 1, {"x": 1})
    assert store.load("acme", "order-2") is None
    assert store.load("other", "order-1") is None


@_check("checkpoints")
def runs_lists_each_run_at_its_latest_seq_and_filters_by_tenant(factory: Opener) -> None:
    """``runs`` names every run once at its latest seq, in order, optionally one tenant's."""
    store = checkpoints(factory)
    store.save("beta", "b", 1, {})
    for seq in (1, 2, 3):
        store.save("acme", "z-run", seq, {"seq": seq})
    store.save("acme", "a-run", 7, {})
    store.save("acme", "with/slash and space", 1, {})
    reopened = checkpoints(factory)
    assert reopened.runs() == [
        RunRef("acme", "a-run", 7),
        RunRef("acme", "with/slash and space", 1),
        RunRef("acme", "z-run", 3),
        RunRef("beta", "b", 1),
    ]
    assert reopened.runs("beta") == [RunRef("beta", "b", 1)]
    assert reopened.runs("nobody") == []


@_check("checkpoints")
def a_seq_that_is_not_newer_is_refused_and_the_state_is_unchanged(factory: Opener) -> None:
    """A stale writer (equal or older seq, from this or another process) gets StaleCheckpoint
    naming the stored seq, and the stored checkpoint stays exactly as it was."""
    writer = checkpoints(factory)
    writer.save("acme", "r", 1, {"v": "one"})
    writer.save("acme", "r", 3, {"v": "three"})
    stale = checkpoints(factory)
    for seq in (3, 2, 1):
        with raises(StaleCheckpoint) as refused:
            stale.save("acme", "r", seq, {"v": "stale"})
        assert (refused.value.seq, refused.value.stored_seq) == (seq, 3)
    loaded = writer.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (3, {"v": "three"})
    stale.save("acme", "r", 4, {"v": "four"})
    loaded = writer.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (4, {"v": "four"})


@_check("checkpoints")
def every_checkpoint_store_speaks_the_protocol(factory: Opener) -> None:
    """Each backend is a CheckpointStore as the loop sees it (runtime protocol check)."""
    assert isinstance(checkpoints(factory), CheckpointStore)


@_check("revisions")
def revisions_move_with_each_checkpoint_and_each_audit_event(factory: Opener) -> None:
    """``revisions`` answers for many runs at once, from any process: a run's checkpoint seq and
    its audit head, each moving when a checkpoint is saved or an event appended (a decision
    made in the store moves one of them); runs never saved are left out, other tenants' runs
    with the same name are apart."""
    stores = factory()
    stores.checkpoints.save("acme", "waiting", 4, {})
    stores.checkpoints.save("beta", "waiting", 1, {})
    reader = factory().checkpoints
    assert isinstance(reader, RunRevisions)
    asked = [("acme", "waiting"), ("beta", "waiting"), ("acme", "never")]
    before = reader.revisions(asked)
    assert before == {("acme", "waiting"): (4, 0), ("beta", "waiting"): (1, 0)}
    stores.audit.append("acme", "waiting", [AuditDraft("loop.reconciled", {"n": 1}, actor="alice")])
    moved = reader.revisions(asked)
    assert moved[("acme", "waiting")][0] == 4 and moved[("acme", "waiting")][1] > 0
    assert moved[("beta", "waiting")] == (1, 0)
    stores.checkpoints.save("beta", "waiting", 2, {})
    assert reader.revisions(asked)[("beta", "waiting")] == (2, 0)
    many = [("acme", f"run-{n}") for n in range(2500)]
    assert reader.revisions([*many, ("acme", "waiting")]) == {
        ("acme", "waiting"): moved[("acme", "waiting")]
    }
    assert reader.revisions([]) == {}


# SpecStore


def specs(factory: Opener) -> SpecStore:
    store = factory().specs
    assert isinstance(store, SpecStore)
    return store


@_check("specs")
def a_recorded_spec_reads_back_and_an_older_generation_cannot_replace_it(factory: Opener) -> None:
    """What the operator records before creating a step pod, the pod reads back in another
    process; a stale writer (an older generation of the same object) cannot take it back, while
    a new object of the same name (another source) replaces it."""
    writer = specs(factory)
    assert writer.recorded_spec("acme", "r") is None
    assert writer.record_spec("acme", "r", AWKWARD_STATE, source="uid-1", generation=2) is True
    reader = specs(factory)
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


def keys(factory: Opener) -> IdempotencyStore:
    store = factory().idempotency
    assert isinstance(store, IdempotencyStore)
    return store


def claim(store: IdempotencyStore, key: str = "kg-1") -> Any:
    return store.claim("acme", key, run="r", action="a1", tool="ship")


@_check("keys")
def a_new_key_is_claimed_once_and_reads_in_flight_while_its_owner_lives(factory: Opener) -> None:
    """The first claim wins (None); every later claim, by the owner or another process, gets
    the record back as in_flight, with its run, action and tool, and runs nothing."""
    owner, other = keys(factory), keys(factory)
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


@_check("keys")
def a_completed_key_replays_its_result_after_a_restart(factory: Opener) -> None:
    """A key recorded completed hands its stored result to whoever claims it next, in a new
    process too, instead of letting the action run again."""
    owner = keys(factory)
    assert claim(owner) is None
    result = {"status": "ok", "output": {"order": 42, "note": "é\u0000"}}
    owner.complete("acme", "kg-1", result)
    owner.close()
    again = claim(keys(factory))
    assert again is not None
    assert again.state is KeyState.COMPLETED
    assert again.result == result


@_check("keys")
def closing_the_owner_makes_its_in_flight_keys_unknown(factory: Opener) -> None:
    """Closing a store is what a process death does: its in-flight key reads outcome_unknown
    from the moment close returns, never in_flight and never claimable again."""
    owner, other = keys(factory), keys(factory)
    assert claim(owner) is None
    owner.close()
    record = claim(other)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    got = other.get("acme", "kg-1")
    assert got is not None and got.state is KeyState.OUTCOME_UNKNOWN


@_check("keys")
def a_held_owner_outlives_close_until_its_running_call_has_ended(factory: Opener) -> None:
    """A call this store started may still run (a timed-out WRITE on its worker): while it is
    held, closing the store keeps its key live (nobody can judge or settle it) and its end can
    still be recorded; the close happens when the hold is released."""
    owner, other = keys(factory), keys(factory)
    assert claim(owner) is None
    release = owner.hold()
    owner.close()
    got = other.get("acme", "kg-1")
    assert got is not None and got.state is KeyState.IN_FLIGHT
    with raises(SettleError):
        other.settle("acme", "kg-1", executed=False, by="ops", source="human")
    assert owner.complete("acme", "kg-1", {"status": "ok", "output": 1}) is True
    assert claim(owner, "kg-2") is None  # still open: a second key is held by the same owner
    release()
    release()  # a second release changes nothing
    got = other.get("acme", "kg-2")
    assert got is not None and got.state is KeyState.OUTCOME_UNKNOWN  # closed for real now
    done = other.get("acme", "kg-1")
    assert done is not None and done.state is KeyState.COMPLETED


@_check("keys")
def release_turns_an_in_flight_key_into_an_unknown_outcome(factory: Opener) -> None:
    """A released key (a timed-out WRITE) is outcome_unknown for everyone, its live owner too."""
    owner, other = keys(factory), keys(factory)
    assert claim(owner) is None
    owner.release("acme", "kg-1")
    for store in (owner, other):
        got = store.get("acme", "kg-1")
        assert got is not None and got.state is KeyState.OUTCOME_UNKNOWN


@_check("keys")
def forget_drops_only_its_own_in_flight_key_so_the_call_can_be_made_again(
    factory: Opener,
) -> None:
    """A definitely refused call leaves no key: its owner's forget drops it (True) and the same
    key can be claimed again; another store's forget, or forgetting a completed key, changes
    nothing (False)."""
    owner, other = keys(factory), keys(factory)
    assert claim(owner) is None
    assert other.forget("acme", "kg-1") is False
    live = other.get("acme", "kg-1")
    assert live is not None and live.state is KeyState.IN_FLIGHT
    assert owner.forget("acme", "kg-1") is True
    assert other.get("acme", "kg-1") is None
    assert claim(other) is None
    other.complete("acme", "kg-1", {"status": "ok"})
    assert other.forget("acme", "kg-1") is False
    done = owner.get("acme", "kg-1")
    assert done is not None and done.state is KeyState.COMPLETED


def settle_applies_only_to_an_unknown_outcome_and_only_once(
    factory: Opener, executed: bool
) -> None:
    """Only an outcome_unknown key can be settled: executed makes it completed, not executed
    abandoned, attributed to who and from where; a live, completed, missing or already settled
    key is refused, so a decision can never be changed."""
    owner, judge = keys(factory), keys(factory)
    assert claim(owner, "kg-live") is None
    with raises(SettleError):
        judge.settle("acme", "kg-live", executed=executed, by="ann", source="human")
    assert claim(owner, "kg-done") is None
    owner.complete("acme", "kg-done", {"status": "ok"})
    with raises(SettleError):
        judge.settle("acme", "kg-done", executed=executed, by="ann", source="human")
    with raises(SettleError):
        judge.settle("acme", "kg-missing", executed=executed, by="ann", source="human")

    assert claim(owner) is None
    owner.release("acme", "kg-1")
    settled = judge.settle("acme", "kg-1", executed=executed, by="ann", source="human")
    expected = KeyState.COMPLETED if executed else KeyState.ABANDONED
    assert (settled.state, settled.settled_by, settled.source) == (expected, "ann", "human")
    with raises(SettleError):
        judge.settle("acme", "kg-1", executed=not executed, by="bob", source="confirmer")
    after = keys(factory).get("acme", "kg-1")
    assert after is not None
    assert (after.state, after.settled_by, after.source) == (expected, "ann", "human")


for _executed, _name in ((True, "executed"), (False, "not_executed")):
    _CHECKS.append(
        Check(
            f"settle_applies_only_to_an_unknown_outcome_and_only_once_{_name}",
            "keys",
            partial(settle_applies_only_to_an_unknown_outcome_and_only_once, executed=_executed),
        )
    )


@_check("keys")
def not_executed_waits_for_the_claims_deadline_on_the_stores_clock(factory: Opener) -> None:
    """A claim with a write deadline (``deadline_in``) reads it back, in seconds since the epoch
    on the store's clock, with how much of it is left. Until it has passed, its unknown outcome
    is refused as not executed (``SettleTooEarly``, saying when, the key unchanged) and accepted
    as executed; once it has passed, not executed is accepted. A claim without one (made before
    deadlines existed) may be settled as before."""
    import time

    owner, judge = keys(factory), keys(factory)
    before = time.time()
    assert (
        owner.claim("acme", "kg-soon", run="r", action="a1", tool="ship", deadline_in=1.5) is None
    )
    assert owner.claim("acme", "kg-yes", run="r", action="a2", tool="ship", deadline_in=60) is None
    assert claim(owner, "kg-none") is None
    for key in ("kg-soon", "kg-yes", "kg-none"):
        owner.release("acme", key)
    soon = judge.get("acme", "kg-soon")
    assert soon is not None and soon.state is KeyState.OUTCOME_UNKNOWN
    assert soon.deadline is not None and before - 5 < soon.deadline - 1.5 < time.time() + 5
    assert soon.deadline_in is not None and 0 < soon.deadline_in <= 1.5
    assert soon.sendable and soon.not_executed_after.endswith("Z")
    with raises(SettleTooEarly) as early:
        judge.settle("acme", "kg-soon", executed=False, by="ann", source="human")
    assert early.value.not_before == soon.not_executed_after
    assert 0 < early.value.retry_after <= 1.5
    still = judge.get("acme", "kg-soon")
    assert still is not None and still.state is KeyState.OUTCOME_UNKNOWN and not still.source
    done = judge.settle("acme", "kg-yes", executed=True, by="ann", source="human")
    assert done.state is KeyState.COMPLETED
    none = judge.get("acme", "kg-none")
    assert none is not None and none.deadline is None and not none.sendable
    assert judge.settle("acme", "kg-none", executed=False, by="ann", source="human").state is (
        KeyState.ABANDONED
    )
    time.sleep(max(0.0, (still.deadline_in or 0.0)) + 0.1)
    late = judge.settle("acme", "kg-soon", executed=False, by="ann", source="human")
    assert late.state is KeyState.ABANDONED and not late.sendable


def a_settled_key_is_refused_again_in_plain_words_naming_who_settled_it(
    factory: Opener, executed: bool
) -> None:
    """The settle rule itself, on every store (not only the memory store, where nothing else
    stands behind it): once a person settled an unknown outcome, settling it again, either
    way, by a person or a confirmer, through the store that settled it or one opened later, is
    refused saying it is already settled, how and by whom; the first decision stays."""
    owner, judge = keys(factory), keys(factory)
    assert claim(owner) is None
    owner.close()  # the owner died: the key reads outcome_unknown
    judge.settle("acme", "kg-1", executed=executed, by="ann", source="human")
    how = "executed" if executed else "not executed"
    for store in (judge, keys(factory)):
        for again, source in ((executed, "human"), (not executed, "confirmer")):
            with raises(SettleError) as refused:
                store.settle("acme", "kg-1", executed=again, by="bob", source=source)
            assert f"already settled as {how} by ann" in str(refused.value)
    after = keys(factory).get("acme", "kg-1")
    assert after is not None
    expected = KeyState.COMPLETED if executed else KeyState.ABANDONED
    assert (after.state, after.settled_by, after.source) == (expected, "ann", "human")


for _executed, _name in ((True, "executed"), (False, "not_executed")):
    _CHECKS.append(
        Check(
            f"a_settled_key_is_refused_again_in_plain_words_naming_who_settled_it_{_name}",
            "keys",
            partial(
                a_settled_key_is_refused_again_in_plain_words_naming_who_settled_it,
                executed=_executed,
            ),
        )
    )


@_check("keys")
def a_late_owner_cannot_overwrite_a_settlement(factory: Opener) -> None:
    """complete is a compare-and-set on owner and state: an owner that finishes after its key
    was judged unknown and settled changes nothing (the record keeps the person's decision)."""
    owner, judge = keys(factory), keys(factory)
    assert claim(owner) is None
    owner.release("acme", "kg-1")
    judge.settle("acme", "kg-1", executed=False, by="ann", source="human")
    owner.complete("acme", "kg-1", {"status": "ok", "output": "late"})
    record = judge.get("acme", "kg-1")
    assert record is not None
    assert (record.state, record.result) == (KeyState.ABANDONED, None)


@_check("run_lock")
def a_run_has_one_driver_at_a_time(factory: Opener) -> None:
    """lock_run: while one store drives a run, no other store (nor the same one again) may,
    at once, not after a wait; other runs and tenants are free; once released the run can be
    driven again, by anyone."""
    first, second = keys(factory), keys(factory)
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


@_check("keys")
def racing_claims_on_one_key_have_exactly_one_winner(factory: Opener) -> None:
    """Several stores claiming one key at the same instant: exactly one claim wins."""
    stores = [keys(factory) for _ in range(6)]
    results = race([partial(claim, s) for s in stores])
    assert sum(r is None for r in results) == 1
    assert all(r is None or r.state is KeyState.IN_FLIGHT for r in results)


@_check("keys")
def racing_settlements_have_exactly_one_winner(factory: Opener) -> None:
    """Several people settling one unknown outcome at once: exactly one decision is recorded,
    every other is refused."""
    owner = keys(factory)
    assert claim(owner) is None
    owner.close()
    judges = [keys(factory) for _ in range(6)]

    def settle(store: IdempotencyStore, who: str) -> Any:
        try:
            return store.settle("acme", "kg-1", executed=True, by=who, source="human")
        except SettleError as refused:
            return refused

    results = race([partial(settle, s, f"p{i}") for i, s in enumerate(judges)])
    winners = [r for r in results if not isinstance(r, SettleError)]
    assert len(winners) == 1
    record = judges[0].get("acme", "kg-1")
    assert record is not None and record.settled_by == winners[0].settled_by


# AuditLog


def audit(factory: Opener) -> AuditLog:
    log = factory().audit
    assert isinstance(log, AuditLog)
    return log


@_check("audit")
def audit_append_skips_known_keys_and_the_chain_verifies(factory: Opener) -> None:
    """Re-appending an event whose key is already on the chain (a crash retry) adds nothing;
    keyless events always append; after a restart the chain continues and verifies."""
    log = audit(factory)
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
    reopened = audit(factory)
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


@_check("audit")
def iter_events_reads_the_chain_in_pages_from_any_point(factory: Opener) -> None:
    """``iter_events`` gives the same events as ``events``, in order, whatever the page size
    (one event per page, a page that ends exactly at the chain's end, one page for all), from
    the start or after any sequence number; and only the named run's events."""
    log = audit(factory)
    log.append("acme", "r", [AuditDraft("note", {"n": n}) for n in range(1, 8)])
    log.append("acme", "other", [AuditDraft("note", {"n": 0})])
    whole = log.events("acme", "r")
    assert [e.seq for e in whole] == list(range(1, 8))
    for page in (1, 2, 7, 1000):
        assert list(log.iter_events("acme", "r", page=page)) == whole
        for after in (0, 3, 7, 9):
            expected = [e for e in whole if e.seq > after]
            assert list(log.iter_events("acme", "r", after=after, page=page)) == expected
    assert list(log.iter_events("acme", "nosuch")) == []


@_check("audit")
def each_run_has_its_own_chain(factory: Opener) -> None:
    """Runs (and tenants) do not share a chain: each starts at 1 and verifies on its own, and
    the same event key may appear once in each."""
    log = audit(factory)
    for tenant, run in (("acme", "a"), ("acme", "b"), ("beta", "a")):
        log.append(tenant, run, [AuditDraft("loop.started", {}, key="started")])
        log.append(tenant, run, [AuditDraft("note", {"run": run})])
    for tenant, run in (("acme", "a"), ("acme", "b"), ("beta", "a")):
        events = log.events(tenant, run)
        assert [e.seq for e in events] == [1, 2]
        assert verify(tenant, run, events).ok


@_check("audit")
def concurrent_appenders_keep_one_unbroken_chain(factory: Opener) -> None:
    """Several processes appending to one run at once never fork or break its chain."""
    logs = [audit(factory) for _ in range(4)]

    def append_many(log: AuditLog, who: int) -> None:
        for i in range(8):
            log.append("acme", "r", [AuditDraft("note", {"who": who, "i": i}, key=f"{who}-{i}")])

    race([partial(append_many, log, i) for i, log in enumerate(logs)])
    events = logs[0].events("acme", "r")
    assert [e.seq for e in events] == list(range(1, 33))
    assert verify("acme", "r", events).ok


@_check("audit")
def appenders_taking_turns_each_with_an_old_view_of_the_head_keep_one_chain(
    factory: Opener,
) -> None:
    """Two stores append to one run in turns, each having last seen the chain before the
    other's event: none is lost or forked, keyed events are not doubled, and the chain
    verifies."""
    first, second = audit(factory), audit(factory)
    for i in range(5):
        first.append("acme", "turns", [AuditDraft("note", {"by": 1, "i": i}, key=f"a{i}")])
        second.append("acme", "turns", [AuditDraft("note", {"by": 2, "i": i})])
        second.append("acme", "turns", [AuditDraft("note", {"by": 2, "i": i}, key=f"a{i}")])
    events = first.events("acme", "turns")
    assert [e.seq for e in events] == list(range(1, 11))
    assert [e.data["by"] for e in events] == [1, 2] * 5
    assert verify("acme", "turns", events).ok


# Declared promises (Capabilities)


@_check("checkpoint_with_events")
def a_checkpoint_and_its_events_commit_together(factory: Opener) -> None:
    """save_with_events writes the checkpoint and its audit events as one: a stale save appends
    none of its events, a good one appends them all (skipping keys already on the chain)."""
    store = factory().checkpoints
    assert isinstance(store, CheckpointLog)
    store.save_with_events("acme", "r", 1, {"s": 1}, [AuditDraft("loop.started", {}, key="st")])
    with raises(StaleCheckpoint):
        store.save_with_events("acme", "r", 1, {"s": "stale"}, [AuditDraft("stale", {}, key="x")])
    store.save_with_events(
        "acme", "r", 2, {"s": 2}, [AuditDraft("loop.started", {}, key="st"), AuditDraft("n", {})]
    )
    reopened = factory()
    loaded = reopened.checkpoints.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (2, {"s": 2})
    events = reopened.audit.events("acme", "r")
    assert [e.type for e in events] == ["loop.started", "n"]
    assert verify("acme", "r", events).ok


def _claimed(factory: Opener) -> CompletingLog:
    """The checkpoint store of an owner holding keys kg-1, kg-2 and kg-3 of run r, while
    another live owner holds kg-theirs."""
    owner, other = factory(), factory()
    store = owner.checkpoints
    assert isinstance(store, CompletingLog)
    for key in ("kg-1", "kg-2", "kg-3"):
        assert owner.idempotency.claim("acme", key, run="r", action=key, tool="ship") is None
    assert other.idempotency.claim("acme", "kg-theirs", run="r", action="t", tool="ship") is None
    return store


@_check("checkpoint_with_completion")
def a_write_completes_with_the_checkpoint_that_records_it(factory: Opener) -> None:
    """save_completing commits the checkpoint, its events and the completion of this owner's
    keys as one (a new process sees all of them); a key this owner does not hold is left as it
    is and named; a stale save still completes the keys (their calls ran), then raises."""
    store = _claimed(factory)
    done = {"status": "ok", "output": {"shipped": 1}}
    missed = store.save_completing(
        "acme",
        "r",
        1,
        {"s": 1},
        [AuditDraft("loop.action_completed", {"action": "kg-1"}, key="c1")],
        [Completion("kg-1", done), Completion("kg-theirs", done)],
    )
    assert missed == ("kg-theirs",)
    reopened = factory()
    loaded = reopened.checkpoints.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (1, {"s": 1})
    first = reopened.idempotency.get("acme", "kg-1")
    assert first is not None and (first.state, first.result) == (KeyState.COMPLETED, done)
    theirs = reopened.idempotency.get("acme", "kg-theirs")
    assert theirs is not None and theirs.state is KeyState.IN_FLIGHT  # its owner lives
    assert [e.type for e in reopened.audit.events("acme", "r")] == ["loop.action_completed"]
    with raises(StaleCheckpoint):
        store.save_completing("acme", "r", 1, {"s": "stale"}, [], [Completion("kg-2", done)])
    second = factory().idempotency.get("acme", "kg-2")
    assert second is not None and second.state is KeyState.COMPLETED
    loaded = factory().checkpoints.load("acme", "r")
    assert loaded is not None and loaded.state == {"s": 1}
    # Without completions it is save_with_events.
    assert store.save_completing("acme", "r", 2, {"s": 2}, [], []) == ()
    third = factory().idempotency.get("acme", "kg-3")
    assert third is not None and third.state is KeyState.IN_FLIGHT


@_check("claim_with_event")
def a_claim_puts_its_event_on_the_chain_only_when_it_wins(factory: Opener) -> None:
    """claim(event=...) appends the event with the claim itself: the winning claim's event is on
    the chain (a new process reads it), a losing claim's is not, and the chain verifies."""
    owner, other = factory(), factory()

    def started(key: str) -> AuditDraft:
        return AuditDraft("loop.action_started", {"action": "a1"}, key=key)

    won = owner.idempotency.claim(
        "acme", "kg-1", run="r", action="a1", tool="ship", event=started("started:1")
    )
    assert won is None
    lost = other.idempotency.claim(
        "acme", "kg-1", run="r", action="a1", tool="ship", event=started("started:2")
    )
    assert lost is not None and lost.state is KeyState.IN_FLIGHT
    events = factory().audit.events("acme", "r")
    assert [(e.type, e.key) for e in events] == [("loop.action_started", "started:1")]
    assert verify("acme", "r", events).ok


@_check("settle_with_event")
def a_settlement_puts_its_event_on_the_chain_with_it(factory: Opener) -> None:
    """settle(event=...) appends the decision's event in the settlement's own transaction: a
    settlement that lands has its event on the chain (a new process reads it, once, after
    what another process appended meanwhile); one that is refused (the key is not unknown)
    adds nothing; and the chain verifies."""
    owner, judge = factory(), factory()
    settling = judge.settling
    assert settling is not None
    draft = AuditDraft("loop.reconciled", {"verdict": "executed"}, actor="ann", key="settled:1")
    assert claim(owner.idempotency) is None
    with raises(SettleError):
        settling.settle("acme", "kg-1", executed=True, by="ann", source="human", event=draft)
    owner.idempotency.release("acme", "kg-1")
    _moved_on(factory, "r")
    settled = settling.settle("acme", "kg-1", executed=True, by="ann", source="human", event=draft)
    assert settled.state is KeyState.COMPLETED
    events = factory().audit.events("acme", "r")
    assert [(e.type, e.key) for e in events] == [
        ("elsewhere", None),
        ("loop.reconciled", "settled:1"),
    ]
    assert verify("acme", "r", events).ok


@_check("claim_after_checkpoint")
def a_claim_lands_only_while_the_checkpoint_it_was_planned_from_stands(factory: Opener) -> None:
    """claim(after=seq) claims a free key while the run's checkpoint is still seq. Once another
    process saved the next one, the same claim of a free key (a process held up before its
    claim, while another drove the run on) is refused with StaleClaim and writes nothing, not
    even its event; a key on record is returned as it stands; a claim after the new checkpoint
    lands. A run with no checkpoint has none to claim after."""
    owner, driver = factory(), factory()
    events = owner.capabilities.claim_with_event

    def claimed(key: str, after: int) -> Any:
        event = AuditDraft("loop.action_started", {"action": key}, key=f"started:{key}")
        return owner.idempotency.claim(
            "acme",
            key,
            run="r",
            action=key,
            tool="ship",
            event=event if events else None,
            after=after,
        )

    owner.checkpoints.save("acme", "r", 1, {"s": 1})
    assert claimed("kg-1", 1) is None
    driver.checkpoints.save("acme", "r", 2, {"s": 2})
    with raises(StaleClaim) as stale:
        claimed("kg-2", 1)
    assert (stale.value.seq, stale.value.stored_seq) == (1, 2)
    assert factory().idempotency.get("acme", "kg-2") is None
    mine = claimed("kg-1", 1)
    assert mine is not None and mine.state is KeyState.IN_FLIGHT
    with raises(StaleClaim):
        owner.idempotency.claim("acme", "kg-9", run="never", action="a", tool="t", after=1)
    assert claimed("kg-2", 2) is None
    if events:
        on_chain = [e.key for e in factory().audit.events("acme", "r")]
        assert on_chain == ["started:kg-1", "started:kg-2"]


def _moved_on(factory: Opener, run: str) -> None:
    """Another process puts one event on ``run``'s chain."""
    factory().audit.append("acme", run, [AuditDraft("elsewhere", {"by": "another process"})])


@_check("checkpoint_with_events")
def a_checkpoint_with_events_after_another_writer_keeps_one_chain(factory: Opener) -> None:
    """Checkpoints with events, one after another, by a store whose view of the chain is now
    current and now old (another process appended since): every checkpoint commits with all its
    events, in order, on one chain that verifies; an event whose key is on the chain already is
    not doubled; a stale save writes nothing, and the next save goes on from where it was."""
    store = factory().checkpoints
    assert isinstance(store, CheckpointLog)
    store.save_with_events("acme", "r", 1, {"s": 1}, [AuditDraft("a", {}, key="a")])
    store.save_with_events("acme", "r", 2, {"s": 2}, [AuditDraft("b", {})])
    _moved_on(factory, "r")
    store.save_with_events("acme", "r", 3, {"s": 3}, [AuditDraft("c", {}), AuditDraft("d", {})])
    store.save_with_events("acme", "r", 4, {"s": 4}, [AuditDraft("a", {}, key="a")])
    with raises(StaleCheckpoint):
        store.save_with_events("acme", "r", 4, {"s": "stale"}, [AuditDraft("no", {})])
    store.save_with_events("acme", "r", 5, {"s": 5}, [AuditDraft("e", {})])
    reopened = factory()
    loaded = reopened.checkpoints.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (5, {"s": 5})
    events = reopened.audit.events("acme", "r")
    assert [e.type for e in events] == ["a", "b", "elsewhere", "c", "d", "e"]
    assert verify("acme", "r", events).ok


@_check("checkpoint_with_completion")
def a_completion_after_another_writer_keeps_one_chain(factory: Opener) -> None:
    """Completions with their checkpoints, by a store whose view of the chain is now current and
    now old: each key completes once, with its result, and each event follows the other
    process's on one chain; a key completed already or held by another owner is named as missed
    and left as it is."""
    store = _claimed(factory)
    done = {"status": "ok", "output": {"shipped": 1}}

    def completing(seq: int, key: str | None, *completions: Completion) -> tuple[str, ...]:
        drafts = [] if key is None else [AuditDraft("loop.action_completed", {}, key=key)]
        return store.save_completing("acme", "r", seq, {"s": seq}, drafts, list(completions))

    store.save_with_events("acme", "r", 1, {"s": 1}, [AuditDraft("planned", {})])
    assert completing(2, "c1", Completion("kg-1", done)) == ()
    again = Completion("kg-1", {"again": True})
    assert completing(3, None, again, Completion("kg-theirs", done)) == ("kg-1", "kg-theirs")
    _moved_on(factory, "r")
    assert completing(4, "c2", Completion("kg-2", done)) == ()
    assert completing(5, "c3", Completion("kg-3", done)) == ()
    reopened = factory()
    for key in ("kg-1", "kg-2", "kg-3"):
        record = reopened.idempotency.get("acme", key)
        assert record is not None and (record.state, record.result) == (KeyState.COMPLETED, done)
    theirs = reopened.idempotency.get("acme", "kg-theirs")
    assert theirs is not None and theirs.state is KeyState.IN_FLIGHT  # its owner lives
    loaded = reopened.checkpoints.load("acme", "r")
    assert loaded is not None and loaded.state == {"s": 5}
    events = reopened.audit.events("acme", "r")
    assert [(e.type, e.key) for e in events] == [
        ("planned", None),
        ("loop.action_completed", "c1"),
        ("elsewhere", None),
        ("loop.action_completed", "c2"),
        ("loop.action_completed", "c3"),
    ]
    assert verify("acme", "r", events).ok


@_check("claim_with_event")
def a_claim_after_another_writer_puts_its_event_after_the_others(factory: Opener) -> None:
    """Claims with their events, by a store whose view of the chain is now current and now old:
    each winning claim's event follows the other process's on one chain; a claim of a key held
    already loses and adds no event; an event whose key is on the chain already is not doubled
    (its claim still wins)."""
    owner = factory()

    def claim(key: str, event_key: str) -> Any:
        event = AuditDraft("loop.action_started", {"action": key}, key=event_key)
        return owner.idempotency.claim("acme", key, run="r", action=key, tool="t", event=event)

    assert claim("kg-1", "started:1") is None
    assert claim("kg-2", "started:2") is None
    _moved_on(factory, "r")
    assert claim("kg-3", "started:3") is None
    lost = claim("kg-3", "started:again")
    assert lost is not None and lost.state is KeyState.IN_FLIGHT
    assert claim("kg-4", "started:1") is None
    assert claim("kg-5", "started:5") is None
    events = factory().audit.events("acme", "r")
    assert [e.key for e in events] == ["started:1", "started:2", None, "started:3", "started:5"]
    assert verify("acme", "r", events).ok
    for key in ("kg-4", "kg-5"):
        record = owner.idempotency.get("acme", key)
        assert record is not None and record.state is KeyState.IN_FLIGHT


# RunOwners: one holder per run under a lease, and every write fenced by its epoch. A lease of
# 0 s has lapsed as soon as it is taken: what a holder paused past its lease looks like to the
# store, without waiting.


def owners(factory: Opener) -> Any:
    store = factory().owners
    assert store is not None
    return store


def _lapsed(factory: Opener, holder: str = "a") -> Any:
    """A store that took run ``r`` under a lease that lapsed at once, saved its checkpoint 1
    and claimed ``kg-1`` from it; then another holder took the run (epoch 2). Returns both."""
    old, new = owners(factory), owners(factory)
    taken = old.take("acme", "r", holder=holder, lease=0.0)
    assert taken.epoch == 1
    old.save("acme", "r", 1, {"step": 1})
    assert old.claim("acme", "kg-1", run="r", action="a1", tool="ship", after=1) is None
    assert new.take("acme", "r", holder="b", lease=60.0).epoch == 2
    return old, new


@_check("ownership")
def a_run_has_one_holder_under_a_lease_and_each_take_is_a_new_epoch(factory: Opener) -> None:
    """take: the first holder gets epoch 1; another holder is refused (RunBusy naming the
    holder) while its lease is live; renew keeps the epoch; once let go, the next holder takes
    the run under epoch 2, and the old one can renew nothing."""
    first, second = owners(factory), owners(factory)
    taken = first.take("acme", "r", holder="op-a", lease=60.0)
    assert (taken.holder, taken.epoch) == ("op-a", 1) and taken.lease_left > 50
    with raises(RunBusy) as busy:
        second.take("acme", "r", holder="op-b", lease=60.0)
    assert "op-a" in busy.value.message and "epoch 1" in busy.value.message
    renewed = first.renew(taken, lease=120.0)
    assert (renewed.holder, renewed.epoch) == ("op-a", 1) and renewed.lease_left > 100
    assert second.take("acme", "other", holder="op-b", lease=60.0).epoch == 1  # runs apart
    assert second.take("globex", "r", holder="op-b", lease=60.0).epoch == 1  # tenants apart
    first.let_go(renewed)
    moved = second.take("acme", "r", holder="op-b", lease=60.0)
    assert (moved.holder, moved.epoch) == ("op-b", 2)
    with raises(StaleEpoch) as stale:
        first.renew(renewed, lease=60.0)
    assert (stale.value.epoch, stale.value.holder, stale.value.current) == (1, "op-b", 2)
    seen = owners(factory).holder_of("acme", "r")
    assert seen is not None and (seen.holder, seen.epoch) == ("op-b", 2)
    assert owners(factory).holder_of("acme", "nobody") is None


@_check("ownership")
def a_holder_renews_every_run_it_holds_at_once_and_learns_which_it_lost(factory: Opener) -> None:
    """renew_held: one call renews each live lease of the holder, and returns the runs it
    still holds: not one another holder took after it lapsed, nor one it let go."""
    mine, other = owners(factory), owners(factory)
    kept = mine.take("acme", "kept", holder="op-a", lease=60.0)
    gone = mine.take("acme", "gone", holder="op-a", lease=0.0)
    freed = mine.take("globex", "freed", holder="op-a", lease=60.0)
    assert other.take("acme", "gone", holder="op-b", lease=60.0).epoch == gone.epoch + 1
    mine.let_go(freed)
    other.take("acme", "theirs", holder="op-b", lease=60.0)
    held = mine.renew_held("op-a", lease=120.0)
    assert [(h.tenant, h.run, h.holder, h.epoch) for h in held] == [("acme", "kept", "op-a", 1)]
    assert held[0].lease_left > 100
    seen = owners(factory).holder_of("acme", "kept")
    assert seen is not None and seen.lease_left > 100
    assert kept.epoch == 1


@_check("ownership")
def a_holder_whose_lease_lapsed_is_refused_at_its_next_write(factory: Opener) -> None:
    """Once another holder took the run, every write the old one started under its epoch is
    refused with StaleEpoch and writes nothing: a checkpoint, a claim, a key's end, an audit
    event; the new holder's writes land."""
    old, new = _lapsed(factory)
    with raises(StaleEpoch) as refused:
        old.save("acme", "r", 2, {"step": 2, "by": "old"})
    assert (refused.value.run, refused.value.epoch, refused.value.current) == ("r", 1, 2)
    assert refused.value.exit_code == 6
    with raises(StaleEpoch):
        old.save_with_events("acme", "r", 2, {"by": "old"}, [AuditDraft("x.old", {})])
    with raises(StaleEpoch):
        old.claim("acme", "kg-2", run="r", action="a2", tool="ship", after=1)
    with raises(StaleEpoch):
        old.complete("acme", "kg-1", {"status": "ok", "output": 1})
    with raises(StaleEpoch):
        old.append("acme", "r", [AuditDraft("x.old", {}, key="old-1")])
    loaded = new.load("acme", "r")
    assert loaded is not None and (loaded.seq, loaded.state) == (1, {"step": 1})
    assert new.get("acme", "kg-2") is None
    assert [e.type for e in new.events("acme", "r")] == []
    new.save_with_events("acme", "r", 2, {"step": 2}, [AuditDraft("x.new", {})])
    assert [e.type for e in new.events("acme", "r")] == ["x.new"]


@_check("ownership")
def a_write_left_in_flight_under_an_old_epoch_is_unknown_to_the_new_holder(
    factory: Opener,
) -> None:
    """The old holder's store is open and its owner alive, yet its in-flight key reads
    outcome_unknown to the new holder (never in flight, never claimable again): a claim
    returns the record instead of a retry, the old holder can neither drop nor release it,
    and a person may settle it."""
    old, new = _lapsed(factory)
    for store in (new, old, owners(factory)):
        got = store.get("acme", "kg-1")
        assert got is not None and got.state is KeyState.OUTCOME_UNKNOWN
    again = new.claim("acme", "kg-1", run="r", action="a1", tool="ship", after=1)
    assert again is not None and again.state is KeyState.OUTCOME_UNKNOWN
    with raises(StaleEpoch):
        old.forget("acme", "kg-1")  # dropped after a refusal: the new holder's to settle
    with raises(StaleEpoch):
        old.release("acme", "kg-1")
    kept = new.get("acme", "kg-1")
    assert kept is not None and kept.state is KeyState.OUTCOME_UNKNOWN
    settled = new.settle("acme", "kg-1", executed=True, by="ops", source="human")
    assert settled.state is KeyState.COMPLETED
    with raises(StaleEpoch):
        old.complete("acme", "kg-1", {"status": "ok", "output": "late"})
    done = new.get("acme", "kg-1")
    assert done is not None and (done.state, done.settled_by) == (KeyState.COMPLETED, "ops")


@_check("ownership")
def a_writer_that_never_took_an_owned_run_writes_only_under_its_epoch(factory: Opener) -> None:
    """Once a run has a holder, a store that carries no epoch for it is refused; one that
    carries the holder's epoch (a step process under its operator's) writes; one that
    carries an older epoch is refused. A run nobody took is written as before."""
    holder, step = owners(factory), owners(factory)
    taken = holder.take("acme", "r", holder="op", lease=60.0)
    with raises(StaleEpoch) as refused:
        step.save("acme", "r", 1, {"step": 1})
    assert refused.value.epoch is None and refused.value.holder == "op"
    step.carry("acme", "r", taken.epoch)
    step.save("acme", "r", 1, {"step": 1})
    assert step.claim("acme", "kg-1", run="r", action="a1", tool="ship", after=1) is None
    assert step.complete("acme", "kg-1", {"status": "ok", "output": 1}) is True
    step.carry("acme", "r", taken.epoch - 1)
    with raises(StaleEpoch):
        step.save("acme", "r", 2, {"step": 2})
    step.save("acme", "free", 1, {"step": 1})  # nobody holds it


@_check("ownership")
def taking_the_run_again_makes_the_holders_own_older_claims_unknown(factory: Opener) -> None:
    """A holder that takes its run again (a restart under the same name) does so under a new
    epoch at once, even while its lease is live: what its earlier life left in flight reads
    unknown, and that life's store can no longer write."""
    before, after = owners(factory), owners(factory)
    before.take("acme", "r", holder="op", lease=60.0)
    before.save("acme", "r", 1, {"step": 1})
    assert before.claim("acme", "kg-1", run="r", action="a1", tool="ship", after=1) is None
    assert after.take("acme", "r", holder="op", lease=60.0).epoch == 2
    got = after.get("acme", "kg-1")
    assert got is not None and got.state is KeyState.OUTCOME_UNKNOWN
    with raises(StaleEpoch):
        before.save("acme", "r", 2, {"step": 2})


@_check("ownership")
def racing_takes_have_exactly_one_holder(factory: Opener) -> None:
    """Six stores taking one run at the same instant: exactly one holds it under epoch 1, and
    the others are told who does."""
    stores = [owners(factory) for _ in range(6)]

    def take(i: int) -> Any:
        try:
            return stores[i].take("acme", "r", holder=f"h{i}", lease=60.0)
        except RunBusy as busy:
            return busy

    results = race([partial(take, i) for i in range(6)])
    won = [r for r in results if not isinstance(r, RunBusy)]
    assert len(won) == 1 and won[0].epoch == 1
    assert all(won[0].holder in r.message for r in results if isinstance(r, RunBusy))
