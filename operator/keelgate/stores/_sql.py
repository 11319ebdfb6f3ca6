"""One SQL store: every statement, and all the logic of the checkpoint, spec, idempotency and
audit stores, for every SQL backend.

Why it exists: the SQLite and PostgreSQL stores used to keep parallel copies of all of this, and the
copies drifted (the audit append retried once on one and up to a hundred times on the other). Here
it is written once. A backend (``sqlite.py``, ``postgres.py``) subclasses ``SQLStore`` and keeps
only what truly differs: its ``Dialect`` (``keelgate.stores._dialect``: placeholders, column types,
how a key's owner is judged in SQL), how it connects and runs a transaction, and how it proves an
owner alive (a flock; a session advisory lock). Each backend's docstring argues why its liveness
judgement is sound.

What a WRITE's safety rests on is in the statements below, for every backend alike: ``save`` and
its stale-writer check are one statement; ``claim`` is one ``INSERT ... ON CONFLICT DO NOTHING`` on
the owner's session, which lands only while the run's checkpoint is the one the action was
planned from; ``complete`` and ``release`` are compare-and-set on this store's own owner, and
``forget`` on the one owner this store holds live now; ``settle`` is compare-and-set on the owner
judged gone; the audit chain's primary key refuses a fork. Every write of a run a holder took
carries its epoch in its own statement (``OwnershipStatements``), and a key claimed under an
epoch its run no longer has reads unknown.

This module must never settle, retry or delete a key on its own (only ``settle`` changes an
unknown outcome, on a person's or a confirmer's word), never read an in-flight key otherwise than
its backend's liveness judgement says, never remember an audit head that did not commit, and
never change the schema (the numbered migrations of ``keelgate.stores._migrations`` do).

Why one module past 500 lines: each commit's statements and the compare-and-sets its safety
rests on are read together here, once for every backend; split by store, a commit that writes a
checkpoint, a key and an event would be read in three places. What is not about a commit is
apart: the dialects (``_dialect``) and the schema with its migrations (``_migrations``).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, TypeVar

from keelgate.core import clocks
from keelgate.core.audit import AuditDraft, AuditEvent, seal, stored_event
from keelgate.core.protocols import (
    Capabilities,
    Checkpoint,
    Completion,
    Ownership,
    RecordedSpec,
    RunRef,
)
from keelgate.core.types import KeyRecord, KeyState, settled_state
from keelgate.errors import (
    RunBusy,
    SettleError,
    SettleTooEarly,
    StaleCheckpoint,
    StaleClaim,
    StaleEpoch,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    UnreadableEvent,
)
from keelgate.stores._dialect import Connection, Dialect
from keelgate.stores._holds import HoldsOwner, OwnerHolds
from keelgate.stores._json import dumps, loads

T = TypeVar("T")

log = logging.getLogger("keelgate.stores")

#: Seconds a store keeps repeating an operation while it cannot be reached or written (a server
#: restart, a failover, a full disk, a file locked past its busy timeout) before it gives up with
#: StoreUnavailable: every operation of a PostgreSQL store, and on every backend the commit that
#: records a WRITE's result (``SQLStore.result_patience``). The first repeat comes at once, then
#: after 0.1 s, doubling to at most 2 s between tries.
PATIENCE = 60.0


#: Runs asked about in one RunRevisions statement (two parameters each: far inside SQLite's
#: and PostgreSQL's limits).
REVISIONS_CHUNK = 2000


class OwnershipStatements:
    """The statements of run ownership (migration 8), and the fences the writes carry."""

    def __init__(self, d: Dialect) -> None:
        def q(text: str) -> str:
            return text.replace("?", d.placeholder)

        clock = f"CAST({d.clock} AS {d.real})"
        # A write of a run lands only while the run has no recorded holder, or its epoch is
        # the one the write carries (parameters: tenant, run, epoch; NULL carries none, so a
        # writer that never took the run is refused once anyone has); ``fenced`` reads the
        # same row back for the refusal (the run held under another epoch than the carried).
        held_otherwise = (
            f"o.tenant = ? AND o.run = ? AND NOT (o.epoch {d.same} CAST(? AS {d.bigint}))"
        )
        self.run_fence = f"NOT EXISTS (SELECT 1 FROM keelgate_owners o WHERE {held_otherwise})"
        # A key's end is recorded only while its run's epoch is still the one it was claimed
        # under (a key claimed before migration 8, or on a run nobody took, has none).
        self.key_fence = (
            "(keelgate_keys.epoch IS NULL OR NOT EXISTS (SELECT 1 FROM keelgate_owners o "
            "WHERE o.tenant = keelgate_keys.tenant AND o.run = keelgate_keys.run "
            "AND o.epoch <> keelgate_keys.epoch))"
        )
        # The last column of a key's SELECT: 1 if it was claimed under an epoch the run no
        # longer has (an in-flight key then reads unknown, whether or not its owner lives).
        self.stale_key = f"CASE WHEN {self.key_fence} THEN 0 ELSE 1 END"
        # Taken where nobody holds the run, its lease has lapsed on the store's clock, or the
        # same holder takes it again; always under a new epoch.
        self.take = q(
            "INSERT INTO keelgate_owners (tenant, run, holder, epoch, expires) "
            f"VALUES (?, ?, ?, 1, {clock} + CAST(? AS {d.real})) "
            "ON CONFLICT (tenant, run) DO UPDATE SET holder = excluded.holder, "
            "epoch = keelgate_owners.epoch + 1, expires = excluded.expires "
            f"WHERE keelgate_owners.expires <= {clock} "
            "OR keelgate_owners.holder = excluded.holder"
        )
        self.owner = q(
            f"SELECT holder, epoch, expires - {clock} FROM keelgate_owners "
            "WHERE tenant = ? AND run = ?"
        )
        # A lease is renewed only under the epoch it was taken with: once another holder took
        # the run, nothing of the old one's comes back.
        self.renew = q(
            f"UPDATE keelgate_owners SET expires = {clock} + CAST(? AS {d.real}) "
            "WHERE tenant = ? AND run = ? AND holder = ? AND epoch = ?"
        )
        # A holder's batched renewal (one statement for every run it holds): only leases still
        # live are renewed, so a run let go, or lapsed in a pause, is never taken back this
        # way (a lapsed lease is lost: the holder takes the run again, under a new epoch).
        self.renew_held = q(
            f"UPDATE keelgate_owners SET expires = {clock} + CAST(? AS {d.real}) "
            f"WHERE holder = ? AND expires > {clock}"
        )
        self.held = q(
            f"SELECT tenant, run, epoch, expires - {clock} FROM keelgate_owners "
            f"WHERE holder = ? AND expires > {clock}"
        )
        self.let_go = q(
            f"UPDATE keelgate_owners SET expires = {clock} "
            f"WHERE tenant = ? AND run = ? AND holder = ? AND epoch = ? AND expires > {clock}"
        )
        # Whose epoch a refused write met: the run's holder, where it is not the one carried.
        self.fenced = q(f"SELECT o.holder, o.epoch FROM keelgate_owners o WHERE {held_otherwise}")
        self.fenced_key = q(
            "SELECT o.holder, o.epoch, k.run, k.epoch FROM keelgate_keys k JOIN keelgate_owners o "
            "ON o.tenant = k.tenant AND o.run = k.run WHERE k.tenant = ? AND k.key = ? "
            "AND k.epoch IS NOT NULL AND o.epoch <> k.epoch"
        )


class Statements:
    """Every statement of the stores in one dialect."""

    def __init__(self, d: Dialect) -> None:
        def q(text: str) -> str:
            return text.replace("?", d.placeholder)

        keys = "tenant, key, run, action, tool, state, owner, result, settled_by, source"
        self.event_columns = "seq, type, actor, at, data, key, prev, hash, writer, writer_kind"
        ownership = OwnershipStatements(d)
        self.ownership = ownership
        # CheckpointStore: the stale-writer check, the epoch's and the write are one statement.
        self.save = q(
            "INSERT INTO keelgate_checkpoints (tenant, run, seq, state) SELECT ?, ?, ?, ? "
            f"WHERE {ownership.run_fence} ON CONFLICT (tenant, run) DO UPDATE SET "
            "seq = excluded.seq, state = excluded.state "
            "WHERE keelgate_checkpoints.seq < excluded.seq"
        )
        self.stored_seq = q("SELECT seq FROM keelgate_checkpoints WHERE tenant = ? AND run = ?")
        self.load = q("SELECT seq, state FROM keelgate_checkpoints WHERE tenant = ? AND run = ?")
        self.runs = q(
            "SELECT tenant, run, seq FROM keelgate_checkpoints "
            "WHERE CAST(? AS TEXT) IS NULL OR tenant = ? "
            f"ORDER BY tenant{d.byte_order}, run{d.byte_order}"
        )
        # RunRevisions: {values} is a row per run asked about, "(?, ?), ...".
        self.revisions = (
            "SELECT c.tenant, c.run, c.seq, COALESCE((SELECT MAX(a.seq) FROM keelgate_audit a "
            "WHERE a.tenant = c.tenant AND a.run = c.run), 0) FROM keelgate_checkpoints c "
            "WHERE (c.tenant, c.run) IN (VALUES {values})"
        )
        # SpecStore: a generation older than the stored one of the same source is refused.
        self.record_spec = q(
            "INSERT INTO keelgate_specs (tenant, run, source, generation, spec) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, run) DO UPDATE SET "
            "source = excluded.source, generation = excluded.generation, spec = excluded.spec "
            "WHERE keelgate_specs.source <> excluded.source "
            "OR keelgate_specs.generation <= excluded.generation"
        )
        self.recorded_spec = q(
            "SELECT source, generation, spec FROM keelgate_specs WHERE tenant = ? AND run = ?"
        )
        # IdempotencyStore. A key's SELECT also says how much of its deadline is left on the
        # store's clock, and (last) the backend's judgement of its owner's liveness.
        clock = f"CAST({d.clock} AS {d.real})"
        self.key = q(
            f"SELECT {keys}, deadline, deadline - {clock}, {d.liveness}, {ownership.stale_key} "
            "FROM keelgate_keys WHERE tenant = ? AND key = ?"
        )
        # The deadline is set on the store's clock: the claim's moment there plus the seconds
        # given (none: NULL, no deadline). The claim lands only while the run's checkpoint is
        # still the one its action was planned from (the four parameters after the epoch: that
        # seq, or NULL for no such condition), in the same statement: a process held up before
        # its claim, while another drove the run on, can never claim (``SQLStore.claim``). It
        # records the epoch it was made under, and lands only while that epoch is the run's
        # (the last three parameters).
        self.claim = q(
            "INSERT INTO keelgate_keys "
            "(tenant, key, run, action, tool, state, owner, deadline, claim_id, epoch) "
            f"SELECT ?, ?, ?, ?, ?, 'in_flight', ?, {clock} + CAST(? AS {d.real}), ?, "
            f"CAST(? AS {d.bigint}) "
            f"WHERE (CAST(? AS {d.bigint}) IS NULL OR EXISTS (SELECT 1 FROM keelgate_checkpoints "
            f"WHERE tenant = ? AND run = ? AND seq = ?)) AND {ownership.run_fence} "
            "ON CONFLICT DO NOTHING"
        )
        # A claim repeated after its acknowledgement was lost: if the first one landed, it is
        # this claim's (its id), still in flight, and is taken over by the current owner id.
        self.own_claim = q(
            "UPDATE keelgate_keys SET owner = ? WHERE tenant = ? AND key = ? AND claim_id = ? "
            "AND state = 'in_flight'"
        )
        self.checkpoint_text = q(
            "SELECT state FROM keelgate_checkpoints WHERE tenant = ? AND run = ? AND seq = ?"
        )
        # A call's end is recorded only under the epoch its key was claimed under.
        mine = (
            f"WHERE tenant = ? AND key = ? AND state = 'in_flight' AND {d.mine} "
            f"AND {ownership.key_fence}"
        )
        self.complete = q(
            f"UPDATE keelgate_keys SET state = 'completed', result = ?, owner = NULL {mine}"
        )
        self.release = q(f"UPDATE keelgate_keys SET owner = NULL {mine}")
        # Only under the one owner this store holds live now (``SQLStore.forget``), never under
        # an owner id of a session it lost: that key may have been read unknown meanwhile.
        self.forget = q(
            "DELETE FROM keelgate_keys WHERE tenant = ? AND key = ? AND state = 'in_flight' "
            f"AND owner = ? AND {ownership.key_fence}"
        )
        # "Not executed" only once the deadline has passed on the store's clock: before it, a
        # held-up owner may still send the call (the first parameter: whether it executed).
        self.settle = q(
            "UPDATE keelgate_keys SET state = ?, owner = NULL, settled_by = ?, source = ? "
            f"WHERE tenant = ? AND key = ? AND state = 'in_flight' AND owner {d.same} ? "
            f"AND (? OR deadline IS NULL OR deadline <= {clock})"
        )
        self._audit_log(q)
        self._q = q
        self._d = d
        self._together: dict[tuple[str, int, int], str] = {}

    def _audit_log(self, q: Callable[[str], str]) -> None:
        """The AuditLog's statements (``q`` puts the dialect's placeholders in)."""
        self.append = q(
            f"INSERT INTO keelgate_audit (tenant, run, {self.event_columns}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
        )
        self.on_chain = q("SELECT 1 FROM keelgate_audit WHERE tenant = ? AND run = ? AND key = ?")
        self.head = q(
            f"SELECT {self.event_columns} FROM keelgate_audit WHERE tenant = ? AND run = ? "
            "ORDER BY seq DESC LIMIT 1"
        )
        # A page of a run's chain after a sequence number: a range of the primary key's index,
        # so each page costs the same however long the chain is.
        self.events_after = q(
            f"SELECT {self.event_columns} FROM keelgate_audit WHERE tenant = ? AND run = ? "
            "AND seq > ? ORDER BY seq LIMIT ?"
        )

    def together(self, first: str, events: int, completions: int = 0) -> str:
        """One statement for a dialect with ``one_statement_writes``: ``first`` (``"save"`` or
        ``"claim"``), then ``events`` audit rows inserted only if ``first`` wrote its row, and
        before them ``completions`` keys completed. Its one row: whether ``first`` wrote, and
        the keys completed.

        The audit rows have no ON CONFLICT: a chain that moved on, or an event already on it,
        fails the whole statement (a unique violation), which then wrote nothing.
        """
        shape = (first, events, completions)
        text = self._together.get(shape)
        if text is not None:
            return text
        parts = []
        if completions:
            pairs = ", ".join(["(?, ?)"] * completions)
            parts.append(
                "completed AS (UPDATE keelgate_keys SET state = 'completed', "
                f"result = done.result_text, owner = NULL FROM (VALUES {pairs}) "
                "AS done (done_key, result_text) WHERE tenant = ? AND key = done.done_key "
                f"AND state = 'in_flight' AND {self._d.mine} AND {self.ownership.key_fence} "
                "RETURNING key)"
            )
        base = self.save if first == "save" else self.claim
        parts.append(f"wrote AS ({base} RETURNING 1)")
        if events:
            rows = ", ".join(["(?, ?, CAST(? AS {b}), ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * events)
            parts.append(
                f"appended AS (INSERT INTO keelgate_audit (tenant, run, {self.event_columns}) "
                f"SELECT event.* FROM (VALUES {rows.format(b=self._d.bigint)}) AS event, wrote "
                "RETURNING 1)"
            )
        done = "ARRAY(SELECT key FROM completed)" if completions else "NULL"
        # A data-modifying WITH runs in full whether or not the query reads it.
        text = self._q(f"WITH {', '.join(parts)} SELECT (SELECT count(*) FROM wrote), {done}")
        self._together[shape] = text
        return text


# How often one event may find the chain moved on by another writer before the append gives up
# (StoreError; the transaction rolls back, nothing is half-written). Under SQLite's BEGIN
# IMMEDIATE nobody else can write, so the head read afresh holds and the first retry lands.
# Under PostgreSQL's READ COMMITTED each retry can meet one more concurrent writer of the run.
APPEND_ATTEMPTS = 100

# The most audit rows, and completions, a one-statement write carries: its parameters stay far
# below the protocol's 65,535, and the statement texts cached per shape stay few. A larger
# commit (an outbox of many events) takes the general path.
ONE_STATEMENT_MOST = 100

# Events per page when a chain is read: enough that a page's round trip is small beside its
# rows, few enough that a page of large events stays a few megabytes.
EVENT_PAGE = 1000


_UNKNOWN: Any = object()  # no head remembered for this chain


class SQLStore(HoldsOwner, ABC):
    """Checkpoint, spec, idempotency and audit store over one SQL database.

    A subclass sets ``dialect`` and provides the backend hooks below: its connections, its
    transactions, and its owner (who this store is, and whether another owner still lives).
    """

    dialect: ClassVar[Dialect]
    sql: ClassVar[Statements]
    # Every role in one transaction: see keelgate.core.protocols.Capabilities.
    capabilities = Capabilities(
        checkpoint_with_events=True,
        claim_with_event=True,
        checkpoint_with_completion=True,
        settle_with_event=True,
        claim_after_checkpoint=True,
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "dialect" in cls.__dict__:
            cls.sql = Statements(cls.dialect)

    #: Seconds any operation is repeated while the store cannot be reached (``_durably``); 0:
    #: it is tried once, and a failure is the caller's (the CLI's exit 5, nothing written).
    patience: float = 0.0
    #: Seconds the commit that records a WRITE's result (``complete``, ``save_completing``) is
    #: repeated, whatever ``patience`` is: it is the one commit whose loss pages a person, for a
    #: WRITE this process knows succeeded.
    result_patience: float = PATIENCE

    def __init__(self) -> None:
        self._holds = OwnerHolds()
        # The last event this store committed on each run's chain, so an append need not read
        # it back. Another writer may have moved on since: the chain's primary key then refuses
        # our insert, and the head is read afresh (see _append).
        self._heads: dict[tuple[str, str], AuditEvent | None] = {}
        # Keys this store claimed, whose end (completion, release, drop) it failed to record
        # and gave up on: nothing of this process drives them any more, so they read unknown
        # here at once (never "in flight in another live process"), and are released for every
        # other reader at this store's next operation that can write (``_let_go_now``).
        self._given_up: set[tuple[str, str]] = set()
        self._given_up_lock = threading.Lock()
        # Who the store records as the writer of the events it appends (the role and its kind),
        # where the database records one and holds each insert to it (PostgreSQL); None where
        # the store has one writer identity (SQLite, memory).
        self._writer: tuple[str, str] | None = None
        # The epoch this store writes each run under (``take``, ``carry``): every write of the
        # run carries it, and the store refuses it once the run has another.
        self._epochs: dict[tuple[str, str], int] = {}
        self._fenced_ever = False  # whether this store has written any run under an epoch

    # Backend hooks

    @abstractmethod
    def _statement(self) -> AbstractContextManager[Connection]:
        """A connection for autocommit statements: each one is atomic on its own."""

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Connection]:
        """One write transaction: committed on a normal exit, rolled back on an exception."""

    @abstractmethod
    def _on_owner_session(self, work: Callable[[Connection], T], *, atomic: bool) -> T:
        """Run ``work`` where this store's owner is provably alive while it runs (a claim must
        never be recorded otherwise), in one transaction if ``atomic``."""

    def _one_statement(self, conn: Connection, sql: str, params: Sequence[Any]) -> Any:
        """Run a statement of ``Statements.together`` as its own transaction and return its
        row, or None if a unique key refused it (it then wrote nothing). Only a backend whose
        dialect has ``one_statement_writes`` is asked."""
        raise NotImplementedError(f"{type(self).__name__} has no one-statement writes")

    @abstractmethod
    def _owner_id(self) -> Any:
        """The owner a new claim records."""

    @abstractmethod
    def _owned(self) -> Any:
        """The parameter of ``Dialect.mine``: the owner id(s) this store's keys may carry."""

    @abstractmethod
    def _alive(self, owner: Any, judged: Any) -> bool:
        """Whether an in-flight key's ``owner`` lives; ``judged`` is the dialect's liveness
        column. Must never say False for a live owner."""

    def _may_repeat(self) -> bool:
        """Whether a failed operation may still be repeated (a closed store's may not)."""
        return True

    def _mine(self, owner: Any) -> bool:
        """Whether ``owner`` is one of this store's own owner ids."""
        owned = self._owned()
        return bool(owner in owned) if isinstance(owned, list) else bool(owner == owned)

    def _durably(self, attempt: Callable[[bool], T], *, result: bool = False, what: str = "") -> T:
        """Run ``attempt(again=False)``, and again (``again=True``) while the store cannot be
        reached or written (``StoreUnavailable``: a server restart, a failover, an ended
        session, a full disk, a file locked past its busy timeout), for ``patience`` seconds,
        or ``result_patience`` for the commit of a WRITE's result (``result``).

        A statement given up after its bounded wait (``StoreBusy``: another session held a lock
        past the store's ``lock_timeout``) is repeated only for the commit of a WRITE's result:
        anything else is the caller's to try again, so that a wait never holds this process's
        session and thread longer than the bound. It is raised naming ``what`` was waiting.

        Every operation here is safe to repeat: reads, and writes that are compare-and-sets. A
        write whose acknowledgement was lost may have landed: ``again`` tells the attempt to
        recognise its own earlier write (a checkpoint already holding exactly this state, a
        key already completed with this result) instead of reading it as someone else's.
        """
        if self._given_up:
            self._let_go_now()
        patience = max(self.patience, self.result_patience) if result else self.patience
        give_up = clocks.boot() + patience
        pause, again = 0.0, False

        def may_repeat() -> bool:
            # No patience is one try, even on a clock that has not moved since (a simulation's).
            return patience > 0 and self._may_repeat() and clocks.boot() + pause <= give_up

        while True:
            try:
                return attempt(again)
            except StoreBusy as error:
                busy = error.doing(what) if what else error
                if not (result and may_repeat()):
                    raise busy from None
                log.warning("%s; trying again", busy.message)
            except StoreUnavailable as error:
                if not may_repeat():
                    raise
                log.warning("%s; trying again", error.message)
            clocks.sleep(pause)
            pause, again = min(max(pause * 2, 0.1), 2.0), True

    def _ending(self, keys: Sequence[tuple[str, str]], end: Callable[[], T]) -> T:
        """``end()``, which records how the calls of ``keys`` (claimed by this store) ended; if
        it fails for good, this store gives them up (``_given_up``)."""
        try:
            return end()
        except StaleCheckpoint:
            raise  # the calls' keys were completed all the same (``_completing_once``)
        except StoreError:
            with self._given_up_lock:
                self._given_up.update(keys)
            raise

    def _let_go_now(self) -> None:
        """Release the keys this store gave up on (one try each; those it cannot release yet
        wait for its next operation): from then on they read unknown for every reader, who may
        settle them."""
        with self._given_up_lock:
            keys = sorted(self._given_up)
        for tenant, key in keys:
            try:
                self._write(self.sql.release, (tenant, key, self._owned()))
            except StoreError:
                return
            with self._given_up_lock:
                self._given_up.discard((tenant, key))

    def _landed(self, conn: Connection, tenant: str, run: str, seq: int, text: str) -> bool:
        """Whether the checkpoint ``seq`` of the run holds exactly ``text``: an earlier attempt
        of this very save committed, its acknowledgement lost."""
        row = conn.execute(self.sql.checkpoint_text, (tenant, run, seq)).fetchone()
        return row is not None and str(row[0]) == text

    # RunOwners

    def take(self, tenant: str, run: str, *, holder: str, lease: float) -> Ownership:
        """Make ``holder`` the run's driver under a new epoch, if nobody else's lease is live
        on the store's clock; from then on every write of the run by this store carries it.
        ``RunBusy`` (naming the holder and its lease) while another holder's lease is live."""
        own = self.sql.ownership

        def attempt(again: bool) -> tuple[bool, Any]:
            with self._transaction() as conn:
                won = conn.execute(own.take, (tenant, run, holder, lease)).rowcount == 1
                return won, conn.execute(own.owner, (tenant, run)).fetchone()

        won, row = self._durably(attempt, what=f"taking run {run!r}")
        current = _ownership(tenant, run, row)
        if not won or current.holder != holder:
            raise RunBusy(
                tenant,
                run,
                f"driven by {current.holder!r} under epoch {current.epoch}, its lease live for "
                f"{max(current.lease_left, 0.0):.1f} s more",
            )
        self._epochs[(tenant, run)] = current.epoch
        self._fenced_ever = True
        return current

    def renew(self, ownership: Ownership, *, lease: float) -> Ownership:
        """Extend the lease of ``ownership`` by ``lease`` seconds from now on the store's
        clock, while its epoch is still the run's; ``StaleEpoch`` once another took it."""
        tenant, run = ownership.tenant, ownership.run
        values = (lease, tenant, run, ownership.holder, ownership.epoch)

        def attempt(again: bool) -> Any:
            with self._transaction() as conn:
                if conn.execute(self.sql.ownership.renew, values).rowcount != 1:
                    self._refuse_stale_epoch(conn, tenant, run, ownership.epoch)
                return conn.execute(self.sql.ownership.owner, (tenant, run)).fetchone()

        row = self._durably(attempt, what=f"renewing the lease of run {run!r}")
        return _ownership(tenant, run, row)

    def renew_held(self, holder: str, *, lease: float) -> list[Ownership]:
        """Extend by ``lease`` seconds (from now, on the store's clock) every live lease of
        ``holder``, in one statement and one commit, and return what it holds now: a run
        another holder took, or whose lease lapsed or was let go, is not among them."""

        def attempt(again: bool) -> list[Any]:
            with self._transaction() as conn:
                conn.execute(self.sql.ownership.renew_held, (lease, holder))
                return list(conn.execute(self.sql.ownership.held, (holder,)).fetchall())

        rows = self._durably(attempt, what=f"renewing the leases of {holder!r}")
        return [Ownership(str(r[0]), str(r[1]), holder, int(r[2]), float(r[3])) for r in rows]

    def carry(self, tenant: str, run: str, epoch: int | None) -> None:
        """Write the run under ``epoch`` from now on (taken by another process: a step
        process under its operator's), or under none (None)."""
        if epoch is None:
            self._epochs.pop((tenant, run), None)
        else:
            self._epochs[(tenant, run)] = epoch
            self._fenced_ever = True

    def let_go(self, ownership: Ownership) -> None:
        """End the lease at once (if it is still this ownership's), so the next holder need
        not wait for it; this store writes the run under no epoch from then on."""
        values = (ownership.tenant, ownership.run, ownership.holder, ownership.epoch)
        self._durably(
            lambda again: self._write(self.sql.ownership.let_go, values),
            what=f"letting run {ownership.run!r} go",
        )
        if self._epochs.get((ownership.tenant, ownership.run)) == ownership.epoch:
            del self._epochs[(ownership.tenant, ownership.run)]

    def holder_of(self, tenant: str, run: str) -> Ownership | None:
        """The run's holder as the store records it (its lease may have lapsed), or None."""
        row = self._durably(
            lambda again: self._one(self.sql.ownership.owner, (tenant, run)),
            what=f"reading the holder of run {run!r}",
        )
        if row is None:
            return None
        return _ownership(tenant, run, row)

    def _run_fence(self, tenant: str, run: str) -> tuple[Any, ...]:
        """The parameters of ``OwnershipStatements.run_fence`` for a write of the run."""
        return (tenant, run, self._epochs.get((tenant, run)))

    def _refuse_stale_epoch(
        self, conn: Connection, tenant: str, run: str, epoch: int | None = None
    ) -> None:
        """Raise ``StaleEpoch`` if the run's recorded epoch is not the one this store writes
        it under (``epoch``, or the one it carries)."""
        carried = self._epochs.get((tenant, run)) if epoch is None else epoch
        row = conn.execute(self.sql.ownership.fenced, (tenant, run, carried)).fetchone()
        if row is not None:
            raise StaleEpoch(tenant, run, carried, str(row[0]), int(row[1]))

    def _refuse_stale_key(self, tenant: str, key: str, conn: Connection | None = None) -> None:
        """Raise ``StaleEpoch`` if the key was claimed under an epoch its run no longer has.
        Only a store that has written some run under an epoch can have claimed such a key:
        any other asks nothing (its failed ends cost no statement more than before)."""
        if not self._fenced_ever:
            return
        if conn is None:
            row = self._one(self.sql.ownership.fenced_key, (tenant, key))
        else:
            row = conn.execute(self.sql.ownership.fenced_key, (tenant, key)).fetchone()
        if row is not None:
            raise StaleEpoch(tenant, str(row[2]), int(row[3]), str(row[0]), int(row[1]))

    # CheckpointStore

    def save(self, tenant: str, run: str, seq: int, state: Mapping[str, Any]) -> None:
        text = dumps(state)

        def attempt(again: bool) -> None:
            with self._statement() as conn:
                try:
                    self._save(conn, tenant, run, seq, text)
                except StaleCheckpoint:
                    if not (again and self._landed(conn, tenant, run, seq, text)):
                        raise

        self._durably(attempt, what=f"saving checkpoint {seq} of run {run!r}")

    def _save(self, conn: Connection, tenant: str, run: str, seq: int, text: str) -> None:
        values = (tenant, run, seq, text, *self._run_fence(tenant, run))
        if conn.execute(self.sql.save, values).rowcount == 1:
            return
        self._refuse_stale_epoch(conn, tenant, run)
        row = conn.execute(self.sql.stored_seq, (tenant, run)).fetchone()
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
            # One autocommit statement is atomic already: BEGIN and COMMIT would only add work
            # (the observe checkpoint of every iteration carries no event).
            self.save(tenant, run, seq, state)
            return
        text = dumps(state)

        def attempt(again: bool) -> None:
            if again:
                self._heads.pop((tenant, run), None)  # what committed is read afresh
            try:
                if self._saved_in_one(tenant, run, seq, text, drafts, ()) is not None:
                    return
                with self._transaction() as conn:
                    # A stale save raises here, inside the transaction: no event is appended.
                    self._save(conn, tenant, run, seq, text)
                    head = self._append(conn, tenant, run, drafts)
            except StaleCheckpoint:
                # Landed with its events (one transaction) if the checkpoint holds our state.
                if again and self._holds_checkpoint(tenant, run, seq, text):
                    return
                raise
            self._heads[(tenant, run)] = head

        self._durably(attempt, what=f"saving checkpoint {seq} of run {run!r}")

    def _holds_checkpoint(self, tenant: str, run: str, seq: int, text: str) -> bool:
        with self._statement() as conn:
            return self._landed(conn, tenant, run, seq, text)

    def save_completing(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
        completions: Sequence[Completion],
    ) -> tuple[str, ...]:
        """``save_with_events`` that also completes WRITEs' keys, in one transaction: the commit
        after a WRITE. Between the call's return and this commit the key stays in flight, so a
        death there reads as an unknown outcome, as it did when the completion was its own
        commit."""
        if not completions:
            self.save_with_events(tenant, run, seq, state, drafts)
            return ()
        text = dumps(state)

        def attempt(again: bool) -> tuple[str, ...]:
            if again:
                self._heads.pop((tenant, run), None)  # what committed is read afresh
            try:
                return self._completing_once(tenant, run, seq, text, drafts, completions)
            except StaleCheckpoint:
                if again and self._holds_checkpoint(tenant, run, seq, text):
                    # An earlier attempt committed it all; its acknowledgement was lost. The
                    # keys it completed are ours; any other was settled by someone else.
                    return tuple(
                        c.key
                        for c in completions
                        if not self._completed_as(tenant, c.key, c.result)
                    )
                raise

        keys = [(tenant, completion.key) for completion in completions]
        return self._ending(
            keys,
            lambda: self._durably(
                attempt,
                result=True,
                what=f"saving checkpoint {seq} of run {run!r} with its results",
            ),
        )

    def _completing_once(
        self,
        tenant: str,
        run: str,
        seq: int,
        text: str,
        drafts: Sequence[AuditDraft],
        completions: Sequence[Completion],
    ) -> tuple[str, ...]:
        in_one = self._saved_in_one(tenant, run, seq, text, drafts, completions)
        if in_one is not None:
            return in_one
        owned = self._owned()
        missed: list[str] = []
        try:
            with self._transaction() as conn:
                for completion in completions:
                    values = (dumps(completion.result), tenant, completion.key, owned)
                    if conn.execute(self.sql.complete, values).rowcount != 1:
                        missed.append(completion.key)
                self._save(conn, tenant, run, seq, text)
                head = self._append(conn, tenant, run, drafts) if drafts else _UNKNOWN
        except StaleCheckpoint:
            # Another writer moved the run on; the calls ran all the same, so their keys must
            # say so (left in flight they would read as unknown once this owner is gone).
            for completion in completions:
                self.complete(tenant, completion.key, completion.result)
            raise
        if head is not _UNKNOWN:
            self._heads[(tenant, run)] = head
        return tuple(missed)

    def _completed_as(self, tenant: str, key: str, result: Any) -> bool:
        """Whether the key is completed with exactly this result by its own call (not settled
        by anyone): what a completion whose acknowledgement was lost left behind."""
        with self._statement() as conn:
            row = conn.execute(self.sql.key, (tenant, key)).fetchone()
        if row is None:
            return False
        record = self._record(row)
        return (
            record.state is KeyState.COMPLETED
            and not record.source
            and record.result == json.loads(dumps(result))
        )

    def _saved_in_one(
        self,
        tenant: str,
        run: str,
        seq: int,
        text: str,
        drafts: Sequence[AuditDraft],
        completions: Sequence[Completion],
    ) -> tuple[str, ...] | None:
        """``save_completing`` (``save_with_events`` without completions) as one statement,
        for a dialect with ``one_statement_writes``: the keys missed, or None where it did not
        commit and the general path must. It then wrote nothing (the chain had moved on: the
        general path reads the head afresh), or only the completions (the save was stale: the
        calls ran all the same, and the general path lands them too, then raises)."""
        keys = [completion.key for completion in completions]
        if not self.dialect.one_statement_writes or len(set(keys)) != len(keys):
            return None
        sealed = self._sealed(tenant, run, drafts) if drafts else ((), _UNKNOWN)
        if sealed is None or len(keys) > ONE_STATEMENT_MOST:
            return None
        events, last = sealed
        done = [x for c in completions for x in (c.key, dumps(c.result))]
        if completions:
            done += [tenant, self._owned()]
        sql = self.sql.together("save", len(drafts), len(completions))
        with self._statement() as conn:
            fence = self._run_fence(tenant, run)
            row = self._one_statement(conn, sql, (*done, tenant, run, seq, text, *fence, *events))
        if row is None:
            self._heads.pop((tenant, run), None)
            return None
        if row[0] != 1:
            return None
        if last is not _UNKNOWN:
            self._heads[(tenant, run)] = last
        completed = set(row[1] or ())
        return tuple(key for key in keys if key not in completed)

    def load(self, tenant: str, run: str) -> Checkpoint | None:
        row = self._durably(
            lambda again: self._one(self.sql.load, (tenant, run)),
            what=f"reading the checkpoint of run {run!r}",
        )
        if row is None:
            return None
        return Checkpoint(tenant, run, int(row[0]), json.loads(row[1]))

    def runs(self, tenant: str | None = None) -> list[RunRef]:
        def attempt(again: bool) -> list[Any]:
            with self._statement() as conn:
                return conn.execute(self.sql.runs, (tenant, tenant)).fetchall()

        return [
            RunRef(str(t), str(r), int(s))
            for t, r, s in self._durably(attempt, what="listing runs")
        ]

    def revisions(self, runs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, int]]:
        """RunRevisions: one statement per ``REVISIONS_CHUNK`` runs, each run's checkpoint seq
        and audit head found by primary key."""
        found: dict[tuple[str, str], tuple[int, int]] = {}
        wanted = list(dict.fromkeys((str(t), str(r)) for t, r in runs))
        for start in range(0, len(wanted), REVISIONS_CHUNK):
            chunk = wanted[start : start + REVISIONS_CHUNK]
            values = ", ".join(["(?, ?)"] * len(chunk)).replace("?", self.dialect.placeholder)
            sql = self.sql.revisions.format(values=values)
            params = [part for pair in chunk for part in pair]

            def attempt(again: bool, sql: str = sql, params: list[str] = params) -> list[Any]:
                with self._statement() as conn:
                    return conn.execute(sql, params).fetchall()

            for tenant, run, seq, head in self._durably(attempt, what="reading runs' revisions"):
                found[(str(tenant), str(run))] = (int(seq), int(head))
        return found

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        """The one row of a read, or None."""
        with self._statement() as conn:
            return conn.execute(sql, params).fetchone()

    # SpecStore

    def record_spec(
        self, tenant: str, run: str, spec: Mapping[str, Any], *, source: str, generation: int
    ) -> bool:
        text = dumps(spec)

        def attempt(again: bool) -> bool:
            with self._statement() as conn:
                # The operator records the spec before every step pod, and it seldom changes:
                # an identical record is left as it is, so a step costs no durable commit here
                # (and a repeat after a lost acknowledgement finds its own record).
                row = conn.execute(self.sql.recorded_spec, (tenant, run)).fetchone()
                if row is not None and (str(row[0]), int(row[1]), str(row[2])) == (
                    source,
                    generation,
                    text,
                ):
                    return True
                values = (tenant, run, source, generation, text)
                return conn.execute(self.sql.record_spec, values).rowcount == 1

        return self._durably(attempt, what=f"recording the spec of run {run!r}")

    def recorded_spec(self, tenant: str, run: str) -> RecordedSpec | None:
        row = self._durably(
            lambda again: self._one(self.sql.recorded_spec, (tenant, run)),
            what=f"reading the spec of run {run!r}",
        )
        if row is None:
            return None
        return RecordedSpec(tenant, run, str(row[0]), int(row[1]), json.loads(row[2]))

    # IdempotencyStore

    def _record(self, row: Sequence[Any]) -> KeyRecord:
        (tenant, key, run, action, tool, state, owner, result, settled_by, source) = row[:10]
        deadline, deadline_in, judged, stale = row[10:14]
        key_state = KeyState(state)
        here = False
        if key_state is KeyState.IN_FLIGHT:
            # Claimed under an epoch the run no longer has: its holder lost the run, and nothing
            # it left in flight is driven by anyone, whether or not its process lives.
            if stale or not self._alive(owner, judged):
                key_state = KeyState.OUTCOME_UNKNOWN
            elif self._mine(owner):
                # Our own claim: its call runs in this process, unless we gave it up (its end
                # could not be recorded), which then no process drives any more.
                with self._given_up_lock:
                    here = (tenant, key) not in self._given_up
                if not here:
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
            None if deadline is None else float(deadline),
            None if deadline_in is None else float(deadline_in),
            here=here,
        )

    def claim(
        self,
        tenant: str,
        key: str,
        *,
        run: str,
        action: str,
        tool: str,
        event: AuditDraft | None = None,
        deadline_in: float | None = None,
        after: int | None = None,
    ) -> KeyRecord | None:
        claim_id = uuid.uuid4().hex
        epoch = self._epochs.get((tenant, run))

        def claimed(*events: Any) -> tuple[Any, ...]:
            """The claim statement's parameters (then ``events``' rows, for one statement): the
            key, its owner (this session's id), its deadline and claim id; the epoch it is
            claimed under; the checkpoint its action was planned from; the epoch the run must
            still have."""
            return (
                *(tenant, key, run, action, tool, self._owner_id(), deadline_in, claim_id),
                *(epoch, after, tenant, run, after, tenant, run, epoch),
                *events,
            )

        def insert(conn: Connection) -> tuple[bool, AuditEvent | None]:
            """Whether the claim won, and then the run's new chain head if it carried an event."""
            if conn.execute(self.sql.claim, claimed()).rowcount != 1:
                return False, None
            return True, None if event is None else self._append(conn, tenant, run, [event])

        def insert_one(conn: Connection) -> tuple[bool, AuditEvent | None] | None:
            """``insert`` as one statement, the event sealed after the remembered head; None
            if the chain had moved on (nothing was written)."""
            assert event is not None
            sealed = self._sealed(tenant, run, [event])
            if sealed is None:
                return None
            events, last = sealed
            row = self._one_statement(conn, self.sql.together("claim", 1), claimed(*events))
            if row is None:
                self._heads.pop((tenant, run), None)
                return None
            return (True, last) if row[0] == 1 else (False, None)

        def mine(conn: Connection) -> bool:
            """After a claim whose acknowledgement was lost: whether it landed (its id is on
            the key, still in flight), and then take it over with the current owner id, so
            that it reads live again (a new owner session has a new id)."""
            values = (self._owner_id(), tenant, key, claim_id)
            return bool(conn.execute(self.sql.own_claim, values).rowcount == 1)

        def attempt(again: bool) -> tuple[bool, AuditEvent | None]:
            if again:
                self._heads.pop((tenant, run), None)
                if self._on_owner_session(mine, atomic=False):
                    # Its event, if any, committed with it; the head is read afresh next time.
                    return True, _UNKNOWN
            fast = None
            if event is not None and self.dialect.one_statement_writes:
                fast = self._on_owner_session(insert_one, atomic=False)
            return fast or self._on_owner_session(insert, atomic=event is not None)

        while True:
            won, head = self._durably(attempt, what=f"claiming key {key}")
            if won:
                if event is not None and head is not _UNKNOWN:
                    self._heads[(tenant, run)] = head  # committed: it may be remembered
                return None
            lost_to = self._claim_lost(tenant, key, run, after)
            if lost_to is not None:
                return lost_to
            # Its live owner just dropped it after a definite refusal: claim it afresh.
            claim_id = uuid.uuid4().hex

    def _claim_lost(self, tenant: str, key: str, run: str, after: int | None) -> KeyRecord | None:
        """After a claim that did not land: the key as it stands (its owner judged alive or
        gone); None where there is no key and the claim may be made afresh. ``StaleEpoch`` or
        ``StaleClaim`` where the run is no longer this store's to claim in."""
        row = self._durably(
            lambda again: self._one(self.sql.key, (tenant, key)), what=f"reading key {key}"
        )
        if row is not None:
            return self._record(row)
        # No key: the run's epoch is not the one this store writes it under, the run's
        # checkpoint has moved on past the action's (a seq only grows, so it never comes
        # back), or the key's live owner just dropped it.
        stored = self._durably(
            lambda again: self._stored_seq_under_epoch(tenant, run),
            what=f"reading the checkpoint of run {run!r}",
        )
        if after is not None:
            stored_seq = None if stored is None else int(stored[0])
            if stored_seq != after:
                raise StaleClaim(tenant, run, after, stored_seq)
        return None

    def _stored_seq_under_epoch(self, tenant: str, run: str) -> Any:
        """The run's stored checkpoint seq (its row, or None); ``StaleEpoch`` first if the run's
        epoch is not the one this store writes it under."""
        with self._statement() as conn:
            self._refuse_stale_epoch(conn, tenant, run)
            return conn.execute(self.sql.stored_seq, (tenant, run)).fetchone()

    def complete(self, tenant: str, key: str, result: Any) -> bool:
        text = dumps(result)

        def attempt(again: bool) -> bool:
            with self._statement() as conn:
                values = (text, tenant, key, self._owned())
                if conn.execute(self.sql.complete, values).rowcount == 1:
                    return True
            if again and self._completed_as(tenant, key, result):
                return True
            self._refuse_stale_key(tenant, key)
            return False

        return self._ending(
            [(tenant, key)],
            lambda: self._durably(attempt, result=True, what=f"completing key {key}"),
        )

    def release(self, tenant: str, key: str) -> None:
        def attempt(again: bool) -> None:
            if self._write(self.sql.release, (tenant, key, self._owned())) == 0:
                self._refuse_stale_key(tenant, key)

        self._ending([(tenant, key)], lambda: self._durably(attempt, what=f"releasing key {key}"))

    def forget(self, tenant: str, key: str) -> bool:
        """Drop our in-flight key after a definite refusal, only while the owner that claimed it
        is the one this store holds live now, judged on the owner session itself (a session
        that ends meanwhile fails the statement, and the repeat runs on a new owner id). A key
        whose owner session was lost read unknown to everyone since: a stop may name it and a
        person may be settling it, so it stays for them (False). Not dropped by a failure
        either: the key then reads unknown, the safe side of a refusal that was not recorded."""

        def drop(conn: Connection) -> bool:
            row = conn.execute(self.sql.key, (tenant, key)).fetchone()
            if row is None:
                return True  # nothing of it on record (a repeat whose first try landed)
            state, owner, judged = row[5], row[6], row[12]
            if state != KeyState.IN_FLIGHT.value or owner != self._owner_id():
                return False
            if not self._alive(owner, judged):
                return False
            if row[13]:
                self._refuse_stale_key(tenant, key, conn)
            return bool(conn.execute(self.sql.forget, (tenant, key, owner)).rowcount == 1)

        return self._ending(
            [(tenant, key)],
            lambda: self._durably(
                lambda again: self._on_owner_session(drop, atomic=True), what=f"dropping key {key}"
            ),
        )

    def _write(self, sql: str, params: Sequence[Any]) -> int:
        """One autocommit write; the rows it changed."""
        with self._statement() as conn:
            return int(conn.execute(sql, params).rowcount)

    def settle(
        self,
        tenant: str,
        key: str,
        *,
        executed: bool,
        by: str,
        source: str,
        event: AuditDraft | None = None,
    ) -> KeyRecord:
        """``event``, when given, is appended to the key's run's chain in the settlement's own
        transaction (``Capabilities.settle_with_event``): whoever settles records the decision,
        never a later process that finds the key settled without it."""

        def attempt(again: bool) -> KeyRecord:
            if again:
                self._heads.clear()  # what committed is read afresh
            try:
                return self._settle_once(
                    tenant, key, executed=executed, by=by, source=source, event=event
                )
            except SettleError:
                if again:
                    # An earlier attempt may have landed, its acknowledgement lost: the very
                    # settlement asked for, by the same person, is this one.
                    current = self.get(tenant, key)
                    verdict = KeyState.COMPLETED if executed else KeyState.ABANDONED
                    if current is not None and (
                        current.state,
                        current.settled_by,
                        current.source,
                    ) == (verdict, by, source):
                        return current
                raise

        return self._durably(attempt, what=f"settling key {key}")

    def _settle_once(
        self,
        tenant: str,
        key: str,
        *,
        executed: bool,
        by: str,
        source: str,
        event: AuditDraft | None,
    ) -> KeyRecord:
        head: Any = _UNKNOWN
        with self._transaction() if event is not None else self._statement() as conn:
            row = conn.execute(self.sql.key, (tenant, key)).fetchone()
            if row is None:
                raise SettleError("", key, "no such idempotency key")
            current = self._record(row)
            state = settled_state(current, executed=executed)
            # Compare-and-set on the owner we judged gone, so a racing settle cannot win twice.
            owner = row[6]
            values = (state.value, by, source, tenant, key, owner, executed)
            if conn.execute(self.sql.settle, values).rowcount != 1:
                again = conn.execute(self.sql.key, (tenant, key)).fetchone()
                now = None if again is None else self._record(again)
                if now is not None and now.state is current.state and now.sendable:
                    raise SettleTooEarly(
                        now.run,
                        now.action,
                        not_before=now.not_executed_after,
                        retry_after=float(now.deadline_in or 0.0),
                    )
                raise SettleError(current.run, current.action, "settled by someone else first")
            if event is not None:
                head = self._append(conn, tenant, current.run, [event])
            settled = conn.execute(self.sql.key, (tenant, key)).fetchone()
        if head is not _UNKNOWN:
            self._heads[(tenant, current.run)] = head
        return self._record(settled)

    def get(self, tenant: str, key: str) -> KeyRecord | None:
        row = self._durably(
            lambda again: self._one(self.sql.key, (tenant, key)), what=f"reading key {key}"
        )
        return None if row is None else self._record(row)

    # AuditLog

    def append(self, tenant: str, run: str, drafts: Sequence[AuditDraft]) -> None:
        if not drafts:
            return

        def attempt(again: bool) -> None:
            if again:
                self._heads.pop((tenant, run), None)
            # A repeat skips what landed: a draft whose key is on the chain is not appended.
            with self._transaction() as conn:
                if (tenant, run) in self._epochs:
                    self._refuse_stale_epoch(conn, tenant, run)
                head = self._append(conn, tenant, run, drafts)
            self._heads[(tenant, run)] = head

        self._durably(attempt, what=f"appending to the audit trail of run {run!r}")

    def _sealed(
        self, tenant: str, run: str, drafts: Sequence[AuditDraft]
    ) -> tuple[tuple[Any, ...], AuditEvent] | None:
        """For a one-statement write: ``drafts`` (at most ``ONE_STATEMENT_MOST``) sealed after
        the head this store remembers, as the audit rows' parameters, and the new head. None
        where no head is remembered (the general path reads it) or there are too many."""
        head = self._heads.get((tenant, run), _UNKNOWN)
        if head is _UNKNOWN or not drafts or len(drafts) > ONE_STATEMENT_MOST:
            return None
        params: list[Any] = []
        for draft in drafts:
            head = seal(tenant, run, head, draft, writer=self._writer)
            params.extend(_event_row(tenant, run, head))
        return tuple(params), head

    def _append(
        self, conn: Connection, tenant: str, run: str, drafts: Sequence[AuditDraft]
    ) -> AuditEvent | None:
        """Seal and insert ``drafts`` after the run's head; returns the new head, which the
        caller remembers once its transaction has committed.

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
            for _ in range(APPEND_ATTEMPTS):
                event = seal(tenant, run, head, draft, writer=self._writer)
                row = _event_row(tenant, run, event)
                if conn.execute(self.sql.append, row).rowcount == 1:
                    head = event
                    break
                if (
                    draft.key is not None
                    and conn.execute(self.sql.on_chain, (tenant, run, draft.key)).fetchone()
                ):
                    break  # on the chain already (appended before a crash)
                head = self._read_head(conn, tenant, run)
            else:
                raise StoreError(f"audit chain of {run!r}: could not append {draft.type}")
        return head

    def _read_head(self, conn: Connection, tenant: str, run: str) -> AuditEvent | None:
        row = conn.execute(self.sql.head, (tenant, run)).fetchone()
        return None if row is None else _event(tenant, run, row)

    def events(self, tenant: str, run: str) -> list[AuditEvent]:
        return list(self.iter_events(tenant, run))

    def iter_events(
        self, tenant: str, run: str, *, after: int = 0, page: int = EVENT_PAGE
    ) -> Iterator[AuditEvent]:
        """The run's events after sequence number ``after``, in order, read ``page`` at a time.

        Each page is its own statement (no transaction is held open while the caller works),
        found through the primary key from the last sequence number read. Events are only ever
        appended, so a page read later never misses one that an earlier page would have held.
        An event whose data cannot be decoded raises ``UnreadableEvent``; reading on from its
        sequence number (``after``) continues the chain past it.
        """
        last = after
        while True:

            def attempt(again: bool, last: int = last) -> list[Any]:
                with self._statement() as conn:
                    return conn.execute(self.sql.events_after, (tenant, run, last, page)).fetchall()

            rows = self._durably(attempt, what=f"reading the audit trail of run {run!r}")
            for row in rows:
                yield _event(tenant, run, row)
                last = int(row[0])
            if len(rows) < page:
                return


def _event_row(tenant: str, run: str, event: AuditEvent) -> tuple[Any, ...]:
    """An event as the parameters of its audit row."""
    return (
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
        event.writer,
        event.writer_kind,
    )


def _ownership(tenant: str, run: str, row: Sequence[Any]) -> Ownership:
    """A row of ``OwnershipStatements.owner``: holder, epoch, seconds of lease left."""
    holder, epoch, lease_left = row
    return Ownership(tenant, run, str(holder), int(epoch), float(lease_left))


def _event(tenant: str, run: str, row: Sequence[Any]) -> AuditEvent:
    seq, type_, actor, at, data, key, prev, hash_, writer, writer_kind = row
    try:
        decoded = loads(data)
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        raise UnreadableEvent(tenant, run, int(seq), str(type_), key, str(hash_))
    return stored_event(int(seq), type_, actor, at, decoded, key, prev, hash_, writer, writer_kind)
