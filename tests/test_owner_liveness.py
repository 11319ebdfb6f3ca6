"""Owner liveness across real processes: the judgement behind OUTCOME_UNKNOWN.

For SQLite and Postgres, with real worker processes (spawned, then killed with SIGKILL): a key in
flight in a live process reads in_flight, and outcome_unknown once that process is dead; two
processes racing to claim one key or to save one seq have exactly one winner, and stores racing
to claim and drop one key never see it unknown. For Postgres, an owner whose session is cut while
its process lives is read as gone, and still cannot make a WRITE land twice. For SQLite, a live
owner is never read as gone through another path to the same file.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keelgate.core.types import KeyRecord, KeyState
from keelgate.errors import SettleError, StaleCheckpoint
from keelgate.stores import open_stores
from keelgate.stores.sqlite import SQLiteStore
from support.stores import StoreFactory, store_fixture

durable_factory = store_fixture("sqlite", "postgres")

SPAWN = multiprocessing.get_context("spawn")  # no fork: the parent has pool threads running
WAIT = 60.0


def _claim(stores: Any, key: str) -> KeyRecord | None:
    record: KeyRecord | None = stores.idempotency.claim(
        "acme", key, run="r", action="a1", tool="ship"
    )
    return record


# Workers (run in spawned processes)


def hold_a_claim(url: str, key: str, claimed: Any, release: Any) -> None:
    """Claim a key and stay alive, as a process in the middle of a WRITE."""
    stores = open_stores(url)
    assert _claim(stores, key) is None
    claimed.set()
    release.wait(WAIT)
    stores.close()


def claim_at_once(url: str, keys: list[str], barrier: Any, done: Any, results: Any) -> None:
    """Claim every key the instant all workers are ready; stay alive until told to stop."""
    stores = open_stores(url)
    barrier.wait(WAIT)
    outcome = []
    for key in keys:
        record = _claim(stores, key)
        outcome.append("won" if record is None else record.state.value)
    results.put(outcome)
    done.wait(WAIT)
    stores.close()


def drive_a_run(url: str, driving: Any, release: Any) -> None:
    """Become the driver of run r and stay alive, as a process in the middle of a run."""
    stores = open_stores(url)
    assert stores.idempotency.lock_run("acme", "r") is not None  # type: ignore[attr-defined]
    driving.set()
    release.wait(WAIT)
    stores.close()


def save_at_once(url: str, rounds: int, barrier: Any, results: Any) -> None:
    """Each round, save seq = round the instant all workers are ready; report who won."""
    stores = open_stores(url)
    wins = []
    for seq in range(1, rounds + 1):
        barrier.wait(WAIT)
        try:
            stores.checkpoints.save("acme", "r", seq, {"writer": os.getpid(), "seq": seq})
            wins.append(True)
        except StaleCheckpoint:
            wins.append(False)
    results.put((os.getpid(), wins))
    stores.close()


@contextmanager
def processes(
    target: Callable[..., None], *args_per_process: tuple[Any, ...]
) -> Iterator[list[Any]]:
    """Start one spawned process per argument tuple; kill any still alive on the way out."""
    started = [SPAWN.Process(target=target, args=args, daemon=True) for args in args_per_process]
    for process in started:
        process.start()
    try:
        yield started
    finally:
        for process in started:
            if process.is_alive():
                process.kill()
            process.join(WAIT)


def eventually(read: Callable[[], Any], expected: Any, *, within: float = 10.0) -> Any:
    """Poll until ``read()`` equals ``expected`` (a dying owner takes a moment to be seen gone)."""
    deadline = time.monotonic() + within
    value = read()
    while value != expected and time.monotonic() < deadline:
        time.sleep(0.01)
        value = read()
    return value


def test_a_live_owner_in_another_process_reads_in_flight_until_it_is_killed(
    durable_factory: StoreFactory,
) -> None:
    """A key claimed by a live process reads in_flight to everyone else (not claimable, not
    settleable) for as long as that process lives; once it is killed with SIGKILL the key reads
    outcome_unknown and can be settled."""
    assert durable_factory.url is not None
    claimed, release = SPAWN.Event(), SPAWN.Event()
    with processes(hold_a_claim, (durable_factory.url, "kg-1", claimed, release)) as [owner]:
        assert claimed.wait(WAIT), "the owner process never claimed its key"
        stores = durable_factory()
        time.sleep(0.3)  # the owner is alive and idle: its key must stay in flight throughout
        record = _claim(stores, "kg-1")
        assert record is not None and record.state is KeyState.IN_FLIGHT
        with pytest.raises(SettleError):
            stores.idempotency.settle("acme", "kg-1", executed=False, by="ann", source="human")
        owner.kill()
        owner.join(WAIT)

        def state() -> KeyState | None:
            got = stores.idempotency.get("acme", "kg-1")
            return None if got is None else got.state

        assert eventually(state, KeyState.OUTCOME_UNKNOWN) is KeyState.OUTCOME_UNKNOWN
        again = _claim(stores, "kg-1")
        assert again is not None and again.state is KeyState.OUTCOME_UNKNOWN
        settled = stores.idempotency.settle("acme", "kg-1", executed=False, by="ann", source="h")
        assert settled.state is KeyState.ABANDONED


def test_a_run_driven_by_a_live_process_is_busy_until_that_process_is_killed(
    durable_factory: StoreFactory,
) -> None:
    """While a live process drives a run, no other may drive it (another run may); once the
    driver is killed with SIGKILL the run is free again, without any timeout or clean-up."""
    assert durable_factory.url is not None
    durable_factory().close()  # the schema first, as an installed system would have it
    driving, release = SPAWN.Event(), SPAWN.Event()
    with processes(drive_a_run, (durable_factory.url, driving, release)) as [driver]:
        assert driving.wait(WAIT), "the driver process never took the run"
        locks = durable_factory().idempotency
        time.sleep(0.3)  # alive and idle: the run must stay taken throughout
        assert locks.lock_run("acme", "r") is None  # type: ignore[attr-defined]
        other = locks.lock_run("acme", "other")  # type: ignore[attr-defined]
        assert other is not None
        other()
        driver.kill()
        driver.join(WAIT)

        def free() -> bool:
            release_it = locks.lock_run("acme", "r")  # type: ignore[attr-defined]
            if release_it is None:
                return False
            release_it()
            return True

        assert eventually(free, True) is True


def test_closing_one_store_makes_only_its_own_keys_unknown(
    durable_factory: StoreFactory,
) -> None:
    """In one process, closing a store turns its in-flight keys unknown at once, while keys of
    another store that is still open stay in flight."""
    closing, staying, judge = durable_factory(), durable_factory(), durable_factory()
    assert _claim(closing, "kg-closing") is None
    assert _claim(staying, "kg-staying") is None
    closing.close()
    gone = judge.idempotency.get("acme", "kg-closing")
    live = judge.idempotency.get("acme", "kg-staying")
    assert gone is not None and gone.state is KeyState.OUTCOME_UNKNOWN
    assert live is not None and live.state is KeyState.IN_FLIGHT


def test_processes_claiming_one_key_at_once_have_exactly_one_winner(
    durable_factory: StoreFactory,
) -> None:
    """Four processes released together claim the same 25 keys: every key has exactly one
    winner, and every loser sees the key in flight (its winner is alive), never a second win."""
    assert durable_factory.url is not None
    durable_factory().close()  # create the schema first, as an installed system would have
    keys = [f"kg-{i}" for i in range(25)]
    workers = 4
    barrier, done, results = SPAWN.Barrier(workers), SPAWN.Event(), SPAWN.Queue()
    args = [(durable_factory.url, keys, barrier, done, results)] * workers
    with processes(claim_at_once, *args):
        outcomes = [results.get(timeout=WAIT) for _ in range(workers)]
        done.set()
    for i, key in enumerate(keys):
        column = [outcome[i] for outcome in outcomes]
        assert column.count("won") == 1, (key, column)
        assert set(column) == {"won", "in_flight"}, (key, column)


def test_processes_saving_the_same_seq_at_once_have_exactly_one_winner(
    durable_factory: StoreFactory,
) -> None:
    """Four processes released together save the same seq, 20 rounds: each round exactly one
    save wins and the others get StaleCheckpoint; the stored checkpoint is the winner's."""
    assert durable_factory.url is not None
    durable_factory().close()
    workers, rounds = 4, 20
    barrier, results = SPAWN.Barrier(workers), SPAWN.Queue()
    with processes(save_at_once, *[(durable_factory.url, rounds, barrier, results)] * workers):
        reports = [results.get(timeout=WAIT) for _ in range(workers)]
    for seq in range(rounds):
        assert sum(wins[seq] for _, wins in reports) == 1, f"round {seq + 1}"
    last_winner = next(pid for pid, wins in reports if wins[-1])
    loaded = durable_factory().checkpoints.load("acme", "r")
    assert loaded is not None
    assert (loaded.seq, loaded.state) == (rounds, {"writer": last_winner, "seq": rounds})


