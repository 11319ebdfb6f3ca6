"""PostgreSQL stores: checkpoints, idempotency keys and the audit chain in one database, shared by
any number of processes on any number of hosts (psycopg 3, pooled).

It holds exactly the JSON the SQLite store holds (states and results as JSON text), so a run can
move between the two.

Owner liveness, the heart of OUTCOME_UNKNOWN. Each store instance takes an owner id from the
sequence ``keelgate_owner_seq`` and holds a session-level advisory lock on it, on a dedicated
connection outside the pool, for as long as it is open. Keys are claimed on that same connection
and record the owner id. Another store judges an in-flight key's owner gone if and only if
``pg_try_advisory_lock`` on that id succeeds from one of its own connections (and unlocks it in
the same statement). Why this is sound:

- A live owner is never read as gone. The lock is taken before the first claim, and every claim
  runs on the session holding it, so a key can only exist while its owner's lock is held. A
  session advisory lock is released only by the end of that session or by an explicit unlock,
  which only ``close`` issues, and owner ids come from a sequence, so no other session ever
  holds one except for the instant of a judgement.
- A dead owner is read as gone. A process that dies (``os._exit``, SIGKILL, OOM) has its socket
  closed by its kernel; the server ends the session and releases the lock at once. A host that
  vanishes sends nothing: TCP keepalives set on the owner session (both on the server side and in
  libpq) end it within about 25 seconds, and until then its keys read as in flight, which only
  delays (``RunBusy``), never duplicates.
- The one misjudgement possible: the owner session ends while its process lives (a network cut,
  a server restart, ``pg_terminate_backend``). Its keys then read ``outcome_unknown`` elsewhere,
  and an unknown outcome is a stop, never a retry. The orphaned owner can start nothing new (its
  next claim needs a new owner session), and the WRITE it is running finishes through
  ``complete``, a compare-and-set on owner and state: it lands if nobody settled the key meanwhile
  and changes nothing if somebody did. No WRITE runs twice either way.

Session advisory locks need a real session: the owner connection must not go through a
transaction-pooling proxy (pgbouncer in transaction mode); connect directly or in session mode.
This module must never settle, retry or delete a key on its own, and never put a password in an
error message.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from keelgate.core.audit import AuditDraft, AuditEvent, seal
from keelgate.core.protocols import Capabilities, Checkpoint, RecordedSpec, RunRef
from keelgate.core.types import KeyRecord, KeyState, settled_state
from keelgate.errors import (
    InputError,
    SettleError,
    StaleCheckpoint,
    StoreError,
    StoreUnavailable,
)
from keelgate.stores._holds import OwnerHolds
from keelgate.stores._json import dumps

# Advisory-lock namespaces (the two-int4 key form), so Keelgate's locks cannot meet another
# application's single-bigint locks in the same database. 0x4B47 is "KG".
OWNER_SPACE = 0x4B470001
SCHEMA_SPACE = 0x4B470003
DRIVER_SPACE = 0x4B470004  # a run's driver (RunLock), keyed by a 32-bit digest of the run

# The server ends a silent owner session after idle + count * interval seconds.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3

SCHEMA = """
CREATE SEQUENCE IF NOT EXISTS keelgate_owner_seq AS integer;
CREATE TABLE IF NOT EXISTS keelgate_checkpoints (
    tenant text NOT NULL, run text NOT NULL, seq bigint NOT NULL, state text NOT NULL,
    PRIMARY KEY (tenant, run));
CREATE TABLE IF NOT EXISTS keelgate_keys (
    tenant text NOT NULL, key text NOT NULL, run text NOT NULL, action text NOT NULL,
    tool text NOT NULL, state text NOT NULL, owner integer, result text,
    settled_by text NOT NULL DEFAULT '', source text NOT NULL DEFAULT '',
    PRIMARY KEY (tenant, key));
CREATE TABLE IF NOT EXISTS keelgate_audit (
    tenant text NOT NULL, run text NOT NULL, seq bigint NOT NULL, type text NOT NULL,
    actor text NOT NULL, at text NOT NULL, data text NOT NULL, key text,
    prev text NOT NULL, hash text NOT NULL,
    PRIMARY KEY (tenant, run, seq));
