"""One driver per run, recorded in the store as (holder, epoch) under a lease: proved the way
the seed proves the loop, by crashing and pausing a holder at every window around taking,
renewing and losing ownership and counting what reached the downstream world.

Each case drives one run of three WRITE steps (``support.ownership``) on a real SQLite file and
on a real PostgreSQL database. A death (in-process: the store closed, every object rebuilt over
the same file or database; or a real ``os._exit(137)``) leaves the lease to lapse; a pause lets
it lapse while the holder lives, its store open and its owner alive, and another holder drives
meanwhile. Whatever happens, every step is sent exactly once: a holder refused for its epoch
stops (``StaleEpoch``) and never sends, and a WRITE left in flight under an old epoch is the new
holder's unknown outcome, settled by a person from the world's own book, never retried.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_tenancy
from crashkit import Journal, opener_for
from keelgate.core.exits import EXIT_FENCED
from keelgate.core.types import KeyState
from keelgate.errors import RunBusy, SimulatedCrash, StaleEpoch
from keelgate.testing.deadlines import pass_leases
from support.ownership import (
    CALL_SECONDS,
    LEASE,
    RUN,
    STEPS,
    TENANT,
    WINDOWS,
    Holder,
    Windows,
    assert_each_step_sent_once,
    sends,
    settle_truthfully,
    step_key,
)

# Tenants A and B sharing one store, each with a role of its own (test_tenancy's fixtures).
checked_server, admin_url = test_tenancy.checked_server, test_tenancy.admin_url
tenants_of_one_store = test_tenancy.shared

TESTS = Path(__file__).resolve().parent
BACKENDS = ("sqlite", "postgres")


@pytest.fixture(params=BACKENDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    return opener_for(
        request.param,
        tmp_path,
        lambda: str(request.getfixturevalue("pg_url")),
        synchronous="NORMAL",
    )


def by_a(journal: Journal) -> int:
    """How many sends the first holder made."""
    return sum(entry["holder"] == "operator-a" for entry in journal.entries("sent"))


def finished(holder: Holder) -> bool:
    """Whether the run has reached its end, as the holder's store reads it."""
    checkpoint = holder.store.load(TENANT, RUN)
    return checkpoint is not None and checkpoint.state["done"] == STEPS


def finish(opener: Any, journal: Journal, name: str) -> Holder:
    """A new holder takes the run over once the last one's lease lapsed, and drives it to its
    end, a person settling each unknown outcome from the journal on the way."""
    holder = Holder(opener, name, journal)
    pass_leases(holder.store)
    for _ in range(STEPS + 1):
        if holder.drive() == "done":
            return holder
        assert settle_truthfully(holder.store, journal) == 1
    raise AssertionError("the run did not finish")


@pytest.mark.parametrize("occurrence", (1, 2, 3))
@pytest.mark.parametrize("window", WINDOWS)
def test_a_holder_that_dies_at_any_window_never_gets_a_step_sent_twice(
    opener: Any, tmp_path: Path, window: str, occurrence: int
) -> None:
    """A holder dies at the 1st, 2nd or 3rd pass of each window; a new holder takes the run
    over after the lease and finishes it: each step reaches the world once, a step the dead
    holder claimed reads unknown (settled truthfully), and the epoch has moved on."""
    journal = Journal(tmp_path / "world.jsonl", fsync=False)
    first = Holder(opener, "operator-a", journal, Windows(window, occurrence))
    crashed = True
    try:
        first.drive()
        crashed = False
    except SimulatedCrash:
        pass
    first.die()
    assert crashed == (window != "after_take" or occurrence == 1), "a window not reached"
    second = finish(opener, journal, "operator-b")
    assert_each_step_sent_once(journal, second.store)
    taken = second.store.holder_of(TENANT, RUN)
    assert (taken.holder, taken.epoch) == ("operator-b", 1 + second.takes)