@pytest.mark.postgres
def test_a_postgres_owner_whose_session_is_cut_never_lands_a_write_twice(pg_url: str) -> None:
    """The one misjudgement Postgres allows: the owner's session is terminated while its process
    lives. Its keys then read outcome_unknown elsewhere (a stop, not a retry); a key settled
    meanwhile keeps the person's decision when the owner completes late; an unsettled one
    records the owner's result; and the owner's next claim runs under a new live owner id."""
    from keelgate.stores.postgres import PostgresStore

    owner, judge = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        first_id = owner.owner
        assert owner.claim("acme", "kg-settled", run="r", action="a1", tool="ship") is None
        assert owner.claim("acme", "kg-finished", run="r", action="a2", tool="ship") is None
        with psycopg.connect(pg_url, autocommit=True) as admin:
            # The session holding the owner id's lock (a bigint advisory lock, migration 4).
            cut = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND objsubid = 1 AND classid = (CAST(%s AS bigint) >> 32)::oid "
                "AND objid = (CAST(%s AS bigint) & 4294967295)::oid",
                (first_id, first_id),
            ).fetchall()
        assert cut == [(True,)]

        def state(key: str) -> KeyState | None:
            got = judge.get("acme", key)
            return None if got is None else got.state

        def both() -> tuple[KeyState | None, ...]:
            return state("kg-settled"), state("kg-finished")

        gone = (KeyState.OUTCOME_UNKNOWN, KeyState.OUTCOME_UNKNOWN)
        assert eventually(both, gone) == gone
        judge.settle("acme", "kg-settled", executed=False, by="ann", source="human")
        owner.complete("acme", "kg-settled", {"status": "ok"})
        owner.complete("acme", "kg-finished", {"status": "ok"})
        settled, finished = judge.get("acme", "kg-settled"), judge.get("acme", "kg-finished")
        assert settled is not None and (settled.state, settled.result) == (KeyState.ABANDONED, None)
        assert finished is not None
        assert (finished.state, finished.result) == (KeyState.COMPLETED, {"status": "ok"})

        assert owner.claim("acme", "kg-next", run="r", action="a3", tool="ship") is None
        assert owner.owner != first_id
        assert state("kg-next") is KeyState.IN_FLIGHT
    finally:
        owner.close()
        judge.close()