CREATE UNIQUE INDEX IF NOT EXISTS keelgate_audit_key ON keelgate_audit (tenant, run, key)
    WHERE key IS NOT NULL;
CREATE TABLE IF NOT EXISTS keelgate_specs (
    tenant text NOT NULL, run text NOT NULL, source text NOT NULL, generation bigint NOT NULL,
    spec text NOT NULL, PRIMARY KEY (tenant, run));
"""

# One statement: the record and, for an in-flight key, whether its owner session still lives.
# The inner CASE takes the owner's lock only to learn that nobody holds it, and drops it at once.
KEY_SELECT = f"""
SELECT tenant, key, run, action, tool, state, owner, result, settled_by, source,
    CASE WHEN state <> 'in_flight' OR owner IS NULL THEN false
         WHEN pg_try_advisory_lock({OWNER_SPACE}, owner)
              THEN NOT pg_advisory_unlock({OWNER_SPACE}, owner)
         ELSE true END
FROM keelgate_keys WHERE tenant = %s AND key = %s
"""

EVENT_COLUMNS = "seq, type, actor, at, data, key, prev, hash"

Conn = psycopg.Connection[tuple[Any, ...]]


def _safe_target(url: str) -> tuple[str, dict[str, Any]]:
    """Where a URL points, for messages: user@host:port/db, never the password."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        # libpq's own message may quote the part it could not read: it is not repeated.
        raise InputError("--store", "not a valid PostgreSQL URL (libpq cannot read it)") from None
    user = str(params.get("user") or "")
    where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
    target = f"{user + '@' if user else ''}{where}/{params.get('dbname') or user or ''}"
    return target, params


def check_url(url: str) -> None:
    """Refuse a URL libpq cannot read, before any connection is tried."""
    _safe_target(url)


def holds_store(url: str, *, connect_timeout: int = 10) -> None:
    """Refuse (``InputError`` for ``--store``) a database that holds no Keelgate store, by
    reading the catalogue only: unlike opening a ``PostgresStore``, it creates no schema."""
    target, params = _safe_target(url)
    secret = str(params.get("password") or "")
    # The user's URL wins, as for the store itself.
    timeout: dict[str, Any] = (
        {} if "connect_timeout" in params else {"connect_timeout": connect_timeout}
    )
    try:
        with psycopg.connect(url, autocommit=True, **timeout) as conn:
            row = conn.execute("SELECT to_regclass('keelgate_checkpoints') IS NOT NULL").fetchone()
    except psycopg.Error as error:
        raise StoreUnavailable(f"PostgreSQL store {target}: {_one_line(error, secret)}") from None
    if row is None or not row[0]:
        raise InputError(
            "--store", f"no Keelgate store in {target} (runs are saved where `run` ran)"
        )


def _one_line(error: BaseException, secret: str) -> str:
    """A driver error as one line, the password (if the server quoted it) masked."""
    text = str(error).strip()
    line = text.splitlines()[0].strip() if text else type(error).__name__
    return line.replace(secret, "***") if secret else line


