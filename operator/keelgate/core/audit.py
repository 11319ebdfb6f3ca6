"""The audit chain: append-only, hash-chained events per run.

Each event's hash covers the previous event's hash, so an edited or removed event breaks the chain
and ``verify`` says where. Stores only persist what ``seal`` returns; the hashing lives here so that
every backend chains identically. Events carry who and what, never tool arguments or secrets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from keelgate.core import clocks
from keelgate.core.json_codec import OMIT_NONE, JsonValue
from keelgate.core.types import canonical_json

GENESIS = "0" * 64


def utc_now() -> str:
    return utc_iso_millis(clocks.wall())


def utc_iso_millis(seconds: float) -> str:
    """Seconds since the epoch as UTC ISO 8601 to the millisecond, as the chain writes times."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class AuditDraft(JsonValue):
    """An event not yet on the chain. ``key``, when set, makes appending it idempotent."""

    type: str
    data: Mapping[str, Any]
    actor: str = "keelgate"
    at: str = field(default_factory=utc_now)
    key: str | None = None


@dataclass(frozen=True)
class AuditEvent(JsonValue):
    """An event on the chain. ``writer`` is the database role that wrote it and
    ``writer_kind`` what that role is (``tenant``, ``operator`` or ``administrator``), as the
    database recorded them (PostgreSQL, from migration 6); None where the store records no
    writer (SQLite and memory, which have one writer identity, and older events)."""

    seq: int
    type: str
    actor: str
    at: str
    data: Mapping[str, Any]
    key: str | None
    prev: str
    hash: str
    writer: Annotated[str | None, OMIT_NONE] = None
    writer_kind: Annotated[str | None, OMIT_NONE] = None


def stored_event(
    seq: int,
    type: str,
    actor: str,
    at: str,
    data: Mapping[str, Any],
    key: str | None,
    prev: str,
    hash: str,
    writer: str | None = None,
    writer_kind: str | None = None,
) -> AuditEvent:
    """An event as a store reads it back, equal to ``AuditEvent(...)`` of the same fields.

    Reading a long chain builds one per event, and a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``, several times the cost of the rest of the read. The
    fields are set here as they come; nothing is checked, as ``__init__`` checks nothing either.
    """
    event = object.__new__(AuditEvent)
    event.__dict__.update(
        seq=seq,
        type=type,
        actor=actor,
        at=at,
        data=data,
        key=key,
        prev=prev,
        hash=hash,
        writer=writer,
        writer_kind=writer_kind,
    )
    return event


def _hash(
    tenant: str,
    run: str,
    seq: int,
    prev: str,
    type: str,
    actor: str,
    at: str,
    data: Mapping[str, Any],
    key: str | None,
    writer: tuple[str, str] | None = None,
) -> str:
    """The event's hash. An event sealed with its writer (the role and its kind, which the
    database then holds it to) covers them too, so a signed head pins who wrote each event as
    well as what it says; an event without one hashes exactly as every event did before."""
    fields: list[Any] = [tenant, run, seq, prev, type, actor, at, dict(data), key]
    if writer is not None:
        fields.extend(writer)
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()


def event_hash(tenant: str, run: str, event: AuditEvent) -> str:
    """What ``event``'s hash must be, from its fields and its place on ``tenant/run``'s chain."""
    e = event
    writer = None if e.writer is None else (e.writer, e.writer_kind or "")
    return _hash(tenant, run, e.seq, e.prev, e.type, e.actor, e.at, e.data, e.key, writer)


def hash_holds(tenant: str, run: str, event: AuditEvent) -> bool:
    """Whether ``event``'s hash is what its fields give: with its writer, or (an event a client
    of the release before wrote, which the database gave its writer) without it."""
    if event_hash(tenant, run, event) == event.hash:
        return True
    if event.writer is None:
        return False
    e = event
    return _hash(tenant, run, e.seq, e.prev, e.type, e.actor, e.at, e.data, e.key) == e.hash


def seal(
    tenant: str,
    run: str,
    head: AuditEvent | None,
    draft: AuditDraft,
    *,
    writer: tuple[str, str] | None = None,
) -> AuditEvent:
    """Put ``draft`` on the chain after ``head`` (None for the first event of a run), written
    by ``writer`` (the role and its kind, where the store records who writes)."""
    seq = 1 if head is None else head.seq + 1
    prev = GENESIS if head is None else head.hash
    digest = _hash(
        tenant, run, seq, prev, draft.type, draft.actor, draft.at, draft.data, draft.key, writer
    )
    return AuditEvent(
        seq,
        draft.type,
        draft.actor,
        draft.at,
        dict(draft.data),
        draft.key,
        prev,
        digest,
        None if writer is None else writer[0],
        None if writer is None else writer[1],
    )


