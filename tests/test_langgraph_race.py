"""The LangGraph store's cross-process lock, proven by a race that fails without it.

The saver API cannot compare-and-set, so ``save`` reads the latest checkpoint and then writes the
next one. Several real processes sharing one ``.sqlite(path)`` file are released together by a
barrier, each having loaded seq n, and each saves n + 1, round after round. With the lock exactly
one wins every round; with the lock switched off (the private switch that exists for this test
only) more than one "wins" the same round: a stale writer is not refused.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

from keelgate.errors import StaleCheckpoint
from keelgate.stores.langgraph import LangGraphCheckpointStore

SPAWN = multiprocessing.get_context("spawn")
WORKERS, ROUNDS, WAIT = 4, 20, 60.0


def race_rounds(path: str, cross_process_lock: bool, barrier: Any, results: Any) -> None:
    """Worker: each round, load seq n, wait for the others, save n + 1; report the wins."""
    store = LangGraphCheckpointStore.sqlite(path, _cross_process_lock=cross_process_lock)
    wins = []
    for _ in range(ROUNDS):
        loaded = store.load("acme", "raced")
        seq = 0 if loaded is None else loaded.seq
        barrier.wait(WAIT)
        try:
            store.save("acme", "raced", seq + 1, {"writer": os.getpid(), "seq": seq + 1})
            wins.append(True)
        except StaleCheckpoint:
            wins.append(False)
        barrier.wait(WAIT)  # the round is over for everyone before anyone loads again
    results.put((os.getpid(), wins))
    store.close()


def run_race(
    path: Path, *, cross_process_lock: bool
) -> tuple[list[int], list[tuple[int, list[bool]]]]:
    """Winners per round, and each worker's report."""
    LangGraphCheckpointStore.sqlite(path).close()  # the file exists before the race starts
    barrier, results = SPAWN.Barrier(WORKERS), SPAWN.Queue()
    workers = [
        SPAWN.Process(
            target=race_rounds, args=(str(path), cross_process_lock, barrier, results), daemon=True
        )
        for _ in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    try:
        reports = [results.get(timeout=WAIT) for _ in workers]
    finally:
        for worker in workers:
            worker.join(WAIT)
            if worker.is_alive():
                worker.kill()
    winners = [sum(wins[i] for _, wins in reports) for i in range(ROUNDS)]
    return winners, reports


def test_with_the_cross_process_lock_exactly_one_writer_wins_every_round(tmp_path: Path) -> None:
    """Four processes race to save the same next seq, 20 rounds: each round exactly one wins,
    the others are refused as stale, and the stored checkpoint is the last winner's."""
    winners, reports = run_race(tmp_path / "graph.db", cross_process_lock=True)
    assert winners == [1] * ROUNDS
    last = next(pid for pid, wins in reports if wins[-1])
    store = LangGraphCheckpointStore.sqlite(tmp_path / "graph.db")
    try:
        loaded = store.load("acme", "raced")
        assert loaded is not None
        assert (loaded.seq, loaded.state) == (ROUNDS, {"writer": last, "seq": ROUNDS})
    finally:
        store.close()


def test_without_the_cross_process_lock_stale_writers_also_win(tmp_path: Path) -> None:
    """The same race with the lock switched off: in some round more than one process "wins" the
    same seq (the read-then-write check let a stale writer through), which is why the lock
    exists."""
    winners, _ = run_race(tmp_path / "graph.db", cross_process_lock=False)
    assert max(winners) > 1, winners