class PostgresStore:
    """Checkpoint, idempotency and audit store over one PostgreSQL database."""

    # Every role in one transaction: see keelgate.core.protocols.Capabilities.
    capabilities = Capabilities(checkpoint_with_events=True, claim_with_event=True)

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout: int = 10,
    ) -> None:
        self.url = url
        self.target, params = _safe_target(url)
        self._secret = str(params.get("password") or "")
        # Detect a dead server or a vanished network from our side too; the user's URL wins.
        defaults: dict[str, Any] = {
            "connect_timeout": connect_timeout,
            "keepalives": 1,
            "keepalives_idle": KEEPALIVE_IDLE,
            "keepalives_interval": KEEPALIVE_INTERVAL,
            "keepalives_count": KEEPALIVE_COUNT,
        }
        self._kwargs = {k: v for k, v in defaults.items() if k not in params}
        self._holds = OwnerHolds()
        self._owner_lock = threading.Lock()
        self._owner_conn: Conn | None = None
        # The last event this store committed on each run's chain (see _append).
        self._heads: dict[tuple[str, str], AuditEvent | None] = {}
        self._owner_ids: list[int] = []
        self._driven: set[tuple[str, str]] = set()  # runs this store drives (lock_run)
        self._pool: ConnectionPool[Conn] | None = None
        try:
            self._open_owner_session()
            self._pool = ConnectionPool(
                url,
                kwargs={"autocommit": True, **self._kwargs},
                min_size=min_size,
                max_size=max_size,
                open=False,
                name=f"keelgate-{self.owner}",
                num_workers=2,
            )
            self._pool.open(wait=True, timeout=float(connect_timeout))
        except psycopg.Error as error:
            self.close()
            # Whatever went wrong, the store could not be opened: nothing was read or written.
            raise self._error(error, StoreUnavailable) from None

    @property
    def owner(self) -> int:
        """This store's current owner id (a new one after its owner session was lost)."""
        return self._owner_ids[-1]

    def _error(self, error: BaseException, kind: type[StoreError] | None = None) -> StoreError:
        line = _one_line(error, self._secret)
        if kind is None:
            # A lost connection or a server gone away: the store cannot be reached.
            unreachable = isinstance(error, psycopg.OperationalError)
            kind = StoreUnavailable if unreachable else StoreError
        return kind(f"PostgreSQL store {self.target}: {line}")

    def _open_owner_session(self) -> None:
        conn: Conn = psycopg.connect(self.url, autocommit=True, **self._kwargs)
        try:
            with conn.transaction():
                # CREATE ... IF NOT EXISTS is not safe when two sessions run it at once.
                conn.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_SPACE}, 0)")
                conn.execute(SCHEMA)
            # The server ends this session (releasing our lock) soon after the host goes silent,
            # and must never end it for being idle.
            conn.execute(f"SET tcp_keepalives_idle = {KEEPALIVE_IDLE}")
            conn.execute(f"SET tcp_keepalives_interval = {KEEPALIVE_INTERVAL}")
            conn.execute(f"SET tcp_keepalives_count = {KEEPALIVE_COUNT}")
            if conn.info.server_version >= 140000:
                conn.execute("SET idle_session_timeout = 0")
            row = conn.execute("SELECT nextval('keelgate_owner_seq')").fetchone()
            assert row is not None
            owner = int(row[0])
            conn.execute("SELECT pg_advisory_lock(%s, %s)", (OWNER_SPACE, owner))
            conn.execute("SELECT set_config('application_name', %s, false)", (f"keelgate-{owner}",))
        except BaseException:
            conn.close()
            raise
        self._owner_conn = conn
        self._owner_ids.append(owner)

    def hold(self) -> Callable[[], None]:
        """Keep this store's owner session alive, even past ``close``, until the returned
        function is called: a call it started may still run (see ``keelgate.stores._holds``)."""
        return self._holds.hold()

    def close(self) -> None:
        """Close the pool and the owner session; this store's in-flight keys then read unknown.
        Deferred while a hold is taken."""
        self._holds.close(self._close_now)

    def _close_now(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        with self._owner_lock:
            if self._owner_conn is not None:
                # Unlock first: ending a session is asynchronous on the server, and a closed
                # store's keys must read unknown from the moment close() returns.
                with suppress(psycopg.Error):
                    self._owner_conn.execute("SELECT pg_advisory_unlock_all()")
                self._owner_conn.close()
                self._owner_conn = None

    @contextmanager
    def _conn(self) -> Iterator[Conn]:
        if self._pool is None:
            raise StoreError(f"PostgreSQL store {self.target}: the store is closed")
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as error:
            raise self._error(error) from None

    def _claim_on_owner_session(
        self, tenant: str, key: str, run: str, action: str, tool: str, event: AuditDraft | None
    ) -> bool:
        """INSERT the claim on the owner session; True if this store won the key.

        If the owner session was lost, a new one (new owner id) is opened and the claim tried
        once more. That is safe: had the first INSERT landed, the retry meets it as a key of a
        gone owner, which reads outcome_unknown, a stop.
        """
        with self._owner_lock:
            for attempt in (1, 2):
                if self._pool is None:
                    raise StoreError(f"PostgreSQL store {self.target}: the store is closed")
                try:
                    if self._owner_conn is None or self._owner_conn.closed:
                        self._owner_conn = None
                        self._open_owner_session()
                    conn = self._owner_conn
                    assert conn is not None
                    with conn.transaction():
                        cursor = conn.execute(
                            "INSERT INTO keelgate_keys (tenant, key, run, action, tool, state, "
                            "owner) VALUES (%s, %s, %s, %s, %s, 'in_flight', %s) "
                            "ON CONFLICT DO NOTHING",
                            (tenant, key, run, action, tool, self.owner),
                        )
                        claimed = cursor.rowcount == 1
                        head = (
                            self._append(conn, tenant, run, [event])
                            if claimed and event is not None
                            else _UNKNOWN
                        )
                    if head is not _UNKNOWN:
                        self._remember(tenant, run, head)
                    return claimed
                except psycopg.Error as error:
                    conn = self._owner_conn
                    if conn is None or not (conn.broken or conn.closed) or attempt == 2:
                        raise self._error(error) from None
                    with suppress(psycopg.Error):
                        conn.close()
                    self._owner_conn = None
        raise AssertionError("unreachable")

    # RunLock

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        """A session advisory lock on the run, taken on the owner session and held by the driver.

        The server drops it when that session ends, so a dead driver's run is free again as
        soon as its owner keys read unknown. Two runs whose 32-bit digests collide cannot be
        driven at the same moment: a RunBusy, never a second driver. Session locks are
        re-entrant, so this store refuses a second driver of its own as well.
        """
        digest = hashlib.sha256(f"{tenant}\0{run}".encode()).digest()
        key = int.from_bytes(digest[:4], "big", signed=True)
        with self._owner_lock:
            if (tenant, run) in self._driven:
                return None
            if self._pool is None:
                raise StoreError(f"PostgreSQL store {self.target}: the store is closed")
            try:
                if self._owner_conn is None or self._owner_conn.closed:
                    self._owner_conn = None
                    self._open_owner_session()
                conn = self._owner_conn
                assert conn is not None
                row = conn.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", (DRIVER_SPACE, key)
                ).fetchone()
            except psycopg.Error as error:
                raise self._error(error) from None
            if row is None or not row[0]:
                return None
            self._driven.add((tenant, run))

        def release() -> None:
            with self._owner_lock:
                self._driven.discard((tenant, run))
                # On a session lost meanwhile the lock went with it: nothing to release.
                if self._owner_conn is conn and not conn.closed:
                    with suppress(psycopg.Error):
                        conn.execute("SELECT pg_advisory_unlock(%s, %s)", (DRIVER_SPACE, key))

        return release

    # CheckpointStore

    def save(self, tenant: str, run: str, seq: int, state: Mapping[str, Any]) -> None:
        text = dumps(state)
        with self._conn() as conn:
            self._save(conn, tenant, run, seq, text)

    def _save(self, conn: Conn, tenant: str, run: str, seq: int, text: str) -> None:
        cursor = conn.execute(
            "INSERT INTO keelgate_checkpoints (tenant, run, seq, state) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (tenant, run) DO UPDATE SET seq = EXCLUDED.seq, state = EXCLUDED.state "
            "WHERE keelgate_checkpoints.seq < EXCLUDED.seq",
            (tenant, run, seq, text),
        )
        if cursor.rowcount == 1:
            return
        row = conn.execute(
            "SELECT seq FROM keelgate_checkpoints WHERE tenant = %s AND run = %s", (tenant, run)
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
        """Save a checkpoint and append its audit events in one transaction (one commit)."""
        text = dumps(state)
        with self._conn() as conn:
            if not drafts:
                # One autocommit statement is already atomic: BEGIN and COMMIT would only add
                # two round trips (the observe checkpoint of every iteration carries no event).
                self._save(conn, tenant, run, seq, text)
                return
            with conn.transaction():
                self._save(conn, tenant, run, seq, text)
                head = self._append(conn, tenant, run, drafts)
            self._remember(tenant, run, head)

    def load(self, tenant: str, run: str) -> Checkpoint | None:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT seq, state FROM keelgate_checkpoints WHERE tenant = %s AND run = %s",
                (tenant, run),
            ).fetchone()
        if row is None:
            return None
        return Checkpoint(tenant, run, int(row[0]), json.loads(row[1]))

    def runs(self, tenant: str | None = None) -> list[RunRef]:
        # Byte order, as SQLite and Python sort, whatever the database's collation.
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT tenant, run, seq FROM keelgate_checkpoints "
                "WHERE %(t)s::text IS NULL OR tenant = %(t)s "
                'ORDER BY tenant COLLATE "C", run COLLATE "C"',
                {"t": tenant},
            ).fetchall()
        return [RunRef(str(t), str(r), int(s)) for t, r, s in rows]

    # SpecStore

    def record_spec(
        self, tenant: str, run: str, spec: Mapping[str, Any], *, source: str, generation: int
    ) -> bool:
        with self._conn() as conn:
            cursor = conn.execute(
                "INSERT INTO keelgate_specs (tenant, run, source, generation, spec) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant, run) DO UPDATE SET "
                "source = EXCLUDED.source, generation = EXCLUDED.generation, spec = EXCLUDED.spec "
                "WHERE keelgate_specs.source <> EXCLUDED.source "
                "OR keelgate_specs.generation <= EXCLUDED.generation",
                (tenant, run, source, generation, dumps(spec)),
            )
        return cursor.rowcount == 1

    def recorded_spec(self, tenant: str, run: str) -> RecordedSpec | None:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT source, generation, spec FROM keelgate_specs "
                "WHERE tenant = %s AND run = %s",
                (tenant, run),
            ).fetchone()
        if row is None:
            return None
        return RecordedSpec(tenant, run, str(row[0]), int(row[1]), json.loads(row[2]))

    # IdempotencyStore

    @staticmethod
    def _record(row: Sequence[Any]) -> KeyRecord:
        tenant, key, run, action, tool, state, _owner, result, settled_by, source, alive = row
        key_state = KeyState(state)
        if key_state is KeyState.IN_FLIGHT and not alive:
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

    def _row(self, conn: Conn, tenant: str, key: str) -> Sequence[Any] | None:
        row: Sequence[Any] | None = conn.execute(KEY_SELECT, (tenant, key)).fetchone()
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
            # On the owner session: a key is only ever recorded while its owner lock is held.
            if self._claim_on_owner_session(tenant, key, run, action, tool, event):
                return None
            # Judged from a pool session: the owner session would find its own lock re-entrant.
            with self._conn() as conn:
                row = self._row(conn, tenant, key)
            if row is not None:
                return self._record(row)
            # Its live owner just dropped it after a definite refusal: claim it afresh.

    def complete(self, tenant: str, key: str, result: Any) -> bool:
        with self._conn() as conn:
            cursor = conn.execute(
                "UPDATE keelgate_keys SET state = 'completed', result = %s, owner = NULL "
                "WHERE tenant = %s AND key = %s AND state = 'in_flight' AND owner = ANY(%s)",
                (dumps(result), tenant, key, self._owner_ids),
            )
        return cursor.rowcount == 1

    def release(self, tenant: str, key: str) -> None:
        with self._conn() as conn:
            conn.execute(
                "UPDATE keelgate_keys SET owner = NULL WHERE tenant = %s AND key = %s "
                "AND state = 'in_flight' AND owner = ANY(%s)",
                (tenant, key, self._owner_ids),
            )

    def forget(self, tenant: str, key: str) -> None:
        with self._conn() as conn:
            conn.execute(
                "DELETE FROM keelgate_keys WHERE tenant = %s AND key = %s "
                "AND state = 'in_flight' AND owner = ANY(%s)",
                (tenant, key, self._owner_ids),
            )

    def settle(self, tenant: str, key: str, *, executed: bool, by: str, source: str) -> KeyRecord:
        with self._conn() as conn:
            row = self._row(conn, tenant, key)
            if row is None:
                raise SettleError("", key, "no such idempotency key")
            current = self._record(row)
            state = settled_state(current, executed=executed)
            # Compare-and-set on the owner we judged gone, so a racing settle cannot win twice.
            cursor = conn.execute(
                "UPDATE keelgate_keys SET state = %s, owner = NULL, settled_by = %s, source = %s "
                "WHERE tenant = %s AND key = %s AND state = 'in_flight' "
                "AND owner IS NOT DISTINCT FROM %s",
                (state.value, by, source, tenant, key, row[6]),
            )
            if cursor.rowcount != 1:
                raise SettleError(current.run, current.action, "settled by someone else first")
            settled = self._row(conn, tenant, key)
        assert settled is not None
        return self._record(settled)

    def get(self, tenant: str, key: str) -> KeyRecord | None:
        with self._conn() as conn:
            row = self._row(conn, tenant, key)
        return None if row is None else self._record(row)

    # AuditLog

    def append(self, tenant: str, run: str, drafts: Sequence[AuditDraft]) -> None:
        if not drafts:
            return
        with self._conn() as conn:
            with conn.transaction():
                head = self._append(conn, tenant, run, drafts)
            self._remember(tenant, run, head)

    def _append(
        self, conn: Conn, tenant: str, run: str, drafts: Sequence[AuditDraft]
    ) -> AuditEvent | None:
        """Seal and insert ``drafts`` after the run's head; returns the new head, which the
        caller remembers once its transaction has committed (``_remember``).

        The head this store last committed is used without reading it back. If another writer
        has moved the chain on, the insert meets the primary key (a concurrent insert of the
        same seq waits for the other transaction, then conflicts) and the head is read afresh.
        A draft whose key is already on the chain is skipped, so re-appending is harmless.
        """
        remembered = self._heads.get((tenant, run), _UNKNOWN)
        head: AuditEvent | None = (
            self._read_head(conn, tenant, run) if remembered is _UNKNOWN else remembered
        )
        for draft in drafts:
            for _ in range(100):
                event = seal(tenant, run, head, draft)
                inserted = conn.execute(
                    f"INSERT INTO keelgate_audit (tenant, run, {EVENT_COLUMNS}) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
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
                ).rowcount
                if inserted == 1:
                    head = event
                    break
                if (
                    draft.key is not None
                    and conn.execute(
                        "SELECT 1 FROM keelgate_audit WHERE tenant = %s AND run = %s AND key = %s",
                        (tenant, run, draft.key),
                    ).fetchone()
                ):
                    break  # on the chain already (appended before a crash)
                head = self._read_head(conn, tenant, run)
            else:
                raise StoreError(f"audit chain of {run!r}: could not append {draft.type}")
        return head

    def _read_head(self, conn: Conn, tenant: str, run: str) -> AuditEvent | None:
        row = conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM keelgate_audit WHERE tenant = %s AND run = %s "
            "ORDER BY seq DESC LIMIT 1",
            (tenant, run),
        ).fetchone()
        return None if row is None else _event(row)

    def _remember(self, tenant: str, run: str, head: AuditEvent | None) -> None:
        """Called after a commit: only a committed event may serve as the remembered head."""
        self._heads[(tenant, run)] = head

    def events(self, tenant: str, run: str) -> list[AuditEvent]:
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM keelgate_audit WHERE tenant = %s AND run = %s "
                "ORDER BY seq",
                (tenant, run),
            ).fetchall()
        return [_event(row) for row in rows]


_UNKNOWN: Any = object()  # no head remembered for this chain


def _event(row: Sequence[Any]) -> AuditEvent:
    seq, type_, actor, at, data, key, prev, hash_ = row
    return AuditEvent(int(seq), type_, actor, at, json.loads(data), key, prev, hash_)
