"""SQLite stores (the default): checkpoints, idempotency keys and the audit chain in one file.

Owner liveness, the heart of OUTCOME_UNKNOWN: every store instance creates a lock file
``<db>.owners/<owner>.lock`` and holds an exclusive ``flock`` on it for as long as it is open. An
in-flight key records its owner. To judge an in-flight key, another store tries to take that
owner's lock without blocking: it gets it only if no open file description holds it, which the
kernel guarantees once the owner process is dead (``os._exit``, SIGKILL, OOM: the kernel closes
every descriptor) or the owner store was closed. While the owner lives the lock is refused, so a
live owner is never read as gone. ``flock`` locks belong to open file descriptions, so this also
holds between two stores in one process, which is what in-process restart tests rely on.
It is sound on one host, the only place an SQLite file may be shared (SQLite over a network
filesystem is unsupported). Multi-host deployments use the Postgres store.

This module must never settle, retry or delete a key on its own: only ``settle`` changes an
unknown outcome, on a person's or a confirmer's word.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from keelgate.core.audit import AuditDraft, AuditEvent, seal
from keelgate.core.protocols import Capabilities, Checkpoint, RecordedSpec, RunRef
from keelgate.core.types import KeyRecord, KeyState, settled_state
from keelgate.errors import SettleError, StaleCheckpoint, StoreError, StoreUnavailable
from keelgate.stores._holds import OwnerHolds
from keelgate.stores._json import dumps

SCHEMA = """
CREATE TABLE IF NOT EXISTS keelgate_checkpoints (
    tenant TEXT NOT NULL, run TEXT NOT NULL, seq INTEGER NOT NULL, state TEXT NOT NULL,
    PRIMARY KEY (tenant, run));
CREATE TABLE IF NOT EXISTS keelgate_keys (
    tenant TEXT NOT NULL, key TEXT NOT NULL, run TEXT NOT NULL, action TEXT NOT NULL,
    tool TEXT NOT NULL, state TEXT NOT NULL, owner TEXT, result TEXT,
    settled_by TEXT NOT NULL DEFAULT '', source TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (tenant, key));
CREATE TABLE IF NOT EXISTS keelgate_audit (
    tenant TEXT NOT NULL, run TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
    actor TEXT NOT NULL, at TEXT NOT NULL, data TEXT NOT NULL, key TEXT,
    prev TEXT NOT NULL, hash TEXT NOT NULL,
    PRIMARY KEY (tenant, run, seq));
CREATE UNIQUE INDEX IF NOT EXISTS keelgate_audit_key ON keelgate_audit (tenant, run, key)
    WHERE key IS NOT NULL;
CREATE TABLE IF NOT EXISTS keelgate_specs (
    tenant TEXT NOT NULL, run TEXT NOT NULL, source TEXT NOT NULL, generation INTEGER NOT NULL,
    spec TEXT NOT NULL, PRIMARY KEY (tenant, run));