@pytest.mark.parametrize("occurrence", (1, 2, 3))
@pytest.mark.parametrize("window", WINDOWS)
def test_a_holder_paused_past_its_lease_is_refused_and_its_write_is_unknown_to_the_next(
    opener: Any, tmp_path: Path, window: str, occurrence: int
) -> None:
    """A holder is frozen at a window (its process alive, its store open, its owner live)
    past its lease and its call's deadline, and another holder takes the run and moves it on
    one step meanwhile. On thawing, its next write is refused with StaleEpoch (exit code 6) and
    it sends nothing more; a WRITE it had in flight was the new holder's unknown outcome,
    settled from the world's book, never sent again. A third holder finishes the run."""
    journal = Journal(tmp_path / "world.jsonl", fsync=False)
    paused: list[Holder] = []
    meanwhile: list[Holder] = []

    at_pause: list[int] = []
    done_at_thaw: list[bool] = []

    def pause() -> None:
        at_pause.append(by_a(journal))
        paused[0].frozen_for += LEASE + CALL_SECONDS + 10
        other = Holder(opener, "operator-b", journal, Windows("after_commit", 1))
        meanwhile.append(other)
        pass_leases(other.store)
        try:
            while other.drive() == "unknown":
                assert settle_truthfully(other.store, journal) == 1
        except SimulatedCrash:
            pass  # it moved the run on one step, then stopped
        done_at_thaw.append(finished(other))
        other.die()

    paused.append(Holder(opener, "operator-a", journal, Windows(window, occurrence, act=pause)))
    holder = paused[0]
    try:
        outcome = holder.drive()
    except StaleEpoch as refused:
        assert refused.exit_code == EXIT_FENCED
        assert refused.holder == "operator-b" and refused.current >= 2
    else:
        # Nothing was left for it to write: the window was never reached, or the holder that
        # took over finished the run meanwhile.
        assert outcome == "done"
        assert not at_pause or done_at_thaw[0]
    assert by_a(journal) == (at_pause[0] if at_pause else STEPS), "a thawed holder sent"
    if window in ("after_claim", "after_send"):
        # The frozen holder's claim was the new holder's unknown outcome, settled truthfully.
        record = holder.store.get(TENANT, step_key(occurrence, 1))
        expected = KeyState.COMPLETED if window == "after_send" else KeyState.ABANDONED
        assert (record.state, record.settled_by) == (expected, "oncall")
    holder.die()
    final = finish(opener, journal, "operator-c")
    assert_each_step_sent_once(journal, final.store)
    final.die()


def test_two_holders_racing_for_one_run_never_both_get_a_write_out(
    opener: Any, tmp_path: Path
) -> None:
    """Four holders in threads keep trying to take and drive one run, each lease lapsing at
    once (every holder is "paused" past it all the time): each takes the run from the others
    over and over, and yet no step reaches the world twice."""
    journal = Journal(tmp_path / "world.jsonl", fsync=False)
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    class Yielding(Windows):
        def hit(self, name: str) -> None:
            time.sleep(0.002)  # at every window, the others may take the run meanwhile

    # Opened one after the other, before the race: four first opens of one SQLite file at once
    # may meet "database is locked" (not what this test is about), and a holder that never
    # opened would leave the others at the barrier.
    holders = [Holder(opener, f"operator-{i}", journal, Yielding()) for i in range(4)]

    def contend(i: int) -> None:
        holder = holders[i]
        barrier.wait()
        for _ in range(15):
            pass_leases(holder.store)
            try:
                outcome = holder.drive()
            except (RunBusy, StaleEpoch) as error:
                outcome = type(error).__name__
            with lock:
                outcomes[outcome] += 1
        holder.die()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(count <= 1 for count in sends(journal).values()), journal.entries("sent")
    keys = Counter(entry["key"] for entry in journal.entries("sent"))
    assert all(count == 1 for count in keys.values())
    assert outcomes["StaleEpoch"] + outcomes["RunBusy"] > 0, outcomes  # they did contend
    final = finish(opener, journal, "operator-last")
    assert_each_step_sent_once(journal, final.store)


def hold_up(holder: Holder, opener: Any, journal: Journal, stalled: list[Holder]) -> None:
    """``holder`` is frozen past its lease and its call's deadline; meanwhile another holder
    takes the run and drives it until it ends or meets an unknown outcome (settled truthfully
    from the journal)."""
    holder.frozen_for += LEASE + CALL_SECONDS + 10
    other = Holder(opener, f"{holder.name}-meanwhile", journal)
    stalled.append(other)
    pass_leases(other.store)
    if other.drive() == "unknown":
        settle_truthfully(other.store, journal)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(("crash", "pause")),
            st.sampled_from(WINDOWS),
            st.integers(min_value=1, max_value=3),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_a_sequence_of_deaths_and_pauses_sends_each_step_once(
    tmp_path_factory: pytest.TempPathFactory, events: list[tuple[str, str, int]]
) -> None:
    """Hypothesis chains deaths and pauses of successive holders (each at a window and
    occurrence), on SQLite: each life takes the run over from the last, and the run ends with
    every step sent exactly once."""
    directory = tmp_path_factory.mktemp("ownership")
    opener = opener_for("sqlite", directory, lambda: "", synchronous="NORMAL")
    journal = Journal(directory / "world.jsonl", fsync=False)
    for life, (kind, window, occurrence) in enumerate(events):
        stalled: list[Holder] = []
        holder = Holder(opener, f"operator-{life}", journal, Windows(window, occurrence))
        if kind == "pause":
            holder.windows.act = partial(hold_up, holder, opener, journal, stalled)
        pass_leases(holder.store)
        try:
            if holder.drive() == "unknown":
                settle_truthfully(holder.store, journal)
        except (SimulatedCrash, StaleEpoch):
            pass
        holder.die()
        for other in stalled:
            other.die()
        assert all(count <= 1 for count in sends(journal).values())
    final = finish(opener, journal, "operator-last")
    assert_each_step_sent_once(journal, final.store)
    final.die()


