"""The simulated runs' stores: the product's own SQL stores, their clock put on virtual time.

Why it exists: a write deadline is set and judged on the store's own clock (SQL ``now``), so a
simulation that moves time must move that clock too. The seam is the store's ``Dialect``: these
subclasses change only its clock expression to a function the world answers, and each process of
the simulation opens its own store object (its own owner, as a process would). The memory store
stands for a server store (PostgreSQL): an owner's session can be lost while its process lives
(``lose_session``), and as a PostgreSQL store does, it then opens a new session, with a new
owner id, at its next claim (its keys may carry any id it has had); and, as over a network, a
statement or a commit may land while its answer is lost (``lose_answer``: the caller meets
``StoreUnavailable`` after the write took place). The SQLite store is the real file with the
real ``flock`` owners, in a temporary folder: one host, no answer to lose. Nothing of the stores'
logic is copied here.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from keelgate.core.audit import AuditDraft
from keelgate.core.protocols import Completion, Stores
from keelgate.errors import StoreUnavailable
from keelgate.stores._dialect import Connection
from keelgate.stores._migrations import migrate
from keelgate.stores.memory import MemoryBackend, MemoryStore
from keelgate.stores.sqlite import SQLITE, SQLiteStore, immediate

#: The SQL function that reads the world's clock.
CLOCK_FUNCTION = "keelgate_sim_clock"
_DIALECT = replace(SQLITE, clock=f"{CLOCK_FUNCTION}()")
# A memory store's keys may carry any owner id it has had, as a PostgreSQL store's (``owner =
# ANY(?)`` there): the parameter is their list, as JSON.
_SESSIONS = replace(_DIALECT, mine="owner IN (SELECT value FROM json_each(?))")

Clock = Callable[[], float]
T = TypeVar("T")


#: What a step process books of one checkpoint save of its own: called as the save is asked
#: for, it returns what is called once the save returned (it landed; a save whose answer was
#: lost, or that was refused, is never booked).
SaveBooking = Callable[[], Callable[[], None]]


class BookedSaves:
    """A store that tells its process when a checkpoint save of its own was asked for and
    when it returned (``booking``; None: nobody asks), whichever of the three ways the
    product saves one: the world's record of where a run's active time was counted
    (``ProcessLife.saves``). Nothing of the save is read or changed."""

    booking: SaveBooking | None = None
    _depth = 0

    def _booked(self, save: Callable[[], T]) -> T:
        # One save may call another (``save_completing`` without completions is
        # ``save_with_events``, which without events is ``save``): the outermost books it.
        done = self.booking() if self.booking is not None and not self._depth else None
        self._depth += 1
        try:
            result = save()
        finally:
            self._depth -= 1
        if done is not None:
            done()
        return result

    def save(self, tenant: str, run: str, seq: int, state: Mapping[str, Any]) -> None:
        self._booked(lambda: super(BookedSaves, self).save(tenant, run, seq, state))  # type: ignore[misc]

    def save_with_events(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
    ) -> None:
        self._booked(
            lambda: super(BookedSaves, self).save_with_events(  # type: ignore[misc]
                tenant, run, seq, state, drafts
            )
        )

    def save_completing(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
        completions: Sequence[Completion],
    ) -> tuple[str, ...]:
        return self._booked(
            lambda: super(BookedSaves, self).save_completing(  # type: ignore[misc]
                tenant, run, seq, state, drafts, completions
            )
        )


class SimMemoryStore(BookedSaves, MemoryStore):
    """A memory store whose SQL clock is the world's, standing for a server store: the runs it
    drives are held by its session (``RunLock``), and go with it when the session is lost, as a
    PostgreSQL session's advisory locks do; its next claim opens a new session, with a new owner
    id (``PostgresStore._live_owner_session``)."""

    dialect = _SESSIONS

    def __init__(
        self,
        backend: MemoryBackend,
        *,
        lose_answer: Callable[[], bool] = lambda: False,
        answer_late: Callable[[], None] = lambda: None,
        reachable: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__(backend)
        self.reachable = reachable
        self.driving: set[tuple[str, str]] = set()
        self.session_lost = False
        self.owners = [self.owner]  # every owner id it has had, one per session
        self.lose_answer = lose_answer
        self.answer_late = answer_late

    # A server store's answers cross a network: a statement, or a commit, may take place and
    # its answer come back late, or never.

    @contextmanager
    def _statement(self) -> Iterator[Connection]:
        self._reach()
        with super()._statement() as conn:
            yield conn
        self._answer_or_not()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        self._reach()
        with super()._transaction() as conn:
            yield conn
        self._answer_or_not()

    def _reach(self) -> None:
        """A process cut off from the store server (its cluster's network) sends nothing
        there: the statement never leaves, and its client gives up on the connection."""
        if not self.reachable():
            raise StoreUnavailable("the store server cannot be reached from here")

    def _answer_or_not(self) -> None:
        self.answer_late()
        if self.lose_answer():
            raise StoreUnavailable("the connection to the store was lost before its answer came")

    def _owned(self) -> str:
        return json.dumps(self.owners)

    def _mine(self, owner: Any) -> bool:
        return owner in self.owners

    def _on_owner_session(self, work: Callable[[Connection], T], *, atomic: bool) -> T:
        if self.session_lost:
            # A new session: a new owner, alive; the run locks of the lost one are not back.
            with self.backend.lock:
                self.owner = uuid.uuid4().hex
                self.owners.append(self.owner)
                self.backend.live_owners.add(self.owner)
                self.session_lost = False
        return super()._on_owner_session(work, atomic=atomic)

    def _close_now(self) -> None:
        # A session that ends takes its run locks with it: ``PostgresStore`` unlocks them all
        # as it closes, and the server drops a session's advisory locks when its backend exits,
        # which it does as soon as its client's connection closes (a killed process's kernel
        # closes it). A driver killed mid-step (held up, then SIGKILLed) never gets to release.
        with self.backend.lock:
            self.backend.live_owners.difference_update(self.owners)
            self.backend.driven.difference_update(self.driving)
            self.driving.clear()

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        self._reach()
        if self.session_lost:
            return None
        release = super().lock_run(tenant, run)
        if release is None:
            return None
        self.driving.add((tenant, run))

        def released() -> None:
            if (tenant, run) in self.driving:  # not lost with the session meanwhile
                self.driving.discard((tenant, run))
                release()

        return released

    def lose_session(self) -> None:
        """The server ended this store's session: its owner and its runs' locks go."""
        with self.backend.lock:
            self.session_lost = True
            self.backend.live_owners.discard(self.owner)
            self.backend.driven.difference_update(self.driving)
            self.driving.clear()


class SimSQLiteStore(BookedSaves, SQLiteStore):
    """A SQLite store (a real file, real flock owners) whose SQL clock is the world's."""

    dialect = _DIALECT

    def __init__(self, path: Path, clock: Clock) -> None:
        super().__init__(path, synchronous="OFF")  # a simulation never loses power
        self._db.create_function(CLOCK_FUNCTION, 0, clock)
        self._run_locks: list[Callable[[], None]] = []

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        release = super().lock_run(tenant, run)
        if release is None:
            return None
        held = [release]

        def released() -> None:
            # Once only: a driver killed while it held the run had its flock dropped then
            # (``died``), and its late unwinding must not touch the next holder's file.
            if held:
                held.pop()()
                self._run_locks.remove(released)

        self._run_locks.append(released)
        return released

    def died(self) -> None:
        """The process was killed: the kernel closes its files, and so drops its run locks
        (the flocks of ``lock_run``) with its owner's; its stack, held up in the world,
        never gets to release them. (It removes their files too, which a dead process
        leaves behind, unlocked: the next driver locks either way.)"""
        for release in list(self._run_locks):
            release()
        self._close_now()


class StoreSite:
    """Where one simulated run's data lives; ``open()`` is one process opening its stores."""

    kind: str
    #: Whether the store's next answer is lost (a server store only; the world sets it).
    lose_answer: Callable[[], bool] = staticmethod(lambda: False)

    def open(
        self,
        *,
        answer_late: Callable[[], None] = lambda: None,
        reachable: Callable[[], bool] = lambda: True,
    ) -> Stores:
        """``answer_late``: called once a statement of the opener's has landed, before its
        answer is heard (a server store only: a step process waits there when the world says
        its answer is slow); ``reachable``: whether the server can be reached from the
        opener's node now (a server store only: a cluster cut off from it)."""
        raise NotImplementedError

    def lose_session(self, stores: Stores) -> bool:
        """The store server ends this process's session (its owner is judged gone) while the
        process lives on; False where no such thing can happen (SQLite: one host, flock)."""
        return False

    def kill(self, stores: Stores) -> None:
        """The process died: its owner goes at once, and the runs it drove with it, whatever
        it still held."""
        store = stores.idempotency
        died = getattr(store, "died", None) or getattr(store, "_close_now", None)
        if died is not None:
            died()

    def close(self) -> None:
        """The simulated run is over."""


class MemorySite(StoreSite):
    kind = "memory"

    def __init__(self, clock: Clock) -> None:
        db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        db.create_function(CLOCK_FUNCTION, 0, clock)
        migrate(db, SQLITE, lambda: immediate(db), where="simulated memory store")
        self.backend = MemoryBackend(db=db)
        self.lose_answer: Callable[[], bool] = lambda: False  # the world sets it

    def open(
        self,
        *,
        answer_late: Callable[[], None] = lambda: None,
        reachable: Callable[[], bool] = lambda: True,
    ) -> Stores:
        return Stores.of(
            SimMemoryStore(
                self.backend,
                lose_answer=self.lose_answer,
                answer_late=answer_late,
                reachable=reachable,
            )
        )

    def lose_session(self, stores: Stores) -> bool:
        store = stores.idempotency
        assert isinstance(store, SimMemoryStore)
        store.lose_session()
        return True

    def close(self) -> None:
        self.backend.db.close()


class SQLiteSite(StoreSite):
    kind = "sqlite"

    def __init__(self, clock: Clock, *, folder: str | None = None) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="keelgate-sim-", dir=folder)
        self.path = Path(self._folder.name) / "keelgate.db"
        self.clock = clock

    def open(
        self,
        *,
        answer_late: Callable[[], None] = lambda: None,
        reachable: Callable[[], bool] = lambda: True,
    ) -> Stores:
        # One host, a local file: no answer crosses a network to be slow, lost or cut off.
        return Stores.of(SimSQLiteStore(self.path, self.clock))

    def close(self) -> None:
        self._folder.cleanup()


def patiently(read: Callable[[], T]) -> T:
    """A person's read (``keelgate status``), tried again while its answer is lost."""
    for _ in range(20):
        try:
            return read()
        except StoreUnavailable:
            continue
    return read()


def site(kind: str, clock: Clock) -> StoreSite:
    if kind == "memory":
        return MemorySite(clock)
    if kind == "sqlite":
        # /dev/shm where there is one: the file's durability is not what is simulated.
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        return SQLiteSite(clock, folder=shm)
    raise ValueError(f"unknown store kind {kind!r} (memory or sqlite)")