@pytest.mark.postgres
def test_a_postgres_store_serves_other_threads_while_its_owner_session_waits(pg_url: str) -> None:
    """A pooled store sends its statements on the owner session when it is free, but never
    makes a thread wait for it: while one thread's claim is held up on the server (another
    session has the same key's row locked), another thread reads and saves through the pool at
    once. The claim then completes as it would have."""
    from keelgate.stores.postgres import PostgresStore

    store = PostgresStore(pg_url)
    claimed: list[KeyRecord | None] = []
    try:
        store.save("acme", "r", 1, {"n": 1})
        with psycopg.connect(pg_url) as blocker:  # a transaction: the row stays locked
            blocker.execute(
                "INSERT INTO keelgate_keys (tenant, key, run, action, tool, state, owner) "
                "VALUES ('acme', 'kg-held', 'r', 'a1', 'ship', 'in_flight', NULL)"
            )
            claiming = threading.Thread(
                target=lambda: claimed.append(
                    store.claim("acme", "kg-held", run="r", action="a1", tool="ship")
                )
            )
            claiming.start()
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            assert eventually(lambda: blocker.execute(waiting).fetchone(), (1,)) == (1,)
            started = time.monotonic()
            store.save("acme", "r", 2, {"n": 2})
            loaded = store.load("acme", "r")
            assert time.monotonic() - started < 2.0
            assert loaded is not None and (loaded.seq, loaded.state) == (2, {"n": 2})
            assert claiming.is_alive()  # still waiting on the server, holding the owner session
            blocker.rollback()
        claiming.join(WAIT)
        assert claimed == [None]  # the claim won once the other session let go
        key = store.get("acme", "kg-held")
        assert key is not None and key.state is KeyState.IN_FLIGHT
    finally:
        store.close()


@pytest.mark.postgres
def test_a_postgres_claim_never_waits_behind_another_threads_statement(pg_url: str) -> None:
    """The owner session, where claims must go, is shared only with the thread that claims: a
    statement of another thread that is held up on the server (a save waiting for a row another
    session has locked) goes through the pool, and a claim made meanwhile lands at once."""
    from keelgate.stores.postgres import PostgresStore

    store = PostgresStore(pg_url)
    saved: list[int] = []
    try:
        store.save("acme", "r", 1, {"n": 1})
        assert store.claim("acme", "kg-first", run="r", action="a1", tool="ship") is None
        with psycopg.connect(pg_url) as blocker:  # a transaction: the row stays locked
            blocker.execute("UPDATE keelgate_checkpoints SET seq = seq WHERE run = 'r'")
            saving = threading.Thread(
                target=lambda: saved.append(store.save("acme", "r", 2, {"n": 2}) or 2)
            )
            saving.start()
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            assert eventually(lambda: blocker.execute(waiting).fetchone(), (1,)) == (1,)
            claimed: list[KeyRecord | None] = []
            # In a thread of its own, so that a claim stuck behind the save fails the test
            # instead of hanging it.
            claiming = threading.Thread(
                target=lambda: claimed.append(
                    store.claim("acme", "kg-second", run="r", action="a2", tool="ship")
                )
            )
            try:
                claiming.start()
                claiming.join(5.0)
                assert claimed == [None], "the claim waited behind another thread's save"
                assert saving.is_alive() and saved == []  # still held up on the server
            finally:
                blocker.rollback()
                claiming.join(WAIT)
        saving.join(WAIT)
        assert saved == [2]
        loaded = store.load("acme", "r")
        assert loaded is not None and loaded.seq == 2
    finally:
        store.close()