#: The kinds of writer that may record a person's decision: the operator's role (a decision
#: made through Kubernetes, as a Reconciliation or an Approval) and an administrator (a role
#: that owns the store). A tenant's role is also its step pods', which run the tenant's own
#: code: a decision it records cannot be told from one that code made up.
DECIDERS = frozenset({"operator", "administrator"})


def decision_refused(event: AuditEvent) -> str | None:
    """Why ``event`` is a decision its writer may not record, or None: a settlement by a person
    (``loop.reconciled`` not from a confirmer), an approval or denial, or a signed head,
    written by a role of a kind not in ``DECIDERS``. A settlement by a confirmer is the
    tenant's own code's word (a confirmer runs in its step pod), and may be written by its
    role. An event whose store recorded no writer is not judged (SQLite, memory, older ones)."""
    kind = event.writer_kind
    if event.writer is None or kind in DECIDERS:
        return None
    if event.type == "loop.reconciled":
        if event.data.get("source") == "confirmer":
            return None
        what = "a person's settlement"
    elif event.type in ("loop.approved", "loop.denied"):
        what = "a person's approval or denial"
    elif event.type == "audit.head_signed":
        what = "a signed head"
    else:
        return None
    return (
        f"event {event.seq} ({event.type}) was written by role {event.writer} "
        f"(a {kind or 'unknown'} role), which may not record {what}"
    )


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    events: int
    problems: tuple[str, ...] = ()


class ChainCheck:
    """Checks a run's chain one event at a time, in sequence order, so a chain of any length is
    verified without holding it: ``add`` each event as it is read, ``unreadable`` for an event
    the store could not decode, then ``report``.

    ``anchor`` is the key of the last event the run's checkpoint says it wrote (``pending``: keys
    still in its outbox, not yet appended). Links alone cannot show that the newest events were
    cut off; if the chain lacks the anchor, events were removed from its end.
    """

    def __init__(
        self,
        tenant: str,
        run: str,
        *,
        anchor: str | None = None,
        pending: Collection[str] = (),
    ) -> None:
        self.tenant = tenant
        self.run = run
        self.anchor = anchor
        self.pending = pending
        self.count = 0
        self.problems: list[str] = []
        self._prev = GENESIS
        self._gap = False  # a missing event: links past it are not judged
        self._anchored = False

    def _next(self, seq: int, key: str | None) -> bool:
        """Count an event; whether its links are to be checked."""
        self.count += 1
        if key is not None and key == self.anchor:
            self._anchored = True
        if self._gap:
            return False
        if seq != self.count:
            self.problems.append(f"event {self.count} is missing (found {seq} in its place)")
            self._gap = True
            return False
        return True

    def add(self, event: AuditEvent) -> None:
        if not self._next(event.seq, event.key):
            return
        if event.prev != self._prev:
            self.problems.append(f"event {event.seq} does not follow event {event.seq - 1}")
        if not hash_holds(self.tenant, self.run, event):
            self.problems.append(f"event {event.seq} ({event.type}) was altered")
        refused = decision_refused(event)
        if refused is not None:
            self.problems.append(refused)
        self._prev = event.hash

    def unreadable(self, seq: int, type: str, key: str | None, hash: str) -> None:
        """An event whose stored data cannot be decoded: it was edited, so its hash cannot
        match; the chain is judged on past it, from the hash it claims."""
        if not self._next(seq, key):
            return
        self.problems.append(f"event {seq} ({type}) was altered: its data is not a JSON object")
        self._prev = hash

    def report(self) -> ChainReport:
        problems = list(self.problems)
        anchor = self.anchor
        if anchor is not None and anchor not in self.pending and not self._anchored:
            problems.append(
                f"events were removed from the end: the checkpoint's last event ({anchor}) "
                "is missing"
            )
        return ChainReport(not problems, self.count, tuple(problems))


def verify(
    tenant: str,
    run: str,
    events: Iterable[AuditEvent],
    *,
    anchor: str | None = None,
    pending: Collection[str] = (),
) -> ChainReport:
    """Check every link: sequence without gaps, each ``prev`` the hash before, each hash right;
    and, given the checkpoint's ``anchor``, that no event was cut off the end (``ChainCheck``)."""
    check = ChainCheck(tenant, run, anchor=anchor, pending=pending)
    for event in events:
        check.add(event)
    return check.report()