"""


class SQLiteStore:
    """Checkpoint, idempotency and audit store over one SQLite file."""

    # Every role in one transaction: see keelgate.core.protocols.Capabilities.
    capabilities = Capabilities(checkpoint_with_events=True, claim_with_event=True)

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL") -> None:
        # The real file, not the path given: every opener must find the same owners folder.
        self.path = Path(path).resolve()
        self._owners = self.path.parent / f"{self.path.name}.owners"
        # A file that turns out not to be a database must not be left with a folder beside it.
        made_owners = not self._owners.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._owners.mkdir(exist_ok=True)
        except OSError as error:
            raise StoreUnavailable(f"cannot use {self.path}: {error.strerror}") from None
        self.owner = uuid.uuid4().hex
        self._holds = OwnerHolds()
        # Held until close: while this descriptor is open, our in-flight keys read as live.
        self._owner_fd: int | None = os.open(
            self._owners / f"{self.owner}.lock", os.O_CREAT | os.O_RDWR, 0o600
        )
        fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        self._lock = threading.Lock()
        # The last event this store committed on each run's chain, so an append need not read
        # it back. Another writer may have moved on since: the chain's primary key then refuses
        # our insert, and the head is read afresh (see _append).
        self._heads: dict[tuple[str, str], AuditEvent | None] = {}
        self._staged_heads: dict[tuple[str, str], AuditEvent | None] = {}
        try:
            self._db = sqlite3.connect(
                self.path, isolation_level=None, timeout=30.0, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit survives power loss, not just a process death.
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as error:
            self.close()
            if made_owners:
                with suppress(OSError):
                    self._owners.rmdir()
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {error}") from None

    @contextmanager
    def _tx(self, *, immediate: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if not immediate:
                yield self._db
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._staged_heads.clear()
                raise
            # Only what committed may be remembered as a run's chain head.
            self._heads.update(self._staged_heads)
            self._staged_heads.clear()

    def hold(self) -> Callable[[], None]:
        """Keep this store's owner alive, even past ``close``, until the returned function is
        called: a call it started may still run (see ``keelgate.stores._holds``)."""
        return self._holds.hold()

    def close(self) -> None:
        """Close the file and release the owner lock: from then on our in-flight keys read
        unknown. Deferred while a hold is taken."""
        self._holds.close(self._close_now)

    def _close_now(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
            self._db = None  # type: ignore[assignment]
        if self._owner_fd is not None:
            os.close(self._owner_fd)  # releases the flock: our in-flight keys now read unknown
            self._owner_fd = None
            with suppress(FileNotFoundError):
                (self._owners / f"{self.owner}.lock").unlink()

    # RunLock

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        """An exclusive ``flock`` on ``<db>.owners/run-<digest>.lock``, held by the driver.

        As for owners, the kernel drops the lock when its holder dies, and a flock belongs to
        an open file description, so two stores in one process exclude each other too.
        """
        digest = hashlib.sha256(f"{tenant}\0{run}".encode()).hexdigest()[:32]
        path = self._owners / f"run-{digest}.lock"
        while True:
            try:
                fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            except OSError as error:
                raise StoreUnavailable(f"cannot use {path}: {error.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            # A driver releasing removes the file (below): the one we opened may be gone or
            # replaced since, and a lock on it would exclude nobody. Then lock the file there now.
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)

        def release() -> None:
            # Removed while still locked, so no file is left per run; a waiter that opened it
            # meanwhile sees it gone and starts again. A dead driver leaves the file, unlocked.
            with suppress(FileNotFoundError):
                path.unlink()
            os.close(fd)

        return release

    # CheckpointStore

    def save(self, tenant: str, run: str, seq: int, state: Mapping[str, Any]) -> None:
        text = _checkpoint_text(state)
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO keelgate_checkpoints (tenant, run, seq, state) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (tenant, run) DO UPDATE SET seq = excluded.seq, "
                "state = excluded.state WHERE keelgate_checkpoints.seq < excluded.seq",
                (tenant, run, seq, text),
            )
            if cursor.rowcount == 1:
                return
            row = db.execute(
                "SELECT seq FROM keelgate_checkpoints WHERE tenant = ? AND run = ?", (tenant, run)
            ).fetchone()
        raise StaleCheckpoint(tenant, run, seq, None if row is None else int(row[0]))

    def save_with_events(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
    ) -> None:
        """``save`` and ``append`` in one transaction: one durable commit, and a crash can
        never leave the checkpoint without its events or the events without the checkpoint."""
        if not drafts:
            # One autocommit statement is atomic already; BEGIN and COMMIT would add nothing.
            self.save(tenant, run, seq, state)
            return
        text = _checkpoint_text(state)
        with self._tx(immediate=True) as db:
            cursor = db.execute(
                "INSERT INTO keelgate_checkpoints (tenant, run, seq, state) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (tenant, run) DO UPDATE SET seq = excluded.seq, "
                "state = excluded.state WHERE keelgate_checkpoints.seq < excluded.seq",
                (tenant, run, seq, text),
            )
            if cursor.rowcount != 1:
                row = db.execute(
                    "SELECT seq FROM keelgate_checkpoints WHERE tenant = ? AND run = ?",
                    (tenant, run),
                ).fetchone()
                # Raised inside the transaction, so it rolls back and no event is appended.
                raise StaleCheckpoint(tenant, run, seq, None if row is None else int(row[0]))
            self._append(db, tenant, run, drafts)

    def load(self, tenant: str, run: str) -> Checkpoint | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT seq, state FROM keelgate_checkpoints WHERE tenant = ? AND run = ?",
                (tenant, run),
            ).fetchone()
        if row is None:
            return None
        return Checkpoint(tenant, run, int(row[0]), json.loads(row[1]))

    def runs(self, tenant: str | None = None) -> list[RunRef]:
        with self._tx() as db:
            rows = db.execute(
                "SELECT tenant, run, seq FROM keelgate_checkpoints "
                "WHERE ? IS NULL OR tenant = ? ORDER BY tenant, run",
                (tenant, tenant),
            ).fetchall()
        return [RunRef(str(t), str(r), int(s)) for t, r, s in rows]

    # SpecStore

    def record_spec(
        self, tenant: str, run: str, spec: Mapping[str, Any], *, source: str, generation: int
    ) -> bool:
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO keelgate_specs (tenant, run, source, generation, spec) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, run) DO UPDATE SET "
                "source = excluded.source, generation = excluded.generation, spec = excluded.spec "
                "WHERE keelgate_specs.source <> excluded.source "
                "OR keelgate_specs.generation <= excluded.generation",
                (tenant, run, source, generation, dumps(spec)),
            )
        return cursor.rowcount == 1

    def recorded_spec(self, tenant: str, run: str) -> RecordedSpec | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT source, generation, spec FROM keelgate_specs WHERE tenant = ? AND run = ?",
                (tenant, run),
            ).fetchone()
        if row is None:
            return None
        return RecordedSpec(tenant, run, str(row[0]), int(row[1]), json.loads(row[2]))

    # IdempotencyStore

    def _owner_alive(self, owner: str | None) -> bool:
        if owner is None:
            return False
        if owner == self.owner:
            return True
        try:
            fd = os.open(self._owners / f"{owner}.lock", os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        else:
            # We hold the lock, so nobody does: the owner is gone for good. Tidy its file.
            with suppress(FileNotFoundError):
                (self._owners / f"{owner}.lock").unlink()
            return False
        finally:
            os.close(fd)

    def _record(self, row: Sequence[Any]) -> KeyRecord:
        tenant, key, run, action, tool, state, owner, result, settled_by, source = row
        key_state = KeyState(state)
        if key_state is KeyState.IN_FLIGHT and not self._owner_alive(owner):
            key_state = KeyState.OUTCOME_UNKNOWN
        return KeyRecord(
            tenant,
            key,
            run,
            action,
            tool,
            key_state,
            None if result is None else json.loads(result),
            settled_by,
            source,
        )

    def _row(self, db: sqlite3.Connection, tenant: str, key: str) -> Sequence[Any] | None:
        row: Sequence[Any] | None = db.execute(
            "SELECT tenant, key, run, action, tool, state, owner, result, settled_by, source "
            "FROM keelgate_keys WHERE tenant = ? AND key = ?",
            (tenant, key),
        ).fetchone()
        return row

    def claim(
        self,
        tenant: str,
        key: str,
        *,
        run: str,
        action: str,
        tool: str,
        event: AuditDraft | None = None,
    ) -> KeyRecord | None:
        while True:
            with self._tx(immediate=event is not None) as db:
                cursor = db.execute(
                    "INSERT INTO keelgate_keys (tenant, key, run, action, tool, state, owner) "
                    "VALUES (?, ?, ?, ?, ?, 'in_flight', ?) ON CONFLICT DO NOTHING",
                    (tenant, key, run, action, tool, self.owner),
                )
                if cursor.rowcount == 1:
                    if event is not None:
                        self._append(db, tenant, run, [event])
                    return None
                row = self._row(db, tenant, key)
            if row is not None:
                return self._record(row)
            # Its live owner just dropped it after a definite refusal: claim it afresh.

    def complete(self, tenant: str, key: str, result: Any) -> bool:
        with self._tx() as db:
            cursor = db.execute(
                "UPDATE keelgate_keys SET state = 'completed', result = ?, owner = NULL "
                "WHERE tenant = ? AND key = ? AND state = 'in_flight' AND owner = ?",
                (dumps(result), tenant, key, self.owner),
            )
        return cursor.rowcount == 1

    def release(self, tenant: str, key: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE keelgate_keys SET owner = NULL WHERE tenant = ? AND key = ? "
                "AND state = 'in_flight' AND owner = ?",
                (tenant, key, self.owner),
            )

    def forget(self, tenant: str, key: str) -> None:
        with self._tx() as db:
            db.execute(
                "DELETE FROM keelgate_keys WHERE tenant = ? AND key = ? "
                "AND state = 'in_flight' AND owner = ?",
                (tenant, key, self.owner),
            )

    def settle(self, tenant: str, key: str, *, executed: bool, by: str, source: str) -> KeyRecord:
        with self._tx() as db:
            row = self._row(db, tenant, key)
        if row is None:
            raise SettleError("", key, "no such idempotency key")
        current = self._record(row)
        state = settled_state(current, executed=executed)
        with self._tx() as db:
            # Compare-and-set on the owner we judged dead, so a racing settle cannot win twice.
            cursor = db.execute(
                "UPDATE keelgate_keys SET state = ?, owner = NULL, settled_by = ?, source = ? "
                "WHERE tenant = ? AND key = ? AND state = 'in_flight' AND owner IS ?",
                (state.value, by, source, tenant, key, row[6]),
            )
            if cursor.rowcount != 1:
                raise SettleError(current.run, current.action, "settled by someone else first")
            settled = self._row(db, tenant, key)
        assert settled is not None
        return self._record(settled)

    def get(self, tenant: str, key: str) -> KeyRecord | None:
        with self._tx() as db:
            row = self._row(db, tenant, key)
        return None if row is None else self._record(row)

    # AuditLog

    def append(self, tenant: str, run: str, drafts: Sequence[AuditDraft]) -> None:
        if not drafts:
            return
        with self._tx(immediate=True) as db:
            self._append(db, tenant, run, drafts)

    def _append(
        self, db: sqlite3.Connection, tenant: str, run: str, drafts: Sequence[AuditDraft]
    ) -> None:
        if not drafts:
            return
        chain = (tenant, run)
        head = self._staged_heads.get(chain, self._heads.get(chain, _UNKNOWN))
        if head is _UNKNOWN:
            head = self._head(db, tenant, run)
        for draft in drafts:
            event = seal(tenant, run, head, draft)
            if self._insert(db, tenant, run, event):
                head = event
                continue
            # Refused: the draft's key is already on the chain (appended before a crash: skip
            # it), or another writer moved the head on (read it afresh and seal again).
            if (
                draft.key is not None
                and db.execute(
                    "SELECT 1 FROM keelgate_audit WHERE tenant = ? AND run = ? AND key = ?",
                    (tenant, run, draft.key),
                ).fetchone()
            ):
                continue
            head = self._head(db, tenant, run)
            event = seal(tenant, run, head, draft)
            if not self._insert(db, tenant, run, event):
                raise StoreError(f"audit chain of {run!r}: could not append {draft.type}")
            head = event
        self._staged_heads[chain] = head

    def _insert(self, db: sqlite3.Connection, tenant: str, run: str, event: AuditEvent) -> bool:
        cursor = db.execute(
            "INSERT INTO keelgate_audit (tenant, run, seq, type, actor, at, data, key, prev, "
            "hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                tenant,
                run,
                event.seq,
                event.type,
                event.actor,
                event.at,
                dumps(event.data),
                event.key,
                event.prev,
                event.hash,
            ),
        )
        return cursor.rowcount == 1

    def _head(self, db: sqlite3.Connection, tenant: str, run: str) -> AuditEvent | None:
        row = db.execute(
            "SELECT seq, type, actor, at, data, key, prev, hash FROM keelgate_audit "
            "WHERE tenant = ? AND run = ? ORDER BY seq DESC LIMIT 1",
            (tenant, run),
        ).fetchone()
        return None if row is None else _event(row)

    def events(self, tenant: str, run: str) -> list[AuditEvent]:
        with self._tx() as db:
            rows = db.execute(
                "SELECT seq, type, actor, at, data, key, prev, hash FROM keelgate_audit "
                "WHERE tenant = ? AND run = ? ORDER BY seq",
                (tenant, run),
            ).fetchall()
        return [_event(row) for row in rows]


def _checkpoint_text(state: Mapping[str, Any]) -> str:
    # A checkpoint is a fresh tree from RunState.to_json, never cyclic: skipping json's cycle
    # check saves about a fifth of the serialisation done at every phase boundary. A cyclic
    # value would still fail (RecursionError) before anything is written.
    return dumps(state)


_UNKNOWN: Any = object()  # no head remembered for this chain


def _event(row: Sequence[Any]) -> AuditEvent:
    seq, type_, actor, at, data, key, prev, hash_ = row
    return AuditEvent(int(seq), type_, actor, at, json.loads(data), key, prev, hash_)
