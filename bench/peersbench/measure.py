"""The measurements: rounds in rotating order, untimed commit counts, and growth over long runs.

Why it exists: on a shared machine, load must fall on every system alike, so each round runs
every system once, in an order rotated by one place each round, in one process; commits and
bytes are counted in passes that are not timed. Keelgate's raw baseline (the durable commits its
iteration needs, issued directly, from ``commitbench.raw``) takes part in the same rounds. It
must never time one system under conditions another escapes.
"""

from __future__ import annotations

import inspect
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from commitbench.loop import calibrate
from commitbench.raw import PostgresRaw, SQLiteRaw
from peersbench.places import Database, Place

WARM = 30  # iterations each system runs before the first timed round
COUNTED = 30  # iterations of the commit-counting pass
RAW = "keelgate raw commits"


class Peer(Protocol):
    label: str
    version: str
    effects: int

    def run(self, run: str, iterations: int, probe: Callable[[], None]) -> None: ...

    def close(self) -> None: ...


PeerFactory = Callable[[Database], Peer]


class RawPeer:
    """Keelgate's raw baseline (commitbench) as a participant: the same rows, issued directly."""

    label = RAW
    version = "sqlite3/psycopg"
    effects = 0

    def __init__(self, database: Database) -> None:
        payload = calibrate()
        if database.store == "sqlite":
            from keelgate.stores.sqlite import SQLiteStore

            synchronous = inspect.signature(SQLiteStore.__init__).parameters["synchronous"]
            self.raw: Any = SQLiteRaw(Path(database.target), str(synchronous.default), payload)
        else:
            self.raw = PostgresRaw(database.target, payload, database.commits)

    def run(self, run: str, iterations: int, probe: Callable[[], None]) -> None:
        for _ in range(iterations):
            probe()
            self.raw.one()

    def close(self) -> None:
        self.raw.close()


@dataclass
class Figures:
    """One system on one store."""

    label: str
    version: str
    ms: list[float] = field(default_factory=list)  # per iteration, one entry per round
    cpu_ms: list[float] = field(default_factory=list)  # this process's CPU (all threads), same
    commits: list[int] = field(default_factory=list)  # per iteration, counting pass
    growth: list[tuple[int, int, float, float]] = field(default_factory=list)
    # (iterations done, stored bytes, bytes per iteration so far, bytes per iteration since
    # the previous point)
    written: float = 0.0  # bytes written per iteration over the growth run's last stretch


@dataclass
class StoreFigures:
    store: str
    settings: str
    iterations: int
    rounds: int
    systems: dict[str, Figures] = field(default_factory=dict)

    def ratio(self, mine: str, theirs: str) -> list[float]:
        """Round by round: ``mine`` ms per iteration over ``theirs`` in the same round."""
        a, b = self.systems[mine].ms, self.systems[theirs].ms
        return [x / y for x, y in zip(a, b, strict=True)]


def _timed(peer: Peer, run: str, iterations: int) -> tuple[float, float]:
    """ms per iteration over ``iterations`` whole iterations, plan to plan: wall clock, and this
    process's CPU time (every thread's: DBOS's and aiosqlite's work runs in threads)."""
    stamps: list[tuple[float, float]] = []
    peer.run(run, iterations + 1, lambda: stamps.append((time.perf_counter(), time.process_time())))
    (wall0, cpu0), (wall1, cpu1) = stamps[0], stamps[-1]
    return (wall1 - wall0) / iterations * 1000, (cpu1 - cpu0) / iterations * 1000


def _counted(peer: Peer, run: str, database: Database) -> list[int]:
    marks: list[int] = []
    peer.run(run, COUNTED + 1, lambda: marks.append(database.commits()))
    return [b - a for a, b in itertools.pairwise(marks)]


def measure(
    place: Place,
    factories: Sequence[tuple[str, PeerFactory]],
    *,
    iterations: int,
    rounds: int,
    growth_at: Sequence[int],
    say: Callable[[str], None],
) -> StoreFigures:
    out = StoreFigures(place.name, place.settings, iterations, rounds)
    peers: list[tuple[Peer, Database]] = []
    try:
        for name, factory in factories:
            database = place.database(name.replace(" ", "_"))
            peer = factory(database)
            peers.append((peer, database))
            out.systems[peer.label] = Figures(peer.label, peer.version)
            peer.run("timed", WARM, lambda: None)
        for number in range(rounds):
            say(f"  [{place.name}] round {number + 1} of {rounds}")
            turn = number % len(peers)
            for peer, _ in peers[turn:] + peers[:turn]:
                wall, cpu = _timed(peer, "timed", iterations)
                out.systems[peer.label].ms.append(wall)
                out.systems[peer.label].cpu_ms.append(cpu)
        for peer, database in peers:
            out.systems[peer.label].commits = _counted(peer, "counted", database)
    finally:
        for peer, _ in peers:
            peer.close()
    if growth_at:
        for name, factory in factories:
            if name == RAW:
                continue
            say(f"  [{place.name}] growth of {name} to {max(growth_at)} iterations")
            database = place.database(f"{name.replace(' ', '_')}_growth")
            peer = factory(database)
            try:
                figures = out.systems[peer.label]
                figures.growth, figures.written = grow(peer, database, growth_at)
            finally:
                peer.close()
    return out


def grow(
    peer: Peer, database: Database, at: Sequence[int]
) -> tuple[list[tuple[int, int, float, float]], float]:
    """Stored bytes after ``at`` iterations of one run (a DBOS run: one workflow per stretch),
    and bytes written per iteration over the last stretch (only this system runs meanwhile)."""
    empty = database.stored_bytes()  # the schema, no iteration yet
    rows = []
    done, previous, written = 0, empty, 0.0
    for point in sorted(at):
        before = database.written()
        peer.run("growth", point - done, lambda: None)
        written = (database.written() - before) / (point - done)
        size = database.stored_bytes()
        rows.append(
            (point, size - empty, (size - empty) / point, (size - previous) / (point - done))
        )
        done, previous = point, size
    return rows, written


def steady(counts: Sequence[int]) -> tuple[float, int, int]:
    """Median over the steady state (past the counting run's start), with min and max."""
    tail = counts[len(counts) // 3 :]
    return statistics.median(tail), min(tail), max(tail)
