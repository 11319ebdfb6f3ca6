"""In-memory stores, for tests and quick experiments.

Data lives in a ``MemoryBackend`` that outlives any ``MemoryStore`` opened on it, so a test can
"restart" a process by closing a store and opening a new one over the same backend: the closed
store's in-flight keys then read as unknown outcomes, exactly as a dead process's would. The
backend is an in-memory SQLite database run by the one SQL store (``keelgate.stores._sql``), so
``memory://`` keeps the very statements, compare-and-sets and audit chain the durable stores
keep; this module adds only the shared connection and owner liveness: a store's owner lives
while it is in the backend's ``live_owners`` (from opening to ``close``, or a test's cut).

Nothing here is durable across real processes; it must never be offered as a production store.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keelgate.stores._migrations import migrate
from keelgate.stores.sqlite import SQLITE, SQLiteConnected, immediate


def _database() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    migrate(db, SQLITE, lambda: immediate(db), where="memory store")
    return db


@dataclass
class MemoryBackend:
    """The shared data behind any number of MemoryStore sessions: one database, used by one
    thread at a time (``lock``), and the owners that are alive."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    db: sqlite3.Connection = field(default_factory=_database)
    live_owners: set[str] = field(default_factory=set)
    driven: set[tuple[str, str]] = field(default_factory=set)  # runs a driver holds (RunLock)


class MemoryStore(SQLiteConnected):
    """Checkpoint, idempotency and audit store in one, over a MemoryBackend."""

    def __init__(self, backend: MemoryBackend | None = None) -> None:
        super().__init__()
        self.backend = backend or MemoryBackend()
        self.owner = uuid.uuid4().hex
        self._db = self.backend.db
        self._lock = self.backend.lock
        with self.backend.lock:
            self.backend.live_owners.add(self.owner)

    def reopen(self) -> MemoryStore:
        """A new session over the same data, as a restarted process would open."""
        return MemoryStore(self.backend)

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        """One driver per run among every store over this backend (this process only)."""
        with self.backend.lock:
            if (tenant, run) in self.backend.driven:
                return None
            self.backend.driven.add((tenant, run))

        def release() -> None:
            with self.backend.lock:
                self.backend.driven.discard((tenant, run))

        return release

    def _close_now(self) -> None:
        with self.backend.lock:
            self.backend.live_owners.discard(self.owner)

    def _alive(self, owner: Any, judged: Any) -> bool:
        with self.backend.lock:
            return owner is not None and owner in self.backend.live_owners