@pytest.mark.postgres
def test_a_postgres_store_claimed_on_by_two_threads_shares_its_owner_session_with_neither(
    pg_url: str,
) -> None:
    """Two loops on two threads of one store: once both have claimed, neither's other
    statements go on the owner session, so one loop's save held up on the server (another
    session has its row locked) never holds up the other loop's claim."""
    from concurrent.futures import ThreadPoolExecutor, TimeoutError

    from keelgate.stores.postgres import PostgresStore

    store = PostgresStore(pg_url)
    loop_a, loop_b = ThreadPoolExecutor(1), ThreadPoolExecutor(1)  # a thread each, throughout
    try:
        store.save("acme", "r", 1, {"n": 1})
        claim = store.claim
        assert (
            loop_a.submit(claim, "acme", "kg-a1", run="a", action="1:0", tool="t").result() is None
        )
        assert (
            loop_b.submit(claim, "acme", "kg-b1", run="r", action="1:0", tool="t").result() is None
        )
        with psycopg.connect(pg_url) as blocker:  # a transaction: B's row stays locked
            blocker.execute("UPDATE keelgate_checkpoints SET seq = seq WHERE run = 'r'")
            saving = loop_b.submit(store.save, "acme", "r", 2, {"n": 2})
            try:
                with pytest.raises(TimeoutError):
                    saving.result(timeout=0.5)  # B's save waits on the server
                second = loop_a.submit(claim, "acme", "kg-a2", run="a", action="2:0", tool="t")
                try:
                    assert second.result(timeout=5.0) is None
                except TimeoutError:
                    pytest.fail("A's claim waited behind B's save")
            finally:
                blocker.rollback()
        saving.result(timeout=WAIT)
    finally:
        loop_a.shutdown()
        loop_b.shutdown()
        store.close()


def test_a_live_owner_is_not_read_as_gone_through_another_path_to_the_same_file(
    tmp_path: Path,
) -> None:
    """Two stores open the same SQLite file, one through a symlink. While the first holds a
    WRITE's key in flight, the second must read it in flight (busy), never unknown: otherwise a
    person is invited to settle a WRITE that is still running."""
    real = tmp_path / "data" / "kg.db"
    real.parent.mkdir()
    link = tmp_path / "kg-link.db"
    os.symlink(real, link)
    owner = SQLiteStore(real)
    other = SQLiteStore(link)
    try:
        assert owner.claim("shop", "kg-1", run="review", action="1:0", tool="place_order") is None
        seen = other.claim("shop", "kg-1", run="review", action="1:0", tool="place_order")
        assert seen is not None
        assert seen.state is KeyState.IN_FLIGHT, f"a live owner's key read {seen.state.value}"
    finally:
        other.close()
        owner.close()


def test_a_key_claimed_and_forgotten_in_a_race_has_one_holder_and_never_reads_unknown(
    durable_factory: StoreFactory,
) -> None:
    """Two stores race to claim one WRITE key; each winner drops it again as after a definite
    refusal (forget). A claim that meets the key just as it vanishes tries again: at no moment
    do two stores hold it, and a loser only ever sees it in flight in a live owner, never as an
    unknown outcome (which would stop a run for nothing) and never completed or abandoned."""
    stores = [durable_factory().idempotency for _ in range(2)]
    holders, seen, errors = [0], Counter[str](), list[BaseException]()
    lock = threading.Lock()
    deadline = time.monotonic() + 2.0

    def contend(keys: Any) -> None:
        try:
            while time.monotonic() < deadline:
                record = keys.claim("acme", "K", run="r", action="1:0", tool="ship")
                if record is not None:
                    with lock:
                        seen[record.state.value] += 1
                    continue
                with lock:
                    holders[0] += 1
                    assert holders[0] == 1, "two stores hold one key"
                    seen["won"] += 1
                # Nobody else may drop or take a key we hold: it must read in flight.
                held = keys.get("acme", "K")
                assert held is not None and held.state is KeyState.IN_FLIGHT, "won a missing key"
                time.sleep(0.0005)
                with lock:
                    holders[0] -= 1
                keys.forget("acme", "K")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=contend, args=(keys,)) for keys in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert seen["won"] >= 2
    assert set(seen) <= {"won", KeyState.IN_FLIGHT.value}, seen
    assert stores[0].get("acme", "K") is None  # every winner dropped it again