@pytest.mark.slow
@pytest.mark.parametrize("occurrence", (1, 2, 3))
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_holder_process_killed_at_any_window_never_gets_a_step_sent_twice(
    backend: str, window: str, occurrence: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A real holder process dies by os._exit(137) at the window's pass (no store closed, no
    lease let go); after its lease a holder in this process takes over, finds any WRITE the
    dead one claimed unknown, and finishes with every step sent once (journal fsynced)."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'keelgate.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
    journal = tmp_path / "world.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    died = subprocess.run(
        [
            sys.executable,
            "-m",
            "support.ownership",
            url,
            "operator-a",
            str(journal),
            window,
            str(occurrence),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    reached = window != "after_take" or occurrence == 1
    assert died.returncode == (137 if reached else 0), died.stderr
    from keelgate.stores import open_stores

    second = finish(lambda: open_stores(url), Journal(journal), "operator-b")
    assert_each_step_sent_once(Journal(journal), second.store)
    second.die()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_of_the_schema_before_is_upgraded_in_place_and_fenced_from_then_on(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database at schema 7 (the release before ownership) with a run stopped mid-WRITE, its
    process gone: opening it with today's code adds migrations 8 and 9 in place, keeps its
    rows, reads the old claim (no epoch) by its owner as before (unknown: settled by a person),
    and from then on the run takes a holder whose epoch fences every write."""
    from keelgate.stores import _migrations, open_stores

    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'keelgate.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
    with monkeypatch.context() as before:
        before.setattr(_migrations, "MIGRATIONS", _migrations.MIGRATIONS[:7])
        old = open_stores(url)
        store: Any = old.checkpoints
        with store._statement() as conn:
            rows = conn.execute("SELECT MAX(version) FROM keelgate_schema").fetchone()
            assert rows[0] == 7
            put = "INSERT INTO keelgate_checkpoints (tenant, run, seq, state) VALUES (?, ?, ?, ?)"
            key = (
                "INSERT INTO keelgate_keys (tenant, key, run, action, tool, state, owner) "
                "VALUES (?, ?, ?, ?, ?, 'in_flight', ?)"
            )
            gone = "a-process-gone" if backend == "sqlite" else 12345  # no live owner
            p = store.dialect.placeholder
            conn.execute(put.replace("?", p), (TENANT, RUN, 1, '{"done": 0, "attempt": 1}'))
            conn.execute(
                key.replace("?", p), (TENANT, step_key(1, 1), RUN, "step1", "payout", gone)
            )
        old.close()
    today = open_stores(url)
    store = today.checkpoints
    with store._statement() as conn:
        versions = conn.execute("SELECT version FROM keelgate_schema ORDER BY version").fetchall()
    assert [v[0] for v in versions] == list(range(1, len(_migrations.MIGRATIONS) + 1))
    assert len(_migrations.MIGRATIONS) >= 9  # ownership (8, 9) and any later one: all applied
    old_claim = store.get(TENANT, step_key(1, 1))
    assert old_claim.state is KeyState.OUTCOME_UNKNOWN  # judged by its owner, as before
    assert store.holder_of(TENANT, RUN) is None
    writer_without_epoch = open_stores(url)
    taken = store.take(TENANT, RUN, holder="operator-a", lease=30.0)
    assert taken.epoch == 1
    with pytest.raises(StaleEpoch):
        writer_without_epoch.checkpoints.save(TENANT, RUN, 2, {"done": 0, "attempt": 2})
    store.settle(TENANT, step_key(1, 1), executed=True, by="oncall", source="human")
    store.save(TENANT, RUN, 2, {"done": 1, "attempt": 1})
    loaded = store.load(TENANT, RUN)
    assert loaded is not None and loaded.seq == 2
    writer_without_epoch.close()
    today.close()


def test_a_step_process_writes_under_its_operators_epoch_and_is_refused_once_it_moved(
    tmp_path: Path,
) -> None:
    """``keelgate step --epoch N`` (env KEELGATE_EPOCH) carries the epoch its operator took the
    run under: under the current one it runs its iteration; once another holder took the run,
    or with no epoch on a run someone holds, it exits 6 with one line naming the holder and
    places no order; a bad KEELGATE_EPOCH is bad input (exit 2) naming it."""
    from keelgate.stores import open_stores
    from test_step import DATA, orders, outcome, record, step

    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    store = f"sqlite:///{tmp_path / 'kg.db'}"
    record(store, (DATA / "runner-task.yaml").read_text())
    operator = open_stores(store)
    owners: Any = operator.checkpoints
    taken = owners.take("shop", "restock", holder="operator-a", lease=30.0)
    first = step(store, ledger, "--epoch", str(taken.epoch))
    assert first.returncode == 0, first.stderr
    assert (outcome(first)["phase"], outcome(first)["iteration"]) == ("Running", 1)
    unfenced = step(store, ledger)
    assert unfenced.returncode == EXIT_FENCED, unfenced.stderr
    pass_leases(owners)
    other = open_stores(store)
    other.checkpoints.take("shop", "restock", holder="operator-b", lease=30.0)  # type: ignore[attr-defined]
    stale = step(store, ledger, "--epoch", str(taken.epoch))
    assert stale.returncode == EXIT_FENCED
    lines = stale.stderr.strip().splitlines()
    assert len(lines) == 1 and "operator-b" in lines[0] and "epoch 2" in lines[0], lines
    assert orders(ledger) == 0  # the order is iteration 2's: nobody refused placed it
    bad = subprocess.run(
        [sys.executable, "-m", "keelgate", "step", "-n", "shop", "--run", "restock"],
        env={**os.environ, "KEELGATE_STORE": store, "KEELGATE_EPOCH": "two"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "KEELGATE_EPOCH" in bad.stderr
    operator.close()
    other.close()


def test_an_epoch_given_to_a_store_that_records_no_ownership_is_bad_input(tmp_path: Path) -> None:
    """``keelgate step --epoch N`` over a store whose checkpoints and keys are two stores (the
    LangGraph saver's) cannot fence its writes with the epoch: it exits 2 naming --epoch in one
    line, and takes no step (no checkpoint, no order)."""
    pytest.importorskip(
        "langgraph.checkpoint.sqlite", reason="the langgraph extra is not installed"
    )
    from keelgate.stores import open_stores
    from test_step import DATA, orders, record, step

    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    store = f"langgraph+sqlite:///{tmp_path / 'kg.db'}"
    record(store, (DATA / "runner-task.yaml").read_text())
    refused = step(store, ledger, "--epoch", "1")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].count("--epoch") == 1, lines
    assert "Traceback" not in refused.stderr
    assert orders(ledger) == 0
    stores = open_stores(store)
    try:
        assert stores.checkpoints.load("shop", "restock") is None
    finally:
        stores.close()


def test_a_tenants_role_cannot_turn_ownership_back_nor_touch_another_tenants(
    tenants_of_one_store: Any,
) -> None:
    """With a tenant's own database role (what its step pods, running its own code, hold):
    it takes its own run, and then cannot give the run's epoch back to a holder that lost it,
    hand the epoch to another holder without a new one, or move the row to another run (the
    database refuses each); B's ownership rows it neither sees nor changes; and the store's own
    take still moves the run forward under a new epoch."""
    import psycopg
    from psycopg import errors

    from keelgate.stores import open_stores

    shared = tenants_of_one_store

    b = open_stores(shared.b)
    b.checkpoints.take(shared.ns_b, "payouts", holder="operator-b", lease=30.0)  # type: ignore[attr-defined]
    a = open_stores(shared.a)
    owners: Any = a.checkpoints
    assert owners.take(shared.ns_a, "payouts", holder="operator-a", lease=0.0).epoch == 1
    assert owners.take(shared.ns_a, "payouts", holder="operator-c", lease=30.0).epoch == 2
    attacks = (
        "UPDATE keelgate_owners SET epoch = 1, holder = 'operator-a'",  # back to the lost one
        "UPDATE keelgate_owners SET holder = 'operator-a'",  # the epoch to another holder
        "UPDATE keelgate_owners SET run = 'elsewhere'",  # onto another run
    )
    with psycopg.connect(shared.a, autocommit=True) as conn:
        for attack in attacks:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(attack)  # type: ignore[arg-type]
        seen = conn.execute("SELECT tenant, run, holder, epoch FROM keelgate_owners").fetchall()
        assert seen == [(shared.ns_a, "payouts", "operator-c", 2)]
        moved = conn.execute(
            "UPDATE keelgate_owners SET expires = 0 WHERE tenant = %s", (shared.ns_b,)
        )
        assert moved.rowcount == 0
    held = b.checkpoints.holder_of(shared.ns_b, "payouts")  # type: ignore[attr-defined]
    assert held is not None and (held.holder, held.epoch) == ("operator-b", 1)
    assert held.lease_left > 20
    administrator = open_stores(shared.at(shared.ns_a))
    pass_leases(administrator)
    administrator.close()
    assert owners.take(shared.ns_a, "payouts", holder="operator-d", lease=30.0).epoch == 3
    a.close()
    b.close()
